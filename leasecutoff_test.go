package tide_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestCutOffWorkerStopsBeforeLeaseEnds checks that a queue's Concurrency
// and GroupConcurrency limits hold also when a server is cut off from Redis
// while a task runs: server A, behind a fault proxy, runs task 1 until its
// context ends; the proxy then cuts A off (requests hang, or connections are
// refused); server B, on Redis directly, may start task 2 only after the
// lease of task 1 expired, and by then A's handler must have returned. Both
// times come from this process's monotonic clock; the test asserts their
// order, not durations. A's settlement is discarded and task 1 is retried.
func TestCutOffWorkerStopsBeforeLeaseEnds(t *testing.T) {
	t.Parallel()
	const lease = 1500 * time.Millisecond
	limits := []struct {
		name   string
		limits tide.QueueLimits
		group  string
	}{
		{"Concurrency", tide.QueueLimits{Concurrency: 1}, ""},
		{"GroupConcurrency", tide.QueueLimits{GroupConcurrency: 1}, "tenant"},
	}
	faults := []struct {
		name string
		// ctxTimeouts makes A's client honour its calls' context deadlines
		// (go-redis's ContextTimeoutEnabled), so a hanging renewal returns
		// after a third of the lease instead of the 3 s read timeout.
		ctxTimeouts bool
		cut         func(px *faultproxy.Proxy)
		restore     func(t *testing.T, px *faultproxy.Proxy)
	}{
		{"Hang", false, (*faultproxy.Proxy).Pause, func(_ *testing.T, px *faultproxy.Proxy) { px.Resume() }},
		{"HangWithContextTimeouts", true, (*faultproxy.Proxy).Pause, func(_ *testing.T, px *faultproxy.Proxy) { px.Resume() }},
		// Refused for longer than A's handler can run on without renewals
		// (a lease and a third, before the fix); then A reconnects, so
		// that its Shutdown does not wait on unreachable Redis.
		{"Refuse", false, func(px *faultproxy.Proxy) { px.Cut(3 * lease) }, func(t *testing.T, px *faultproxy.Proxy) {
			testwait.For(t, 30*time.Second, "the cut to end", func() bool { return !px.Down() })
		}},
	}
	for _, l := range limits {
		for _, f := range faults {
			t.Run(l.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				ctx := context.Background()
				const q = "cutoff"
				px, err := faultproxy.New(e.addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = px.Close() })

				var (
					mu        sync.Mutex
					aEnd      time.Time // A's first handler of task 1 returned
					aCause    error
					nextStart time.Time // task 2 first started, on either server
					nextOn    string
				)
				aStarted := make(chan struct{})
				hold := func(ctx context.Context, _ *tide.Task) error {
					first := false
					mu.Lock()
					select {
					case <-aStarted:
					default:
						close(aStarted)
						first = true
					}
					mu.Unlock()
					<-ctx.Done()
					if first {
						mu.Lock()
						aEnd, aCause = time.Now(), context.Cause(ctx)
						mu.Unlock()
					}
					return context.Cause(ctx)
				}
				next := func(server string) tide.HandlerFunc {
					return func(context.Context, *tide.Task) error {
						mu.Lock()
						if nextStart.IsZero() {
							nextStart, nextOn = time.Now(), server
						}
						mu.Unlock()
						return nil
					}
				}
				cfg := tide.Config{
					Concurrency: 2, Queues: map[string]int{q: 1}, LeaseDuration: lease,
					ShutdownTimeout: 100 * time.Millisecond,
					QueueLimits:     map[string]tide.QueueLimits{q: l.limits},
				}

				// Server A goes through the proxy.
				var aLogs testlog.Buffer
				ardb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: f.ctxTimeouts})
				t.Cleanup(func() { _ = ardb.Close() })
				acfg := cfg
				acfg.Logger = slog.New(slog.NewTextHandler(&aLogs, nil))
				a := tide.NewServer(redisbroker.New(ardb, redisbroker.WithPrefix(e.prefix)), acfg)
				muxA := tide.NewServeMux()
				muxA.HandleFunc("hold", hold)
				muxA.Handle("next", next("A"))
				if err := a.Start(muxA); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Shutdown)
				t.Cleanup(px.Resume) // runs first: a failed test's Shutdown of A need not wait on a paused link

				opts := []tide.Option{tide.Queue(q), tide.Retention(time.Hour), tide.MaxRetry(5)}
				t1, t2 := "t1", "t2"
				if l.group != "" {
					// A grouped task's ID carries its group as hash tag.
					opts = append(opts, tide.Group(l.group))
					t1, t2 = t1+"{"+l.group+"}", t2+"{"+l.group+"}"
				}
				if _, err := e.c.Enqueue(ctx, tide.NewTask("hold", nil), append(opts, tide.TaskID(t1))...); err != nil {
					t.Fatal(err)
				}
				select {
				case <-aStarted:
				case <-time.After(30 * time.Second):
					t.Fatal("server A never started task 1")
				}

				// Server B, on Redis directly, reruns task 1 at once.
				var retried sync.Once
				rerun := make(chan struct{})
				muxB := tide.NewServeMux()
				muxB.HandleFunc("hold", func(context.Context, *tide.Task) error {
					retried.Do(func() { close(rerun) })
					return nil
				})
				muxB.Handle("next", next("B"))
				e.server(cfg, muxB)
				if _, err := e.c.Enqueue(ctx, tide.NewTask("next", nil), append(opts, tide.TaskID(t2))...); err != nil {
					t.Fatal(err)
				}

				f.cut(px)
				cutAt := time.Now()
				testwait.For(t, 30*time.Second, "task 2 to start", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return !nextStart.IsZero()
				})
				mu.Lock()
				end, cause, start, on := aEnd, aCause, nextStart, nextOn
				mu.Unlock()
				switch {
				case end.IsZero():
					t.Fatalf("task 2 started on server %s while server A's handler of task 1 still ran: limit %+v exceeded", on, l.limits)
				case !end.Before(start):
					t.Fatalf("task 2 started on server %s %v before server A's handler of task 1 returned: limit %+v exceeded", on, end.Sub(start), l.limits)
				case on != "B":
					t.Fatalf("task 2 started on server %s, want B (A is cut off)", on)
				}
				if !errors.Is(cause, tide.ErrLeaseLost) {
					t.Fatalf("A's handler of task 1 ended with cause %v, want ErrLeaseLost", cause)
				}

				t.Logf("after the cut: A's handler returned at +%v, task 2 started at +%v",
					end.Sub(cutAt).Round(time.Millisecond), start.Sub(cutAt).Round(time.Millisecond))

				// A's settlement of task 1 is discarded; B runs it again.
				f.restore(t, px)
				stopAt := time.Now()
				a.Shutdown()
				t.Logf("A shut down in %v", time.Since(stopAt).Round(time.Millisecond))
				select {
				case <-rerun:
				case <-time.After(30 * time.Second):
					t.Fatal("task 1 was not retried on server B")
				}
				ti := e.waitState(q, t1, tide.StateCompleted)
				if ti.Retried < 1 {
					t.Fatalf("task 1 completed with %d retries, want at least 1 (the cut-off attempt)", ti.Retried)
				}
				if logs := aLogs.String(); !strings.Contains(logs, "settlement is discarded") {
					t.Fatalf("server A did not discard its settlement of task 1; its log:\n%s", logs)
				}
			})
		}
	}
}
