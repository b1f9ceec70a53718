package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
)

// The steps that move an old partition's tasks into the new span: drain,
// reserve and take, place, retire, and moving single tasks ahead.

func (b *Broker) moveKeys(p part) []string {
	return append(p.keys("t", "pending", "scheduled", "retry", "archived", "completed", "result", "active", "u", "moving", "reserved", "meta", "stat", "seq", "owner", "paused", "h", "m"), append(p.groupKeys(), p.endKeys()...)...)
}

// loadMove loads move.lua into every node (every master of a cluster)
// before a step sends it in a pipeline, where go-redis does not fall back
// from EVALSHA to EVAL: the new span's partitions may live on nodes that
// never ran it.
func (b *Broker) loadMove(ctx context.Context) error {
	return classify(b.s.move.Load(ctx, b.rdb).Err())
}

// moveCall runs one op of move.lua on partition p.
func (b *Broker) moveCall(ctx context.Context, p part, op string, args ...any) *redis.Cmd {
	return b.s.move.Run(ctx, b.rdb, b.moveKeys(p), append([]any{p.layout, op}, args...)...)
}

// moved is a task taken out of an old partition.
type moved struct {
	id, rec, result, hist string
	group                 string // as move.lua's take returns it
	dur                   string // durable records (broker.Durable), or ''
	state                 int64
	score                 float64
}

// drain moves up to moveBatch tasks of old partition o (first those a
// crashed repartition left half-moved) and returns how many it moved and how
// many records are left in o (active tasks, and what it did not get to).
func (b *Broker) drain(ctx context.Context, l layout, o part) (int, int, error) {
	if err := b.loadMove(ctx); err != nil {
		return 0, 0, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, err)
	}
	fail := func(err error) (int, int, error) {
		return 0, 0, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, classify(err))
	}
	// Tasks taken but not finished by an earlier run: place, then finish.
	res, err := b.moveCall(ctx, o, "moving", moveBatch).Slice()
	if err != nil {
		return fail(err)
	}
	ms, _, err := parseTaken(res)
	if err != nil {
		return fail(err)
	}
	if len(ms) == 0 {
		peek, err := b.moveCall(ctx, o, "peek", moveBatch).Slice()
		if err != nil {
			return fail(err)
		}
		if ms, err = b.reserveAndTake(ctx, l, o, peek); err != nil {
			return 0, 0, err
		}
	}
	if len(ms) > 0 {
		if err := b.place(ctx, l, o, ms); err != nil {
			return 0, 0, err
		}
	}
	pipe := b.rdb.Pipeline()
	recs := pipe.HLen(ctx, o.k("t"))
	ptrs := pipe.ZCard(ctx, o.k("x"))
	if _, err := pipe.Exec(ctx); err != nil {
		return fail(err)
	}
	return len(ms), int(max(recs.Val()-ptrs.Val(), 0)), nil
}

// drainPointers empties old partition o of the pointers it holds once it
// holds no task: a claim is repaired, a pointer to a task still in the old
// span moves that task ahead (the move drops the pointer; a task that runs
// stays until it ends), and a pointer to a task that is gone is dropped. It
// returns how many pointers are left.
func (b *Broker) drainPointers(ctx context.Context, l layout, o part) (int, error) {
	fail := func(err error) (int, error) {
		return 0, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, classify(err))
	}
	ids, err := b.rdb.ZRange(ctx, o.k("x"), 0, moveBatch-1).Result()
	if err != nil {
		return fail(err)
	}
	for _, id := range ids {
		v, err := b.rdb.HGet(ctx, o.k("t"), id).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fail(err)
		}
		ptr, ok := parsePointer(v)
		if !ok {
			b.rdb.ZRem(ctx, o.k("x"), id)
			continue
		}
		if ptr.claimed() {
			if err := b.repair(ctx, o.queue, l, o, id, ptr); err != nil {
				return 0, err
			}
			continue // a confirmed claim is looked at next time
		}
		home, _ := b.oldPartOf(o.queue, l, ptr.group)
		has, err := b.idsText(ctx, home, "look", id, "r")
		if err != nil {
			if has, err = b.ifRetired(ctx, home, err, "0"); err != nil {
				return 0, err
			}
		}
		if has == "1" {
			if err := b.moveAhead(ctx, l, home, []string{id}); err != nil {
				return 0, err
			}
			continue
		}
		if _, err := b.idsText(ctx, o, "drop", id, ptr.group); err != nil {
			return 0, err
		}
	}
	n, err := b.rdb.ZCard(ctx, o.k("x")).Result()
	if err != nil {
		return fail(err)
	}
	return int(n), nil
}

