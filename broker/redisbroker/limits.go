package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// limitsKey is the hash of every queue's limits as set: queue ->
// "<version>:<concurrency>:<rate>:<per ms>:<group concurrency>:<group
// rate>:<group per ms>:<ordered 0|1>" (records written before groups have
// the first four fields only).
func (b *Broker) limitsKey() string { return b.prefix + ":limits" }

// SetQueueLimits implements broker.Admin: it records the limits with a new
// version, then gives every partition its share (see the package
// documentation). A Concurrency or Rate.Limit below the queue's partition
// count is refused.
func (b *Broker) SetQueueLimits(ctx context.Context, queue string, l tidetype.QueueLimits) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckQueueLimits(l); err != nil {
		return err
	}
	lay, err := b.freshLayout(ctx, queue)
	if err != nil {
		return err
	}
	if err := broker.CheckLimitsFit(queue, l, lay.cur.n); err != nil {
		return err
	}
	ord := 0
	if l.Ordered {
		ord = 1
	}
	enc := fmt.Sprintf("%d:%d:%d:%d:%d:%d:%d", l.Concurrency, l.Rate.Limit, l.Rate.Per.Milliseconds(), l.GroupConcurrency, l.GroupRate.Limit, l.GroupRate.Per.Milliseconds(), ord)
	v, err := b.s.limits.Run(ctx, b.rdb, []string{b.limitsKey()}, queue, enc).Int64()
	if err != nil {
		return callErr("set limits of "+queue, classify(err))
	}
	err = b.applyLimits(ctx, queue, lay, v, l)
	if errors.Is(err, broker.ErrLayout) {
		// The layout changed under us (a repartition started or ended):
		// share the limits out on the new one.
		b.forgetLayout(queue)
		if lay, err = b.freshLayout(ctx, queue); err == nil {
			err = b.applyLimits(ctx, queue, lay, v, l)
		}
	}
	return err
}

// QueueLimits implements broker.Admin.
func (b *Broker) QueueLimits(ctx context.Context, queue string) (tidetype.QueueLimits, error) {
	if err := b.check(); err != nil {
		return tidetype.QueueLimits{}, err
	}
	_, l, _, err := b.readLimits(ctx, queue)
	return l, err
}

// readLimits returns the recorded version and limits of queue; ok is false
// when none were ever set.
func (b *Broker) readLimits(ctx context.Context, queue string) (v int64, l tidetype.QueueLimits, ok bool, err error) {
	s, err := b.rdb.HGet(ctx, b.limitsKey(), queue).Result()
	if errors.Is(err, redis.Nil) {
		return 0, l, false, nil
	}
	if err != nil {
		return 0, l, false, callErr("read limits of "+queue, classify(err))
	}
	f := strings.Split(s, ":")
	nums := make([]int64, len(f))
	for i, x := range f {
		if nums[i], err = strconv.ParseInt(x, 10, 64); err != nil {
			break
		}
	}
	if len(f) != 4 && len(f) != 8 || err != nil {
		return 0, l, false, fmt.Errorf("tide: redisbroker: limits of queue %q recorded as %q, which is not <version>:<concurrency>:<rate>:<per ms>[:<group concurrency>:<group rate>:<group per ms>:<ordered>]", queue, s)
	}
	l = tidetype.QueueLimits{Concurrency: int(nums[1]), Rate: tidetype.Rate{Limit: int(nums[2]), Per: time.Duration(nums[3]) * time.Millisecond}}
	if len(f) == 8 {
		l.GroupConcurrency = int(nums[4])
		l.GroupRate = tidetype.Rate{Limit: int(nums[5]), Per: time.Duration(nums[6]) * time.Millisecond}
		l.Ordered = nums[7] == 1
	}
	if err := broker.CheckQueueLimits(l); err != nil {
		return 0, tidetype.QueueLimits{}, false, fmt.Errorf("tide: redisbroker: limits of queue %q recorded as %q: %w", queue, s, err)
	}
	return nums[0], l, true, nil
}

// groupLimits encodes l's group limits as share.lua reads them; hold
// stops grouped tasks from starting (see applyLimits).
func groupLimits(l tidetype.QueueLimits, hold bool) string {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	return fmt.Sprintf("%d:%d:%d:%d:%d", l.GroupConcurrency, l.GroupRate.Limit, l.GroupRate.Per.Milliseconds(), b(l.Ordered), b(hold))
}

