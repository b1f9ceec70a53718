package engine

import (
	"context"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// A running server is listed with the tasks it runs, and its record is
// removed on a clean stop.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	active := []tidetype.ActiveTask{{Queue: "q", ID: "job", Type: "t"}}
	h := newHeartbeat(bd.cfg, func() []tidetype.ActiveTask { return active })
	h.start()
	var got []tidetype.ServerInfo
	testwait.For(t, 10*time.Second, "the server record", func() bool {
		got, _ = bd.b.Servers(context.Background())
		return len(got) == 1
	})
	if got[0].ID != "test-server" || len(got[0].Active) != 1 || got[0].Active[0].ID != "job" {
		t.Fatalf("record: %+v", got[0])
	}
	h.stop()
	if ss, _ := bd.b.Servers(context.Background()); len(ss) != 0 {
		t.Fatalf("records after stop: %+v", ss)
	}
}
