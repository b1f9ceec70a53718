package membroker

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Groups (tidetype.TaskInfo.Group).
//
// A queue serves its ready tasks through a rotation of lanes: one lane per
// group with ready tasks, and the queue's plain lane for the ungrouped tasks
// (its pending list). Dequeue takes the lane at the front, starts its next
// task and puts it at the back, so the lane served least recently goes
// first, one task per turn. A lane that joins the rotation goes to the back.
//
// A group that may not start a task leaves the rotation: at the start after
// which it may not start another (Ordered, its rate used up) or at the
// first turn that finds it at its concurrency limit, and a task made ready
// does not bring it back while it is blocked, so Dequeue looks at a blocked
// group at most once each time it blocks. At its concurrency limit or
// while an earlier task of an ordered group has not finished, it comes back
// when one of its tasks leaves active or finishes; while throttled or over
// its rate it is held until a time (queue.held) and comes back at the first
// Dequeue from then on.

// group is one group of a queue: its ready tasks and what limits it.
type group struct {
	name     string
	ready    taskHeap    // ready (pending) tasks, by enqueue sequence (addReady)
	active   int         // active tasks
	holder   *task       // Ordered: the started task that holds the group's place until it finishes
	throttle time.Time   // no task starts before (a throttling settlement)
	starts   []time.Time // start times (ms) within GroupRate.Per, oldest first
	until    time.Time   // held out of the rotation until then; zero when not held

	inRot      bool
	prev, next *group // rotation
}

// ---- rotation ----

// rotPush puts lane g at the back of the rotation.
func (q *queue) rotPush(g *group) {
	if g.inRot {
		return
	}
	g.inRot, g.prev, g.next = true, q.rotTail, nil
	if q.rotTail != nil {
		q.rotTail.next = g
	} else {
		q.rotHead = g
	}
	q.rotTail = g
}

// rotRemove takes lane g out of the rotation.
func (q *queue) rotRemove(g *group) {
	if !g.inRot {
		return
	}
	if g.prev != nil {
		g.prev.next = g.next
	} else {
		q.rotHead = g.next
	}
	if g.next != nil {
		g.next.prev = g.prev
	} else {
		q.rotTail = g.prev
	}
	g.inRot, g.prev, g.next = false, nil, nil
}

// ---- ready tasks ----

// group returns the group named name, created when missing.
func (q *queue) group(name string) *group {
	g := q.groups[name]
	if g == nil {
		g = &group{name: name}
		q.groups[name] = g
	}
	return g
}

// addReady adds a grouped task to its group's ready tasks (the caller counts
// it in q.pending) and reports whether the group joined the rotation: it
// joins unless it is held until a time or blocked.
func (q *queue) addReady(t *task) bool {
	g := q.group(t.msg.Group)
	t.key, t.seq = time.Time{}, t.eseq // a taskHeap of equal keys orders by seq
	heap.Push(&g.ready, t)
	if g.inRot || !g.until.IsZero() || q.blocked(g, t) {
		return false
	}
	q.rotPush(g)
	return true
}

// blocked reports whether group g may not start a task for a reason that a
// settlement or a removal ends: it runs GroupConcurrency tasks, or an
// Ordered group's place is held by a task other than t (nil: any) that is
// not ready.
func (q *queue) blocked(g *group, t *task) bool {
	l := q.limits
	if l.GroupConcurrency > 0 && g.active >= l.GroupConcurrency {
		return true
	}
	return l.Ordered && g.holder != nil && g.holder != t && g.holder.msg.State != tidetype.StatePending
}

// unready takes a ready grouped task out of its group's ready tasks.
func (q *queue) unready(t *task) {
	if g := q.groups[t.msg.Group]; g != nil && t.idx >= 0 && t.idx < len(g.ready) && g.ready[t.idx] == t {
		heap.Remove(&g.ready, t.idx)
		q.pending--
	}
}

