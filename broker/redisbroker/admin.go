package redisbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/codec"
)

var _ broker.Admin = (*Broker)(nil)

// maxListLimit bounds one ListTasks page; maxBulkLimit one bulk step.
const (
	maxListLimit = 1000
	maxBulkLimit = 1000
)

// stateKey names the structure holding tasks in state st.
func stateKey(st broker.State) (string, bool) {
	switch st {
	case broker.StatePending:
		return "pending", true
	case broker.StateActive:
		return "active", true
	case broker.StateScheduled:
		return "scheduled", true
	case broker.StateRetry:
		return "retry", true
	case broker.StateArchived:
		return "archived", true
	case broker.StateCompleted:
		return "completed", true
	}
	return "", false
}

var allStates = []broker.State{broker.StatePending, broker.StateActive, broker.StateScheduled, broker.StateRetry, broker.StateArchived, broker.StateCompleted}

// Queues implements broker.Admin.
func (b *Broker) Queues(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	qs, err := b.rdb.SMembers(ctx, b.prefix+":queues").Result()
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: queues: %w", err)
	}
	sort.Strings(qs)
	return qs, nil
}

// QueueStats implements broker.Admin with one pipeline (plus one for the
// oldest pending records).
func (b *Broker) QueueStats(ctx context.Context, queue string) (*broker.QueueStats, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	parts := b.Partitions(queue)
	day := today()
	type partCmds struct {
		sizes    map[broker.State]*redis.IntCmd
		paused   *redis.IntCmd
		proc, fl *redis.StringCmd
		oldest   *redis.StringCmd
	}
	pc := make([]partCmds, parts)
	pipe := b.rdb.Pipeline()
	for p := range parts {
		k := b.keysFor(queue, p)
		c := partCmds{sizes: map[broker.State]*redis.IntCmd{}}
		for _, st := range allStates {
			name, _ := stateKey(st)
			if st == broker.StatePending {
				c.sizes[st] = pipe.LLen(ctx, k.k(name))
			} else {
				c.sizes[st] = pipe.ZCard(ctx, k.k(name))
			}
		}
		c.paused = pipe.Exists(ctx, k.k("paused"))
		c.proc = pipe.Get(ctx, k.k("stat:p:"+day))
		c.fl = pipe.Get(ctx, k.k("stat:f:"+day))
		c.oldest = pipe.LIndex(ctx, k.k("pending"), -1)
		pc[p] = c
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("tide: redisbroker: queue stats %s: %w", queue, err)
	}
	qs := &broker.QueueStats{Queue: queue, Sizes: map[broker.State]int{}}
	for _, st := range allStates {
		qs.Sizes[st] = 0
	}
	var oldest []*redis.StringCmd
	pipe = b.rdb.Pipeline()
	for p, c := range pc {
		for st, cmd := range c.sizes {
			qs.Sizes[st] += int(cmd.Val())
		}
		qs.Paused = qs.Paused || c.paused.Val() == 1
		n, _ := c.proc.Int() // missing key: 0
		f, _ := c.fl.Int()
		qs.Processed += n
		qs.Failed += f
		if id := c.oldest.Val(); id != "" {
			oldest = append(oldest, pipe.HGet(ctx, b.keysFor(queue, p).k("t"), id))
		}
	}
	if len(oldest) > 0 {
		_, _ = pipe.Exec(ctx)
		for _, cmd := range oldest {
			if m, err := codec.DecodeHeader(queue, "", []byte(cmd.Val())); err == nil && !m.ProcessAt.IsZero() {
				if qs.OldestPending.IsZero() || m.ProcessAt.Before(qs.OldestPending) {
					qs.OldestPending = m.ProcessAt
				}
			}
		}
	}
	return qs, nil
}

