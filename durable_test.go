package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// durableEnv runs fn on a Redis broker and on the in-memory broker: a
// client, and a function that starts a server on the same broker.
func durableEnv(t *testing.T, fn func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler))) {
	for _, name := range []string{"redis", "memory"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var b broker.Broker
			var next func() broker.Broker
			if name == "redis" {
				e := setup(t)
				b, next = e.b, func() broker.Broker { return e.broker() }
			} else {
				mb := membroker.New()
				b, next = mb, func() broker.Broker { return mb }
			}
			serve := func(cfg tide.Config, h tide.Handler) {
				t.Helper()
				if cfg.Logger == nil {
					cfg.Logger = testLogger(t)
				}
				s := tide.NewServer(next(), cfg)
				if err := s.Start(h); err != nil {
					t.Fatalf("Start: %v", err)
				}
				t.Cleanup(s.Shutdown)
			}
			fn(t, b, tide.NewClient(b), serve)
		})
	}
}

func awaitTaskState(t *testing.T, b broker.Broker, queue, id string, st tide.TaskState) *tide.TaskInfo {
	t.Helper()
	var ti *tide.TaskInfo
	testwait.For(t, 10*time.Second, "task "+id+" to be "+st.String(), func() bool {
		var err error
		ti, err = tide.NewInspector(b).GetTaskInfo(context.Background(), queue, id)
		return err == nil && ti.State == st
	})
	return ti
}

// A durable handler's steps run once across a sleep that parks the task:
// the replay after the sleep takes the stored results.
func TestDurableStepsAcrossSleep(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		var runs, a, bb atomic.Int32
		var slept atomic.Int64
		mux := tide.NewServeMux()
		mux.HandleFunc("order", func(ctx context.Context, _ *tide.Task) error {
			runs.Add(1)
			v, err := tide.Step(ctx, "reserve", func(context.Context) (int, error) { a.Add(1); return 42, nil })
			if err != nil || v != 42 {
				return errors.Join(err, errors.New("wrong step value"))
			}
			start := time.Now()
			if err := tide.Sleep(ctx, "cool", 200*time.Millisecond); err != nil {
				return err
			}
			slept.Store(int64(time.Since(start)))
			_, err = tide.Step(ctx, "ship", func(context.Context) (string, error) { bb.Add(1); return "ok", nil })
			return err
		})
		serve(tide.Config{Concurrency: 2}, mux)
		if _, err := c.Enqueue(t.Context(), tide.NewTask("order", nil), tide.TaskID("o1"), tide.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		ti := awaitTaskState(t, b, "default", "o1", tide.StateWaiting)
		if ti.WaitingFor != "sleep:cool" {
			t.Fatalf("WaitingFor = %q", ti.WaitingFor)
		}
		ti = awaitTaskState(t, b, "default", "o1", tide.StateCompleted)
		if a.Load() != 1 || bb.Load() != 1 {
			t.Fatalf("steps ran reserve %d, ship %d times; want once each", a.Load(), bb.Load())
		}
		if runs.Load() != 2 {
			t.Fatalf("handler ran %d times, want 2 (before and after the sleep)", runs.Load())
		}
		names := []string{}
		for _, s := range ti.Steps {
			names = append(names, s.Name)
		}
		if got := strings.Join(names, ","); got != "reserve,sleep:cool,ship" {
			t.Fatalf("Steps = %s", got)
		}
		if ti.Retried != 0 {
			t.Fatalf("Retried = %d: parking is not a retry", ti.Retried)
		}
	})
}

type payment struct {
	Amount int `json:"amount"`
}

// A signal wakes a parked task at once and its payload reaches WaitSignal;
// the first signal of a name wins.
func TestDurableSignal(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		got := make(chan payment, 1)
		mux := tide.NewServeMux()
		mux.HandleFunc("order", func(ctx context.Context, _ *tide.Task) error {
			p, err := tide.WaitSignal[payment](ctx, "paid", time.Hour)
			if err != nil {
				return err
			}
			got <- p
			return nil
		})
		serve(tide.Config{}, mux)
		ctx := t.Context()
		if err := c.Signal(ctx, "default", "nope", "paid", nil); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("Signal to an unknown task: %v, want ErrTaskNotFound", err)
		}
		if _, err := c.Enqueue(ctx, tide.NewTask("order", nil), tide.TaskID("o2"), tide.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		awaitTaskState(t, b, "default", "o2", tide.StateWaiting)
		if err := c.Signal(ctx, "default", "o2", "paid", payment{Amount: 1250}); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		err := c.Signal(ctx, "default", "o2", "paid", payment{Amount: 1})
		if !errors.Is(err, tide.ErrSignalSent) && !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("second Signal: %v, want ErrSignalSent (or ErrTaskNotFound once done)", err)
		}
		select {
		case p := <-got:
			if p.Amount != 1250 {
				t.Fatalf("payload %+v, want the first signal's", p)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the signal did not resume the handler")
		}
		awaitTaskState(t, b, "default", "o2", tide.StateCompleted)
		if err := c.Signal(ctx, "default", "o2", "late", nil); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("Signal to a completed task: %v, want ErrTaskNotFound", err)
		}
	})
}

