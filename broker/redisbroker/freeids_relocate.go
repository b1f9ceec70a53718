package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidequeue/tide/broker"
)

// Moves of a free-ID task into a group of another partition (Replace):
// the steps, their undo, and the repair of a move a dead client left.

// relocateText runs one relocate.lua op on task id in partition p, the
// partition of the group the task leaves.
func (b *Broker) relocateText(ctx context.Context, p part, op, id, nonce string, args ...any) (string, error) {
	keys := append(p.keys("t", "pending", "scheduled", "retry", "archived", "completed", "result", "h", "u", "meta", "xr", "xl"), p.groupKeys()...)
	c := &call{
		script: b.s.relocate,
		keys:   append(keys, p.k("pg"), p.k("wt"), p.k("x")),
		args:   append([]any{p.layout, op, id, nonce}, args...),
		queue:  p.queue,
	}
	b.run(ctx, []*call{c})
	if c.err != nil {
		return "", callErr("move task "+op, c.err)
	}
	s, err := c.cmd.Text()
	if err != nil {
		return "", callErr("move task "+op, fmt.Errorf("unexpected reply: %w", err))
	}
	return s, nil
}

// moveFree replaces task it.t.ID, which waits in group old.group (its
// pointer old in partition in), by it, a task of a group in another
// partition (Replace). The steps, each idempotent by a new nonce N:
//
//  1. move in I: the confirmed pointer becomes a move's claim naming both
//     groups (compare-and-set on old's nonce); lookups look in the old
//     group's partition S, then in the new one's D.
//  2. leave in S: the task, when it waits or has finished, is taken out
//     of where it waits and flagged as moving, so nothing leases it; one
//     that runs (or a workflow's step, ...) is a conflict, as on one
//     partition, and the claim goes back.
//  3. store in D under the claim (enqueue.lua, fenced like any claim).
//  4. gone in S deletes the task that left; moved in I confirms the
//     pointer for the new group.
//
// A definite refusal of the store puts the task back (stay in S, then in
// I); with no answer the claim stays, and repairMove finishes or undoes
// the move. again reports that the pointer changed before step 1: the
// caller looks again.
func (b *Broker) moveFree(ctx context.Context, it item, opts broker.EnqueueOptions, in part, old pointer) (again bool, err error) {
	t, l := it.t, it.lay
	src := b.partOf(t.Queue, l, old.group)
	nonce := newNonce()
	look := (b.claimLife() + clockSlack()).Milliseconds()
	r, err := b.idsText(ctx, in, "move", t.ID, nonce, t.Group, look, old.nonce, old.group)
	if err != nil {
		return false, err
	}
	switch {
	case r == "0":
		return true, nil
	case r == "d" || len(r) < 2 || r[0] != 'c':
		return false, callErr("task index move", fmt.Errorf("unexpected reply %q", r))
	}
	at, err := strconv.ParseInt(r[1:], 10, 64)
	if err != nil {
		return false, callErr("task index move", fmt.Errorf("unexpected reply %q", r))
	}
	deadline := at + b.claimLife().Milliseconds()
	if err := moveStep(t.ID, "claimed"); err != nil {
		return false, err
	}
	lv, err := b.relocateText(ctx, src, "leave", t.ID, nonce, old.group, deadline, t.Group)
	if err != nil {
		return false, err // the repair settles the claim
	}
	switch lv {
	case "ok", "gone":
	case "busy", "no":
		b.undoMove(ctx, t.Queue, in, src, t.ID, nonce, deadline)
		return false, fmt.Errorf("%w: task %q of group %q cannot be replaced now (it runs, or is a workflow's step)", broker.ErrTaskIDConflict, t.ID, old.group)
	case "late":
		b.undoMove(ctx, t.Queue, in, src, t.ID, nonce, deadline)
		return false, errFenced
	case "held":
		b.undoMove(ctx, t.Queue, in, src, t.ID, nonce, deadline)
		return false, heldError{fmt.Errorf("%w: queue %q is being repartitioned; replace task %q again when that is done", broker.ErrUnavailable, t.Queue, t.ID)}
	default:
		return false, callErr("move task leave", fmt.Errorf("unexpected reply %q", lv))
	}
	if err := moveStep(t.ID, "left"); err != nil {
		return false, err
	}
	// Nothing else holds the ID where the task moves. An ungrouped task
	// keeps the Replace flag all the same: it keeps it off the plain
	// scripts, which know no claims.
	it.replace = t.Group == ""
	return b.storeMove(ctx, it, opts, in, src, nonce, deadline, src.channel, src.idx, b.doneChannel(src.queue), "", 0)
}

