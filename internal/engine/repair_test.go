package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// The repairer calls its function every period, goes on after an error,
// passes a context that Stop cancels, and leaves nothing running after
// Stop, even while a call is under way.
func TestRepairer(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	blocked := make(chan struct{})
	r := newRepairer(Config{RepairEvery: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Repair: func(ctx context.Context) (int, error) {
			switch calls.Add(1) {
			case 1:
				return 0, errors.New("store away")
			case 2:
				return 3, nil
			default:
				close(blocked)
				<-ctx.Done()
				return 0, ctx.Err()
			}
		}})
	r.start()
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d calls", calls.Load())
	}
	r.stop() // returns although the third call waits on its context
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3", n)
	}
	// Without a function there is nothing to run or stop.
	none := newRepairer(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	none.start()
	none.stop()
}
