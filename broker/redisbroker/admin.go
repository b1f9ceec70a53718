package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// maxListLimit bounds one ListTasks page; maxBulkLimit one bulk step.
const (
	maxListLimit = 1000
	maxBulkLimit = 1000
)

// stateKey names the structure holding tasks in state st.
func stateKey(st tidetype.TaskState) (string, bool) {
	switch st {
	case tidetype.StatePending:
		return "pending", true
	case tidetype.StateActive:
		return "active", true
	case tidetype.StateScheduled:
		return "scheduled", true
	case tidetype.StateRetry, tidetype.StateWaiting:
		return "retry", true // waiting tasks lie with the retry tasks
	case tidetype.StateArchived:
		return "archived", true
	case tidetype.StateCompleted:
		return "completed", true
	}
	return "", false
}

// Queues implements broker.Admin.
func (b *Broker) Queues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	qs, err := b.rdb.SMembers(ctx, b.prefix+":queues").Result()
	if err != nil {
		return nil, callErr("queues", classify(err))
	}
	sort.Strings(qs)
	return qs, nil
}

// QueueInfo implements broker.Admin with one pipeline (plus one for the
// oldest pending records).
func (b *Broker) QueueInfo(ctx context.Context, queue string) (*tidetype.QueueInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, err
	}
	day := b.today()
	now := strconv.FormatInt(b.Now().Add(-time.Second).UnixMilli(), 10) // due a second ago: not just a race with the maintainer
	type partCmds struct {
		sizes    map[tidetype.TaskState]*redis.IntCmd
		paused   *redis.IntCmd
		pauseTTL *redis.DurationCmd
		proc, fl *redis.StringCmd
		oldest   *redis.StringCmd
		grouped  *redis.IntCmd

		overdue, overdueRetry *redis.IntCmd
	}
	pc := make([]partCmds, l.total())
	pipe := b.rdb.Pipeline()
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		c := partCmds{sizes: map[tidetype.TaskState]*redis.IntCmd{}}
		for _, st := range tidetype.States {
			if st == tidetype.StateWaiting {
				continue // in the retry zset: counted with the retry tasks
			}
			name, _ := stateKey(st)
			if st == tidetype.StatePending {
				c.sizes[st] = pipe.LLen(ctx, p.k(name))
				c.grouped = pipe.ZCard(ctx, p.k("gq"))
			} else {
				c.sizes[st] = pipe.ZCard(ctx, p.k(name))
			}
		}
		c.paused = pipe.Exists(ctx, p.k("paused"))
		c.pauseTTL = pipe.PTTL(ctx, p.k("paused"))
		c.proc = pipe.HGet(ctx, p.k("stat"), "p:"+day)
		c.fl = pipe.HGet(ctx, p.k("stat"), "f:"+day)
		c.oldest = pipe.LIndex(ctx, p.k("pending"), -1)
		c.overdue = pipe.ZCount(ctx, p.k("scheduled"), "-inf", now)
		c.overdueRetry = pipe.ZCount(ctx, p.k("retry"), "-inf", now)
		pc[i] = c
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("queue info "+queue, classify(err))
	}
	qi := &tidetype.QueueInfo{Queue: queue}
	var oldest []*redis.StringCmd
	pipe = b.rdb.Pipeline()
	for i, c := range pc {
		for st, cmd := range c.sizes {
			qi.SetCount(st, qi.Count(st)+int(cmd.Val()))
		}
		qi.SetCount(tidetype.StatePending, qi.Pending+int(c.grouped.Val()))
		qi.Paused = qi.Paused || c.paused.Val() == 1
		if ttl := c.pauseTTL.Val(); c.paused.Val() == 1 && ttl > 0 {
			if until := b.Now().Add(ttl).Truncate(time.Millisecond); until.After(qi.PausedUntil) {
				qi.PausedUntil = until
			}
		}
		qi.Overdue += int(c.overdue.Val() + c.overdueRetry.Val())
		n, _ := c.proc.Int() // missing field: 0
		f, _ := c.fl.Int()
		qi.Processed += n
		qi.Failed += f
		if id := c.oldest.Val(); id != "" {
			oldest = append(oldest, pipe.HGet(ctx, b.partAt(queue, l, i).k("t"), id))
		}
	}
	if len(oldest) > 0 {
		_, _ = pipe.Exec(ctx)
		for _, cmd := range oldest {
			if m, err := codec.DecodeHeader(queue, "", []byte(cmd.Val())); err == nil && !m.NextProcessAt.IsZero() {
				if qi.OldestPending.IsZero() || m.NextProcessAt.Before(qi.OldestPending) {
					qi.OldestPending = m.NextProcessAt
				}
			}
		}
	}
	if !qi.OldestPending.IsZero() {
		qi.Latency = max(b.Now().Sub(qi.OldestPending), 0)
	}
	return qi, nil
}

