package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestMaintainer(t *testing.T) {
	t.Parallel()

	// A scheduled task becomes pending once the broker's clock reaches its
	// due time, and the processor is woken.
	t.Run("ForwardsWhenDue", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, nil)
		bd.enqueue(t, time.Hour, "later")
		woken := make(chan struct{}, 16)
		m := newMaintainer(bd.cfg, "q", 0, func() { woken <- struct{}{} }, func(string) {})
		m.start()
		defer m.stop()
		bd.clock.Advance(time.Hour)
		m.hint(time.Time{})
		testwait.For(t, 10*time.Second, "the task to be forwarded", func() bool { return bd.state(t, "later").String() == "pending" })
		select {
		case <-woken:
		case <-time.After(10 * time.Second):
			t.Fatal("the processor was not woken")
		}
	})

	// A clean stop gives the claim up: another owner claims at once.
	t.Run("ReleasesOnStop", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, nil)
		m := newMaintainer(bd.cfg, "q", 0, func() {}, func(string) {})
		m.start()
		// A probe claims only for a millisecond of the fake clock, which
		// is then moved past it, so it never keeps the maintainer out.
		claim := func() bool {
			r, err := bd.b.Maintain(context.Background(), broker.MaintainRequest{Queue: "q", Owner: "other", OwnerTTL: time.Millisecond})
			if err == nil && r.Owned {
				bd.clock.Advance(time.Second)
				return true
			}
			return false
		}
		testwait.For(t, 10*time.Second, "the maintainer to claim the partition", func() bool { return !claim() })
		m.stop()
		if !claim() {
			t.Fatal("the claim was kept after a clean stop")
		}
	})

	// A layout error (another partition count) makes the maintainer ask
	// for the layout again, and is logged each time.
	t.Run("LayoutErrorRelayouts", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, nil)
		bd.cfg.Broker = layoutRefuser{bd.b}
		asked := make(chan string, 4)
		m := newMaintainer(bd.cfg, "q", 0, func() {}, func(q string) { asked <- q })
		m.start()
		defer m.stop()
		if q := <-asked; q != "q" {
			t.Fatalf("relayout of %q", q)
		}
		testwait.For(t, 10*time.Second, "the refusal to be logged", func() bool { return strings.Contains(bd.logs.String(), "maintenance refused") })
	})
}

type layoutRefuser struct{ broker.Broker }

func (layoutRefuser) Maintain(context.Context, broker.MaintainRequest) (broker.MaintainResult, error) {
	return broker.MaintainResult{}, fmt.Errorf("%w: queue q has 4 partitions recorded, configured 3", broker.ErrLayout)
}

// partitionsBroker reports a partition count the test sets.
type partitionsBroker struct {
	broker.Broker
	n   atomic.Int32
	err atomic.Pointer[error]
}

func (p *partitionsBroker) Partitions(ctx context.Context, q string) (int, error) {
	if e := p.err.Load(); e != nil {
		return 0, *e
	}
	return int(p.n.Load()), nil
}

func (p *partitionsBroker) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	return broker.MaintainResult{Owned: true}, nil
}

func TestLayoutWatcher(t *testing.T) {
	t.Parallel()
	bd := setup(t, nil)
	pb := &partitionsBroker{Broker: bd.b}
	pb.n.Store(2)
	bd.cfg.Broker = pb
	w := newLayoutWatcher(bd.cfg, []string{"q"}, func() {})
	count := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.parts["q"])
	}
	w.start()
	testwait.For(t, 10*time.Second, "two maintainers", func() bool { return count() == 2 })

	pb.n.Store(5) // a repartition started
	w.recheck("q")
	testwait.For(t, 10*time.Second, "five maintainers", func() bool { return count() == 5 })

	pb.n.Store(3) // and ended
	w.recheck("q")
	testwait.For(t, 10*time.Second, "three maintainers", func() bool { return count() == 3 })

	bad := fmt.Errorf("%w: configured with another count", broker.ErrLayout)
	pb.err.Store(&bad)
	w.recheck("q")
	testwait.For(t, 10*time.Second, "no maintainer for a queue this process cannot serve", func() bool { return count() == 0 })
	if !strings.Contains(bd.logs.String(), "cannot serve queue") {
		t.Fatal("the layout error was not logged")
	}
	w.stop()
	if !errors.Is(bad, broker.ErrLayout) {
		t.Fatal("unreachable")
	}
}
