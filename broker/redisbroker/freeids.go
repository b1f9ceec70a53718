package redisbroker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
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

// A grouped task whose ID does not carry its group (broker.FreeGroupID) on
// a queue of several partitions lives in its group's partition G and is
// found through a pointer in its ID's partition I, when the two differ:
// ids.lua and docs/design.md ("Free IDs on several partitions") describe
// the protocol, enqueueFree runs it.

// slackNs is how far apart the clocks of two Redis nodes may be (ns; a
// minute, tests change it): a fence outlives the last moment its claim's
// store may run by this much, and the maintainer repairs a claim only this
// long after that moment.
var slackNs atomic.Int64

func init() { slackNs.Store(int64(time.Minute)) }

func clockSlack() time.Duration { return time.Duration(slackNs.Load()) }

// afterClaim, when set (by tests), runs after a claim and before its
// store; an error ends the enqueue there, as if the client died.
var afterClaim atomic.Pointer[func(id string) error]

// afterLookup, when set (by tests), runs in Delete and Cancel after the
// lookup by ID and before the removal it leads to.
var afterLookup atomic.Pointer[func(id string)]

// beforeRemove, when set (by tests), runs in Delete and Cancel before the
// removal in each partition the lookup led to.
var beforeRemove atomic.Pointer[func(queue, id string, p part)]

// afterRemove, when set (by tests), runs in Delete and Cancel after the
// removal script deleted a task and before the pointer that led there is
// released.
var afterRemove atomic.Pointer[func(id string)]

// pointerLook is how long after a pointer is confirmed the maintainer of
// its partition first looks whether its task is still there.
const pointerLook = 10 * time.Second

// afterMove, when set (by tests), runs after each step of a move
// (moveFree: "claimed", "left", "stored"); an error ends the enqueue there,
// as if the client died.
var afterMove atomic.Pointer[func(id, step string) error]

func moveStep(id, step string) error {
	if f := afterMove.Load(); f != nil {
		return (*f)(id, step)
	}
	return nil
}

// pointer is an index entry of ids.lua.
type pointer struct {
	state byte // 'c' claimed, 'k' confirmed, 'v' a move's claim
	nonce string
	at    int64 // claim time, ms on the clock of the pointer's node
	group string
	from  string // of a move: the group the task leaves
}

// claimed reports a claim that is not settled yet (repair settles it).
func (p pointer) claimed() bool { return p.state == 'c' || p.state == 'v' }

func parsePointer(v string) (pointer, bool) {
	if len(v) < 21 || v[0] != 0 || v[1] != 'g' {
		return pointer{}, false
	}
	z := strings.IndexByte(v[3:], 0)
	if z < 17 {
		return pointer{}, false
	}
	z += 3
	at, err := strconv.ParseInt(v[19:z], 10, 64)
	if err != nil {
		return pointer{}, false
	}
	p := pointer{state: v[2], nonce: v[3:19], at: at, group: v[z+1:]}
	if p.state == 'v' {
		var ok bool
		if p.group, p.from, ok = strings.Cut(p.group, "\x00"); !ok {
			return pointer{}, false
		}
	}
	return p, true
}

// needsPointer reports whether task t takes the free-ID protocol on
// layout l: a grouped task with an ID that does not carry its group, on
// several partitions, whose ID's partition is not its group's.
func needsPointer(t *tidetype.TaskInfo, l layout) bool {
	return l.cur.n > 1 && broker.FreeGroupID(t.ID, t.Group) && broker.Partition(t.ID, l.cur.n) != broker.Partition(t.Group, l.cur.n)
}

// storeKey is what places task t in its partition: its group when it has
// one (a tagged ID's partition is its group's too), else its ID.
func storeKey(t *tidetype.TaskInfo) string {
	if t.Group != "" {
		return t.Group
	}
	return t.ID
}

func newNonce() string {
	var raw [12]byte
	_, _ = rand.Read(raw[:])
	return base64.RawURLEncoding.EncodeToString(raw[:])
}