// reserveAndTake reserves the peeked tasks' IDs (and copies their locks) in
// the new span, then takes them out of o; tasks that turned active or went
// away meanwhile are unreserved. A task with a free ID gets its pointer in
// the new span first.
func (b *Broker) reserveAndTake(ctx context.Context, l layout, o part, peek []any) ([]moved, error) {
	if len(peek)%3 != 0 {
		return nil, fmt.Errorf("tide: redisbroker: repartition %s: peek returned %d values", o.queue, len(peek))
	}
	type res struct {
		ids []string
		cmd *redis.Cmd
	}
	type peeked struct {
		id, uniq, lock, key string
		free                bool // needs a pointer in the new span
		group               string
	}
	var ps []peeked
	for i := 0; i < len(peek); i += 3 {
		var pk peeked
		pk.id, _ = peek[i].(string)
		rec, _ := peek[i+1].(string)
		pk.lock, _ = peek[i+2].(string)
		pk.key = pk.id
		if t, err := codec.DecodeHeader(o.queue, pk.id, []byte(rec)); err == nil {
			pk.uniq = t.UniqueKey
			pk.key = storeKey(t)
			pk.free, pk.group = needsPointer(t, l), t.Group
		}
		ps = append(ps, pk)
	}
	// A task with a free ID gets its pointer first: a lookup by ID (a
	// Delete) then finds the task's placeholder and, once it is placed,
	// the task in its new partition. What was peeked may be out of date:
	// a Replace may have moved the task ahead since, and the new span may
	// have made something else of the ID (replaced the task into another
	// group, deleted it and stored another task). put keeps a pointer it
	// finds, and a record there is a conflict only when the task still
	// waits here.
	var putClash []string
	for _, pk := range ps {
		if !pk.free {
			continue
		}
		r, err := b.idsText(ctx, b.partOf(o.queue, l, pk.id), "put", pk.id, newNonce(), pk.group)
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, err)
		}
		if r != "1" {
			putClash = append(putClash, pk.id)
		}
	}
	var skip map[string]bool
	if len(putClash) > 0 {
		var err error
		if skip, err = b.movedMeanwhile(ctx, o, putClash); err != nil {
			return nil, err
		}
	}
	reserve := map[part][]any{}
	locks := map[part][]any{}
	groupOf := map[string]string{} // ID -> what places it (storeKey)
	var ids []any
	for _, pk := range ps {
		if skip[pk.id] {
			continue
		}
		uniq, lock := pk.uniq, pk.lock
		groupOf[pk.id] = pk.key
		np := b.partOf(o.queue, l, pk.key)
		if uniq != "" && lock != "" && broker.Partition(uniq, l.cur.n) != broker.Partition(pk.key, l.cur.n) {
			up := b.partOf(o.queue, l, uniq)
			locks[up] = append(locks[up], uniq, lock)
			uniq, lock = "", ""
		}
		reserve[np] = append(reserve[np], pk.id, uniq, lock)
		ids = append(ids, pk.id)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := b.rdb.Pipeline()
	var rs []res
	for p, args := range reserve {
		r := res{cmd: b.s.move.Run(ctx, pipe, b.moveKeys(p), append([]any{p.layout, "reserve"}, args...)...)}
		for i := 0; i < len(args); i += 3 {
			r.ids = append(r.ids, args[i].(string))
		}
		rs = append(rs, r)
	}
	for p, args := range locks {
		b.s.move.Run(ctx, pipe, b.moveKeys(p), append([]any{p.layout, "lock"}, args...)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("tide: redisbroker: repartition %s: reserve: %w", o.queue, classify(err))
	}
	var clash []string
	for _, r := range rs {
		codes, _ := r.cmd.Val().(string)
		for j, c := range codes {
			switch c {
			case '1':
			case '2':
				// The repartition finished since the peek: o is retired
				// and holds nothing to take.
				return nil, fmt.Errorf("%w: repartition %s: it finished meanwhile (the old partition is retired); look again", broker.ErrUnavailable, o.queue)
			default:
				clash = append(clash, r.ids[j])
			}
		}
	}
	if len(clash) > 0 {
		// The new span holds a task with the ID. Another run (a Replace
		// that moved the task ahead) may have moved it there since the
		// peek: then it is no longer here, or flagged as moving, and not
		// to be taken again.
		skip, err := b.movedMeanwhile(ctx, o, clash)
		if err != nil {
			return nil, err
		}
		kept := ids[:0]
		for _, id := range ids {
			if !skip[id.(string)] {
				kept = append(kept, id)
			}
		}
		ids = kept
	}
	if len(ids) == 0 {
		return nil, nil
	}
	res2, err := b.moveCall(ctx, o, "take", ids...).Slice()
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: repartition %s: take: %w", o.queue, classify(err))
	}
	ms, busy, err := parseTaken(res2)
	if err != nil {
		return nil, err
	}
	taken := map[string]bool{}
	for _, m := range ms {
		taken[m.id] = true
	}
	un := map[part][]any{}
	for _, id := range ids {
		// A task another run took keeps its placeholder: that run places
		// it there.
		if !taken[id.(string)] && !busy[id.(string)] {
			np := b.partOf(o.queue, l, groupOf[id.(string)])
			un[np] = append(un[np], id)
		}
	}
	for p, args := range un {
		if err := b.moveCall(ctx, p, "unreserve", args...).Err(); err != nil {
			return nil, fmt.Errorf("tide: redisbroker: repartition %s: unreserve: %w", o.queue, classify(err))
		}
	}
	return ms, nil
}

