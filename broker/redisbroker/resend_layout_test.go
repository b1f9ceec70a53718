package redisbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
)

// An Enqueue whose reply does not come is sent again; when a repartition
// recorded its new layout in between, the second send is refused by the
// layout check, which runs before the reply cache, while the first send
// stored the task. That refusal says nothing about the first send: the
// Enqueue reports ErrOutcomeUnknown (a layout refusal would tell the
// broker nothing was stored, and its retry on the new layout stored a
// second task with a new ID, or met its own task as a conflict), and the
// queue holds one task.
func TestResentEnqueueMeetsANewLayout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opts []tide.Option
		drop bool // the reply is dropped (connection reset), not late
		many bool // two tasks in one EnqueueMany (through the pool)
	}{
		{"GeneratedID", nil, false, false},
		{"TaskID", []tide.Option{tide.TaskID("order-cancel:42")}, false, false},
		{"GeneratedIDDropped", nil, true, false},
		{"TaskIDDropped", []tide.Option{tide.TaskID("order-cancel:42")}, true, false},
		{"ManyDelayed", nil, false, true},
		{"ManyDropped", nil, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t)
			ctx := context.Background()
			direct := redisbroker.New(f.direct, redisbroker.WithPrefix(f.prefix))
			t.Cleanup(func() { _ = direct.Close() })
			// Load enqueue.lua, so that the fault hits the call under test.
			if _, err := f.c.EnqueueMany(ctx, []*tide.Task{tide.NewTask("w", nil), tide.NewTask("w", nil)}, tide.Queue("warm")); err != nil {
				t.Fatal(err)
			}
			base := f.proxy.Seen("EVALSHA")
			// The first send runs and its reply comes after the read
			// timeout; the second is held until the repartition below
			// has recorded its layout.
			if c.drop {
				f.proxy.DropReplies(faultproxy.Commands("EVALSHA"), 1)
			} else {
				f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
			}
			done := make(chan error, 1)
			go func() {
				for f.proxy.Seen("EVALSHA") == base {
					time.Sleep(time.Millisecond)
				}
				f.proxy.DelayRequests(faultproxy.Commands("EVALSHA"), 1500*time.Millisecond, 1)
				done <- direct.Repartition(ctx, "q", 2, nil)
			}()
			want := 1
			var info *tide.TaskInfo
			var err error
			if c.many {
				want = 2
				var infos []*tide.TaskInfo
				infos, err = f.c.EnqueueMany(ctx, []*tide.Task{tide.NewTask("t", []byte("a")), tide.NewTask("t", []byte("b"))}, tide.Queue("q"))
				if len(infos) > 0 {
					info = infos[0]
				}
			} else {
				info, err = f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), append(c.opts, tide.Queue("q"))...)
			}
			if rerr := <-done; rerr != nil {
				t.Fatalf("Repartition: %v", rerr)
			}
			if f.proxy.Seen("EVALSHA") < base+2 {
				t.Fatal("the enqueue was not sent again: the fault did not happen")
			}
			qi, qerr := direct.QueueInfo(ctx, "q")
			if qerr != nil {
				t.Fatal(qerr)
			}
			// Never more tasks than were enqueued; all of them when the call
			// succeeded, none when it failed for sure.
			unknown := errors.Is(err, broker.ErrOutcomeUnknown) && !errors.Is(err, broker.ErrLayout)
			switch {
			case qi.Pending > want:
				t.Errorf("%d tasks pending after enqueueing %d (the call returned %v)", qi.Pending, want, err)
			case err == nil && qi.Pending != want:
				t.Errorf("%d tasks pending after enqueueing %d with success", qi.Pending, want)
			case err == nil:
				if _, gerr := direct.GetTask(ctx, "q", info.ID); gerr != nil {
					t.Errorf("the task the call reported: %v", gerr)
				}
			case !unknown && qi.Pending != 0:
				t.Errorf("the call failed for sure (%v) but %d tasks are pending", err, qi.Pending)
			}
		})
	}
}
