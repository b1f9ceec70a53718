package membroker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
)

var _ broker.Admin = (*Broker)(nil)

// dayCount holds one UTC day's counters of a queue.
type dayCount struct{ processed, failed int }

// count adds to today's counters; days older than 90 are dropped.
func (q *queue) count(now time.Time, processed, failed int) {
	if q.days == nil {
		q.days = map[string]*dayCount{}
	}
	day := now.UTC().Format(time.DateOnly)
	d := q.days[day]
	if d == nil {
		d = &dayCount{}
		q.days[day] = d
		cutoff := now.UTC().AddDate(0, 0, -90).Format(time.DateOnly)
		for k := range q.days {
			if k < cutoff {
				delete(q.days, k)
			}
		}
	}
	d.processed += processed
	d.failed += failed
}

// registryEntry is a server or scheduler record with its expiry.
type registryEntry struct {
	server    broker.ServerInfo
	entries   []broker.SchedulerEntry
	expiresAt time.Time
}

// Queues implements broker.Admin.
func (b *Broker) Queues(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	qs := slices.Collect(maps.Keys(b.queues))
	sort.Strings(qs)
	return qs, nil
}

// QueueStats implements broker.Admin.
func (b *Broker) QueueStats(ctx context.Context, name string) (*broker.QueueStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	st := &broker.QueueStats{Queue: name, Sizes: map[broker.State]int{}}
	for s := broker.StatePending; s <= broker.StateCompleted; s++ {
		st.Sizes[s] = 0
	}
	q := b.queues[name]
	if q == nil {
		return st, nil
	}
	for _, t := range q.tasks {
		st.Sizes[t.msg.State]++
	}
	st.Paused = q.paused
	if d := q.days[b.clock.Now().UTC().Format(time.DateOnly)]; d != nil {
		st.Processed, st.Failed = d.processed, d.failed
	}
	if q.head != nil {
		st.OldestPending = q.head.msg.ProcessAt
	}
	return st, nil
}

// History implements broker.Admin.
func (b *Broker) History(ctx context.Context, name string, days int) ([]broker.DayStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if days < 1 || days > 90 {
		return nil, fmt.Errorf("membroker: history of %d days: must be 1 to 90", days)
	}
	now := b.clock.Now().UTC()
	start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	out := make([]broker.DayStats, days)
	q := b.queues[name]
	for i := range out {
		out[i].Date = start.AddDate(0, 0, -i)
		if q != nil {
			if d := q.days[out[i].Date.Format(time.DateOnly)]; d != nil {
				out[i].Processed, out[i].Failed = d.processed, d.failed
			}
		}
	}
	return out, nil
}

// ListTasks implements broker.Admin. Pending tasks are listed by walking the
// list; the others are sorted copies of a heap, so a page costs
// O(n log n) in the size of the state: fine in process, where queues are
// small.
func (b *Broker) ListTasks(ctx context.Context, name string, state broker.State, offset, limit int) ([]*broker.Message, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if offset < 0 || limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("membroker: list tasks: offset %d / limit %d out of range (limit 1..1000)", offset, limit)
	}
	q := b.queues[name]
	if q == nil {
		return nil, nil
	}
	var ts []*task
	switch state {
	case broker.StatePending:
		for t := q.head; t != nil && len(ts) < offset+limit; t = t.next {
			ts = append(ts, t)
		}
	case broker.StateActive, broker.StateArchived, broker.StateCompleted, broker.StateScheduled, broker.StateRetry:
		h := map[broker.State]taskHeap{broker.StateActive: q.active, broker.StateArchived: q.archived,
			broker.StateCompleted: q.completed, broker.StateScheduled: q.sched, broker.StateRetry: q.sched}[state]
		for _, t := range h {
			if t.msg.State == state {
				ts = append(ts, t)
			}
		}
		sort.Slice(ts, func(i, j int) bool {
			if !ts[i].key.Equal(ts[j].key) {
				return ts[i].key.Before(ts[j].key)
			}
			return ts[i].seq < ts[j].seq
		})
	default:
		return nil, fmt.Errorf("membroker: list tasks: unknown state %d", state)
	}
	if offset >= len(ts) {
		return nil, nil
	}
	ts = ts[offset:min(offset+limit, len(ts))]
	out := make([]*broker.Message, len(ts))
	for i, t := range ts {
		out[i] = clone(&t.msg)
	}
	return out, nil
}

// RunTask implements broker.Admin.
func (b *Broker) RunTask(ctx context.Context, name, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, t, err := b.find(ctx, name, id)
	if err != nil {
		return err
	}
	return b.run(name, q, t)
}

func (b *Broker) run(name string, q *queue, t *task) error {
	switch t.msg.State {
	case broker.StateScheduled, broker.StateRetry, broker.StateArchived:
	default:
		return fmt.Errorf("tide: cannot run a task that is %s", t.msg.State)
	}
	q.detach(t)
	t.msg.ProcessAt = msTime(b.clock.Now())
	b.pushPending(name, q, t, true)
	return nil
}