// next takes the task Dequeue starts next from q at now, or returns nil
// when no lane may start one. It counts the start against the task's
// group; the caller makes the task active.
func (b *Broker) next(q *queue, now time.Time) *task {
	l := q.limits
	for g := q.rotHead; g != nil; g = q.rotHead {
		q.rotRemove(g)
		if g == &q.plain {
			t := q.head
			if t == nil {
				continue
			}
			q.unlinkPending(t)
			if q.head != nil {
				q.rotPush(g)
			}
			return t
		}
		if len(g.ready) == 0 {
			continue
		}
		t := g.ready[0]
		if l.Ordered && g.holder != nil && g.holder.msg.State == tidetype.StatePending {
			t = g.holder // back from retry or requeued: it still holds the place
		}
		switch {
		case g.throttle.After(now):
			b.hold(q, g, g.throttle)
			continue
		case l.GroupConcurrency > 0 && g.active >= l.GroupConcurrency:
			continue // back when one of its tasks leaves active
		case l.Ordered && g.holder != nil && g.holder != t:
			continue // back when the holder finishes or is ready again
		}
		r := l.GroupRate
		if r.Limit > 0 {
			g.prune(r.Per, now)
			if len(g.starts) >= r.Limit {
				b.hold(q, g, g.starts[len(g.starts)-r.Limit].Add(r.Per))
				continue
			}
			g.starts = append(g.starts, msTime(now))
		}
		heap.Remove(&g.ready, t.idx)
		q.pending--
		g.active++
		if l.Ordered {
			g.holder = t
		}
		// It stays in the rotation while it may start another task, and at
		// its concurrency limit (as in the Redis broker: a turn that finds
		// it still there takes it out).
		switch {
		case len(g.ready) == 0, l.Ordered:
			// back when a task is ready, or when its task finishes
		case r.Limit > 0 && len(g.starts) >= r.Limit:
			b.hold(q, g, g.starts[len(g.starts)-r.Limit].Add(r.Per))
		default:
			q.rotPush(g)
		}
		return t
	}
	return nil
}

// prune drops the start times that left the window of length per ending at
// now.
func (g *group) prune(per time.Duration, now time.Time) {
	now = msTime(now)
	i := 0
	for i < len(g.starts) && now.Sub(g.starts[i]) >= per {
		i++
	}
	g.starts = g.starts[i:]
}

// hold takes g out of the rotation until at and, when g has ready tasks,
// tells subscribers (once per time) when they may start.
func (b *Broker) hold(q *queue, g *group, at time.Time) {
	q.rotRemove(g)
	if at.After(g.until) {
		g.until = at
	}
	q.held[g] = struct{}{}
	if len(g.ready) > 0 && !g.until.Equal(q.groupWake) && !q.isPaused(b.clock.Now()) {
		q.groupWake = g.until
		b.emit(q, broker.Event{Kind: broker.EventPending, Queue: q.name, At: g.until})
	}
}

// wake puts the groups held until now or earlier back in the rotation,
// earliest first.
func (q *queue) wake(now time.Time) {
	var due []*group
	for g := range q.held {
		if !now.Before(g.until) {
			due = append(due, g)
		}
	}
	slices.SortFunc(due, func(x, y *group) int { return cmp.Or(x.until.Compare(y.until), cmp.Compare(x.name, y.name)) })
	for _, g := range due {
		delete(q.held, g)
		g.until = time.Time{}
		if len(g.ready) > 0 && !q.blocked(g, nil) {
			q.rotPush(g)
		}
	}
}

// ---- releases ----

// release is called when grouped task t leaves active (left: settled or
// recovered) and/or finishes (finished: done, archived, deleted or
// replaced, which frees the place an ordered group's task holds). The group
// goes back in the rotation when it has ready tasks and may start one (not
// held until a time, not blocked); subscribers learn when it was out of it.
func (b *Broker) release(q *queue, t *task, left, finished bool) {
	if t.msg.Group == "" {
		return
	}
	g := q.groups[t.msg.Group]
	if g == nil {
		return
	}
	if left && g.active > 0 {
		g.active--
	}
	if finished && g.holder == t {
		g.holder = nil
	}
	now := b.clock.Now()
	if len(g.ready) > 0 && !g.inRot && g.until.IsZero() && !q.blocked(g, nil) {
		q.rotPush(g)
		if !q.isPaused(now) {
			b.emit(q, broker.Event{Kind: broker.EventPending, Queue: q.name})
		}
	}
	q.dropIdle(g, now)
}

// throttle holds t's group back until at: no task of it starts before.
func (b *Broker) throttle(q *queue, t *task, at time.Time) {
	if t.msg.Group == "" {
		return
	}
	g := q.group(t.msg.Group)
	if at.After(g.throttle) {
		g.throttle = at
	}
	b.hold(q, g, g.throttle)
}

