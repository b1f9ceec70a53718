package tide

import (
	"context"
	"errors"
	"testing"

	"github.com/tidequeue/tide/broker/membroker"
)

// The broker chooses the IDs of tasks enqueued without TaskID and draws one
// again only when the task holding it is provably another
// (redisbroker's TestRedrawOnlyProvenCollisions); a caller-chosen ID is
// never redrawn.
func TestCallerIDConflictIsReported(t *testing.T) {
	c := NewClient(membroker.New())
	ctx := context.Background()
	info, err := c.Enqueue(ctx, NewTask("t", nil))
	if err != nil || info.ID == "" {
		t.Fatalf("Enqueue without TaskID: %+v, %v", info, err)
	}
	infos, err := c.EnqueueMany(ctx, []*Task{NewTask("a", nil), NewTask("b", nil)})
	if err != nil || infos[0] == nil || infos[1] == nil || infos[0].ID == infos[1].ID {
		t.Fatalf("EnqueueMany: %v, %v", infos, err)
	}
	if _, err := c.Enqueue(ctx, NewTask("t", nil), TaskID("mine")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, NewTask("t", nil), TaskID("mine")); !errors.Is(err, ErrTaskIDConflict) {
		t.Fatalf("TaskID conflict = %v", err)
	}
}
