package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// heldError is a refusal of a grouped task with a free ID by a partition
// that a repartition holds (field xf, set before the new layout is
// recorded; see holdFreeIDs).
type heldError struct{ error }

func (e heldError) Unwrap() error { return e.error }

// holdWait is how long an enqueue refused by a repartition's hold waits
// for the new layout (tests change it).
var holdWait atomic.Int64

func init() { holdWait.Store(int64(10 * time.Second)) }

// waitHolds waits, for the tasks at indexes todo that a repartition's hold
// refused, until their queue's layout changes (or the hold is lifted), and
// then marks them refused by the layout, so that Enqueue sends them again
// the new way. A hold that lasts past holdWait or ctx (a repartition that
// stopped before it recorded its layout) leaves the refusal as it is.
func (b *Broker) waitHolds(ctx context.Context, tasks []*tidetype.TaskInfo, todo []int, errs []error) {
	var done map[string]bool // made on the first held task: most calls have none
	for _, i := range todo {
		if !isHeld(errs[i]) {
			continue
		}
		q := tasks[i].Queue
		ok, seen := done[q]
		if !seen {
			ok = b.waitHold(ctx, q)
			if done == nil {
				done = map[string]bool{}
			}
			done[q] = ok
		}
		if ok {
			errs[i] = fmt.Errorf("%w: %w: queue %q: a repartition held grouped tasks with free IDs back; its new layout is recorded now", broker.ErrUnavailable, broker.ErrLayout, q)
		}
	}
}

// isHeld reports whether err is a heldError; the target errors.As needs
// is only made for an error.
func isHeld(err error) bool {
	if err == nil {
		return false
	}
	var held heldError
	return errors.As(err, &held)
}

// waitHold waits until queue's layout differs from the one it reads first
// or no partition of it is held any more; false when holdWait or ctx ended
// first.
func (b *Broker) waitHold(ctx context.Context, queue string) bool {
	deadline := time.Now().Add(time.Duration(holdWait.Load()))
	// pause waits d; false when the deadline has passed or ctx ends first.
	pause := func(d time.Duration) bool {
		if !time.Now().Before(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	b.forgetLayout(queue)
	l, err := b.layoutOf(ctx, queue)
	for d := 5 * time.Millisecond; err != nil; d = min(2*d, 200*time.Millisecond) {
		// Read while the repartition records the new layout and marks
		// the partitions: the registry and their meta keys differ for a
		// moment.
		if !pause(d) {
			return false
		}
		b.forgetLayout(queue)
		l, err = b.layoutOf(ctx, queue)
	}
	for d := 5 * time.Millisecond; ; d = min(2*d, 200*time.Millisecond) {
		pipe := b.rdb.Pipeline()
		held := make([]*redis.BoolCmd, l.cur.n)
		for i := range l.cur.n {
			held[i] = pipe.HExists(ctx, b.partAt(queue, l, i).k("gs"), "xf")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return false
		}
		if !slices.ContainsFunc(held, func(c *redis.BoolCmd) bool { return c.Val() }) {
			return true
		}
		if !pause(d) {
			return false
		}
		b.forgetLayout(queue)
		nl, err := b.layoutOf(ctx, queue)
		if err != nil {
			continue // as above: read again
		}
		if nl.tag != l.tag {
			return true
		}
	}
}
