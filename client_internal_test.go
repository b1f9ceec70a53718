package tide

import (
	"context"
	"testing"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
)

// conflictOnce is a broker that reports the first enqueue of every message
// as an ID conflict, as if its random ID had met an existing task.
type conflictOnce struct {
	broker.Broker
	seen map[*broker.Message]bool
}

func (c *conflictOnce) Enqueue(ctx context.Context, msgs []*broker.Message) ([]error, error) {
	errs := make([]error, len(msgs))
	var pass []*broker.Message
	var at []int
	for i, m := range msgs {
		if !c.seen[m] {
			c.seen[m] = true
			errs[i] = broker.ErrTaskIDConflict
			continue
		}
		pass, at = append(pass, m), append(at, i)
	}
	if len(pass) > 0 {
		e2, err := c.Broker.Enqueue(ctx, pass)
		if err != nil {
			return nil, err
		}
		for j, i := range at {
			errs[i] = e2[j]
		}
	}
	return errs, nil
}

func TestRedrawOnConflict(t *testing.T) {
	b := &conflictOnce{Broker: membroker.New(), seen: map[*broker.Message]bool{}}
	c := NewClient(b)
	ctx := context.Background()
	if _, err := c.Enqueue(ctx, NewTask("t", nil)); err != nil {
		t.Fatalf("a collision on a generated ID reached the caller: %v", err)
	}
	infos, err := c.EnqueueMany(ctx, []*Task{NewTask("a", nil), NewTask("b", nil)})
	if err != nil || infos[0] == nil || infos[1] == nil {
		t.Fatalf("EnqueueMany: %v, %v", infos, err)
	}
	// A caller-chosen ID that conflicts is reported, not redrawn.
	if _, err := c.Enqueue(ctx, NewTask("t", nil), TaskID("mine")); err != ErrTaskIDConflict {
		t.Fatalf("TaskID conflict = %v", err)
	}
}