// A wait that times out returns ErrSignalTimeout to the handler, and a
// signal sent afterwards is refused with it: one outcome.
func TestDurableSignalTimeout(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		outcome := make(chan error, 1)
		release := make(chan struct{})
		mux := tide.NewServeMux()
		mux.HandleFunc("order", func(ctx context.Context, _ *tide.Task) error {
			_, err := tide.WaitSignal[payment](ctx, "paid", 150*time.Millisecond)
			if errors.Is(err, tide.ErrSuspended) {
				return err
			}
			outcome <- err
			<-release // keep the task active so that a signal meets it unfinished
			return nil
		})
		serve(tide.Config{}, mux)
		ctx := t.Context()
		if _, err := c.Enqueue(ctx, tide.NewTask("order", nil), tide.TaskID("o3")); err != nil {
			t.Fatal(err)
		}
		var err error
		select {
		case err = <-outcome:
		case <-time.After(10 * time.Second):
			t.Fatal("the wait never ended")
		}
		if !errors.Is(err, tide.ErrSignalTimeout) {
			t.Fatalf("WaitSignal = %v, want ErrSignalTimeout", err)
		}
		if err := c.Signal(ctx, "default", "o3", "paid", payment{Amount: 5}); !errors.Is(err, tide.ErrSignalTimeout) {
			t.Fatalf("Signal after the time-out: %v, want ErrSignalTimeout", err)
		}
		close(release)
	})
}

// A handler that swallows ErrSuspended is parked all the same.
func TestDurableSwallowedSuspension(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		var after atomic.Int32
		mux := tide.NewServeMux()
		mux.HandleFunc("sloppy", func(ctx context.Context, _ *tide.Task) error {
			if err := tide.Sleep(ctx, "nap", time.Hour); err != nil {
				return nil // swallowed
			}
			after.Add(1)
			return nil
		})
		serve(tide.Config{}, mux)
		if _, err := c.Enqueue(t.Context(), tide.NewTask("sloppy", nil), tide.TaskID("s1")); err != nil {
			t.Fatal(err)
		}
		ti := awaitTaskState(t, b, "default", "s1", tide.StateWaiting)
		if ti.WaitingFor != "sleep:nap" {
			t.Fatalf("WaitingFor = %q", ti.WaitingFor)
		}
		// Run now ends the sleep: the handler goes on past it.
		if err := tide.NewInspector(b).RunTask(t.Context(), "default", "s1"); err != nil {
			t.Fatalf("RunTask: %v", err)
		}
		testwait.For(t, 10*time.Second, "the handler to pass the sleep", func() bool { return after.Load() == 1 })
	})
}

// Cancel stops a parked task: it is gone, and a signal to it is refused.
func TestDurableCancelParked(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		var runs atomic.Int32
		mux := tide.NewServeMux()
		mux.HandleFunc("order", func(ctx context.Context, _ *tide.Task) error {
			runs.Add(1)
			_, err := tide.WaitSignal[payment](ctx, "paid", time.Hour)
			return err
		})
		serve(tide.Config{}, mux)
		ctx := t.Context()
		if _, err := c.Enqueue(ctx, tide.NewTask("order", nil), tide.TaskID("c1")); err != nil {
			t.Fatal(err)
		}
		awaitTaskState(t, b, "default", "c1", tide.StateWaiting)
		if err := c.Cancel(ctx, "default", "c1"); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		if _, err := tide.NewInspector(b).GetTaskInfo(ctx, "default", "c1"); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("GetTaskInfo after cancel: %v", err)
		}
		if err := c.Signal(ctx, "default", "c1", "paid", nil); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("Signal after cancel: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
		if runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", runs.Load())
		}
	})
}

