package tidetest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/tidetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type cancelOrder struct {
	OrderID int `json:"order_id"`
}

func (cancelOrder) TaskType() string { return "order:cancel" }

func TestAdvanceRunsDelayedTask(t *testing.T) {
	var ran atomic.Int32
	mux := tide.NewServeMux()
	tide.HandleArgs(mux, func(_ context.Context, a cancelOrder) error {
		if a.OrderID == 42 {
			ran.Add(1)
		}
		return nil
	})
	h := tidetest.New(t, mux)
	task, err := tide.NewTaskFrom(cancelOrder{OrderID: 42})
	if err != nil {
		t.Fatal(err)
	}
	h.Enqueue(task, tide.ProcessIn(15*time.Minute))
	tidetest.AssertEnqueued(t, h, cancelOrder{OrderID: 42})

	h.Advance(14 * time.Minute)
	if ran.Load() != 0 {
		t.Fatal("ran before its due time")
	}
	h.Advance(time.Minute)
	if ran.Load() != 1 {
		t.Fatalf("ran %d times after 15 minutes, want 1", ran.Load())
	}
	tidetest.AssertNotEnqueued(t, h, "order:cancel")
}

func TestRetriesFollowTheFakeClock(t *testing.T) {
	var calls atomic.Int32
	h := tidetest.New(t, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		if calls.Add(1) < 3 {
			return errors.New("flaky")
		}
		return nil
	}), tidetest.Options{RetryDelayFunc: tide.RetrySchedule(time.Minute, 10*time.Minute)})
	info := h.Enqueue(tide.NewTask("webhook", nil), tide.Retention(time.Hour))
	h.Settle()
	if calls.Load() != 1 {
		t.Fatalf("calls = %d after the first run", calls.Load())
	}
	if ts := h.Tasks("default", tide.StateRetry); len(ts) != 1 || ts[0].ID != info.ID {
		t.Fatalf("retry tasks = %v", ts)
	}
	h.Advance(time.Minute)
	h.Advance(9 * time.Minute)
	if calls.Load() != 2 {
		t.Fatalf("calls = %d before the second delay passed", calls.Load())
	}
	h.Advance(time.Minute)
	if calls.Load() != 3 {
		t.Fatalf("calls = %d", calls.Load())
	}
	ti, err := h.Inspector.GetTaskInfo(context.Background(), "default", info.ID)
	if err != nil || ti.State != tide.StateCompleted || ti.Retried != 2 {
		t.Fatalf("final info %+v, %v", ti, err)
	}
}

// failingTB records Fatalf instead of stopping the test, to test the
// assertion helpers' failure messages.
type failingTB struct {
	testing.TB
	msg string
}

func (f *failingTB) Fatalf(format string, args ...any) { f.msg = format; panic(f) }
func (f *failingTB) Helper()                           {}

func TestAssertEnqueuedFails(t *testing.T) {
	h := tidetest.New(t, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	task, _ := tide.NewTaskFrom(cancelOrder{OrderID: 1})
	h.Enqueue(task, tide.ProcessIn(time.Hour))
	f := &failingTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != f {
				t.Fatalf("AssertEnqueued did not fail: %v", r)
			}
		}()
		tidetest.AssertEnqueued(f, h, cancelOrder{OrderID: 2})
	}()
}