// History implements broker.Admin.
func (b *Broker) History(ctx context.Context, queue string, days int) ([]broker.DayStats, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if days < 1 || days > 90 {
		return nil, fmt.Errorf("tide: redisbroker: history of %d days: must be 1 to 90", days)
	}
	now := time.Now().UTC()
	start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	out := make([]broker.DayStats, days)
	proc := make([][]*redis.StringCmd, days)
	fail := make([][]*redis.StringCmd, days)
	pipe := b.rdb.Pipeline()
	for d := range days {
		date := start.AddDate(0, 0, -d)
		out[d].Date = date
		day := date.Format(time.DateOnly)
		for p := range b.Partitions(queue) {
			k := b.keysFor(queue, p)
			proc[d] = append(proc[d], pipe.Get(ctx, k.k("stat:p:"+day)))
			fail[d] = append(fail[d], pipe.Get(ctx, k.k("stat:f:"+day)))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("tide: redisbroker: history %s: %w", queue, err)
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

// ListTasks implements broker.Admin. Partitions are listed one after
// another; offset counts across them.
func (b *Broker) ListTasks(ctx context.Context, queue string, state broker.State, offset, limit int) ([]*broker.Message, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	name, ok := stateKey(state)
	if !ok {
		return nil, fmt.Errorf("tide: redisbroker: list tasks: unknown state %d", state)
	}
	if offset < 0 || limit < 1 || limit > maxListLimit {
		return nil, fmt.Errorf("tide: redisbroker: list tasks: offset %d / limit %d out of range (limit 1..%d)", offset, limit, maxListLimit)
	}
	var ids []string
	var from []int // partition of each id
	for p := 0; p < b.Partitions(queue) && len(ids) < limit; p++ {
		k := b.keysFor(queue, p)
		var size int64
		var err error
		if state == broker.StatePending {
			size, err = b.rdb.LLen(ctx, k.k(name)).Result()
		} else {
			size, err = b.rdb.ZCard(ctx, k.k(name)).Result()
		}
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: list tasks: %w", err)
		}
		if int64(offset) >= size {
			offset -= int(size)
			continue
		}
		want := int64(limit - len(ids))
		var page []string
		if state == broker.StatePending {
			// Oldest first: the list is consumed from its right end.
			stop := -1 - int64(offset)
			page, err = b.rdb.LRange(ctx, k.k(name), stop-want+1, stop).Result()
			slices.Reverse(page)
		} else {
			page, err = b.rdb.ZRange(ctx, k.k(name), int64(offset), int64(offset)+want-1).Result()
		}
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: list tasks: %w", err)
		}
		offset = 0
		for _, id := range page {
			ids = append(ids, id)
			from = append(from, p)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := b.rdb.Pipeline()
	recs := make([]*redis.StringCmd, len(ids))
	results := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		k := b.keysFor(queue, from[i])
		recs[i] = pipe.HGet(ctx, k.k("t"), id)
		results[i] = pipe.HGet(ctx, k.k("result"), id)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("tide: redisbroker: list tasks: %w", err)
	}
	out := make([]*broker.Message, 0, len(ids))
	for i, id := range ids {
		raw, err := recs[i].Bytes()
		if err != nil {
			continue // finished between the two reads
		}
		m, err := codec.DecodeHeader(queue, id, raw)
		if err != nil {
			m = &broker.Message{ID: id, Queue: queue, State: state, LastErr: err.Error()}
		}
		if r, err := results[i].Bytes(); err == nil {
			m.Result = r
		}
		out = append(out, m)
	}
	return out, nil
}

func (b *Broker) adminKeys(k keys) []string {
	return []string{k.k("t"), k.k("pending"), k.k("scheduled"), k.k("retry"), k.k("archived"), k.k("completed"), k.k("result"), k.k("active")}
}

func (b *Broker) adminOne(ctx context.Context, op, queue, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	k := b.keysFor(queue, b.partOf(queue, id))
	code, err := b.s.admin.Run(ctx, b.rdb, b.adminKeys(k), op, id, 0, time.Now().UnixMilli(), k.channel, k.part, k.k("u:")).Int64()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: %s %s/%s: %w", op, queue, id, err)
	}
	switch {
	case code == 0:
		return broker.ErrTaskNotFound
	case code == -99:
		return fmt.Errorf("tide: cannot %s task %s: its record is unreadable (delete it instead)", op, id)
	case code < 0:
		return fmt.Errorf("tide: cannot %s a task that is %s", op, broker.State(-code))
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

func (b *Broker) adminBulk(ctx context.Context, op, queue string, st broker.State, limit int) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if _, ok := stateKey(st); !ok || st == broker.StateActive {
		return 0, fmt.Errorf("tide: redisbroker: %s: state %s not allowed", op, st)
	}
	if limit < 1 || limit > maxBulkLimit {
		return 0, fmt.Errorf("tide: redisbroker: %s: limit %d out of range 1..%d", op, limit, maxBulkLimit)
	}
	total := 0
	for p := 0; p < b.Partitions(queue) && total < limit; p++ {
		k := b.keysFor(queue, p)
		n, err := b.s.admin.Run(ctx, b.rdb, b.adminKeys(k), op, int(st), limit-total, time.Now().UnixMilli(), k.channel, k.part, k.k("u:")).Int()
		if err != nil {
			return total, fmt.Errorf("tide: redisbroker: %s %s: %w", op, queue, err)
		}
		total += n
	}
	return total, nil
}

// RunTasks implements broker.Admin.
func (b *Broker) RunTasks(ctx context.Context, queue string, st broker.State, limit int) (int, error) {
	return b.adminBulk(ctx, "runall", queue, st, limit)
}

// ArchiveTasks implements broker.Admin.
func (b *Broker) ArchiveTasks(ctx context.Context, queue string, st broker.State, limit int) (int, error) {
	return b.adminBulk(ctx, "archiveall", queue, st, limit)
}

// DeleteTasks implements broker.Admin.
func (b *Broker) DeleteTasks(ctx context.Context, queue string, st broker.State, limit int) (int, error) {
	return b.adminBulk(ctx, "deleteall", queue, st, limit)
}

// CancelProcessing implements broker.Admin: it publishes a cancel event on
// the queue's channel; the server running the task cancels its handler.
func (b *Broker) CancelProcessing(ctx context.Context, queue, id string) error {
	m, err := b.GetTask(ctx, queue, id)
	if err != nil {
		return err
	}
	if m.State != broker.StateActive {
		return fmt.Errorf("tide: cannot cancel task %s: it is %s, not active", id, m.State)
	}
	if err := b.rdb.Publish(ctx, b.channel(queue), "c"+id).Err(); err != nil {
		return fmt.Errorf("tide: redisbroker: cancel: %w", err)
	}
	return nil
}

// registry stores JSON records under <prefix>:<kind>:<id> with a TTL, indexed
// by the sorted set <prefix>:<kind>s (score = expiry), so listing needs no
// key scan.
func (b *Broker) registryPut(ctx context.Context, kind, id string, v any, ttl time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("tide: redisbroker: register %s: %w", kind, err)
	}
	pipe := b.rdb.Pipeline()
	pipe.Set(ctx, b.prefix+":"+kind+":"+id, data, ttl)
	pipe.ZAdd(ctx, b.prefix+":"+kind+"s", redis.Z{Score: float64(time.Now().Add(ttl).UnixMilli()), Member: id})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: register %s: %w", kind, err)
	}
	return nil
}