// storeMove is the end of a move of task it.t.ID (moveHere, moveFree)
// that left partition src, its ID's index being in partition in: it
// stores the task in its new partition under the move's claim (nonce,
// good until deadline), then deletes what left src (relocate.lua's gone,
// with goneArgs after the ID and nonce) and confirms the pointer in in
// (moved). A definite refusal of the store puts the task back (undoMove);
// with no answer, or when a step after the store fails, the claim stays
// for the maintainer of in (sweepLeft, repairMove) or a repartition's hold
// to settle.
func (b *Broker) storeMove(ctx context.Context, it item, opts broker.EnqueueOptions, in, src part, nonce string, deadline int64, goneArgs ...any) (again bool, err error) {
	t := it.t
	it.claim = nonce + strconv.FormatInt(deadline, 10)
	it.move = true
	id := t.ID
	errs, err := b.enqueueNow(ctx, []item{it}, opts)
	if err == nil {
		err = errs[0]
	}
	switch {
	case (err == nil || errors.Is(err, broker.ErrNotReplicated)) && t.ID == id:
		if serr := moveStep(id, "stored"); serr != nil {
			return false, serr
		}
		_, gerr := b.relocateText(ctx, src, "gone", id, nonce, goneArgs...)
		if gerr == nil {
			_, gerr = b.idsText(ctx, in, "moved", id, nonce, pointerLook.Milliseconds())
		}
		if gerr != nil {
			b.log.Warn("tide: redisbroker: a moved task's index entry is left unsettled; the partition's maintainer finishes the move", "queue", t.Queue, "err", gerr)
		}
		return false, err
	case err == nil || errors.Is(err, broker.ErrTaskIDConflict) || errors.Is(err, broker.ErrDuplicateTask) ||
		errors.Is(err, broker.ErrInvalidTask) || errors.Is(err, errFenced) || errors.Is(err, broker.ErrLayout):
		// Nothing stored under this claim: the task stays where it was.
		t.ID = id
		b.undoMove(ctx, t.Queue, in, src, id, nonce, deadline)
		return false, err
	}
	return false, err // unknown: the claim stays for the maintainer to settle
}

// undoMove puts back the task that a move (nonce) took out of partition
// src, whose store was refused or never sent, and its pointer in in (best
// effort: the repair does it otherwise).
func (b *Broker) undoMove(ctx context.Context, queue string, in, src part, id, nonce string, deadline int64) {
	s, err := b.relocateText(ctx, src, "stay", id, nonce, deadline+clockSlack().Milliseconds(), src.channel, src.idx)
	if err == nil {
		if s == "g" {
			_, err = b.idsText(ctx, in, "release", id, nonce, "")
		} else {
			_, err = b.idsText(ctx, in, "stay", id, nonce, pointerLook.Milliseconds())
		}
	}
	if err != nil {
		b.log.Warn("tide: redisbroker: a moved task's index entry is left claimed; the partition's maintainer puts the task back", "queue", queue, "err", err)
	}
}

