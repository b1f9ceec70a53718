package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// item is one task of an Enqueue with what routing it needs.
type item struct {
	t       *tidetype.TaskInfo
	lay     layout
	own     bool // the broker chose the ID (and may draw again on a proven collision)
	replace bool // EnqueueOptions.Replace, for a task with its own ID
	watch   bool // EnqueueOptions.Watch
	// claim is the nonce and store deadline of the task's claim in its
	// ID's partition (enqueueFree), for enqueue.lua; "" for none.
	claim string
	// looked: the old span of a repartition was looked at for the task's
	// ID already (lookOldSpan), so checkOldSpan leaves it.
	looked bool
	// move: the store of a move under its claim (storeMove): enqueue.lua
	// marks the claim's nonce stored, for the move's repair.
	move bool
}

// maxRedraws bounds how often a broker-chosen ID that met another task is
// drawn again.
const maxRedraws = 5

func validTask(t *tidetype.TaskInfo) error {
	switch {
	case t == nil:
		return fmt.Errorf("%w: nil task", broker.ErrInvalidTask)
	case t.Queue == "" || strings.ContainsAny(t.Queue, "{}"):
		return fmt.Errorf("%w: invalid queue name %q", broker.ErrInvalidTask, t.Queue)
	case t.Type == "":
		return fmt.Errorf("%w: empty task type", broker.ErrInvalidTask)
	case len(t.UniqueKey) > codec.MaxUniqueKey:
		return fmt.Errorf("%w: unique key of %d bytes, over %d", broker.ErrInvalidTask, len(t.UniqueKey), codec.MaxUniqueKey)
	case len(t.IdempotencyKey) > codec.MaxUniqueKey:
		return fmt.Errorf("%w: idempotency key of %d bytes, over %d", broker.ErrInvalidTask, len(t.IdempotencyKey), codec.MaxUniqueKey)
	case len(t.Payload) > codec.MaxBody/2:
		return fmt.Errorf("%w: payload of %d bytes is too large", broker.ErrInvalidTask, len(t.Payload))
	case t.State != tidetype.StatePending && t.State != tidetype.StateScheduled:
		return fmt.Errorf("%w: cannot enqueue a task in state %s", broker.ErrInvalidTask, t.State)
	}
	if err := broker.CheckID(t.ID); err != nil {
		return err
	}
	if t.Group != "" {
		// An ID without the group's tag takes the protocol of freeids.go
		// on several partitions, in Enqueue.
		return broker.CheckGroup(t.Group)
	}
	return nil
}

// Enqueue implements broker.Broker: one script call per partition, all in
// one pipeline. Concurrent calls share round trips: a call made while none
// is on the wire is sent at once; calls made while one is on the wire are
// sent together, in a second round trip once about half the recent
// concurrent callers wait, or when the first returns. A call whose context
// ends while it waits returns the context's error; its tasks may still have
// been stored, as with any timeout. Tasks that a script refused because
// their queue's layout changed since this process read it (a repartition
// by another process; the script stored nothing) are sent again, once,
// with the layout read anew.
func (b *Broker) Enqueue(ctx context.Context, tasks []*tidetype.TaskInfo, opts broker.EnqueueOptions) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for _, t := range tasks {
		if err := validTask(t); err != nil {
			return nil, err
		}
	}
	if len(tasks) == 0 {
		return nil, nil
	}
	var errs []error
	var own []bool
	var todo []int
	if len(tasks) == 1 { // the common single Enqueue: one allocation
		one := new(enqueueState)
		errs, own, todo = one.errs[:], one.own[:], one.todo[:]
	} else {
		errs = make([]error, len(tasks))
		own = make([]bool, len(tasks))
		todo = make([]int, len(tasks))
	}
	for i, t := range tasks {
		own[i], todo[i] = t.ID == "", i
	}
	for attempt := 0; ; attempt++ {
		if err := b.enqueueSome(ctx, tasks, own, todo, opts, errs); err != nil {
			return nil, err
		}
		var again []int
		for _, i := range todo {
			if errors.Is(errs[i], broker.ErrLayout) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || attempt > 0 {
			return errs, nil
		}
		todo = again
	}
}