func (b *Broker) registryDel(ctx context.Context, kind, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	pipe := b.rdb.Pipeline()
	pipe.Del(ctx, b.prefix+":"+kind+":"+id)
	pipe.ZRem(ctx, b.prefix+":"+kind+"s", id)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: unregister %s: %w", kind, err)
	}
	return nil
}

// registryList returns the raw records of live entries and drops expired ones
// from the index.
func (b *Broker) registryList(ctx context.Context, kind string) ([][]byte, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	idx := b.prefix + ":" + kind + "s"
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	b.rdb.ZRemRangeByScore(ctx, idx, "-inf", "("+now)
	ids, err := b.rdb.ZRange(ctx, idx, 0, 999).Result()
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: list %ss: %w", kind, err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	ks := make([]string, len(ids))
	for i, id := range ids {
		ks[i] = b.prefix + ":" + kind + ":" + id
	}
	// One GET per key: on a cluster the keys live in different slots.
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ks))
	for i, k := range ks {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	var out [][]byte
	for _, c := range cmds {
		if v, err := c.Bytes(); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// RegisterServer implements broker.Admin.
func (b *Broker) RegisterServer(ctx context.Context, s broker.ServerInfo, ttl time.Duration) error {
	return b.registryPut(ctx, "server", s.ID, s, ttl)
}

// UnregisterServer implements broker.Admin.
func (b *Broker) UnregisterServer(ctx context.Context, id string) error {
	return b.registryDel(ctx, "server", id)
}

// Servers implements broker.Admin.
func (b *Broker) Servers(ctx context.Context) ([]broker.ServerInfo, error) {
	raws, err := b.registryList(ctx, "server")
	if err != nil {
		return nil, err
	}
	out := make([]broker.ServerInfo, 0, len(raws))
	for _, r := range raws {
		var s broker.ServerInfo
		if json.Unmarshal(r, &s) == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RegisterSchedulerEntries implements broker.Admin.
func (b *Broker) RegisterSchedulerEntries(ctx context.Context, schedulerID string, entries []broker.SchedulerEntry, ttl time.Duration) error {
	return b.registryPut(ctx, "scheduler", schedulerID, entries, ttl)
}

// SchedulerEntries implements broker.Admin.
func (b *Broker) SchedulerEntries(ctx context.Context) ([]broker.SchedulerEntry, error) {
	raws, err := b.registryList(ctx, "scheduler")
	if err != nil {
		return nil, err
	}
	var out []broker.SchedulerEntry
	for _, r := range raws {
		var es []broker.SchedulerEntry
		if json.Unmarshal(r, &es) == nil {
			out = append(out, es...)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].SchedulerID != out[j].SchedulerID {
			return out[i].SchedulerID < out[j].SchedulerID
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