// History implements broker.Admin.
func (b *Broker) History(ctx context.Context, queue string, days int) ([]tidetype.DailyStats, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if days < 1 || days > 90 {
		return nil, fmt.Errorf("tide: redisbroker: history of %d days: must be 1 to 90", days)
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, err
	}
	now := b.Now().UTC()
	start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	out := make([]tidetype.DailyStats, days)
	proc := make([][]*redis.StringCmd, days)
	fail := make([][]*redis.StringCmd, days)
	pipe := b.rdb.Pipeline()
	for d := range days {
		date := start.AddDate(0, 0, -d)
		out[d].Queue, out[d].Date = queue, date
		day := date.Format(time.DateOnly)
		for i := range l.total() {
			p := b.partAt(queue, l, i)
			proc[d] = append(proc[d], pipe.HGet(ctx, p.k("stat"), "p:"+day))
			fail[d] = append(fail[d], pipe.HGet(ctx, p.k("stat"), "f:"+day))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("history "+queue, classify(err))
	}
	for d := range days {
		for i := range proc[d] {
			n, _ := proc[d][i].Int()
			f, _ := fail[d][i].Int()
			out[d].Processed += n
			out[d].Failed += f
		}
	}
	return out, nil
}

// Series implements broker.Admin: the per-minute counters the settle and
// maintain scripts keep for two hours, summed over the partitions.
func (b *Broker) Series(ctx context.Context, queue string, since time.Time) ([]tidetype.Point, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, err
	}
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, l.total())
	for i := range l.total() {
		cmds[i] = pipe.HGetAll(ctx, b.partAt(queue, l, i).k("m"))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("series "+queue, classify(err))
	}
	first, last := since.Unix()/60, b.Now().Unix()/60
	if last-first > 180 {
		first = last - 180
	}
	pts := make([]tidetype.Point, 0, last-first+1)
	for m := first; m <= last; m++ {
		pts = append(pts, tidetype.Point{At: time.Unix(m*60, 0).UTC(), Pending: -1})
	}
	for _, c := range cmds {
		for f, v := range c.Val() {
			if len(f) < 3 {
				continue
			}
			m, err1 := strconv.ParseInt(f[2:], 10, 64)
			n, err2 := strconv.Atoi(v)
			if err1 != nil || err2 != nil || m < first || m > last {
				continue
			}
			p := &pts[m-first]
			switch f[0] {
			case 'p':
				p.Processed += n
			case 'f':
				p.Failed += n
			case 'q':
				p.Pending = max(p.Pending, 0) + n
			}
		}
	}
	return pts, nil
}

// StoreInfo implements broker.Admin: INFO of the Redis server (summed over a
// cluster's primaries).
func (b *Broker) StoreInfo(ctx context.Context) (*tidetype.StoreInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	si := &tidetype.StoreInfo{Kind: "redis"}
	add := func(ctx context.Context, c *redis.Client) error {
		txt, err := c.Info(ctx, "server", "memory", "clients").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(txt, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "redis_version":
				si.Version = v
			case "redis_mode":
				si.Mode = v
			case "used_memory":
				si.UsedMemory += n
			case "maxmemory":
				si.MaxMemory += n
			case "maxmemory_policy":
				si.EvictionPolicy = v
			case "connected_clients":
				si.ConnectedClients += int(n)
			}
		}
		si.Nodes++
		return nil
	}
	var err error
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return add(ctx, n)
		})
	case *redis.Client:
		err = add(ctx, c)
	default:
		err = errors.New("unsupported client type")
	}
	if err != nil {
		return nil, callErr("store info", classify(err))
	}
	return si, nil
}

