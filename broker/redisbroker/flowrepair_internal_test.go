package redisbroker

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// A flow whose creation stopped after its first call (its steps not stored)
// is listed by RepairFlows, and ReadySteps cancels and ends it instead of
// leaving it running forever; ConfirmFlow takes it off the list.
func TestRepairCreationStoppedHalfway(t *testing.T) {
	t.Parallel()
	b := New(redistest.Client(t, redistest.Addr(t)), WithPrefix(redistest.Prefix(t)))
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	// What CreateFlow does first: list it, then the create call alone.
	if err := b.rdb.ZAdd(ctx, b.newFlows(), redisZ(b.Now().Add(-time.Minute))).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.flowCall(ctx, "half", "create", "c", "b", "d1", b.Now().UnixMilli(), 60000, "", 3, ""); err != nil {
		t.Fatal(err)
	}
	ids, err := b.RepairFlows(ctx, 30*time.Second, 10)
	if err != nil || len(ids) != 1 || ids[0] != "half" {
		t.Fatalf("RepairFlows: %v, %v", ids, err)
	}
	ready, err := b.ReadySteps(ctx, "half")
	if err != nil || len(ready) != 0 {
		t.Fatalf("ReadySteps of a flow created halfway: %v, %v", ready, err)
	}
	f, err := b.GetFlow(ctx, "half", false)
	if err != nil || f.State != tidetype.FlowCanceled || f.FinishedAt.IsZero() {
		t.Fatalf("flow after the repair: %+v, %v; want cancelled and ended", f, err)
	}
	if err := b.ConfirmFlow(ctx, "half"); err != nil {
		t.Fatal(err)
	}
	if ids, err := b.RepairFlows(ctx, 0, 10); err != nil || len(ids) != 0 {
		t.Fatalf("RepairFlows after ConfirmFlow: %v, %v", ids, err)
	}
	if _, err := b.ReadySteps(ctx, "never"); !errors.Is(err, broker.ErrFlowNotFound) {
		t.Fatalf("ReadySteps of no flow: %v", err)
	}
}

func redisZ(at time.Time) redis.Z { return redis.Z{Score: float64(at.UnixMilli()), Member: "half"} }