// ids runs one ids.lua op in partition p.
func (b *Broker) ids(ctx context.Context, p part, op, id string, args ...any) (*redis.Cmd, error) {
	c := b.idsCall(p, op, id, args...)
	b.run(ctx, []*call{c})
	if c.err != nil {
		return nil, callErr("task index "+op, c.err)
	}
	return c.cmd, nil
}

// idsCall is a call of one ids.lua op in partition p.
func (b *Broker) idsCall(p part, op, id string, args ...any) *call {
	return &call{
		script: b.s.ids,
		keys:   p.keys("t", "x", "xr", "wt", "oc", "meta", "gid"),
		args:   append([]any{p.layout, op, id}, args...),
		queue:  p.queue,
	}
}

func (b *Broker) idsText(ctx context.Context, p part, op, id string, args ...any) (string, error) {
	cmd, err := b.ids(ctx, p, op, id, args...)
	if err != nil {
		return "", err
	}
	s, err := cmd.Text()
	if err != nil {
		return "", callErr("task index "+op, fmt.Errorf("unexpected reply: %w", err))
	}
	return s, nil
}

// claimLife is how long after its claim a store may run (L in the design).
func (b *Broker) claimLife() time.Duration { return b.window }

// sameSpan returns the partition of key in the span of p (current or old).
func (b *Broker) sameSpan(queue string, l layout, p part, key string) part {
	if p.old {
		o, _ := b.oldPartOf(queue, l, key)
		return o
	}
	return b.partOf(queue, l, key)
}

// fenceClaim fences the claim ptr of id in partition g, where its task is
// (or was to be) stored: 's' g holds a record of the claim's store, 'f' a
// store with the claim's nonce is refused from now on (also when g has
// retired). With the claim's group (a claim, not a move), a record in g
// is answered 'o' and the record's group, the claim refused from now on:
// the record may be the claim's store or the task whose pointer's place
// a Replace's claim took, its store still to come, and either way the
// pointer is to name that record's group.
func (b *Broker) fenceClaim(ctx context.Context, g part, id string, ptr pointer, group string) (string, error) {
	r, err := b.idsText(ctx, g, "fence", id, ptr.nonce, b.claimEnd(ptr), group)
	if err != nil {
		return b.ifRetired(ctx, g, err, "f")
	}
	return r, nil
}

// claimEnd is when (ms, Redis clock) the claim ptr can no longer be
// stored under, whatever a client's clock says: when its fence expires.
func (b *Broker) claimEnd(ptr pointer) int64 {
	return ptr.at + (b.claimLife() + clockSlack()).Milliseconds()
}

// repair settles the claim ptr of id in partition in: it fences the claim
// in the group's partition, then points it to the group of the record
// there (the claim's store, or the task whose pointer's place a Replace's
// claim took: a store after the repair would leave a second task that no
// pointer leads to), or releases it (no task there, and none will be
// stored).
func (b *Broker) repair(ctx context.Context, queue string, l layout, in part, id string, ptr pointer) error {
	if ptr.state == 'v' {
		return b.repairMove(ctx, queue, l, in, id, ptr)
	}
	r, err := b.fenceClaim(ctx, b.sameSpan(queue, l, in, ptr.group), id, ptr, ptr.group)
	if err != nil {
		return err
	}
	switch {
	case r == "s":
		_, err = b.idsText(ctx, in, "confirm", id, ptr.nonce, pointerLook.Milliseconds())
	case len(r) > 1 && r[0] == 'o':
		_, err = b.idsText(ctx, in, "back", id, ptr.nonce, r[1:], pointerLook.Milliseconds())
	default:
		_, err = b.idsText(ctx, in, "release", id, ptr.nonce, "")
	}
	return err
}