// drop deletes t, which is not active, from q: a deleted task finishes.
func (b *Broker) drop(q *queue, t *task) {
	finished := t.msg.State == tidetype.StateArchived || t.msg.State == tidetype.StateCompleted
	q.detach(t)
	q.releaseLock(t)
	delete(q.tasks, t.msg.ID)
	b.release(q, t, false, true)
	if !finished { // a finished task's end was told when it finished
		b.ended(q, t, true, nil, b.clock.Now())
	}
}

// dropIdle forgets g when nothing is left of it: no ready or active task,
// no place held, no hold and no start within the rate's window.
func (q *queue) dropIdle(g *group, now time.Time) {
	if g.inRot || len(g.ready) > 0 || g.active > 0 || g.holder != nil || !g.until.IsZero() || g.throttle.After(now) {
		return
	}
	if r := q.limits.GroupRate; r.Limit > 0 {
		if g.prune(r.Per, now); len(g.starts) > 0 {
			return
		}
	}
	delete(q.groups, g.name)
}

// sweepGroups forgets the idle groups of q (Maintain).
func (q *queue) sweepGroups(now time.Time) {
	q.wake(now)
	for _, g := range q.groups {
		q.dropIdle(g, now)
	}
}

// limitsChanged applies new limits to q's groups: a group held back by its
// rate goes back in, and one out of the rotation for its concurrency or
// order goes back in unless the new limits block it too.
func (q *queue) limitsChanged(now time.Time) {
	if q.limits.GroupRate.Limit == 0 {
		for _, g := range q.groups {
			g.starts = nil
		}
	}
	for g := range q.held {
		if g.throttle.After(now) {
			g.until = g.throttle
			continue
		}
		delete(q.held, g)
		g.until = time.Time{}
	}
	names := make([]string, 0, len(q.groups))
	for n := range q.groups {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if g := q.groups[n]; len(g.ready) > 0 && g.until.IsZero() && !q.blocked(g, nil) {
			q.rotPush(g)
		}
	}
}

// ---- listings ----

// pendingTasks returns at least the first n ready tasks of q (all when it
// has groups), oldest first: the pending list merged with the grouped
// tasks by due time.
func (q *queue) pendingTasks(n int) []*task {
	var ts []*task
	if len(q.groups) == 0 {
		for t := q.head; t != nil && len(ts) < n; t = t.next {
			ts = append(ts, t)
		}
		return ts
	}
	var grouped []*task
	for _, g := range q.groups {
		grouped = append(grouped, g.ready...)
	}
	slices.SortFunc(grouped, func(x, y *task) int {
		return cmp.Or(x.msg.NextProcessAt.Compare(y.msg.NextProcessAt), cmp.Compare(x.eseq, y.eseq))
	})
	t := q.head
	for t != nil || len(grouped) > 0 {
		if t != nil && (len(grouped) == 0 || !grouped[0].msg.NextProcessAt.Before(t.msg.NextProcessAt)) {
			ts = append(ts, t)
			t = t.next
		} else {
			ts = append(ts, grouped[0])
			grouped = grouped[1:]
		}
	}
	return ts
}

// Groups implements broker.Admin. ThrottledUntil is the end of a throttle
// or, for a group with tasks waiting, of the hold of its rate limit.
func (b *Broker) Groups(ctx context.Context, queue string, n int) ([]tidetype.GroupInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if n < 1 || n > broker.MaxGroupsListed {
		return nil, fmt.Errorf("%w: membroker: Groups(%q, %d): n must be 1 to %d", broker.ErrInvalidTask, queue, n, broker.MaxGroupsListed)
	}
	q := b.queues[queue]
	if q == nil {
		return nil, nil
	}
	now := b.clock.Now()
	var out []tidetype.GroupInfo
	for _, g := range q.groups {
		gi := tidetype.GroupInfo{Queue: queue, Group: g.name, Waiting: len(g.ready), Running: g.active}
		if g.throttle.After(now) {
			gi.ThrottledUntil = g.throttle
		}
		if r := q.limits.GroupRate; r.Limit > 0 && gi.Waiting > 0 {
			if g.prune(r.Per, now); len(g.starts) >= r.Limit {
				if at := g.starts[0].Add(r.Per); at.After(gi.ThrottledUntil) {
					gi.ThrottledUntil = at
				}
			}
		}
		if gi.Waiting > 0 || gi.Running > 0 || !gi.ThrottledUntil.IsZero() {
			out = append(out, gi)
		}
	}
	slices.SortFunc(out, func(x, y tidetype.GroupInfo) int {
		return cmp.Or(cmp.Compare(y.Waiting, x.Waiting), cmp.Compare(x.Group, y.Group))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, nil
}
