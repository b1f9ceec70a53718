package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// GetTask implements broker.Broker. Reads run no script, so they check the
// partitions' layout keys themselves: a process that missed a repartition
// reads the layout again instead of wrongly reporting a task missing.
func (b *Broker) GetTask(ctx context.Context, queue, id string) (*tidetype.TaskInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		t, stale, err := b.getTask(ctx, queue, id)
		if !stale || attempt > 0 {
			return t, err
		}
		b.forgetLayout(queue)
	}
}

func (b *Broker) getTask(ctx context.Context, queue, id string) (*tidetype.TaskInfo, bool, error) {
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		return nil, false, err
	}
	where, err := b.resolve(ctx, queue, l, id)
	if err != nil {
		return nil, false, err
	}
	for _, f := range where {
		p := f.p
		pipe := b.rdb.Pipeline()
		meta := pipe.Get(ctx, p.k("meta"))
		rec := pipe.HGet(ctx, p.k("t"), id)
		result := pipe.HGet(ctx, p.k("result"), id)
		hist := pipe.HGet(ctx, p.k("h"), id)
		lease := pipe.ZScore(ctx, p.k("active"), id)
		progress := pipe.HGet(ctx, p.k("pg"), id)
		steps := pipe.HGet(ctx, p.k("result"), "\x00"+id)
		_, _ = pipe.Exec(ctx)
		if err := meta.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, false, callErr("get task", classify(err))
		}
		if meta.Val() != p.layout {
			return nil, true, fmt.Errorf("%w: %w: queue %q changed its layout", broker.ErrUnavailable, broker.ErrLayout, queue)
		}
		raw, err := rec.Bytes()
		if errors.Is(err, redis.Nil) || string(raw) == placeholder {
			continue // not here (or about to move in): look in the old span
		}
		if err != nil {
			return nil, false, callErr("get task", classify(err))
		}
		t, err := codec.DecodeHeader(queue, id, raw)
		if err != nil {
			return nil, false, fmt.Errorf("tide: redisbroker: task %s/%s: %w", queue, id, err)
		}
		if pr, ok := decodeProgress(progress.Val()); ok {
			t.Progress = pr
		}
		if r, err := result.Bytes(); err == nil {
			t.Result = r
		} else if !errors.Is(err, redis.Nil) {
			return nil, false, callErr("get result", classify(err))
		}
		if h, err := hist.Bytes(); err == nil {
			t.Attempts = codec.DecodeAttempts(h)
		}
		if d, err := steps.Bytes(); err == nil {
			broker.StepInfos(t, broker.DecodeSteps(d))
		}
		if exp, err := lease.Result(); err == nil && t.State == tidetype.StateActive {
			t.LeaseExpiresAt = time.UnixMilli(int64(exp))
		}
		return t, false, nil
	}
	return nil, false, broker.ErrTaskNotFound
}

// placeholder is what a repartition writes where a task is about to move in
// (see move.lua).
const placeholder = "\x00mv"

// remove.lua's reply codes (see its header).
const (
	removeNotFound   = "0" // no such task
	removeDeleted    = "1"
	removeActive     = "2" // delete refused: the task runs
	removeRecorded   = "3" // cancellation of an active task recorded
	removeNotActive  = "4" // "4<state>": cancelactive refused
	removeMovingHere = "5" // placeholder of a repartition removed: look in the old span
	removeInternal   = "6" // a workflow follow-up, left alone
	removeFollowed   = "7" // cancelstep: gone, but its follow-up is stored
	removeFinished   = "8" // cancelstep: finished, left as it is
	removePointer    = "9" // a free ID's pointer written since the lookup, or a record a repartition took: look again
)

// remove runs remove.lua with op on one task, in the task's partition, and
// while a repartition runs in its old partition too when the task is not
// (or not yet) in the new one. It turns the reply into the error op's
// caller returns: nil when the task was deleted, cancelled or (cancelstep)
// has ended or will report its end.
func (b *Broker) remove(ctx context.Context, queue, id, op string) error {
	if err := b.check(); err != nil {
		return err
	}
	return b.againOnLayout(ctx, queue, func(l layout, last bool) error { return b.removeIn(ctx, l, last, queue, id, op) })
}

// againOnLayout runs f with queue's layout, and again with the layout read
// afresh, up to twice, when f's call was refused for its layout (the queue
// was repartitioned since this process cached it: refused calls change
// nothing, and the next reads the layout again), or when f found nothing
// but an old partition that a running repartition has retired (it moved
// its tasks to the new span, maybe just after f looked there). last tells
// f its last run. An operator's call so succeeds during and right after a
// repartition rather than fail with ErrUnavailable.
func (b *Broker) againOnLayout(ctx context.Context, queue string, f func(l layout, last bool) error) error {
	for attempt := 0; ; attempt++ {
		l, err := b.layoutOf(ctx, queue)
		if err != nil {
			return err
		}
		err = f(l, attempt == 2)
		if attempt == 2 || !errors.Is(err, broker.ErrLayout) || errors.Is(err, broker.ErrOutcomeUnknown) {
			return err
		}
		b.forgetLayout(queue)
	}
}

// errRetiredOnly is a lookup's report that it found the task nowhere but
// may have missed it in an old partition a repartition retired meanwhile:
// againOnLayout looks again.
var errRetiredOnly = fmt.Errorf("%w: %w: an old partition was retired during the lookup", broker.ErrUnavailable, broker.ErrLayout)

// retiredOld reports whether err is a refusal by old partition p that a
// repartition has retired (it holds nothing any more).
func (b *Broker) retiredOld(ctx context.Context, p part, err error) bool {
	return err != nil && p.old && errors.Is(err, broker.ErrLayout) && b.retired(ctx, p)
}