// clearPointer makes way for a new task with id in partition in, where
// pointer ptr stands: it repairs a claim, and releases a confirmed pointer
// whose task is gone. It reports whether the way is clear (false: a task
// holds the ID).
func (b *Broker) clearPointer(ctx context.Context, queue string, l layout, in part, id string, ptr pointer) (bool, error) {
	if ptr.claimed() {
		return true, b.repair(ctx, queue, l, in, id, ptr)
	}
	g := b.sameSpan(queue, l, in, ptr.group)
	has, err := b.idsText(ctx, g, "look", id, "r")
	if err != nil || has == "1" {
		return false, err
	}
	_, err = b.idsText(ctx, in, "release", id, ptr.nonce, "k")
	return true, err
}

// errFenced is a store refused because its claim was fenced or too old.
var errFenced = fmt.Errorf("%w: the enqueue took too long or met another enqueue of its task ID; nothing was stored", broker.ErrUnavailable)

// lookOldSpan looks, while a repartition runs, whether a task of the old
// span holds it's ID: its record in the ID's old partition, or a pointer
// there to its record in its group's old partition. A task there is
// ErrTaskIDConflict; with Replace a waiting one moves to the new span
// first (moveAhead), where the enqueue meets it as any other time. When no
// task of the old span holds the ID none will (new tasks go to the new
// span), and one that moved is in the new span already (the move places a
// task before it deletes it from the old partition), so what the new span
// holds decides: its pointers may be cleared and claimed as always.
func (b *Broker) lookOldSpan(ctx context.Context, it item) error {
	t, l := it.t, it.lay
	in, _ := b.oldPartOf(t.Queue, l, t.ID)
	for attempt := 0; ; attempt++ {
		v, err := b.rdb.HGet(ctx, in.k("t"), t.ID).Result()
		if errors.Is(err, redis.Nil) {
			return nil
		}
		if err != nil {
			return callErr("enqueue", classify(err))
		}
		where := in
		if ptr, ok := parsePointer(v); ok {
			// A claim there never stores now: the repartition settled the
			// claims it found, and later ones are refused by its hold. A
			// move's claim made since never took its task out of its old
			// group (the hold refuses that too): the task is there.
			groups := []string{ptr.group}
			if ptr.state == 'v' && ptr.from != "" {
				groups = []string{ptr.from, ptr.group}
			}
			found := false
			for _, g := range groups {
				where, _ = b.oldPartOf(t.Queue, l, g)
				has, err := b.idsText(ctx, where, "look", t.ID, "r")
				if err != nil {
					if has, err = b.ifRetired(ctx, where, err, "0"); err != nil {
						return err
					}
				}
				if found = has == "1"; found {
					break
				}
			}
			if !found {
				return nil
			}
		}
		if !it.replace || attempt > 0 {
			return broker.ErrTaskIDConflict
		}
		if err := b.moveAhead(ctx, l, where, []string{t.ID}); err != nil && !b.retired(ctx, where) {
			return err // (a partition retired meanwhile holds the task no more: look again)
		}
	}
}

