package tide_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/encrypt"
)

// durCounter counts the Durable calls a server makes through it: each is
// one round trip to Redis.
type durCounter struct {
	broker.Broker
	calls atomic.Int64
}

func (c *durCounter) LoadSteps(ctx context.Context, l broker.LeaseRef) ([]broker.StepRecord, error) {
	c.calls.Add(1)
	return c.Broker.LoadSteps(ctx, l)
}

func (c *durCounter) SaveStep(ctx context.Context, l broker.LeaseRef, r broker.StepRecord) (broker.StepRecord, error) {
	c.calls.Add(1)
	return c.Broker.SaveStep(ctx, l, r)
}

func (c *durCounter) ResolveWait(ctx context.Context, l broker.LeaseRef, name string, deadline time.Time) (broker.StepRecord, bool, error) {
	c.calls.Add(1)
	return c.Broker.ResolveWait(ctx, l, name, deadline)
}

// A step costs at most one broker call: a step run costs the store of its
// result and nothing else (the lease brought the task's records, so there
// is nothing to load first), and a step replayed costs none. On the Redis
// broker, the in-memory broker and an encrypted Redis broker.
func TestDurableStepRoundTrips(t *testing.T) {
	t.Parallel()
	key := encrypt.Key{ID: 1, Secret: bytes.Repeat([]byte{7}, encrypt.SecretSize)}
	for _, name := range []string{"redis", "memory", "encrypted"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var b broker.Broker
			switch name {
			case "redis":
				b = setup(t).b
			case "memory":
				b = membroker.New()
			case "encrypted":
				w, err := encrypt.Wrap(setup(t).b, key)
				if err != nil {
					t.Fatal(err)
				}
				b = w
			}
			cb := &durCounter{Broker: b}
			var mu sync.Mutex
			var costs []int64
			var ran atomic.Int32
			done := make(chan struct{})
			mux := tide.NewServeMux()
			mux.HandleFunc("cost", func(ctx context.Context, _ *tide.Task) error {
				before := cb.calls.Load()
				step := func(name string) error {
					_, err := tide.Step(ctx, name, func(context.Context) (string, error) { ran.Add(1); return name, nil })
					return err
				}
				var err error
				if n, _ := tide.GetRetryCount(ctx); n == 0 {
					// First attempt: two steps run, then a failure.
					err = errors.Join(step("a"), step("b"), errors.New("fail once"))
				} else {
					// Retry: two steps replayed, one run.
					err = errors.Join(step("a"), step("b"), step("c"))
				}
				mu.Lock()
				costs = append(costs, cb.calls.Load()-before)
				mu.Unlock()
				if err == nil {
					close(done)
				}
				return err
			})
			s := tide.NewServer(cb, tide.Config{Logger: testLogger(t),
				RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 0 }})
			if err := s.Start(mux); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Shutdown)
			if _, err := tide.NewClient(b).Enqueue(t.Context(), tide.NewTask("cost", nil)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the task did not complete")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(costs) != 2 || costs[0] != 2 || costs[1] != 1 {
				t.Fatalf("broker calls per attempt = %v, want [2 1] (one per step run, none per step replayed)", costs)
			}
			if n := ran.Load(); n != 3 {
				t.Fatalf("step functions ran %d times, want 3", n)
			}
		})
	}
}

// A WaitSignal costs one broker call on first reach (the deadline is
// stored in the call that asks for the signal) and none on the replay
// after the signal: the lease brought the signal along.
func TestDurableWaitRoundTrips(t *testing.T) {
	t.Parallel()
	durableEnv(t, func(t *testing.T, b broker.Broker, c *tide.Client, _ func(tide.Config, tide.Handler)) {
		cb := &durCounter{Broker: b}
		var mu sync.Mutex
		var costs []int64
		done := make(chan struct{})
		mux := tide.NewServeMux()
		mux.HandleFunc("wait", func(ctx context.Context, _ *tide.Task) error {
			before := cb.calls.Load()
			_, err := tide.WaitSignal[int](ctx, "paid", time.Hour)
			mu.Lock()
			costs = append(costs, cb.calls.Load()-before)
			mu.Unlock()
			if err == nil {
				close(done)
			}
			return err
		})
		s := tide.NewServer(cb, tide.Config{Logger: testLogger(t)})
		if err := s.Start(mux); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		if _, err := c.Enqueue(t.Context(), tide.NewTask("wait", nil), tide.TaskID("w1")); err != nil {
			t.Fatal(err)
		}
		awaitTaskState(t, b, "default", "w1", tide.StateWaiting)
		if err := c.Signal(t.Context(), "default", "w1", "paid", 7); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the signal did not resume the handler")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(costs) != 2 || costs[0] != 1 || costs[1] != 0 {
			t.Fatalf("broker calls per attempt = %v, want [1 0]", costs)
		}
	})
}
