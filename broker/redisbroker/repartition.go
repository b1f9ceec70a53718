package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
)

// moveBatch is how many tasks one step of a repartition moves.
const moveBatch = 200

// A partition of span epoch e hands out its grouped tasks' enqueue
// sequences from e << seqEpochShift on, so that tasks enqueued in a new span
// sort after those moved in from older ones (a trillion enqueues a partition
// and epoch); a sequence is a Lua number, exact below 2^53, which bounds the
// epoch.
const (
	seqEpochShift = 40
	maxEpoch      = 1 << (53 - seqEpochShift)
)

var _ broker.Repartitioner = (*Broker)(nil)

// Repartition implements broker.Repartitioner: it changes queue to n
// partitions while servers keep processing and clients keep enqueueing.
//
// It records the new layout (a new span of n partitions, with keys of their
// own) next to the old one, so that every process routes new tasks to the
// new span, still serves and settles the old one, and looks up tasks by ID
// in both. Then it moves every task that is not active from the old span to
// the new one (see move.lua for the steps and why a crash at any of them
// neither loses nor doubles a task), waits for the active ones to finish,
// retires the old partitions and records the new layout alone. It returns
// when that is done, or with ctx's error; calling it again with the same n
// resumes a repartition that stopped. progress, when not nil, is called after
// each step with the tasks moved so far and those still in the old span.
//
// Grouped tasks whose IDs lack their group's tag (broker.FreeGroupID) move
// with their groups and stay found by their IDs (see the package
// documentation, "Groups"); new ones go to the new partitions.
//
// Grouped tasks keep their enqueue order, and their groups' rate windows
// and throttles go with them; grouped tasks start nowhere until the
// repartition is done (see the package documentation). Unique locks move
// with their tasks. A task whose ID the broker chose to
// share its lock's partition may land apart from its lock in the new span;
// its lock is then held until its TTL even after the task finishes.
// Processes configured with WithQueuePartitions for the queue refuse it
// afterwards until their configuration says n. A queue's limits fit any
// partition count, and hold over both sets of partitions together while the
// repartition runs: the old partitions start nothing more and give their
// slots to the new ones as their tasks finish (see the package
// documentation, "Limits").
func (b *Broker) Repartition(ctx context.Context, queue string, n int, progress func(moved, left int)) error {
	if err := b.check(); err != nil {
		return err
	}
	if n < 1 || n > maxPartitions {
		return fmt.Errorf("%w: %d partitions out of range 1..%d", broker.ErrInvalidTask, n, maxPartitions)
	}
	l, err := b.startRepartition(ctx, queue, n)
	if err != nil {
		return err
	}
	if l.old == nil {
		return b.refreshLimits(ctx, queue, l)
	}
	moved := 0
	for o := range l.old.n {
		old := b.partAt(queue, l, l.cur.n+o)
		if b.retired(ctx, old) {
			continue // done by an earlier run
		}
		if err := b.drainAll(ctx, l, old, o, &moved, progress); err != nil {
			if b.retired(ctx, old) {
				continue // another run of the repartition finished it
			}
			return err
		}
	}
	return b.finishRepartition(ctx, queue, l)
}

// retired reports whether old partition o is retired.
func (b *Broker) retired(ctx context.Context, o part) bool {
	meta, err := b.rdb.Get(ctx, o.k("meta")).Result()
	return err == nil && meta == "retired"
}