// ArchiveTask implements broker.Admin.
func (b *Broker) ArchiveTask(ctx context.Context, name, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, t, err := b.find(ctx, name, id)
	if err != nil {
		return err
	}
	return b.archiveOne(q, t)
}

func (b *Broker) archiveOne(q *queue, t *task) error {
	switch t.msg.State {
	case broker.StatePending, broker.StateScheduled, broker.StateRetry:
	default:
		return fmt.Errorf("tide: cannot archive a task that is %s", t.msg.State)
	}
	q.detach(t)
	now := msTime(b.clock.Now())
	b.archive(q, t, t.msg.LastErr, now, now)
	return nil
}

func (b *Broker) find(ctx context.Context, name, id string) (*queue, *task, error) {
	if err := b.check(ctx); err != nil {
		return nil, nil, err
	}
	q := b.queues[name]
	if q == nil {
		return nil, nil, broker.ErrTaskNotFound
	}
	t := q.tasks[id]
	if t == nil {
		return nil, nil, broker.ErrTaskNotFound
	}
	return q, t, nil
}

// bulk applies op to up to limit tasks of name in state.
func (b *Broker) bulk(ctx context.Context, name string, state broker.State, limit int, op func(q *queue, t *task) error) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	if state == broker.StateActive || state < broker.StatePending || state > broker.StateCompleted {
		return 0, fmt.Errorf("membroker: bulk operation on state %s not allowed", state)
	}
	if limit < 1 {
		return 0, fmt.Errorf("membroker: bulk limit %d must be positive", limit)
	}
	q := b.queues[name]
	if q == nil {
		return 0, nil
	}
	var ts []*task
	for _, t := range q.tasks {
		if t.msg.State == state {
			ts = append(ts, t)
			if len(ts) == limit {
				break
			}
		}
	}
	n := 0
	for _, t := range ts {
		if err := op(q, t); err == nil {
			n++
		}
	}
	return n, nil
}

// RunTasks implements broker.Admin.
func (b *Broker) RunTasks(ctx context.Context, name string, state broker.State, limit int) (int, error) {
	return b.bulk(ctx, name, state, limit, func(q *queue, t *task) error { return b.run(name, q, t) })
}

// ArchiveTasks implements broker.Admin.
func (b *Broker) ArchiveTasks(ctx context.Context, name string, state broker.State, limit int) (int, error) {
	return b.bulk(ctx, name, state, limit, b.archiveOne)
}

// DeleteTasks implements broker.Admin.
func (b *Broker) DeleteTasks(ctx context.Context, name string, state broker.State, limit int) (int, error) {
	return b.bulk(ctx, name, state, limit, func(q *queue, t *task) error {
		q.detach(t)
		q.releaseLock(t)
		delete(q.tasks, t.msg.ID)
		return nil
	})
}

// CancelProcessing implements broker.Admin with an EventCancel to the
// queue's subscribers.
func (b *Broker) CancelProcessing(ctx context.Context, name, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, t, err := b.find(ctx, name, id)
	if err != nil {
		return err
	}
	if t.msg.State != broker.StateActive {
		return fmt.Errorf("tide: cannot cancel task %s: it is %s, not active", id, t.msg.State)
	}
	b.emit(q, broker.Event{Kind: broker.EventCancel, Queue: name, ID: id})
	return nil
}

func (b *Broker) registry() map[string]*registryEntry {
	if b.reg == nil {
		b.reg = map[string]*registryEntry{}
	}
	now := b.clock.Now()
	for k, e := range b.reg {
		if !now.Before(e.expiresAt) {
			delete(b.reg, k)
		}
	}
	return b.reg
}

// RegisterServer implements broker.Admin.
func (b *Broker) RegisterServer(ctx context.Context, s broker.ServerInfo, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	if s.ID == "" {
		return errors.New("membroker: register server: empty ID")
	}
	s.Active = slices.Clone(s.Active)
	s.Queues = maps.Clone(s.Queues)
	b.registry()["server:"+s.ID] = &registryEntry{server: s, expiresAt: b.clock.Now().Add(ttl)}
	return nil
}

// UnregisterServer implements broker.Admin.
func (b *Broker) UnregisterServer(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	delete(b.registry(), "server:"+id)
	return nil
}

// Servers implements broker.Admin.
func (b *Broker) Servers(ctx context.Context) ([]broker.ServerInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var out []broker.ServerInfo
	for k, e := range b.registry() {
		if strings.HasPrefix(k, "server:") {
			out = append(out, e.server)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RegisterSchedulerEntries implements broker.Admin.
func (b *Broker) RegisterSchedulerEntries(ctx context.Context, id string, entries []broker.SchedulerEntry, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	b.registry()["scheduler:"+id] = &registryEntry{entries: slices.Clone(entries), expiresAt: b.clock.Now().Add(ttl)}
	return nil
}

// SchedulerEntries implements broker.Admin.
func (b *Broker) SchedulerEntries(ctx context.Context) ([]broker.SchedulerEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var out []broker.SchedulerEntry
	for k, e := range b.registry() {
		if strings.HasPrefix(k, "scheduler:") {
			out = append(out, e.entries...)
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