func (b *Broker) adminCall(p part, rid, cache string, exp int64, op string, target any, limit int) *call {
	if cache == "" {
		cache = p.k("rq:none")
	}
	return &call{
		script: b.s.admin,
		keys:   append(append(append(p.keys("t", "pending", "scheduled", "retry", "archived", "completed", "result", "active", "u", "meta"), cache, p.k("h")), append(p.groupKeys(), p.endKeys()...)...), p.k(eventsKey)),
		args:   []any{p.layout, rid, exp, op, target, limit, p.channel, p.idx, b.doneChannel(p.queue), b.eventsArg(p), p.idTag},
		queue:  p.queue,
	}
}

func (b *Broker) adminOne(ctx context.Context, op, queue, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	return b.againOnLayout(ctx, queue, func(l layout, last bool) error { return b.adminOneIn(ctx, l, last, op, queue, id) })
}

// adminOneIn is adminOne under layout l (last: see againOnLayout).
func (b *Broker) adminOneIn(ctx context.Context, l layout, last bool, op, queue, id string) error {
	var code int64
	retired := false
	where, err := b.resolve(ctx, queue, l, id)
	if err != nil {
		return err
	}
	for _, f := range where {
		p := f.p
		rid, cache, exp, _ := b.request(p)
		c := b.adminCall(p, rid, cache, exp, op, id, 0)
		b.run(ctx, []*call{c})
		if b.retiredOld(ctx, p, c.err) {
			retired = true
			continue
		}
		if c.err != nil {
			return callErr(fmt.Sprintf("%s %s/%s", op, queue, id), c.err)
		}
		if code, err = c.cmd.Int64(); err != nil {
			return callErr(op, fmt.Errorf("unexpected reply: %w", err))
		}
		if code != 0 {
			break
		}
	}
	switch {
	case code == 0 && retired && !last:
		return callErr(op, errRetiredOnly)
	case code == 0:
		return broker.ErrTaskNotFound
	case code == -99:
		return fmt.Errorf("%w: cannot %s task %s: its record is unreadable (delete it instead)", broker.ErrTaskState, op, id)
	case code == -96:
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, queue, id)
	case code == -97:
		return fmt.Errorf("%w (task %s/%s)", broker.ErrFlowStep, queue, id)
	case code == -98:
		return fmt.Errorf("%w: cannot %s task %s now: a repartition is moving it; try again", broker.ErrUnavailable, op, id)
	case code < 0:
		return fmt.Errorf("%w: cannot %s a task that is %s", broker.ErrTaskState, op, tidetype.TaskState(-code))
	}
	return nil
}

// RunTask implements broker.Admin.
func (b *Broker) RunTask(ctx context.Context, queue, id string) error {
	return b.adminOne(ctx, "run", queue, id)
}

// ArchiveTask implements broker.Admin.
func (b *Broker) ArchiveTask(ctx context.Context, queue, id string) error {
	return b.adminOne(ctx, "archive", queue, id)
}

func (b *Broker) adminBulk(ctx context.Context, op, queue string, st tidetype.TaskState, limit int) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if _, ok := stateKey(st); !ok || st == tidetype.StateActive {
		return 0, fmt.Errorf("tide: redisbroker: %s: state %s not allowed", op, st)
	}
	if limit < 1 || limit > maxBulkLimit {
		return 0, fmt.Errorf("tide: redisbroker: %s: limit %d out of range 1..%d", op, limit, maxBulkLimit)
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return 0, err
	}
	total := 0
	for i := 0; i < l.total() && total < limit; i++ {
		// With a request ID, a run again (a lost reply) answers with the
		// first run's count, not with what is left then.
		p := b.partAt(queue, l, i)
		rid, cache, exp, _ := b.request(p)
		c := b.adminCall(p, rid, cache, exp, op, int(st), limit-total)
		b.run(ctx, []*call{c})
		if c.err != nil && p.old && errors.Is(c.err, broker.ErrLayout) && b.retired(ctx, p) {
			continue // retired by the repartition: it holds nothing
		}
		if c.err != nil {
			return total, callErr(fmt.Sprintf("%s %s", op, queue), c.err)
		}
		n, err := c.cmd.Int()
		if err != nil {
			return total, callErr(op, fmt.Errorf("unexpected reply: %w", err))
		}
		total += n
	}
	return total, nil
}

