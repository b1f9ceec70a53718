package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
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
// version and changes the queue's bank by the change of each limit in the
// same step, gives every partition the new settings, then rebalances the
// slots (see the package documentation, "Limits"). Any limit of at least 1
// fits any partition count.
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
	ord := 0
	if l.Ordered {
		ord = 1
	}
	enc := fmt.Sprintf("%d:%d:%d:%d:%d:%d:%d", l.Concurrency, l.Rate.Limit, l.Rate.Per.Milliseconds(), l.GroupConcurrency, l.GroupRate.Limit, l.GroupRate.Per.Milliseconds(), ord)
	res, err := b.s.limits.Run(ctx, b.rdb, []string{b.limitsKey(), b.bankKey(queue)}, queue, enc).Slice()
	if err != nil || len(res) != 3 {
		if err == nil {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		return callErr("set limits of "+queue, classify(err))
	}
	v, _ := res[0].(int64)
	ce, _ := res[1].(string)
	re, _ := res[2].(string)
	if h := limitsRecorded.Load(); h != nil {
		(*h)(queue)
	}
	// The settings depend on the layout (grouped tasks are held while a
	// repartition runs): a repartition that started or ended while they
	// were given may have given its own with the same version before ours
	// came, so the layout is read again after, and the settings given
	// anew when it changed. A repartition that changes it later reads
	// this version of the limits when it gives its settings.
	for attempt := 0; ; attempt++ {
		err = b.applyLimits(ctx, queue, lay, v, l, ce, re, 0)
		if err != nil && !errors.Is(err, broker.ErrLayout) {
			return err
		}
		b.forgetLayout(queue)
		nl, lerr := b.freshLayout(ctx, queue)
		if lerr != nil {
			return lerr
		}
		if err == nil && nl.tag == lay.tag {
			break
		}
		if attempt == 2 {
			if err == nil {
				err = fmt.Errorf("%w: %w: queue %q is changing its layout; try again", broker.ErrUnavailable, broker.ErrLayout, queue)
			}
			return err
		}
		lay = nl
	}
	if h := limitsShared.Load(); h != nil {
		(*h)(queue)
	}
	// A repartition may start between the settings and the rebalance, and
	// the partitions it marks refuse the layout this process cached: read
	// it again, as the settings step does, rather than report an error
	// for limits that are recorded and given.
	for attempt := 0; ; attempt++ {
		err := b.rebalance(ctx, queue)
		if err == nil || !errors.Is(err, broker.ErrLayout) || attempt == 2 {
			return err
		}
		b.forgetLayout(queue)
	}
}

// limitsShared, when set (by tests), runs in SetQueueLimits after every
// partition has the new settings and before the rebalance moves slots.
var limitsShared atomic.Pointer[func(queue string)]

// limitsRecorded, when set (by tests), runs in SetQueueLimits after the
// limits are recorded and before the partitions get their settings.
var limitsRecorded atomic.Pointer[func(queue string)]

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

// shareCall gives partition p the settings of limits version v: the eras
// of its concurrency and rate slots (ce, re; "" for no such limit), the
// rate period, the group limits g (groupLimits) and the longest rate period
// the queue's partitions count now (0: none known; a partition new to the
// rate counts over it until the rebalance lets a shorter one in, see
// share.lua).
func (b *Broker) shareCall(p part, v int64, ce, re string, per time.Duration, g string, longest time.Duration) *call {
	lp := ""
	if longest > 0 {
		lp = strconv.FormatInt(longest.Milliseconds(), 10)
	}
	return &call{
		script: b.s.share,
		keys:   p.keys("lim", "pending", "active", "meta", "starts", "gr", "gs", "gw", "gq", "gid"),
		args:   []any{p.layout, v, ce, p.channel, p.idx, re, per.Milliseconds(), g, lp},
		queue:  p.queue,
	}
}

// longestPeriod returns the longest rate period the partitions of layout
// l count (0 for none): a repartition gives it to its new partitions,
// which may get tokens of a limit whose shorter period has not come in
// yet.
func (b *Broker) longestPeriod(ctx context.Context, queue string, l layout) (time.Duration, error) {
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, l.total())
	for i := range l.total() {
		cmds[i] = pipe.HGet(ctx, b.partAt(queue, l, i).k("lim"), "per")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, callErr("read limits of "+queue, classify(err))
	}
	var longest int64
	for _, c := range cmds {
		if ms, err := c.Int64(); err == nil {
			longest = max(longest, ms)
		}
	}
	return time.Duration(longest) * time.Millisecond, nil
}

// applyLimits gives every partition of layout l the settings of limits lim
// (version v, slot eras ce and re; longest as for shareCall). While a
// repartition runs grouped tasks are held in both spans (see move.lua).
func (b *Broker) applyLimits(ctx context.Context, queue string, l layout, v int64, lim tidetype.QueueLimits, ce, re string, longest time.Duration) error {
	calls := make([]*call, l.total())
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		calls[i] = b.shareCall(p, v, ce, re, lim.Rate.Per, groupLimits(lim, l.old != nil), longest)
	}
	return b.runAll(ctx, "set limits of "+queue, calls)
}

// eras returns the eras of queue's bank for the limits lim: "" for a limit
// that is not set, "0" for slots recorded before the bank had eras.
func (b *Broker) eras(ctx context.Context, queue string, lim tidetype.QueueLimits) (ce, re string, err error) {
	v, err := b.rdb.HMGet(ctx, b.bankKey(queue), "ce", "re").Result()
	if err != nil {
		return "", "", callErr("read limits of "+queue, classify(err))
	}
	era := func(set bool, x any) string {
		if !set {
			return ""
		}
		if s, ok := x.(string); ok && s != "" {
			return s
		}
		return "0"
	}
	return era(lim.Concurrency > 0, v[0]), era(lim.Rate.Limit > 0, v[1]), nil
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

// refreshLimits gives the partitions of layout l queue's recorded settings
// again (a repartition's steps). A queue without limits gets them too, as
// none: while a repartition runs its grouped tasks are held all the same (a
// throttle set in an old partition must reach the new one before the group
// starts there).
func (b *Broker) refreshLimits(ctx context.Context, queue string, l layout) error {
	v, lim, _, err := b.readLimits(ctx, queue)
	if err != nil {
		return err
	}
	ce, re, err := b.eras(ctx, queue, lim)
	if err != nil {
		return err
	}
	longest, err := b.longestPeriod(ctx, queue, l)
	if err != nil {
		return err
	}
	return b.applyLimits(ctx, queue, l, v, lim, ce, re, longest)
}

// forgetLimits deletes the limits of a deleted queue with l's partitions.
func (b *Broker) forgetLimits(ctx context.Context, queue string, l layout) error {
	pipe := b.rdb.Pipeline()
	pipe.HDel(ctx, b.limitsKey(), queue)
	pipe.Del(ctx, b.bankKey(queue))
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		// With the limits go the group keys (groups.lua): an empty
		// partition's groups hold only counters.
		pipe.Del(ctx, append([]string{p.k("lim"), p.k("starts"), p.k("forgot")}, p.groupKeys()...)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return callErr("delete queue "+queue, classify(err))
	}
	return nil
}