// drainAll moves every task of old partition o (index o of the old span) to
// the new span, waiting for its running tasks to finish, and retires it.
func (b *Broker) drainAll(ctx context.Context, l layout, old part, o int, moved *int, progress func(moved, left int)) error {
	queue := old.queue
	for {
		// The old partitions' slots go to the new ones as their running
		// tasks finish.
		if err := b.rebalance(ctx, queue); err != nil {
			return err
		}
		m, left, err := b.drain(ctx, l, old)
		*moved += m
		if progress != nil {
			progress(*moved, left)
		}
		if err != nil {
			return err
		}
		if left == 0 {
			// What is left are pointers to tasks elsewhere (freeids.go).
			rest, err := b.drainPointers(ctx, l, old)
			if err != nil {
				return err
			}
			if rest > 0 {
				left = rest
			}
		}
		if left == 0 {
			if err := b.handOverGroups(ctx, l, old); err != nil {
				return err
			}
			if err := b.releaseSlots(ctx, l, old); err != nil {
				return err
			}
			done, err := b.retire(ctx, l, old, o)
			if err != nil {
				return err
			}
			if done {
				return nil
			}
		}
		if m == 0 {
			// Only active tasks are left: wait for them to finish.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// retiredLimitsKeep is how long a retired partition's limits hash is kept
// after its repartition finished: it records which slot transfers reached
// the partition (slots.lua apply), and a transfer still outstanding
// after that long is dropped rather than risk counting it twice.
const retiredLimitsKeep = 24 * time.Hour

// finishRepartition ends the repartition of queue to l.cur once every old
// partition is retired: it drops placeholders a crash may have left, records
// the new span alone and gives it the whole limits. Another run that
// finished first leaves it nothing but the limits to share.
func (b *Broker) finishRepartition(ctx context.Context, queue string, l layout) error {
	if err := b.loadMove(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, err)
	}
	pipe := b.rdb.Pipeline()
	for i := range l.cur.n {
		p := b.partAt(queue, l, i)
		b.s.move.Run(ctx, pipe, b.moveKeys(p), p.layout, "unreserve")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	if err := b.casLayout(ctx, queue, l.tag, l.cur.tag()); err != nil {
		if cur, gerr := b.rdb.HGet(ctx, b.prefix+":partitions", queue).Result(); gerr != nil || cur != l.cur.tag() {
			return err
		}
	}
	b.forgetLayout(queue)
	b.rdb.Publish(ctx, b.channel(queue), "l")
	// The old partitions hold nothing any more (releaseSlots gave their
	// slots away before they were retired): their starts go, and their
	// limits hashes expire after retiredLimitsKeep. Until then a transfer
	// given to one after the repartition's last look finds there whether
	// it arrived, and goes to the bank if not (complete).
	pipe = b.rdb.Pipeline()
	for i := range l.old.n {
		p := b.partAt(queue, l, l.cur.n+i)
		pipe.Del(ctx, p.k("starts"), p.k("forgot"))
		pipe.PExpire(ctx, p.k("lim"), retiredLimitsKeep)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	nl, err := b.freshLayout(ctx, queue)
	if err != nil {
		return err
	}
	if err := b.refreshLimits(ctx, queue, nl); err != nil {
		return err
	}
	return b.rebalance(ctx, queue)
}

// startRepartition records the repartition of queue to n (or finds the one
// that runs) and returns the layout with both spans; a layout without an old
// span means there is nothing to do.
func (b *Broker) startRepartition(ctx context.Context, queue string, n int) (layout, error) {
	b.forgetLayout(queue)
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		return layout{}, err
	}
	if l.old != nil {
		if l.cur.n != n {
			return layout{}, fmt.Errorf("%w: queue %q is being repartitioned from %d to %d partitions; finish that first (repartition it to %d again)",
				broker.ErrLayout, queue, l.old.n, l.cur.n, l.cur.n)
		}
		// The run that recorded it may have stopped (or not be there
		// yet) before it marked the old partitions.
		if err := b.markOld(ctx, queue, l); err != nil {
			return layout{}, err
		}
		return l, nil
	}
	if l.cur.n == n {
		// Undo the hold of a repartition that stopped before it began
		// (see holdFreeIDs).
		for i := range n {
			if err := b.rdb.HDel(ctx, b.partAt(queue, l, i).k("gs"), "xf").Err(); err != nil {
				return layout{}, fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
			}
		}
		return l, nil
	}
	if err := b.holdFreeIDs(ctx, queue, l); err != nil {
		return layout{}, err
	}
	if afterHold != nil {
		afterHold(queue)
	}
	next := span{n: n, epoch: l.cur.epoch + 1}
	ml := layout{tag: next.tag() + "<" + l.cur.tag(), cur: next, old: &span{n: l.cur.n, epoch: l.cur.epoch}}
	// The new span's partitions first (paused like the old ones), then the
	// record that makes processes use them, then the old partitions' meta
	// keys, which from then on refuse processes that route the old way.
	// PTTL: -2 not paused, -1 paused until unpaused, else the ms left of a
	// PauseFor, which the new partitions keep.
	ttl, err := b.rdb.PTTL(ctx, b.partAt(queue, ml, ml.cur.n).k("paused")).Result()
	if err != nil {
		return layout{}, fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	// The new partitions get the queue's settings before any process can
	// use them: no slots of its limits (the old partitions give theirs as
	// their tasks finish, see slots.go) and grouped tasks held.
	limV, lim, _, err := b.readLimits(ctx, queue)
	if err != nil {
		return layout{}, err
	}
	ce, re, err := b.eras(ctx, queue, lim)
	if err != nil {
		return layout{}, err
	}
	longest, err := b.longestPeriod(ctx, queue, l)
	if err != nil {
		return layout{}, err
	}
	if next.epoch >= maxEpoch {
		return layout{}, fmt.Errorf("%w: queue %q has been repartitioned %d times, the most its ordered groups' sequences allow", broker.ErrLayout, queue, l.cur.epoch)
	}
	pipe := b.rdb.Pipeline()
	for i := range ml.cur.n {
		p := b.partAt(queue, ml, i)
		pipe.SetNX(ctx, p.k("meta"), p.layout, 0)
		// Grouped tasks keep their enqueue sequence when they move (see
		// move.lua): the new span's sequences start above the old ones.
		pipe.HSetNX(ctx, p.k("gs"), "seq", int64(next.epoch)<<seqEpochShift)
		switch {
		case ttl == -1:
			pipe.Set(ctx, p.k("paused"), "1", 0)
		case ttl > 0:
			pipe.Set(ctx, p.k("paused"), "1", ttl)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return layout{}, fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	calls := make([]*call, ml.cur.n)
	for i := range ml.cur.n {
		calls[i] = b.shareCall(b.partAt(queue, ml, i), limV, ce, re, lim.Rate.Per, groupLimits(lim, true), longest)
	}
	if err := b.runAll(ctx, "repartition "+queue, calls); err != nil {
		return layout{}, err
	}
	if err := b.casLayout(ctx, queue, l.tag, ml.tag); err != nil {
		// Another run of this very repartition may have recorded it
		// first: then go on with it.
		if cur, gerr := b.rdb.HGet(ctx, b.prefix+":partitions", queue).Result(); gerr != nil || cur != ml.tag {
			return layout{}, err
		}
	}
	if err := b.markOld(ctx, queue, ml); err != nil {
		return layout{}, err
	}
	b.forgetLayout(queue)
	b.rdb.Publish(ctx, b.channel(queue), "l") // servers: new partitions to maintain
	nl, err := b.layoutOf(ctx, queue)
	if err != nil {
		return layout{}, err
	}
	return nl, b.refreshLimits(ctx, queue, nl)
}

// afterHold, when set (by tests), runs after holdFreeIDs found no grouped
// task with a free ID and before the new layout is recorded.
var afterHold func(queue string)

// holdFreeIDs prepares the repartition of queue l: grouped tasks whose IDs
// do not carry their group (broker.FreeGroupID) move with their groups,
// and on several partitions their pointers (freeids.go) are written anew
// in the new span as they move. It marks every partition (field xf of its
// group state), from when on enqueue.lua refuses new such tasks in them
// (processes that route by the new layout refuse them while the
// repartition runs), then settles every claim of their pointers (repair),
// so that no enqueue of one is half done while tasks move, and every move
// of one whose task left its partition.
func (b *Broker) holdFreeIDs(ctx context.Context, queue string, l layout) error {
	fail := func(err error) error {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	for i := range l.cur.n {
		if err := b.rdb.HSet(ctx, b.partAt(queue, l, i).k("gs"), "xf", "1").Err(); err != nil {
			return fail(err)
		}
	}
	if l.cur.n < 2 {
		return nil
	}
	for i := range l.cur.n {
		p := b.partAt(queue, l, i)
		ids, err := b.rdb.ZRange(ctx, p.k("x"), 0, -1).Result()
		if err != nil {
			return fail(err)
		}
		for _, id := range ids {
			v, err := b.rdb.HGet(ctx, p.k("t"), id).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fail(err)
			}
			if ptr, ok := parsePointer(v); ok && ptr.claimed() {
				if err := b.repair(ctx, queue, l, p, id, ptr); err != nil {
					return err
				}
			}
		}
	}
	// A move out of an ID's own partition makes no claim (moveHere): its
	// task, flagged as moving, is settled from where it left.
	for i := range l.cur.n {
		if err := b.sweepLeft(ctx, queue, l, b.partAt(queue, l, i), true); err != nil {
			return err
		}
	}
	return nil
}

// markOld writes the meta key of each partition of l's old span that still
// says the old span alone: from then on it refuses processes that route the
// old way. A partition marked already, or retired, is left as it is.
func (b *Broker) markOld(ctx context.Context, queue string, l layout) error {
	calls := make([]*call, l.old.n)
	for i := range l.old.n {
		p := b.partAt(queue, l, l.cur.n+i)
		calls[i] = &call{script: b.s.move, keys: b.moveKeys(p), args: []any{l.old.tag(), "mark", p.layout}}
	}
	b.run(ctx, calls)
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && !strings.HasPrefix(err.Error(), "TIDELAYOUT ") {
			return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, c.err)
		}
	}
	return nil
}

// casLayout changes queue's recorded layout from old to new.
func (b *Broker) casLayout(ctx context.Context, queue, old, new string) error {
	ok, err := b.s.registry.Run(ctx, b.rdb, []string{b.prefix + ":partitions"}, queue, old, new).Int()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", queue, classify(err))
	}
	if ok != 1 {
		return fmt.Errorf("%w: queue %q changed its layout while it was repartitioned; run the repartition again", broker.ErrLayout, queue)
	}
	return nil
}
