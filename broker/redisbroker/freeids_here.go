package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidequeue/tide/broker"
)

// moveHere replaces task it.t.ID, stored in its ID's own partition in (of
// no group, or of a group of that partition), by it, a task of a group in
// another partition (Replace). The task's record is the field its pointer
// takes there, so the move makes no claim in in first (moveFree's step 1):
//
//  1. leave in in (relocate.lua, 'i'): the task, when it waits or has
//     finished, is taken out of where it waits and flagged as moving, its
//     record kept in place (lookups find it there, nothing leases it), and
//     the leaving hash keeps N, the deadline T + L (T on in's clock) and
//     the new group. One that runs (or a workflow's step, ...) is a
//     conflict, as on one partition.
//  2. store in D under N (as step 2 of an enqueue).
//  3. gone in in: the record's field becomes the new group's confirmed
//     pointer (N), and the rest of the task is deleted.
//
// A Delete meanwhile leaves the move's claim ('v', of no old group) in the
// record's place (remove.lua), so the ID stays taken for the task the
// store makes; moved then confirms it, or the undo releases it. A definite
// refusal of the store puts the task back (stay); with no answer the
// leaving hash entry stays for sweepLeft (the maintainer of in) or a
// repartition's hold to settle. again reports that the task went away
// before step 1: the caller claims again.
func (b *Broker) moveHere(ctx context.Context, it item, opts broker.EnqueueOptions, in part) (again bool, err error) {
	t := it.t
	nonce := newNonce()
	lv, err := b.relocateText(ctx, in, "leave", t.ID, nonce, "", "+"+strconv.FormatInt(b.claimLife().Milliseconds(), 10), t.Group, "i")
	if err != nil {
		return false, err // the sweep settles what the leave did
	}
	switch {
	case strings.HasPrefix(lv, "ok:"):
	case lv == "gone":
		return true, nil
	case lv == "busy" || lv == "no":
		return false, fmt.Errorf("%w: task %q cannot be replaced now (it runs, or is a workflow's step)", broker.ErrTaskIDConflict, t.ID)
	case lv == "held":
		return false, heldError{fmt.Errorf("%w: queue %q is being repartitioned; replace task %q again when that is done", broker.ErrUnavailable, t.Queue, t.ID)}
	default:
		return false, callErr("move task leave", fmt.Errorf("unexpected reply %q", lv))
	}
	deadline, err := strconv.ParseInt(lv[3:], 10, 64)
	if err != nil {
		return false, callErr("move task leave", fmt.Errorf("unexpected reply %q", lv))
	}
	if err := moveStep(t.ID, "left"); err != nil {
		return false, err
	}
	it.replace = false // nothing holds the ID where the task moves
	// Deleted meanwhile, the task leaves the claim in its place, which
	// is the new task's pointer once gone has run: moved confirms it.
	at := strconv.FormatInt(deadline-b.claimLife().Milliseconds(), 10)
	return b.storeMove(ctx, it, opts, in, in, nonce, deadline, in.channel, in.idx, b.doneChannel(in.queue), at, pointerLook.Milliseconds())
}