// A parked task holds no group slot: under GroupConcurrency 1 the group's
// next task runs while the first waits for its signal.
func TestDurableParkFreesGroupSlot(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		var mu sync.Mutex
		var order []string
		mux := tide.NewServeMux()
		mux.HandleFunc("order", func(ctx context.Context, t *tide.Task) error {
			if string(t.Payload()) == "wait" {
				if _, err := tide.WaitSignal[payment](ctx, "paid", time.Hour); err != nil {
					return err
				}
			}
			mu.Lock()
			order = append(order, string(t.Payload()))
			mu.Unlock()
			return nil
		})
		serve(tide.Config{Concurrency: 4, QueueLimits: map[string]tide.QueueLimits{"default": {GroupConcurrency: 1}}}, mux)
		ctx := t.Context()
		if _, err := c.Enqueue(ctx, tide.NewTask("order", []byte("wait")), tide.TaskID("g1{cust}"), tide.Group("cust")); err != nil {
			t.Fatal(err)
		}
		awaitTaskState(t, b, "default", "g1{cust}", tide.StateWaiting)
		if _, err := c.Enqueue(ctx, tide.NewTask("order", []byte("next")), tide.Group("cust")); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 10*time.Second, "the group's next task to run", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == 1 && order[0] == "next"
		})
		if err := c.Signal(ctx, "default", "g1{cust}", "paid", nil); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 10*time.Second, "the parked task to finish", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == 2
		})
	})
}

// Misuse is refused with clear errors.
func TestDurableBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := tide.Step(ctx, "x", func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, tide.ErrNotDurable) {
		t.Errorf("Step outside a handler: %v", err)
	}
	if err := tide.Sleep(ctx, "x", tide.MaxSleep+time.Second); !errors.Is(err, tide.ErrNotDurable) {
		t.Errorf("Sleep past MaxSleep: %v", err)
	}
	c := tide.NewClient(membroker.New())
	big := strings.Repeat("x", tide.MaxSignalSize)
	if err := c.Signal(ctx, "default", "t", "paid", big); !errors.Is(err, tide.ErrStepLimit) {
		t.Errorf("Signal with a payload over MaxSignalSize: %v", err)
	}
	if err := c.Signal(ctx, "default", "t", "", nil); !errors.Is(err, tide.ErrInvalidTask) {
		t.Errorf("Signal with an empty name: %v", err)
	}

	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		errs := make(chan error, 2)
		mux := tide.NewServeMux()
		mux.HandleFunc("mixed", func(ctx context.Context, _ *tide.Task) error {
			if _, err := tide.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return err
			}
			_, err := tide.Step(ctx, "a", func(context.Context) (string, error) { return "x", nil })
			errs <- err
			errs <- tide.Sleep(ctx, "a", time.Second)
			return nil
		})
		serve(tide.Config{}, mux)
		if _, err := c.Enqueue(t.Context(), tide.NewTask("mixed", nil)); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; !errors.Is(err, tide.ErrNotDurable) {
				t.Errorf("a step name reused with another type or kind: %v, want ErrNotDurable", err)
			}
		}
	})
}

// A worker that lost its lease while a step's fn ran stores nothing: its
// store is refused (ErrLeaseLost) and the next attempt runs fn and stores
// its own result.
func TestDurableStepFencedAfterLeaseLoss(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		ctx := context.Background()
		g := newGate(b)
		inFn := make(chan struct{})
		release := make(chan struct{})
		aErr := make(chan error, 1)
		var again atomic.Bool
		a := tide.NewServer(g, tide.Config{LeaseDuration: time.Second, ShutdownTimeout: 100 * time.Millisecond, Logger: testLogger(t)})
		if err := a.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
			if again.Swap(true) {
				<-ctx.Done() // A ran it once: hold any later delivery until shutdown
				return ctx.Err()
			}
			_, err := tide.Step(ctx, "charge", func(context.Context) (string, error) {
				close(inFn)
				<-release
				return "A", nil
			})
			aErr <- err
			return err
		})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Shutdown)
		t.Cleanup(g.release) // first: a failed check must not leave A's calls held
		if _, err := c.Enqueue(ctx, tide.NewTask("pay", nil), tide.TaskID("f1"), tide.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		<-inFn
		g.hold() // A is paused: its renewals wait
		testwait.For(t, 10*time.Second, "the paused worker's lease to be recovered", func() bool {
			r, err := b.Maintain(ctx, broker.MaintainRequest{Queue: "default", Owner: "recoverer", OwnerTTL: time.Second})
			return err == nil && r.Recovered == 1
		})
		close(release) // A's fn returns; its store goes out with the old token
		if err := <-aErr; !errors.Is(err, tide.ErrLeaseLost) {
			t.Fatalf("Step after the lease was lost: %v, want ErrLeaseLost", err)
		}
		stopped := make(chan struct{})
		go func() { a.Shutdown(); close(stopped) }()
		g.release()
		<-stopped
		var runs atomic.Int32
		serve(tide.Config{}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
			_, err := tide.Step(ctx, "charge", func(context.Context) (string, error) { runs.Add(1); return "B", nil })
			return err
		}))
		// A's last Dequeue, held by the gate, may lease the task after A
		// stopped (as a reply lost at shutdown would): nobody runs that
		// delivery, its lease is recovered into retry with a back-off, and
		// the test runs it at once rather than wait for the back-off.
		var ti *tide.TaskInfo
		in := tide.NewInspector(b)
		testwait.Until(t, 20*time.Second, func() error {
			var err error
			ti, err = in.GetTaskInfo(context.Background(), "default", "f1")
			if err != nil {
				return err
			}
			if ti.State == tide.StateRetry {
				_ = in.RunTask(context.Background(), "default", "f1")
			}
			if ti.State != tide.StateCompleted {
				return fmt.Errorf("task f1 is %s (retried %d, last error %q, next at %v, runs of B %d)", ti.State, ti.Retried, ti.LastErr, ti.NextProcessAt.Format("15:04:05.000"), runs.Load())
			}
			return nil
		})
		if runs.Load() != 1 || len(ti.Steps) != 1 {
			t.Fatalf("the next attempt ran fn %d times, steps %+v; want its own run stored", runs.Load(), ti.Steps)
		}
	})
}

