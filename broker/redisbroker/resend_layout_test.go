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
	}{
		{"GeneratedID", nil},
		{"TaskID", []tide.Option{tide.TaskID("order-cancel:42")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFaulty(t)
			ctx := context.Background()
			direct := redisbroker.New(f.direct, redisbroker.WithPrefix(f.prefix))
			t.Cleanup(func() { _ = direct.Close() })
			base := f.proxy.Seen("EVALSHA")
			// The first send runs and its reply comes after the read
			// timeout; the second is held until the repartition below
			// has recorded its layout.
			f.proxy.DelayReplies(faultproxy.Commands("EVALSHA"), 500*time.Millisecond, 1)
			done := make(chan error, 1)
			go func() {
				for f.proxy.Seen("EVALSHA") == base {
					time.Sleep(time.Millisecond)
				}
				f.proxy.DelayRequests(faultproxy.Commands("EVALSHA"), 1500*time.Millisecond, 1)
				done <- direct.Repartition(ctx, "q", 2, nil)
			}()
			info, err := f.c.Enqueue(ctx, tide.NewTask("t", []byte("p")), append(c.opts, tide.Queue("q"))...)
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
			if qi.Pending != 1 {
				t.Errorf("%d tasks pending after one Enqueue (it returned %v)", qi.Pending, err)
			}
			switch {
			case err == nil:
				if _, gerr := direct.GetTask(ctx, "q", info.ID); gerr != nil {
					t.Errorf("the task Enqueue reported: %v", gerr)
				}
			case !errors.Is(err, broker.ErrOutcomeUnknown) || errors.Is(err, broker.ErrLayout):
				t.Errorf("Enqueue = %v; want success or ErrOutcomeUnknown (its first send stored the task)", err)
			}
		})
	}
}
