package tide_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// A task that replaces a finished task of an ordered group (Replace with
// the finished task's ID) is a new task: it runs after the tasks enqueued
// before it, never ahead of them.
func TestReplaceFinishedRunsInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const q = "replace-order"
	var mu sync.Mutex
	var order []string
	started := make(chan string, 10)
	release := make(chan struct{})
	e.server(tide.Config{
		Queues:      map[string]int{q: 1},
		QueueLimits: map[string]tide.QueueLimits{q: {Ordered: true}},
	}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		p := string(task.Payload())
		mu.Lock()
		order = append(order, p)
		mu.Unlock()
		started <- p
		if p == "a" {
			<-release
		}
		return nil
	}))
	opts := []tide.Option{tide.Queue(q), tide.Group("acct")}
	x := append([]tide.Option{tide.TaskID("x{acct}"), tide.Retention(time.Hour)}, opts...)
	if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("x")), x...); err != nil {
		t.Fatal(err)
	}
	e.waitState(q, "x{acct}", tide.StateCompleted)
	for _, p := range []string{"a", "b"} {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte(p)), opts...); err != nil {
			t.Fatal(err)
		}
	}
	for p := range started {
		if p == "a" {
			break
		}
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("step", []byte("x again")), append(x, tide.Replace())...); err != nil {
		t.Fatalf("Replace of the completed task: %v", err)
	}
	close(release)
	eventually(t, 10*time.Second, "every task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"x", "a", "b", "x again"}; !slices.Equal(order, want) {
		t.Fatalf("the group ran %q, want %q: the replacement of a finished task is enqueued after b", order, want)
	}
}