// enqueueFree enqueues it, a task that needsPointer, by the protocol of
// ids.lua: claim in the ID's partition, store in the group's, confirm.
// While a repartition runs it also takes the grouped tasks with free IDs
// that need no pointer in the new span, after a look at the old span.
func (b *Broker) enqueueFree(ctx context.Context, it item, opts broker.EnqueueOptions) error {
	t, l := it.t, it.lay
	if l.old != nil {
		if err := b.lookOldSpan(ctx, it); err != nil {
			return err
		}
		it.looked = true
		if !needsPointer(t, l) {
			items := []item{it}
			errs, err := b.enqueueNow(ctx, items, opts)
			if err != nil {
				return err
			}
			b.freeConflicts(ctx, items, errs, opts)
			return errs[0]
		}
	}
	in := b.partOf(t.Queue, l, t.ID)
	home := b.partOf(t.Queue, l, t.Group)
	nonce := newNonce()
	look := (b.claimLife() + clockSlack()).Milliseconds()
	swap, swapped := "", ""
	var at int64
	for attempt := 0; ; attempt++ {
		if attempt == 4 {
			return fmt.Errorf("%w: task ID %q: enqueues of it keep meeting", broker.ErrUnavailable, t.ID)
		}
		r, err := b.idsText(ctx, in, "claim", t.ID, nonce, t.Group, look, swap)
		if err != nil {
			return err // a claim left behind is repaired
		}
		if r == "1" {
			if it.replace {
				// A task stored in the ID's partition itself moves out.
				again, err := b.moveHere(ctx, it, opts, in)
				if again {
					continue
				}
				return err
			}
			return broker.ErrTaskIDConflict
		}
		if r[0] == 'c' {
			if at, err = strconv.ParseInt(r[1:], 10, 64); err != nil {
				return callErr("task index claim", fmt.Errorf("unexpected reply %q", r))
			}
			break
		}
		ptr, ok := parsePointer(r[1:])
		if r[0] != 'p' || !ok {
			return callErr("task index claim", fmt.Errorf("unexpected reply %q", r))
		}
		if ptr.state == 'k' && it.replace {
			if broker.Partition(ptr.group, l.cur.n) != broker.Partition(t.Group, l.cur.n) {
				// While a repartition runs the task is in the new span by
				// now (lookOldSpan moved it ahead: its old pointer goes
				// last), and moves there as any other time.
				again, err := b.moveFree(ctx, it, opts, in, ptr)
				if again {
					continue
				}
				return err
			}
			has, err := b.idsText(ctx, home, "look", t.ID, "r")
			if err != nil {
				return err
			}
			if has == "1" {
				swap, swapped = ptr.nonce, ptr.group
				continue
			}
		}
		clear, err := b.clearPointer(ctx, t.Queue, l, in, t.ID, ptr)
		if err != nil {
			return err
		}
		if !clear {
			return broker.ErrTaskIDConflict
		}
	}
	if f := afterClaim.Load(); f != nil {
		if err := (*f)(t.ID); err != nil {
			return err
		}
	}
	it.claim = nonce + strconv.FormatInt(at+b.claimLife().Milliseconds(), 10)
	id := t.ID
	errs, err := b.enqueueNow(ctx, []item{it}, opts)
	if err == nil {
		err = errs[0]
	}
	switch {
	case (err == nil || errors.Is(err, broker.ErrNotReplicated)) && t.ID == id:
		if _, cerr := b.idsText(ctx, in, "confirm", id, nonce, pointerLook.Milliseconds()); cerr != nil {
			b.log.Warn("tide: redisbroker: a task's index entry is left claimed; the partition's maintainer confirms it", "queue", t.Queue, "err", cerr)
		}
		return err
	case err == nil || errors.Is(err, broker.ErrTaskIDConflict) || errors.Is(err, broker.ErrDuplicateTask) ||
		errors.Is(err, broker.ErrInvalidTask) || errors.Is(err, errFenced) || errors.Is(err, broker.ErrLayout):
		// Not stored under this claim: an idempotency key's earlier task
		// answered (its ID is t.ID now), or a definite refusal. A claim
		// that took the place of the pointer of a task still there (a
		// Replace refused: the task runs) points to it again. A claim a
		// repair settled meanwhile (fenced: confirmed for the task it
		// found there) is left as it is.
		var rerr error
		has := "0"
		if swapped != "" {
			has, rerr = b.idsText(ctx, home, "look", id, "r")
		}
		if rerr == nil && has == "1" {
			_, rerr = b.idsText(ctx, in, "back", id, nonce, swapped, pointerLook.Milliseconds())
		} else if rerr == nil {
			_, rerr = b.idsText(ctx, in, "release", id, nonce, "c")
		}
		if rerr != nil {
			b.log.Warn("tide: redisbroker: a task's index entry is left claimed; the partition's maintainer releases it", "queue", t.Queue, "err", rerr)
		}
		return err
	}
	return err // unknown: the claim stays for the repair to decide
}