// A workflow step may be a durable handler: it parks, and the steps after
// it start only when it has finished.
func TestDurableWorkflowStep(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		var mu sync.Mutex
		var ends []string
		serve(tide.Config{Concurrency: 4}, tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
			step, _ := tide.GetStepName(ctx)
			if step == "wait" {
				if err := tide.Sleep(ctx, "nap", 200*time.Millisecond); err != nil {
					return err
				}
			}
			mu.Lock()
			ends = append(ends, step)
			mu.Unlock()
			return nil
		}))
		wf := tide.NewWorkflow("durable-1").
			Add("wait", tide.NewTask("step", nil)).
			Add("after", tide.NewTask("step", nil), tide.After("wait"))
		ctx := t.Context()
		if _, err := c.EnqueueWorkflow(ctx, wf); err != nil {
			t.Fatal(err)
		}
		awaitTaskState(t, b, "default", "durable-1/wait", tide.StateWaiting)
		got := waitFlow(t, tide.NewInspector(b), "durable-1")
		mu.Lock()
		defer mu.Unlock()
		if got.State != tide.FlowSucceeded || strings.Join(ends, ",") != "wait,after" {
			t.Fatalf("workflow %v, steps ended %v; want succeeded, wait then after", got.State, ends)
		}
	})
}

// Signals sent around their wait's time-out: for every task exactly one
// outcome, the same on both sides. Either the handler got the payload and
// Signal returned nil, or the handler got ErrSignalTimeout and Signal did
// (or ErrTaskNotFound, once the task had finished).
func TestDurableSignalRacesTimeout(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, serve func(tide.Config, tide.Handler)) {
		const n = 40
		var mu sync.Mutex
		got := map[string]string{} // task ID -> "signal" or "timeout"
		serve(tide.Config{Concurrency: 2 * n}, tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
			_, err := tide.WaitSignal[int](ctx, "paid", 100*time.Millisecond)
			if errors.Is(err, tide.ErrSuspended) {
				return err
			}
			id, _ := tide.GetTaskID(ctx)
			out := "signal"
			if errors.Is(err, tide.ErrSignalTimeout) {
				out = "timeout"
			} else if err != nil {
				return err
			}
			mu.Lock()
			got[id] = out
			mu.Unlock()
			time.Sleep(150 * time.Millisecond) // still active: late signals meet the recorded outcome
			return nil
		}))
		ctx := t.Context()
		sent := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			id := "race-" + strconvI(i)
			if _, err := c.Enqueue(ctx, tide.NewTask("race", nil), tide.TaskID(id)); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// From well before to well after the deadline.
				time.Sleep(time.Duration(i*8) * time.Millisecond)
				sent[i] = c.Signal(ctx, "default", id, "paid", i)
			}()
		}
		wg.Wait()
		testwait.For(t, 20*time.Second, "every task to end", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == n
		})
		signalled, timedOut := 0, 0
		for i := range n {
			id := "race-" + strconvI(i)
			mu.Lock()
			out := got[id]
			mu.Unlock()
			switch {
			case sent[i] == nil && out == "signal":
				signalled++
			case (errors.Is(sent[i], tide.ErrSignalTimeout) || errors.Is(sent[i], tide.ErrTaskNotFound)) && out == "timeout":
				timedOut++
			default:
				t.Errorf("%s: Signal returned %v but the handler saw %s", id, sent[i], out)
			}
		}
		t.Logf("%d signalled, %d timed out", signalled, timedOut)
	})
}

func strconvI(i int) string { return fmt.Sprint(i) }