// movedMeanwhile looks up in old partition o the tasks whose IDs the new
// span holds already: those gone from o, or taken by another run, were moved
// by that run (skip them); one still waiting in o exists twice, an error.
func (b *Broker) movedMeanwhile(ctx context.Context, o part, ids []string) (map[string]bool, error) {
	pipe := b.rdb.Pipeline()
	recs := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		recs[i] = pipe.HGet(ctx, o.k("t"), id)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, classify(err))
	}
	skip := map[string]bool{}
	for i, id := range ids {
		rec, err := recs[i].Bytes()
		if err != nil || codec.Moving(rec) {
			skip[id] = true
			continue
		}
		return nil, fmt.Errorf("%w: repartition %s: task %q exists in both the old and the new partitions; delete one of them and run the repartition again",
			broker.ErrTaskIDConflict, o.queue, id)
	}
	return skip, nil
}

// parseTaken reads what take and moving return: per task id, status,
// record, state, score, result, history, group, durable records. It returns the taken ones
// ("ok") and the IDs of those another run has taken ("moving").
func parseTaken(res []any) ([]moved, map[string]bool, error) {
	if len(res)%9 != 0 {
		return nil, nil, fmt.Errorf("tide: redisbroker: repartition: %d values for taken tasks", len(res))
	}
	var out []moved
	busy := map[string]bool{}
	for i := 0; i < len(res); i += 9 {
		if st, _ := res[i+1].(string); st != "ok" {
			if st == "moving" {
				id, _ := res[i].(string)
				busy[id] = true
			}
			continue
		}
		m := moved{}
		m.id, _ = res[i].(string)
		m.rec, _ = res[i+2].(string)
		m.state, _ = res[i+3].(int64)
		m.result, _ = res[i+5].(string)
		m.hist, _ = res[i+6].(string)
		m.group, _ = res[i+7].(string)
		m.dur, _ = res[i+8].(string)
		switch v := res[i+4].(type) {
		case int64:
			m.score = float64(v)
		case string:
			fmt.Sscan(v, &m.score)
		}
		out = append(out, m)
	}
	return out, busy, nil
}

// place puts taken tasks into their new partitions, then deletes them from o.
func (b *Broker) place(ctx context.Context, l layout, o part, ms []moved) error {
	byPart := map[part][]any{}
	for _, m := range ms {
		p := b.partOf(o.queue, l, m.key())
		byPart[p] = append(byPart[p], m.id, m.rec, m.state, int64(m.score), m.result, m.hist, m.group, m.dur)
	}
	pipe := b.rdb.Pipeline()
	for p, args := range byPart {
		b.s.move.Run(ctx, pipe, b.moveKeys(p), append([]any{p.layout, "place", p.channel, p.idx}, args...)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: place: %w", o.queue, classify(err))
	}
	ids := make([]any, len(ms))
	for i, m := range ms {
		ids[i] = m.id
	}
	if err := b.moveCall(ctx, o, "finish", ids...).Err(); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: finish: %w", o.queue, classify(err))
	}
	// A task with a free ID that moved leaves its old pointer behind.
	for _, m := range ms {
		g := m.key()
		if g == m.id || l.old.n < 2 || broker.Partition(m.id, l.old.n) == broker.Partition(g, l.old.n) {
			continue
		}
		in, _ := b.oldPartOf(o.queue, l, m.id)
		if _, err := b.idsText(ctx, in, "drop", m.id, g); err != nil {
			return fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, err)
		}
	}
	return nil
}

// key is what places m in its partition: its group, or its ID.
func (m moved) key() string {
	if g, _, _ := strings.Cut(m.group, "\x00"); g != "" {
		return g
	}
	return m.id
}

