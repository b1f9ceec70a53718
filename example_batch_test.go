package tide_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

// A batch handler inserts rows in bulk: the three tasks enqueued together
// reach it in one batch (BatchSize 3), and each settles with its own error.
func ExampleServeMux_HandleBatch() {
	b := membroker.New()
	c := tide.NewClient(b)
	done := make(chan struct{})
	mux := tide.NewServeMux()
	mux.HandleBatch("row:insert", tide.BatchHandlerFunc(func(ctx context.Context, ts []*tide.Task) []error {
		errs := make([]error, len(ts))
		fmt.Printf("inserting %d rows\n", len(ts))
		close(done)
		return errs
	}), tide.BatchSize(3), tide.BatchWait(10*time.Second))
	srv := tide.NewServer(b, tide.Config{Concurrency: 4, Logger: discard()})
	ctx := context.Background()
	tasks := []*tide.Task{
		tide.NewTask("row:insert", []byte("a")),
		tide.NewTask("row:insert", []byte("b")),
		tide.NewTask("row:insert", []byte("c")),
	}
	if _, err := c.EnqueueMany(ctx, tasks); err != nil {
		fmt.Println(err)
		return
	}
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	<-done
	// Output: inserting 3 rows
}

// EnqueueAndWait runs a task on a worker and waits for its outcome: the
// request/response shape. The task's Retention keeps its result to read.
func ExampleClient_EnqueueAndWait() {
	b := membroker.New()
	c := tide.NewClient(b)
	mux := tide.NewServeMux()
	mux.HandleFunc("image:resize", func(ctx context.Context, t *tide.Task) error {
		_ = tide.ReportProgress(ctx, 50, "half way")
		return tide.WriteResult(ctx, []byte("https://cdn.example.com/"+string(t.Payload())+"-small.png"))
	})
	srv := tide.NewServer(b, tide.Config{Concurrency: 2, Logger: discard()})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	info, err := c.EnqueueAndWait(context.Background(), tide.NewTask("image:resize", []byte("cat")), tide.Retention(time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.State, string(info.Result), info.Progress.Percent)
	// Output: completed https://cdn.example.com/cat-small.png 50
}