// freeConflicts looks again at the tasks enqueued into their ID's
// partition that met an ID conflict on a queue of several partitions: a
// pointer left over from a task that is gone, or a claim nobody finished,
// is cleared and the task sent again.
func (b *Broker) freeConflicts(ctx context.Context, items []item, errs []error, opts broker.EnqueueOptions) {
	for i, it := range items {
		// While a repartition runs the new span's pointers are cleared
		// only after lookOldSpan (a pointer written by the move may lead to
		// a task not placed yet).
		if !errors.Is(errs[i], broker.ErrTaskIDConflict) || it.own || it.lay.cur.n < 2 || (it.lay.old != nil && !it.looked) || needsPointer(it.t, it.lay) {
			continue
		}
		in := b.partOf(it.t.Queue, it.lay, it.t.ID)
		v, err := b.rdb.HGet(ctx, in.k("t"), it.t.ID).Result()
		if err != nil {
			continue
		}
		ptr, ok := parsePointer(v)
		if !ok {
			continue
		}
		clear, err := b.clearPointer(ctx, it.t.Queue, it.lay, in, it.t.ID, ptr)
		if err != nil {
			continue
		}
		if !clear {
			// A task of a group of another partition holds the ID:
			// Replace moves it here (while a repartition runs, only after
			// lookOldSpan, above: the task is in the new span then).
			if it.replace && ptr.state == 'k' {
				if again, err := b.moveFree(ctx, it, opts, in, ptr); !again {
					errs[i] = err
				}
			}
			continue
		}
		if again, err := b.enqueueNow(ctx, []item{it}, opts); err == nil {
			errs[i] = again[0]
		}
	}
}

// found is where a lookup by ID goes: p, and the pointer that led there.
type found struct {
	p     part
	via   *part  // the ID's partition when a pointer led to p
	nonce string // that pointer's, to release once its task is gone ('' when it was a claim)
}

// resolve returns where task id may be (as lookup), with pointers
// followed: on a queue of several partitions it reads the ID's record
// field first.
func (b *Broker) resolve(ctx context.Context, queue string, l layout, id string) ([]found, error) {
	ps := b.lookup(queue, l, id)
	out := make([]found, len(ps))
	var cmds []*redis.StringCmd
	var pipe redis.Pipeliner
	for i, p := range ps {
		out[i] = found{p: p}
		n := l.cur.n
		if p.old {
			n = l.old.n
		}
		if n < 2 {
			cmds = append(cmds, nil)
			continue
		}
		if pipe == nil {
			pipe = b.rdb.Pipeline()
		}
		cmds = append(cmds, pipe.HGet(ctx, p.k("t"), id))
	}
	if pipe == nil {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("look up "+id, classify(err))
	}
	res := make([]found, 0, len(out)+1)
	for i, c := range cmds {
		res = append(res, out[i])
		if c == nil {
			continue
		}
		if ptr, ok := parsePointer(c.Val()); ok {
			in := out[i].p
			// A claim's nonce is no pointer of the task found there yet:
			// the task may be the one a Replace's claim took the place of,
			// and the nonce the pointer of the Replace's task once it is
			// stored, which a release after the task's deletion would drop.
			nonce := ptr.nonce
			if ptr.state == 'c' {
				nonce = ""
			}
			res[len(res)-1] = found{p: b.sameSpan(queue, l, in, ptr.group), via: &in, nonce: nonce}
			if ptr.state == 'v' && ptr.from != "" {
				// A move under way: the task stays in the old group's
				// partition until it is stored in the new one's, so look
				// there first. A task deleted there releases no pointer:
				// the move's nonce becomes the new task's pointer's. (A
				// move out of the ID's own partition names no old group:
				// its task was deleted there, its claim left in its place.)
				res = append(res[:len(res)-1], found{p: b.sameSpan(queue, l, in, ptr.from)}, res[len(res)-1])
			}
		}
	}
	return res, nil
}

