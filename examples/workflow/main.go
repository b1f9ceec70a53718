// Command workflow shows tide's workflows and batches in memory (no Redis
// needed): an order goes through charge and reserve, then ship, then a
// report that runs even when shipping did not happen; and a batch of rows is
// imported, two of them bad, with a callback that reports the outcome once
// all have finished.
//
//	go run ./examples/workflow
//
// With TIDE_REDIS_ADDR set it keeps its tasks in that Redis instead.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

func main() {
	if err := run(context.Background(), os.Getenv("TIDE_REDIS_ADDR"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "workflow:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, redisAddr string, out io.Writer) error {
	var b broker.Broker = membroker.New()
	if redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		b = redisbroker.New(rdb, redisbroker.WithPrefix("tide-example-workflow"))
	}
	defer b.Close()
	batchDone := make(chan *tide.BatchInfo, 1)
	srv := tide.NewServer(b, tide.Config{
		Concurrency: 4,
		Queues:      map[string]int{"default": 1, "stock": 1},
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err := srv.Start(handlers(out, batchDone)); err != nil {
		return err
	}
	defer srv.Shutdown()
	c := tide.NewClient(b)
	in := tide.NewInspector(b)

	// The workflow: ship needs charge and reserve; report runs whatever
	// happened to ship.
	order := []byte("42")
	wf := tide.NewWorkflow("fulfil-order-42").
		Add("charge", tide.NewTask("order:charge", order)).
		Add("reserve", tide.NewTask("stock:reserve", order, tide.Queue("stock"))).
		Add("ship", tide.NewTask("order:ship", order), tide.After("charge", "reserve")).
		Add("report", tide.NewTask("order:report", order), tide.After("ship"), tide.OnDependencyFailure(tide.RunDependents))
	if _, err := c.EnqueueWorkflow(ctx, wf); err != nil {
		return err
	}
	info, err := waitWorkflow(ctx, in, "fulfil-order-42")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "workflow %s %s:\n", info.ID, info.State)
	for _, s := range info.Steps {
		after := ""
		if len(s.After) > 0 {
			after = " after " + strings.Join(s.After, ", ")
		}
		fmt.Fprintf(out, "  %-8s %s%s\n", s.Name, s.State, after)
	}

	// The batch: ten rows, rows 3 and 7 are bad; the callback runs once.
	rows := make([]*tide.Task, 10)
	for i := range rows {
		rows[i] = tide.NewTask("row:import", []byte(strconv.Itoa(i)), tide.MaxRetry(0))
	}
	if _, err := c.EnqueueBatch(ctx, rows, tide.OnBatchDone(tide.NewTask("import:report", nil))); err != nil {
		return err
	}
	select {
	case bi := <-batchDone:
		fmt.Fprintf(out, "batch of %d: %d imported, %d failed\n", bi.Total, bi.Succeeded, bi.Failed)
	case <-time.After(30 * time.Second):
		return errors.New("the batch callback did not run")
	}
	return nil
}

// handlers are the example's task handlers.
func handlers(out io.Writer, batchDone chan<- *tide.BatchInfo) *tide.ServeMux {
	mux := tide.NewServeMux()
	mux.HandleFunc("order:charge", func(ctx context.Context, t *tide.Task) error {
		return tide.WriteResult(ctx, []byte("receipt-"+string(t.Payload())))
	})
	mux.HandleFunc("stock:reserve", func(ctx context.Context, t *tide.Task) error { return nil })
	mux.HandleFunc("order:ship", func(ctx context.Context, t *tide.Task) error {
		receipt, err := tide.StepResult(ctx, "charge")
		if err != nil {
			return err
		}
		return tide.WriteResult(ctx, []byte("shipped with "+string(receipt)))
	})
	mux.HandleFunc("order:report", func(ctx context.Context, t *tide.Task) error {
		shipped, err := tide.StepResult(ctx, "ship")
		if err != nil {
			fmt.Fprintln(out, "report: order 42 was not shipped:", err)
			return nil
		}
		fmt.Fprintf(out, "report: order 42 %s\n", shipped)
		return nil
	})
	mux.HandleFunc("row:import", func(ctx context.Context, t *tide.Task) error {
		if n := string(t.Payload()); n == "3" || n == "7" {
			return fmt.Errorf("row %s: bad data", n)
		}
		return nil
	})
	mux.HandleFunc("import:report", func(ctx context.Context, t *tide.Task) error {
		if bi, ok := tide.GetBatch(ctx); ok {
			batchDone <- bi
		}
		return nil
	})
	return mux
}

// waitWorkflow waits until the workflow has ended.
func waitWorkflow(ctx context.Context, in *tide.Inspector, id string) (*tide.WorkflowInfo, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := in.GetWorkflow(ctx, id)
		if err != nil {
			return nil, err
		}
		if info.State != tide.FlowRunning {
			return info, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("workflow %s still running after 30s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