// removeIn is remove under layout l (last: see againOnLayout).
func (b *Broker) removeIn(ctx context.Context, l layout, last bool, queue, id, op string) error {
	retired := false
	code := removeNotFound // a placeholder alone is no task
	// A free ID's pointer may be written in the ID's partition after the
	// lookup found nothing there (an enqueue's claim, a repartition's
	// move of the task): remove.lua leaves it alone and the lookup runs
	// again, so the pointer is followed rather than taken for a record.
	// A record a repartition has taken may yet be placed in the new span:
	// remove.lua deletes it only once this lookup removed its placeholder
	// (answer 9 otherwise, and the lookup runs again).
look:
	for try := 0; ; try++ {
		ph := "0"
		where, err := b.resolve(ctx, queue, l, id)
		if err != nil {
			return err
		}
		if f := afterLookup.Load(); f != nil {
			(*f)(id)
		}
		for _, f := range where {
			p := f.p
			if f := beforeRemove.Load(); f != nil {
				(*f)(queue, id, p)
			}
			rid, cache, exp, _ := b.request(p)
			here := "0" // the ID's own partition (of its span)
			if slices.ContainsFunc(b.lookup(queue, l, id), func(i part) bool { return i.base == p.base }) {
				here = "1"
			}
			c := &call{
				script: b.s.remove,
				keys:   append(append(append(p.keys("t", "pending", "scheduled", "retry", "archived", "completed", "result", "active", "u", "meta"), cache, p.k("moving"), p.k("h")), append(p.groupKeys(), p.endKeys()...)...), p.k(eventsKey), p.k("xl"), p.k("x")),
				args:   []any{p.layout, rid, exp, id, op, p.channel, b.doneChannel(queue), b.eventsArg(p), p.idTag, p.idx, here, ph},
				queue:  queue,
			}
			b.run(ctx, []*call{c})
			if b.retiredOld(ctx, p, c.err) {
				retired = true
				continue
			}
			if c.err != nil {
				return callErr(op, c.err)
			}
			reply, err := c.cmd.Text()
			if err != nil || reply == "" {
				return callErr(op, fmt.Errorf("unexpected reply %q (%v)", reply, err))
			}
			if reply == removePointer {
				if try == 4 {
					return fmt.Errorf("%w: %s %s/%s: its index entry keeps changing", broker.ErrUnavailable, op, queue, id)
				}
				continue look
			}
			if reply == removeMovingHere {
				ph = "1"
			}
			if reply != removeNotFound && reply != removeMovingHere {
				code = reply
				if code == removeDeleted {
					if h := afterRemove.Load(); h != nil {
						(*h)(id)
					}
					b.release(ctx, f, id)
				}
				break look
			}
		}
		break
	}
	switch {
	case code == removeNotFound && retired && !last:
		return callErr(op, errRetiredOnly)
	case code == removeNotFound:
		return broker.ErrTaskNotFound
	case code == removeActive:
		return broker.ErrTaskActive
	case code == removeInternal:
		return fmt.Errorf("%w (task %s/%s)", broker.ErrInternalTask, queue, id)
	case strings.HasPrefix(code, removeNotActive):
		st, err := strconv.Atoi(code[len(removeNotActive):])
		if err != nil {
			return callErr(op, fmt.Errorf("unexpected reply %q", code))
		}
		return fmt.Errorf("%w: cannot cancel task %s: it is %s, not active", broker.ErrTaskState, id, tidetype.TaskState(st))
	case code == removeDeleted, code == removeRecorded, code == removeFollowed, code == removeFinished:
		return nil
	}
	return callErr(op, fmt.Errorf("unexpected reply %q", code))
}

// Delete implements broker.Broker.
func (b *Broker) Delete(ctx context.Context, queue, id string) error {
	return b.remove(ctx, queue, id, "delete")
}

// Cancel implements broker.Broker.
func (b *Broker) Cancel(ctx context.Context, queue, id string) error {
	return b.remove(ctx, queue, id, "cancel")
}

// CancelStepTask implements broker.Broker.
func (b *Broker) CancelStepTask(ctx context.Context, queue, id string) error {
	return b.remove(ctx, queue, id, "cancelstep")
}

// CancelProcessing implements broker.Broker: it records the cancellation of
// an active task (read by the running server at its next lease renewal at
// the latest) and publishes it so that the server cancels the handler now.
func (b *Broker) CancelProcessing(ctx context.Context, queue, id string) error {
	return b.remove(ctx, queue, id, "cancelactive")
}

// Pause implements broker.Broker.
func (b *Broker) Pause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, true, 0)
}

// Unpause implements broker.Broker.
func (b *Broker) Unpause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, false, 0)
}

// PauseFor implements broker.Admin: the partitions' pause flags expire
// after d, and the servers' maintenance finds the waiting tasks within a
// few seconds.
func (b *Broker) PauseFor(ctx context.Context, queue string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("tide: redisbroker: pause %s for %v: under a millisecond", queue, d)
	}
	return b.setPaused(ctx, queue, true, d)
}

func (b *Broker) setPaused(ctx context.Context, queue string, on bool, d time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return err
	}
	pipe := b.rdb.Pipeline()
	for i := range l.total() {
		k := b.partAt(queue, l, i).k("paused")
		if on {
			pipe.Set(ctx, k, "1", d) // d 0: no expiry
		} else {
			pipe.Del(ctx, k)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return callErr("pause "+queue, classify(err))
	}
	if !on {
		// Wake idle servers: the queue may hold work.
		for i := range l.total() {
			b.rdb.Publish(ctx, b.channel(queue), "p"+strconv.Itoa(i))
		}
	}
	return nil
}