// enqueueState holds a single Enqueue's outcome, ownership, indexes and
// call, allocated together.
type enqueueState struct {
	errs  [1]error
	own   [1]bool
	todo  [1]int
	calls [1]*call // enqueueNow's
}

// enqueueSome enqueues the tasks at indexes todo, writing their outcomes
// into errs; own tells the tasks whose IDs the broker draws (again, on a
// second attempt: the layout may differ).
func (b *Broker) enqueueSome(ctx context.Context, tasks []*tidetype.TaskInfo, own []bool, todo []int, opts broker.EnqueueOptions, errs []error) error {
	var send, free []item
	var at, freeAt []int
	for _, i := range todo {
		t := tasks[i]
		l, err := b.layoutOf(ctx, t.Queue)
		if err != nil {
			return err
		}
		if own[i] {
			t.ID = ""
		}
		it := item{t: t, lay: l, own: own[i], replace: opts.Replace && !own[i], watch: opts.Watch}
		errs[i] = nil
		switch {
		case t.UniqueKey != "" && !it.own && broker.Partition(storeKey(t), l.cur.n) != broker.Partition(t.UniqueKey, l.cur.n):
			// The task and its lock must share a partition (one script
			// sees both); the caller chose an ID elsewhere.
			errs[i] = fmt.Errorf("%w: Unique cannot be combined with TaskID on queue %q, which has %d partitions; the task ID already makes the task unique",
				broker.ErrInvalidTask, t.Queue, l.cur.n)
		case it.own:
			t.ID = b.drawID(t, l)
		}
		switch {
		case errs[i] != nil:
		case needsPointer(it.t, it.lay) || l.old != nil && broker.FreeGroupID(t.ID, t.Group):
			free, freeAt = append(free, it), append(freeAt, i)
		default:
			send, at = append(send, it), append(at, i)
		}
	}
	// Grouped tasks with IDs of their own away from their group's
	// partition (claim, store, confirm) or on a queue being repartitioned,
	// one at a time.
	for k, i := range freeAt {
		errs[i] = b.enqueueFree(ctx, free[k], opts)
	}
	if len(send) == 0 {
		b.waitHolds(ctx, tasks, todo, errs)
		return nil
	}
	var got []error
	var err error
	if opts.WaitReplicas > 0 {
		// A replica wait can take its whole timeout: never make other
		// callers' tasks share it.
		got, err = b.enqueueNow(ctx, send, opts)
	} else {
		got, err = b.coalesce.enqueue(ctx, send)
	}
	if err != nil {
		return err
	}
	b.freeConflicts(ctx, send, got, opts)
	for j, i := range at {
		errs[i] = got[j]
	}
	b.waitHolds(ctx, tasks, todo, errs)
	return nil
}

// drawID returns a new ID for t. A grouped task's ID carries the group as
// its hash tag. A unique task's ID is drawn so that the
// task lands in its lock's partition, where one script sees both; else a
// task with an idempotency key lands in the key's partition, so that a
// repeated request is looked up where the first one was stored.
func (b *Broker) drawID(t *tidetype.TaskInfo, l layout) string {
	if t.Group != "" {
		// The group's tag keeps the task with its group, whatever the
		// partition count (the client tagged its unique key alike).
		return b.newID() + "{" + t.Group + "}"
	}
	id := b.newID()
	key := t.UniqueKey
	if key == "" {
		key = t.IdempotencyKey
	}
	if key != "" && l.cur.n > 1 {
		want := broker.Partition(key, l.cur.n)
		for broker.Partition(id, l.cur.n) != want {
			id = b.newID()
		}
	}
	return id
}

