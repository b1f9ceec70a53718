package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
)

// An outage logs one line when it starts and one when it ends, however many
// loops fail meanwhile; loops waiting to retry are released when it ends.
func TestHealthLogsOncePerOutage(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	h := bd.cfg.health
	h.ok()
	back := h.recovered()
	err := fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
	for range 50 {
		h.fail("dequeue", err, time.Now())
	}
	select {
	case <-back:
		t.Fatal("released before the broker came back")
	default:
	}
	h.ok()
	<-back
	h.ok()
	out := bd.logs.String()
	if n := strings.Count(out, "broker unreachable"); n != 1 {
		t.Fatalf("%d outage lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "reachable again"); n != 1 || !strings.Contains(out, "failed_calls=50") {
		t.Fatalf("recovery line missing or wrong:\n%s", out)
	}
	// A call begun before the last success carries no news.
	h.fail("dequeue", err, time.Now().Add(-time.Hour))
	if strings.Count(bd.logs.String(), "broker unreachable") != 1 {
		t.Fatal("a stale failure opened an outage")
	}
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", broker.ErrUnavailable), true},
		{fmt.Errorf("x: %w", broker.ErrLayout), false},
		{broker.ErrLeaseLost, false},
	} {
		if got := unavailable(c.err); got != c.want {
			t.Errorf("unavailable(%v) = %v", c.err, got)
		}
	}
}