// RunTasks implements broker.Admin.
func (b *Broker) RunTasks(ctx context.Context, queue string, st tidetype.TaskState, limit int) (int, error) {
	return b.adminBulk(ctx, "runall", queue, st, limit)
}

// ArchiveTasks implements broker.Admin.
func (b *Broker) ArchiveTasks(ctx context.Context, queue string, st tidetype.TaskState, limit int) (int, error) {
	return b.adminBulk(ctx, "archiveall", queue, st, limit)
}

// DeleteTasks implements broker.Admin.
func (b *Broker) DeleteTasks(ctx context.Context, queue string, st tidetype.TaskState, limit int) (int, error) {
	return b.adminBulk(ctx, "deleteall", queue, st, limit)
}

// DeleteQueue implements broker.Admin. It looks at every partition, takes
// the queue out of the registry, then deletes each partition's keys in a
// script that checks again that it is empty; a task that arrives meanwhile
// stops it and puts the queue back. A queue with limits keeps them, its
// partition count (their shares are per partition) and what they count
// (recent starts, group throttles and rate windows).
func (b *Broker) DeleteQueue(ctx context.Context, queue string) error {
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return err
	}
	if l.old != nil {
		return fmt.Errorf("%w: queue %q is being repartitioned", broker.ErrQueueNotEmpty, queue)
	}
	qi, err := b.QueueInfo(ctx, queue)
	if err != nil {
		return err
	}
	_, lim, limited, err := b.readLimits(ctx, queue)
	if err != nil {
		return err
	}
	// Limits are the queue's configuration, not its bookkeeping: they stay,
	// with the partitions they are shared on and what they count.
	keep := limited && lim != (tidetype.QueueLimits{})
	if qi.Size > 0 {
		what := "tasks"
		if qi.Size == 1 {
			what = "task"
		}
		return fmt.Errorf("%w: queue %q holds %d %s", broker.ErrQueueNotEmpty, queue, qi.Size, what)
	}
	restore := func() {
		pipe := b.rdb.Pipeline()
		pipe.SAdd(ctx, b.prefix+":queues", queue)
		pipe.HSetNX(ctx, b.prefix+":partitions", queue, l.tag)
		_, _ = pipe.Exec(ctx)
	}
	pipe := b.rdb.Pipeline()
	pipe.SRem(ctx, b.prefix+":queues", queue)
	// A repartitioned queue keeps its layout too: recorded anew with the
	// configured count, it would be on the partitions the repartition
	// retired, whose meta keys refuse every layout for good.
	keepLayout := keep || l.cur.epoch > 0
	if !keepLayout {
		pipe.HDel(ctx, b.prefix+":partitions", queue)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return callErr("delete queue "+queue, classify(err))
	}
	b.forgetLayout(queue)
	keepArg := "0"
	if keep {
		keepArg = "1"
	}
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		if l.cur.n > 1 {
			if err := b.dropPointers(ctx, queue, l, p); err != nil {
				restore()
				return err
			}
		}
		// The events stream goes with the partition's other keys.
		n, err := b.s.drop.Run(ctx, b.rdb, append(b.moveKeys(p), p.k(eventsKey)), p.layout, keepArg, flag(keepLayout)).Int()
		if err != nil {
			restore()
			return callErr("delete queue "+queue, classify(err))
		}
		if n > 0 {
			restore()
			return fmt.Errorf("%w: a task arrived in queue %q while it was deleted; it is kept", broker.ErrQueueNotEmpty, queue)
		}
		b.rdb.Del(ctx, p.k("x"), p.k("xr")) // the task index's, not among drop.lua's keys
	}
	if keep {
		return nil
	}
	return b.forgetLimits(ctx, queue, l)
}