// enqueueNow sends items at once: one script call per partition. Each item
// gets its own error; an ID the broker chose that the script proves to be
// another task's is drawn again and sent again.
func (b *Broker) enqueueNow(ctx context.Context, items []item, opts broker.EnqueueOptions) ([]error, error) {
	var errs []error
	var todo []int
	var oneCalls []*call
	if len(items) == 1 { // the common single Enqueue: one allocation
		one := new(enqueueState)
		errs, todo, oneCalls = one.errs[:], one.todo[:], one.calls[:]
	} else {
		errs = make([]error, len(items))
		todo = make([]int, len(items))
	}
	for i := range todo {
		todo[i] = i
	}
	if err := b.checkOldSpan(ctx, items, errs); err != nil {
		return nil, err
	}
	todo = todo[:0]
	for i := range items {
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	for round := 0; len(todo) > 0; round++ {
		var again []int
		groups := b.groupItems(items, todo)
		calls := oneCalls
		if len(groups) != 1 || calls == nil {
			calls = make([]*call, len(groups))
		}
		for gi, g := range groups {
			calls[gi] = b.enqueueCall(g.p, items, g.idx)
		}
		// One call and no replica wait: it may take the kept connection.
		calls[0].solo = len(calls) == 1 && opts.WaitReplicas == 0
		var waits []*redis.Cmd
		if opts.WaitReplicas > 0 {
			var err error
			if waits, err = b.runAndWait(ctx, calls, groups, opts.WaitReplicas, opts.WaitTimeout); err != nil {
				return nil, err
			}
		} else {
			b.run(ctx, calls)
		}
		for gi, g := range groups {
			c := calls[gi]
			if c.err != nil {
				for _, i := range g.idx {
					errs[i] = callErr("enqueue", c.err)
				}
				continue
			}
			reply, err := c.cmd.Text()
			var codes string
			var firsts []string
			if err == nil {
				codes, firsts, err = parseEnqueueReply(reply, len(g.idx))
			}
			if err != nil {
				for _, i := range g.idx {
					errs[i] = callErr("enqueue", fmt.Errorf("unexpected reply: %w", err))
				}
				continue
			}
			for j, i := range g.idx {
				switch codes[j] {
				case '0':
					errs[i] = nil
					if waits != nil {
						if n, err := waits[gi].Int64(); err != nil || int(n) < opts.WaitReplicas {
							errs[i] = broker.ErrNotReplicated
						}
					}
				case '1':
					errs[i] = broker.ErrTaskIDConflict
				case '2':
					errs[i] = broker.ErrDuplicateTask
				case '4':
					// The idempotency key was used before: the task
					// stored then is the answer.
					errs[i] = nil
					items[i].t.ID, firsts = firsts[0], firsts[1:]
				case '6':
					errs[i] = errFenced
				case '5':
					errs[i] = heldError{fmt.Errorf("%w: queue %q is being repartitioned; task ID %q of group %q must hold the group as its tag, e.g. %q (or repartition the queue to 1 to cancel a repartition that stopped before it began)",
						broker.ErrInvalidTask, items[i].t.Queue, items[i].t.ID, items[i].t.Group, items[i].t.ID+"{"+items[i].t.Group+"}")}
				case '3':
					if round < maxRedraws {
						items[i].t.ID = b.drawID(items[i].t, items[i].lay)
						again = append(again, i)
					} else {
						errs[i] = fmt.Errorf("tide: redisbroker: enqueue: %d task IDs drawn at random all met existing tasks", maxRedraws+1)
					}
				default:
					errs[i] = callErr("enqueue", fmt.Errorf("unknown code %q", codes[j]))
				}
			}
		}
		todo = again
	}
	return errs, nil
}

// parseEnqueueReply splits enqueue.lua's reply into one code per task and,
// for each code '4', the ID of the task first stored under the key.
func parseEnqueueReply(reply string, n int) (codes string, firsts []string, err error) {
	codes, rest, found := strings.Cut(reply, "\n")
	if len(codes) != n {
		return "", nil, fmt.Errorf("%d codes for %d tasks", len(codes), n)
	}
	if found {
		firsts = strings.Split(rest, "\n")
	}
	if want := strings.Count(codes, "4"); want != len(firsts) {
		return "", nil, fmt.Errorf("%d task IDs for %d repeated idempotency keys", len(firsts), want)
	}
	for _, id := range firsts {
		if id == "" {
			return "", nil, errors.New("empty task ID for a repeated idempotency key")
		}
	}
	return codes, firsts, nil
}

// checkOldSpan refuses, while a queue is repartitioned, a caller's task ID
// that a task in the old span still holds and a unique key whose lock is
// held there: new tasks go to the new span, and without this look a task
// could exist twice. A task that moves over meanwhile meets its new partition's
// placeholder instead, so the look and the enqueue need not be atomic. A
// task to Replace that waits in the old span is moved to the new one first
// (moveAhead), where the enqueue replaces it as it would any other time.
func (b *Broker) checkOldSpan(ctx context.Context, items []item, errs []error) error {
	type look struct {
		i        int
		id, lock *redis.StringCmd
	}
	var looks []look
	var pipe redis.Pipeliner
	for i, it := range items {
		if it.lay.old == nil || ((it.own || it.looked) && it.t.UniqueKey == "") {
			continue
		}
		if pipe == nil {
			pipe = b.rdb.Pipeline()
		}
		lk := look{i: i}
		if !it.own && !it.looked {
			o, _ := b.oldPartOf(it.t.Queue, it.lay, it.t.ID)
			lk.id = pipe.HGet(ctx, o.k("t"), it.t.ID)
		}
		if it.t.UniqueKey != "" {
			o, _ := b.oldPartOf(it.t.Queue, it.lay, it.t.UniqueKey)
			lk.lock = pipe.HGet(ctx, o.k("u"), it.t.UniqueKey)
		}
		looks = append(looks, lk)
	}
	if pipe == nil {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("tide: redisbroker: enqueue: %w", classify(err))
	}
	// A task to replace that waits in the old span moves to the new one
	// first (Replace takes the place of a waiting task whatever the
	// layout); one that is still there after that runs: a conflict.
	type move struct {
		l   layout
		ids []string
	}
	ahead := map[part]*move{}
	for _, lk := range looks {
		if it := items[lk.i]; it.replace && lk.id != nil && lk.id.Err() == nil {
			o, _ := b.oldPartOf(it.t.Queue, it.lay, it.t.ID)
			if ahead[o] == nil {
				ahead[o] = &move{l: it.lay}
			}
			ahead[o].ids = append(ahead[o].ids, it.t.ID)
		}
	}
	if len(ahead) > 0 {
		for o, m := range ahead {
			if err := b.moveAhead(ctx, m.l, o, m.ids); err != nil && !b.retired(ctx, o) {
				return err // (a partition retired meanwhile holds the tasks no more: the look below finds nothing)
			}
		}
		pipe = b.rdb.Pipeline()
		for j, lk := range looks {
			if it := items[lk.i]; it.replace && lk.id != nil && lk.id.Err() == nil {
				o, _ := b.oldPartOf(it.t.Queue, it.lay, it.t.ID)
				looks[j].id = pipe.HGet(ctx, o.k("t"), it.t.ID)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("tide: redisbroker: enqueue: %w", classify(err))
		}
	}
	now := b.Now().UnixMilli()
	for _, lk := range looks {
		if lk.id != nil && lk.id.Err() == nil {
			errs[lk.i] = broker.ErrTaskIDConflict
			continue
		}
		if lk.lock != nil && lk.lock.Err() == nil {
			exp, _, _ := strings.Cut(lk.lock.Val(), ":")
			if n, err := strconv.ParseInt(exp, 10, 64); err == nil && n >= now {
				errs[lk.i] = broker.ErrDuplicateTask
			}
		}
	}
	return nil
}
