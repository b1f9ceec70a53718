package tide_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
)

// Three servers restarted one after another, over and over, while durable
// handlers step, sleep and wait for signals: every task completes, and
// every step's fn ran exactly once (a graceful shutdown lets a handler
// finish or park, so no stored step is ever run again and none is lost).
func TestDurableRollingRestarts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 40
	var mu sync.Mutex
	runs := map[string]int{} // "<task> <step>" -> fn runs
	done := map[string]bool{}
	mux := tide.NewServeMux()
	mux.HandleFunc("rolling", func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		step := func(name string) error {
			_, err := tide.Step(ctx, name, func(context.Context) (string, error) {
				mu.Lock()
				runs[id+" "+name]++
				mu.Unlock()
				return name, nil
			})
			return err
		}
		if err := step("reserve"); err != nil {
			return err
		}
		if err := tide.Sleep(ctx, "cool", 150*time.Millisecond); err != nil {
			return err
		}
		if err := step("charge"); err != nil {
			return err
		}
		if _, err := tide.WaitSignal[string](ctx, "paid", time.Minute); err != nil {
			return err
		}
		if err := step("ship"); err != nil {
			return err
		}
		mu.Lock()
		done[id] = true
		mu.Unlock()
		return nil
	})
	cfg := tide.Config{Concurrency: 4, ShutdownTimeout: 10 * time.Second}
	servers := []*tide.Server{e.server(cfg, mux), e.server(cfg, mux), e.server(cfg, mux)}

	ctx := context.Background()
	for i := range n {
		// Spread over two seconds, so that restarts meet every stage.
		if _, err := e.c.Enqueue(ctx, tide.NewTask("rolling", nil), tide.TaskID(fmt.Sprint("r", i)), tide.MaxRetry(0),
			tide.ProcessIn(time.Duration(i)*50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	// Restart one server every 100 ms, and signal each task once it waits
	// for its payment (every fifth before it waits: a signal that comes
	// early is kept). No signal goes out before the tenth restart, so that
	// however slow the machine, tasks cannot all finish before ten
	// restarts have met them.
	signaled := map[string]bool{}
	finished := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == n
	}
	restarts := 0
	for deadline := time.Now().Add(60 * time.Second); !finished(); {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("after 60 s and %d restarts, %d of %d tasks finished", restarts, len(done), n)
		}
		time.Sleep(100 * time.Millisecond)
		servers[restarts%3].Shutdown()
		servers[restarts%3] = e.server(cfg, mux)
		restarts++
		for i := range n {
			if restarts < 10 {
				break
			}
			id := fmt.Sprint("r", i)
			if signaled[id] {
				continue
			}
			ti, err := tide.NewInspector(e.b).GetTaskInfo(ctx, "default", id)
			if err != nil {
				continue
			}
			if ti.WaitingFor == "signal:paid" || (i%5 == 0 && ti.State != tide.StateScheduled) {
				if err := e.c.Signal(ctx, "default", id, "paid", "ok"); err != nil {
					t.Fatalf("Signal %s: %v", id, err)
				}
				signaled[id] = true
			}
		}
	}
	if restarts < 10 {
		t.Fatalf("only %d restarts happened while the tasks ran", restarts)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		for _, s := range []string{"reserve", "charge", "ship"} {
			if got := runs[fmt.Sprint("r", i, " ", s)]; got != 1 {
				t.Errorf("task r%d step %s ran %d times, want 1", i, s, got)
			}
		}
	}
	t.Logf("%d rolling restarts", restarts)
}