// retireStep, when set (by tests), runs in retire just before old
// partition o is retired (retired false) and just after (true).
var retireStep atomic.Pointer[func(o part, retired bool)]

// retire adds old partition o's day counters to the new span's first
// partition (once) and retires o if it holds nothing; it reports whether it
// did.
func (b *Broker) retire(ctx context.Context, l layout, o part, idx int) (bool, error) {
	stats, err := b.rdb.HGetAll(ctx, o.k("stat")).Result()
	if err != nil {
		return false, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, classify(err))
	}
	if len(stats) > 0 {
		args := []any{"merged:" + l.old.tag() + ":" + fmt.Sprint(idx)}
		for f, v := range stats {
			if strings.HasPrefix(f, "p:") || strings.HasPrefix(f, "f:") {
				args = append(args, f, v)
			}
		}
		if err := b.moveCall(ctx, b.partAt(o.queue, l, 0), "stats", args...).Err(); err != nil {
			return false, fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, classify(err))
		}
	}
	if h := retireStep.Load(); h != nil {
		(*h)(o, false)
	}
	// The limits hash goes last: retire refuses while it holds slots
	// (releaseSlots then runs again).
	r, err := b.s.move.Run(ctx, b.rdb, append(b.moveKeys(o), o.k("lim")), o.layout, "retire").Int64Slice()
	if err != nil {
		return false, fmt.Errorf("tide: redisbroker: repartition %s: retire: %w", o.queue, classify(err))
	}
	if len(r) == 2 && r[0] == 1 {
		if h := retireStep.Load(); h != nil {
			defer (*h)(o, true)
		}
		b.rdb.Del(ctx, o.k("x"), o.k("xr")) // the task index's, not listed in moveKeys
		// Nothing writes to a retired partition again: its events stay
		// for readers that have not reached its end, then expire.
		if b.eventsAge > 0 {
			b.rdb.PExpire(ctx, o.k(eventsKey), b.eventsAge)
		} else {
			b.rdb.PExpire(ctx, o.k(eventsKey), DefaultEventsMaxAge)
		}
		return true, nil
	}
	return false, nil
}

// handOverGroups copies the rate windows and throttles of old partition o's
// groups to their partitions in the new span. It runs when o holds no task:
// grouped tasks start nowhere while a repartition runs, so nothing changes
// them in o any more, and the new span's groups see them before they start.
func (b *Broker) handOverGroups(ctx context.Context, l layout, o part) error {
	if err := b.loadMove(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: repartition %s: %w", o.queue, err)
	}
	cursor := "0"
	for {
		res, err := b.moveCall(ctx, o, "groups", cursor).Slice()
		if err != nil {
			return fmt.Errorf("tide: redisbroker: repartition %s: groups: %w", o.queue, classify(err))
		}
		if len(res)%3 != 1 {
			return fmt.Errorf("tide: redisbroker: repartition %s: groups returned %d values", o.queue, len(res))
		}
		cursor, _ = res[0].(string)
		byPart := map[part][]any{}
		for i := 1; i < len(res); i += 3 {
			g, _ := res[i].(string)
			np := b.partOf(o.queue, l, g) // a group's tasks are in the partition of its key
			byPart[np] = append(byPart[np], res[i], res[i+1], res[i+2])
		}
		if len(byPart) > 0 {
			pipe := b.rdb.Pipeline()
			for p, args := range byPart {
				b.s.move.Run(ctx, pipe, b.moveKeys(p), append([]any{p.layout, "adopt"}, args...)...)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("tide: redisbroker: repartition %s: adopt: %w", o.queue, classify(err))
			}
		}
		if cursor == "0" || cursor == "" {
			return nil
		}
	}
}

// moveAhead moves the tasks ids of old partition o to the new span now,
// ahead of the repartition's own order, as the repartition moves tasks (a
// crash at any step neither loses nor doubles one): so that a Replace finds
// a waiting task where new tasks go. A task that runs stays where it is; one
// another run has taken is placed from what that run left.
func (b *Broker) moveAhead(ctx context.Context, l layout, o part, ids []string) error {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	peek, err := b.moveCall(ctx, o, "peekids", args...).Slice()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: enqueue: move ahead: %w", classify(err))
	}
	ms, err := b.reserveAndTake(ctx, l, o, peek)
	if err != nil {
		return err
	}
	res, err := b.moveCall(ctx, o, "moving", append([]any{len(ids)}, args...)...).Slice()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: enqueue: move ahead: %w", classify(err))
	}
	others, _, err := parseTaken(res)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, m := range ms {
		seen[m.id] = true
	}
	for _, m := range others {
		if !seen[m.id] {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return nil
	}
	return b.place(ctx, l, o, ms)
}