// repairMove settles a move's claim ptr of id in partition in (see
// moveFree): it fences the claim in the new group's partition; a task
// stored there before finishes the move (the task that left is deleted,
// the pointer names the new group), else the task that left is put back
// (or the pointer released when it is gone).
func (b *Broker) repairMove(ctx context.Context, queue string, l layout, in part, id string, ptr pointer) error {
	dst := b.sameSpan(queue, l, in, ptr.group)
	src := in // a move out of the ID's own partition (moveHere)
	if ptr.from != "" {
		src = b.sameSpan(queue, l, in, ptr.from)
	}
	r, err := b.fenceClaim(ctx, dst, id, ptr, "")
	if err != nil {
		return err
	}
	if r == "s" {
		at := ""
		if src.base == in.base {
			at = strconv.FormatInt(ptr.at, 10)
		}
		if _, err := b.relocateText(ctx, src, "gone", id, ptr.nonce, src.channel, src.idx, b.doneChannel(src.queue), at, pointerLook.Milliseconds()); err != nil {
			if _, err = b.ifRetired(ctx, src, err, "0"); err != nil {
				return err
			}
		}
		_, err = b.idsText(ctx, in, "moved", id, ptr.nonce, pointerLook.Milliseconds())
		return err
	}
	s, err := b.relocateText(ctx, src, "stay", id, ptr.nonce, b.claimEnd(ptr), src.channel, src.idx)
	if err != nil {
		if s, err = b.ifRetired(ctx, src, err, "g"); err != nil {
			return err
		}
	}
	if s == "g" {
		_, err = b.idsText(ctx, in, "release", id, ptr.nonce, "")
	} else {
		_, err = b.idsText(ctx, in, "stay", id, ptr.nonce, pointerLook.Milliseconds())
	}
	return err
}

// sweepLeft settles the moves (moveFree, moveHere) whose task left
// partition p and that nobody finished by their deadline (plus the clock
// slack), or every one with force (a repartition's hold, which moves no
// task that left): as repairMove, from the side of the partition the task
// left, which also covers a move into the ID's own partition, whose store
// replaced the move's claim with the task, and a move out of it, which
// made no claim.
func (b *Broker) sweepLeft(ctx context.Context, queue string, l layout, p part, force bool) error {
	left, err := b.rdb.HGetAll(ctx, p.k("xl")).Result()
	if err != nil {
		return callErr("task index sweep", classify(err))
	}
	now := b.Now().UnixMilli()
	for id, v := range left {
		f := strings.SplitN(v, "\x00", 3)
		if len(f) != 3 || len(f[0]) < 16 {
			continue
		}
		deadline, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || !force && now < deadline+clockSlack().Milliseconds() {
			continue
		}
		nonce, group := f[0][:16], f[2]
		in := b.partOf(queue, l, id)
		dst := b.partOf(queue, l, group)
		exp := deadline + clockSlack().Milliseconds()
		r, err := b.idsText(ctx, dst, "fence", id, nonce, exp)
		if err != nil {
			return err
		}
		if r == "s" {
			at := "" // out of the ID's own partition: its pointer takes the record's place
			if in.base == p.base {
				at = strconv.FormatInt(deadline-b.claimLife().Milliseconds(), 10)
			}
			if _, err := b.relocateText(ctx, p, "gone", id, nonce, p.channel, p.idx, b.doneChannel(p.queue), at, pointerLook.Milliseconds()); err != nil {
				return err
			}
			if _, err := b.idsText(ctx, in, "moved", id, nonce, pointerLook.Milliseconds()); err != nil {
				return err
			}
			continue
		}
		s, err := b.relocateText(ctx, p, "stay", id, nonce, exp, p.channel, p.idx)
		if err != nil {
			return err
		}
		if s == "g" {
			_, err = b.idsText(ctx, in, "release", id, nonce, "")
		} else {
			_, err = b.idsText(ctx, in, "stay", id, nonce, pointerLook.Milliseconds())
		}
		if err != nil {
			return err
		}
	}
	return nil
}