// release drops the pointer that led to a task that is gone now (best
// effort: the maintainer sweeps what is left). A claim that led there is
// left to its enqueue and the repair.
func (b *Broker) release(ctx context.Context, f found, id string) {
	if f.via == nil || f.nonce == "" {
		return
	}
	if _, err := b.idsText(ctx, *f.via, "release", id, f.nonce, "k"); err != nil {
		b.log.Debug("tide: redisbroker: a task's index entry is left; the partition's maintainer drops it", "err", err)
	}
}

// dropPointers releases every pointer of partition p whose task is not in
// its group's partition (a claim is repaired first), for DeleteQueue: an
// empty partition may hold pointers left by tasks that ended.
func (b *Broker) dropPointers(ctx context.Context, queue string, l layout, p part) error {
	ids, err := b.rdb.ZRange(ctx, p.k("x"), 0, -1).Result()
	if err != nil {
		return callErr("delete queue "+queue, classify(err))
	}
	for _, id := range ids {
		v, err := b.rdb.HGet(ctx, p.k("t"), id).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return callErr("delete queue "+queue, classify(err))
		}
		if ptr, ok := parsePointer(v); ok {
			if _, err := b.clearPointer(ctx, queue, l, p, id, ptr); err != nil {
				return err
			}
		}
	}
	return nil
}

// sweepIDs looks at the due pointers of partition p: a claim is repaired,
// a confirmed pointer whose task (with its waiter and kept outcome) is
// gone is released. Not while a repartition runs.
func (b *Broker) sweepIDs(ctx context.Context, queue string, l layout, p part) error {
	if l.old != nil || l.cur.n < 2 || p.old {
		return nil
	}
	if v, ok := b.idSweeps.Load(p.base); ok && time.Since(v.(time.Time)) < time.Second {
		return nil
	}
	b.idSweeps.Store(p.base, time.Now())
	if err := b.sweepLeft(ctx, queue, l, p, false); err != nil {
		return err
	}
	cmd, err := b.ids(ctx, p, "due", "100")
	if err != nil {
		return err
	}
	vals, err := cmd.StringSlice()
	if err != nil {
		return callErr("task index due", fmt.Errorf("unexpected reply: %w", err))
	}
	// Claims are rare: repaired one by one. The looks at confirmed
	// pointers go in one pipeline, and so do the releases.
	now := b.Now().UnixMilli()
	type look struct {
		id  string
		ptr pointer
		c   *call
	}
	var looks []look
	for i := 0; i+1 < len(vals); i += 2 {
		id := vals[i]
		ptr, ok := parsePointer(vals[i+1])
		if !ok {
			continue
		}
		if ptr.claimed() {
			if now < ptr.at+(b.claimLife()+clockSlack()).Milliseconds() {
				continue // not due after all (clocks); looked at later
			}
			if err := b.repair(ctx, queue, l, p, id, ptr); err != nil {
				return err
			}
			continue
		}
		g := b.partOf(queue, l, ptr.group)
		looks = append(looks, look{id: id, ptr: ptr, c: b.idsCall(g, "look", id, "a")})
	}
	if len(looks) == 0 {
		return nil
	}
	calls := make([]*call, len(looks))
	for i, lk := range looks {
		calls[i] = lk.c
	}
	b.run(ctx, calls)
	var releases []*call
	for _, lk := range looks {
		if lk.c.err != nil {
			return callErr("task index look", lk.c.err)
		}
		if has, _ := lk.c.cmd.Text(); has == "0" {
			releases = append(releases, b.idsCall(p, "release", lk.id, lk.ptr.nonce, "k"))
		}
	}
	if len(releases) > 0 {
		b.run(ctx, releases)
		for _, c := range releases {
			if c.err != nil {
				return callErr("task index release", c.err)
			}
		}
	}
	return nil
}

// ifRetired answers empty for a call refused by old partition p of a
// repartition because p is retired (it holds nothing, and takes nothing),
// else returns err.
func (b *Broker) ifRetired(ctx context.Context, p part, err error, empty string) (string, error) {
	if errors.Is(err, broker.ErrLayout) && p.old && b.retired(ctx, p) {
		return empty, nil
	}
	return "", err
}
