package testwait

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records Fatalf instead of ending the
// goroutine, so the test can look at what For reported.
type recorder struct {
	testing.TB
	fatal []string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = append(r.fatal, fmt.Sprintf(format, args...))
}

func TestFor(t *testing.T) {
	t.Parallel()

	t.Run("returns once cond holds", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		var calls atomic.Int32
		For(r, time.Minute, "the third call", func() bool { return calls.Add(1) == 3 })
		if got := calls.Load(); got != 3 {
			t.Errorf("cond called %d times, want 3 (not again after it held)", got)
		}
		if len(r.fatal) != 0 {
			t.Errorf("For failed the test: %q", r.fatal)
		}
	})

	t.Run("sees a state reached by another goroutine", func(t *testing.T) {
		t.Parallel()
		var done atomic.Bool
		go done.Store(true)
		For(t, time.Minute, "the goroutine to finish", done.Load)
	})

	t.Run("calls cond once even without time", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		var calls atomic.Int32
		For(r, 0, "an immediate state", func() bool { calls.Add(1); return true })
		if got := calls.Load(); got != 1 {
			t.Errorf("cond called %d times, want 1", got)
		}
		if len(r.fatal) != 0 {
			t.Errorf("For failed the test: %q", r.fatal)
		}
	})

	t.Run("fails naming what and the timeout", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		var calls atomic.Int32
		For(r, 30*time.Millisecond, "the impossible", func() bool { calls.Add(1); return false })
		if len(r.fatal) != 1 {
			t.Fatalf("Fatalf called %d times, want 1: %q", len(r.fatal), r.fatal)
		}
		msg := r.fatal[0]
		for _, want := range []string{"the impossible", "30ms"} {
			if !strings.Contains(msg, want) {
				t.Errorf("failure %q does not mention %q", msg, want)
			}
		}
		if got := calls.Load(); got < 2 {
			t.Errorf("cond called %d times before giving up, want it polled again", got)
		}
	})
}

func TestUntil(t *testing.T) {
	t.Parallel()

	t.Run("returns once check passes", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		var calls atomic.Int32
		Until(r, time.Minute, func() error {
			if n := calls.Add(1); n < 3 {
				return fmt.Errorf("only %d calls", n)
			}
			return nil
		})
		if got := calls.Load(); got != 3 {
			t.Errorf("check called %d times, want 3 (not again after it passed)", got)
		}
		if len(r.fatal) != 0 {
			t.Errorf("Until failed the test: %q", r.fatal)
		}
	})

	t.Run("fails with the last error and the timeout", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		var calls atomic.Int32
		Until(r, 30*time.Millisecond, func() error { return fmt.Errorf("still %d short", calls.Add(1)) })
		if len(r.fatal) != 1 {
			t.Fatalf("Fatalf called %d times, want 1: %q", len(r.fatal), r.fatal)
		}
		msg, last := r.fatal[0], fmt.Sprintf("still %d short", calls.Load())
		for _, want := range []string{last, "30ms"} {
			if !strings.Contains(msg, want) {
				t.Errorf("failure %q does not mention %q", msg, want)
			}
		}
	})
}
