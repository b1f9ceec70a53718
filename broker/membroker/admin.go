package membroker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// dayCount holds one UTC day's counters of a queue.
type dayCount struct{ processed, failed int }

// minuteCount holds one minute's counters of a queue for the live view.
type minuteCount struct{ processed, failed, pending int }

// minute returns the counters of now's minute, dropping those older than
// two hours.
func (q *queue) minute(now time.Time) *minuteCount {
	if q.minutes == nil {
		q.minutes = map[int64]*minuteCount{}
	}
	m := now.Unix() / 60
	c := q.minutes[m]
	if c == nil {
		c = &minuteCount{pending: -1}
		q.minutes[m] = c
		for k := range q.minutes {
			if k < m-120 {
				delete(q.minutes, k)
			}
		}
	}
	return c
}

// count adds to today's counters; days older than 90 are dropped.
func (q *queue) count(now time.Time, processed, failed int) {
	mc := q.minute(now)
	mc.processed += processed
	mc.failed += failed
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
	server    tidetype.ServerInfo
	entries   []tidetype.SchedulerEntry
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

// QueueInfo implements broker.Admin.
func (b *Broker) QueueInfo(ctx context.Context, name string) (*tidetype.QueueInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	st := &tidetype.QueueInfo{Queue: name}
	q := b.queues[name]
	if q == nil {
		return st, nil
	}
	for _, t := range q.tasks {
		s := t.msg.State
		if s == tidetype.StateWaiting {
			s = tidetype.StateRetry // counted with them, as in the Redis broker
		}
		st.SetCount(s, st.Count(s)+1)
		if t.msg.State == tidetype.StatePending && (st.OldestPending.IsZero() || t.msg.NextProcessAt.Before(st.OldestPending)) {
			st.OldestPending = t.msg.NextProcessAt
		}
	}
	if now := b.clock.Now(); q.isPaused(now) {
		st.Paused, st.PausedUntil = true, q.pausedUntil
	}
	if d := q.days[b.clock.Now().UTC().Format(time.DateOnly)]; d != nil {
		st.Processed, st.Failed = d.processed, d.failed
	}
	if !st.OldestPending.IsZero() {
		st.Latency = max(b.clock.Now().Sub(st.OldestPending), 0)
	}
	overdue := b.clock.Now().Add(-time.Second)
	for _, t := range q.sched {
		if !t.key.After(overdue) {
			st.Overdue++
		}
	}
	return st, nil
}

// History implements broker.Admin.
func (b *Broker) History(ctx context.Context, name string, days int) ([]tidetype.DailyStats, error) {
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
	out := make([]tidetype.DailyStats, days)
	q := b.queues[name]
	for i := range out {
		out[i].Queue, out[i].Date = name, start.AddDate(0, 0, -i)
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
func (b *Broker) ListTasks(ctx context.Context, name string, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if offset < 0 || limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("membroker: list tasks: offset %d / limit %d out of range (limit 1..1000)", offset, limit)
	}
	ts, err := b.inState(name, state, offset+limit)
	if err != nil || offset >= len(ts) {
		return nil, err
	}
	ts = ts[offset:min(offset+limit, len(ts))]
	out := make([]*tidetype.TaskInfo, len(ts))
	for i, t := range ts {
		out[i] = b.info(t)
	}
	return out, nil
}

// inState returns the tasks of queue name in state in the order of
// ListTasks, at least the first n of them (all for the sorted states).
func (b *Broker) inState(name string, state tidetype.TaskState, n int) ([]*task, error) {
	q := b.queues[name]
	if q == nil {
		if !state.Valid() {
			return nil, fmt.Errorf("membroker: list tasks: unknown state %d", state)
		}
		return nil, nil
	}
	var ts []*task
	switch state {
	case tidetype.StatePending:
		ts = q.pendingTasks(n)
	case tidetype.StateActive, tidetype.StateArchived, tidetype.StateCompleted, tidetype.StateScheduled, tidetype.StateRetry, tidetype.StateWaiting:
		h := map[tidetype.TaskState]taskHeap{tidetype.StateActive: q.active, tidetype.StateArchived: q.archived,
			tidetype.StateCompleted: q.completed, tidetype.StateScheduled: q.sched, tidetype.StateRetry: q.sched, tidetype.StateWaiting: q.sched}[state]
		for _, t := range h {
			// Waiting tasks lie with the retry tasks (as in the Redis
			// broker): listing either lists both.
			if t.msg.State == state || (state == tidetype.StateRetry && t.msg.State == tidetype.StateWaiting) ||
				(state == tidetype.StateWaiting && t.msg.State == tidetype.StateRetry) {
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
	return ts, nil
}

// info is what the Admin and GetTask show of t: a copy, with its attempts
// and, when active, its lease's expiry.
func (b *Broker) info(t *task) *tidetype.TaskInfo {
	m := clone(&t.msg)
	m.Attempts = slices.Clone(t.attempts)
	if t.msg.State == tidetype.StateActive {
		m.LeaseExpiresAt = t.key
	}
	broker.StepInfos(m, t.dur)
	return m
}

// SearchTasks implements broker.Admin.
func (b *Broker) SearchTasks(ctx context.Context, name string, state tidetype.TaskState, f tidetype.TaskFilter, offset, limit int) ([]*tidetype.TaskInfo, int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, -1, err
	}
	if offset < 0 || limit < 1 || limit > 1000 {
		return nil, -1, fmt.Errorf("membroker: search tasks: offset %d / limit %d out of range (limit 1..1000)", offset, limit)
	}
	ts, err := b.inState(name, state, math.MaxInt)
	if err != nil {
		return nil, -1, err
	}
	var out []*tidetype.TaskInfo
	for i := offset; i < len(ts); i++ {
		// Retry and waiting tasks lie together: a search of either keeps
		// its own state only.
		if m := b.info(ts[i]); f.Match(m) && m.State == state {
			out = append(out, m)
			if len(out) == limit {
				return out, i + 1, nil
			}
		}
	}
	return out, -1, nil
}

// Series implements broker.Admin.
func (b *Broker) Series(ctx context.Context, name string, since time.Time) ([]tidetype.Point, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	first, last := since.Unix()/60, b.clock.Now().Unix()/60
	if last-first > 180 {
		first = last - 180
	}
	q := b.queues[name]
	pts := make([]tidetype.Point, 0, last-first+1)
	for m := first; m <= last; m++ {
		p := tidetype.Point{At: time.Unix(m*60, 0).UTC(), Pending: -1}
		if q != nil {
			if c := q.minutes[m]; c != nil {
				p.Processed, p.Failed, p.Pending = c.processed, c.failed, c.pending
			}
		}
		pts = append(pts, p)
	}
	return pts, nil
}

// StoreInfo implements broker.Admin.
func (b *Broker) StoreInfo(ctx context.Context) (*tidetype.StoreInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	return &tidetype.StoreInfo{Kind: "memory", Mode: "in-process", Nodes: 1, EvictionPolicy: "noeviction"}, nil
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
	case tidetype.StateScheduled, tidetype.StateRetry, tidetype.StateArchived:
	case tidetype.StateWaiting:
		t.wakeNow(b.clock.Now())
	default:
		return fmt.Errorf("%w: cannot run a task that is %s", broker.ErrTaskState, t.msg.State)
	}
	if t.msg.State == tidetype.StateArchived && t.msg.Headers[broker.FlowHeader] != "" {
		return fmt.Errorf("%w (task %s/%s)", broker.ErrFlowStep, name, t.msg.ID)
	}
	q.detach(t)
	t.msg.NextProcessAt = msTime(b.clock.Now())
	b.pushPending(name, q, t, true)
	b.event(q, t, tidetype.EventRetrying, "")
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
	case tidetype.StatePending, tidetype.StateScheduled, tidetype.StateRetry, tidetype.StateWaiting:
	default:
		return fmt.Errorf("%w: cannot archive a task that is %s", broker.ErrTaskState, t.msg.State)
	}
	if t.flowFollowup() {
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, t.msg.Queue, t.msg.ID)
	}
	q.detach(t)
	now := msTime(b.clock.Now())
	last := t.msg.LastErr
	b.archive(q, t, "", now, now) // the event says no error: an operator archived it
	t.msg.LastErr = last
	b.release(q, t, false, true)
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

// bulk applies op to up to limit tasks of name in state, passing over those
// skip says op would refuse.
func (b *Broker) bulk(ctx context.Context, name string, state tidetype.TaskState, limit int, skip func(t *task) bool, op func(q *queue, t *task) error) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	if state == tidetype.StateActive || !state.Valid() {
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
		if (t.msg.State == state || (state == tidetype.StateRetry && t.msg.State == tidetype.StateWaiting)) && (skip == nil || !skip(t)) {
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
func (b *Broker) RunTasks(ctx context.Context, name string, state tidetype.TaskState, limit int) (int, error) {
	archivedStep := func(t *task) bool {
		return t.msg.State == tidetype.StateArchived && t.msg.Headers[broker.FlowHeader] != ""
	}
	return b.bulk(ctx, name, state, limit, archivedStep, func(q *queue, t *task) error { return b.run(name, q, t) })
}

// ArchiveTasks implements broker.Admin.
func (b *Broker) ArchiveTasks(ctx context.Context, name string, state tidetype.TaskState, limit int) (int, error) {
	return b.bulk(ctx, name, state, limit, (*task).flowFollowup, b.archiveOne)
}

// DeleteTasks implements broker.Admin.
func (b *Broker) DeleteTasks(ctx context.Context, name string, state tidetype.TaskState, limit int) (int, error) {
	return b.bulk(ctx, name, state, limit, (*task).flowFollowup, func(q *queue, t *task) error {
		b.dropOrFail(name, q, t, "tide: deleted by an operator", tidetype.EventDeleted)
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
	if t.flowFollowup() {
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, name, id)
	}
	if t.msg.State != tidetype.StateActive {
		return fmt.Errorf("%w: cannot cancel task %s: it is %s, not active", broker.ErrTaskState, id, t.msg.State)
	}
	if !t.canceled {
		b.event(q, t, tidetype.EventCancelled, "")
	}
	t.canceled = true
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

// RegisterServer implements broker.Registry.
func (b *Broker) RegisterServer(ctx context.Context, s tidetype.ServerInfo, ttl time.Duration) error {
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

// UnregisterServer implements broker.Registry.
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
func (b *Broker) Servers(ctx context.Context) ([]tidetype.ServerInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var out []tidetype.ServerInfo
	for k, e := range b.registry() {
		if strings.HasPrefix(k, "server:") {
			out = append(out, e.server)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RegisterSchedulerEntries implements broker.Registry.
func (b *Broker) RegisterSchedulerEntries(ctx context.Context, id string, entries []tidetype.SchedulerEntry, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	b.registry()["scheduler:"+id] = &registryEntry{entries: slices.Clone(entries), expiresAt: b.clock.Now().Add(ttl)}
	return nil
}

// SchedulerEntries implements broker.Admin.
func (b *Broker) SchedulerEntries(ctx context.Context) ([]tidetype.SchedulerEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var out []tidetype.SchedulerEntry
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

// DeleteQueue implements broker.Admin. A queue with limits keeps them,
// with its starts and its groups' throttles and rate windows, until it
// comes back (or SetQueueLimits removes them).
func (b *Broker) DeleteQueue(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	q := b.queues[name]
	if q == nil {
		return nil
	}
	if n := len(q.tasks); n > 0 {
		what := "tasks"
		if n == 1 {
			what = "task"
		}
		return fmt.Errorf("%w: queue %q holds %d %s", broker.ErrQueueNotEmpty, name, n, what)
	}
	delete(b.queues, name) // subscribers are attached again if it comes back (see queue)
	if q.limits != (tidetype.QueueLimits{}) {
		// Limits are the queue's configuration, not its bookkeeping: they
		// stay, with what they count, for the queue to take up again.
		for _, g := range q.groups {
			g.inRot, g.prev, g.next = false, nil, nil // no task is left to serve
		}
		b.kept[name] = &keptLimits{limits: q.limits, starts: q.starts, groups: q.groups, held: q.held}
	}
	return nil
}

// Repartition implements broker.Repartitioner: the in-memory broker has no
// partitions, so it answers with an error wrapping broker.ErrNotSupported.
func (b *Broker) Repartition(ctx context.Context, queue string, n int, progress func(moved, left int)) error {
	return fmt.Errorf("%w: the in-memory broker has no partitions to change", broker.ErrNotSupported)
}

// keptLimits is what a queue deleted with limits keeps (DeleteQueue): its
// limits, its starts, and its groups' throttles and rate windows.
type keptLimits struct {
	limits tidetype.QueueLimits
	starts []time.Time
	groups map[string]*group
	held   map[*group]struct{}
}