// shareCall sets partition p's shares from limits version v: concurrency
// share c and rate share r per per (a negative share means no limit), the
// group limits g (groupLimits), with seeds (member, start ms pairs) added
// to its starts.
func (b *Broker) shareCall(p part, v int64, c, r int, per time.Duration, g string, seeds []any) *call {
	num := func(n int) string {
		if n < 0 {
			return ""
		}
		return strconv.Itoa(n)
	}
	return &call{
		script: b.s.share,
		keys:   p.keys("lim", "pending", "active", "meta", "starts", "gr", "gs", "gw", "gq"),
		args:   append([]any{p.layout, v, num(c), p.channel, p.idx, num(r), per.Milliseconds(), g}, seeds...),
		queue:  p.queue,
	}
}

// applyLimits gives every partition of layout l its shares of limits lim
// (version v). While a repartition runs, the old span's partitions get a
// concurrency share of 0 first (from then on they start nothing and their
// running tasks only finish); then the new span shares what those running
// tasks leave of the concurrency limit, and gets the old span's recent starts
// spread over its partitions' starts, so that they count against the rate.
// The repartition calls it again as the old tasks finish.
func (b *Broker) applyLimits(ctx context.Context, queue string, l layout, v int64, lim tidetype.QueueLimits) error {
	c, r := -1, -1
	if lim.Concurrency > 0 {
		c = lim.Concurrency
	}
	if lim.Rate.Limit > 0 {
		r = lim.Rate.Limit
	}
	var running int
	var seeds [][]any
	if l.old != nil {
		calls := make([]*call, l.old.n)
		for i := range l.old.n {
			oc := -1
			if c >= 0 || r >= 0 {
				oc = 0
			}
			calls[i] = b.shareCall(b.partAt(queue, l, l.cur.n+i), v, oc, -1, 0, groupLimits(lim, true), nil)
		}
		if err := b.runAll(ctx, "set limits of "+queue, calls); err != nil {
			return err
		}
		pipe := b.rdb.Pipeline()
		counts := make([]*redis.IntCmd, l.old.n)
		starts := make([]*redis.ZSliceCmd, l.old.n)
		for i := range l.old.n {
			p := b.partAt(queue, l, l.cur.n+i)
			counts[i] = pipe.ZCard(ctx, p.k("active"))
			starts[i] = pipe.ZRangeWithScores(ctx, p.k("starts"), 0, -1)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return callErr("set limits of "+queue, classify(err))
		}
		seeds = make([][]any, l.cur.n)
		k := 0
		for i := range l.old.n {
			running += int(counts[i].Val())
			if r < 0 {
				continue
			}
			for _, z := range starts[i].Val() {
				member := fmt.Sprintf("o%d.%d.%v", l.old.epoch, i, z.Member)
				seeds[k%l.cur.n] = append(seeds[k%l.cur.n], member, int64(z.Score))
				k++
			}
		}
	}
	calls := make([]*call, l.cur.n)
	for i := range l.cur.n {
		cs, rs := -1, -1
		if c >= 0 {
			cs = broker.Share(max(c-running, 0), l.cur.n, i)
		}
		if r >= 0 {
			rs = broker.Share(r, l.cur.n, i)
		}
		var seed []any
		if seeds != nil {
			seed = seeds[i]
		}
		calls[i] = b.shareCall(b.partAt(queue, l, i), v, cs, rs, lim.Rate.Per, groupLimits(lim, l.old != nil), seed)
	}
	return b.runAll(ctx, "set limits of "+queue, calls)
}

// runAll runs calls and returns the first error.
func (b *Broker) runAll(ctx context.Context, op string, calls []*call) error {
	b.run(ctx, calls)
	for _, c := range calls {
		if c.err != nil {
			return callErr(op, c.err)
		}
	}
	return nil
}

// refreshLimits shares queue's recorded limits out on layout l again (a
// repartition's steps). A queue without limits gets them too, as none: while
// a repartition runs its grouped tasks are held all the same (a throttle set
// in an old partition must reach the new one before the group starts there).
func (b *Broker) refreshLimits(ctx context.Context, queue string, l layout) error {
	v, lim, _, err := b.readLimits(ctx, queue)
	if err != nil {
		return err
	}
	return b.applyLimits(ctx, queue, l, v, lim)
}

// forgetLimits deletes the limits of a deleted queue with l's partitions.
func (b *Broker) forgetLimits(ctx context.Context, queue string, l layout) error {
	pipe := b.rdb.Pipeline()
	pipe.HDel(ctx, b.limitsKey(), queue)
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		// With the limits go the group keys (groups.lua): an empty
		// partition's groups hold only counters.
		pipe.Del(ctx, append([]string{p.k("lim"), p.k("starts")}, p.groupKeys()...)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return callErr("delete queue "+queue, classify(err))
	}
	return nil
}
