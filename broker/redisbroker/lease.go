package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// Dequeue implements broker.Broker. Queues are tried in order; the
// partitions of a queue from a rotating start, so that all get served. A
// partition that cannot be reached is skipped; its error is returned only
// when nothing could be had.
func (b *Broker) Dequeue(ctx context.Context, queues []string, n int, lease time.Duration) ([]*broker.Delivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	var out []*broker.Delivery
	var firstErr error
	start := int(b.nextStart.Add(1))
	for _, q := range queues {
		l, err := b.layoutOf(ctx, q)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		for i := 0; i < l.total() && len(out) < n; i++ {
			p := b.partAt(q, l, (start+i)%l.total())
			c := b.dequeueCall(p, n-len(out), lease)
			b.run(ctx, []*call{c})
			if c.err != nil {
				// One unreachable partition (a cluster node failing over)
				// must not starve the others.
				if firstErr == nil {
					firstErr = callErr("dequeue "+q, c.err)
				}
				continue
			}
			res, err := c.cmd.Slice()
			if err != nil {
				if firstErr == nil {
					firstErr = callErr("dequeue "+q, fmt.Errorf("unexpected reply: %w", err))
				}
				continue
			}
			if len(res) == 1 {
				// The partition wants slots of the queue's limits, or
				// holds some it is to give away (dequeue.lua).
				b.kick(q)
			}
			for j := 0; j+2 < len(res); j += 3 {
				id, _ := res[j].(string)
				rec, _ := res[j+1].(string)
				dur, _ := res[j+2].(string)
				t, tok, derr := codec.Decode(q, id, []byte(rec))
				if derr == nil && t.Type == "" {
					derr = fmt.Errorf("%w: empty task type", codec.ErrCorrupt)
				}
				if derr != nil {
					tok, _ = codec.Token([]byte(rec))
					b.archiveUndecodable(ctx, p, id, tok, derr)
					continue
				}
				out = append(out, &broker.Delivery{Task: t, Token: tok, LeaseFor: lease, Internal: codec.Internal([]byte(rec)),
					Steps: broker.DecodeSteps([]byte(dur)), StepsLoaded: true})
			}
		}
		if len(out) >= n {
			break
		}
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// dequeueCall is the call that leases up to n tasks of partition p:
// dequeue_plain.lua when the partition's queue records no events and the
// partition was not found lately to hold limits or groups (the script
// itself refuses, changing nothing, when it does, and dequeue.lua runs
// instead with the same request), else dequeue.lua.
func (b *Broker) dequeueCall(p part, n int, lease time.Duration) *call {
	rid, cache, exp, edge := b.request(p)
	full := func() *call {
		return &call{
			script: b.s.dequeue,
			keys:   append(append(append(p.keys("t", "pending", "active", "paused", "archived", "result", "scheduled", "retry", "seq", "meta"), cache, p.k("lim"), p.k("starts")), p.groupKeys()...), p.k(eventsKey)),
			args:   []any{p.layout, rid, exp, n, lease.Milliseconds(), p.channel, p.idx, b.eventsArg(p), broker.MaxRatePer.Milliseconds(), broker.MaxQueueRate},
			queue:  p.queue,
		}
	}
	if n > maxPlain || b.eventsArg(p) != "" || !b.plainOK(p.base) {
		return full()
	}
	c := &call{
		script: b.s.dequeuePlain,
		keys: []string{p.plainKeys[0], p.plainKeys[1], p.k("active"), p.k("paused"), p.plainKeys[2], p.plainKeys[3],
			p.k("seq"), p.plainKeys[4], cache, p.k("lim"), p.k("starts"), p.k("gid"), p.k("archived"), p.k("result")},
		args:  []any{p.layout, rid, b.plainExpiry(p, cache, exp, edge), n, lease.Milliseconds(), broker.MaxRatePer.Milliseconds(), broker.MaxQueueRate},
		queue: p.queue,
		full:  full,
		base:  p.base,
	}
	return c.withExpiry(p, cache)
}

// maxPlain is the most tasks a plain script's call takes: they pass their
// lists to one command each, and Lua unpacks a few thousand values at most.
const maxPlain = 1000

// plainExpiry is a plain script's reply cache expiry argument: exp, or -exp
// when the call need not set it (setsExpiry).
func (b *Broker) plainExpiry(p part, cache string, exp int64, edge bool) int64 {
	if b.setsExpiry(p.base, cache, edge) {
		return exp
	}
	return -exp
}

// withExpiry notes, on a plain script's call that sets its reply cache's
// expiry (a positive ARGV[3]), which cache that is.
func (c *call) withExpiry(p part, cache string) *call {
	if c.args[2].(int64) > 0 {
		c.expiry = [2]string{p.base, cache}
	}
	return c
}

// archiveUndecodable archives a leased task whose body could not be decoded,
// through the settle script so that the lease's token fences it.
func (b *Broker) archiveUndecodable(ctx context.Context, p part, id string, tok uint64, derr error) {
	now := b.Now()
	s := broker.Settlement{
		Lease: broker.LeaseRef{Queue: p.queue, ID: id, Token: tok},
		Kind:  broker.SettleArchive, At: now,
		Err: "tide: undecodable task record: " + derr.Error(),
	}
	b.run(ctx, []*call{b.settleCall(p, []broker.Settlement{s}, []int{0})})
}

// leaseKey is what places a leased task in its partition: its group when
// it has one (a group's tasks live in the group's partition, whatever
// their IDs; a tagged ID's partition is its group's too), else its ID.
func leaseKey(ref broker.LeaseRef) string {
	if ref.Group != "" {
		return ref.Group
	}
	return ref.ID
}

// Extend implements broker.Broker: one script call per partition.
func (b *Broker) Extend(ctx context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	errs := make([]error, len(leases))
	b.perPartition(ctx, "extend", len(leases), func(i int) broker.LeaseRef { return leases[i] }, errs,
		func(p part, idx []int) *call {
			args := []any{p.layout, d.Milliseconds()}
			for _, i := range idx {
				args = append(args, leases[i].ID, leases[i].Token)
			}
			return &call{script: b.s.extend, keys: p.keys("t", "active", "meta"), args: args, queue: p.queue}
		}, map[byte]error{'1': broker.ErrLeaseLost, '2': broker.ErrTaskCanceled})
	return errs, nil
}

// perPartition runs one call per partition for n lease references and maps
// each element's reply code: '0' is success, '3' (no such task here) sends
// the element to its partition in the old span while a repartition runs and
// is ErrLeaseLost otherwise, the other codes go through m. A queue whose
// layout cannot be read, or a call that fails, fails only its own elements.
func (b *Broker) perPartition(ctx context.Context, op string, n int, at func(int) broker.LeaseRef, errs []error,
	build func(p part, idx []int) *call, m map[byte]error) {
	var gs grouping
	for i := range n {
		ref := at(i)
		l, err := b.layoutOf(ctx, ref.Queue)
		if err != nil {
			errs[i] = err
			continue
		}
		gs.add(b.partOf(ref.Queue, l, leaseKey(ref)), i)
	}
	order := gs.order
	for round := 0; len(order) > 0 && round < 2; round++ {
		calls := make([]*call, len(order))
		for gi, g := range order {
			calls[gi] = build(g.p, g.idx)
		}
		b.run(ctx, calls)
		var next grouping
		for gi, g := range order {
			c := calls[gi]
			var codes string
			err := c.err
			if err == nil {
				codes, err = c.cmd.Text()
				if err == nil && len(codes) != len(g.idx) {
					err = fmt.Errorf("%d codes for %d items", len(codes), len(g.idx))
				}
				if err != nil {
					err = fmt.Errorf("unexpected reply: %w", err)
				}
			}
			for j, i := range g.idx {
				switch {
				case err != nil:
					errs[i] = callErr(op, err)
				case codes[j] == '0':
					errs[i] = nil
				case codes[j] == '3':
					errs[i] = broker.ErrLeaseLost
					if g.p.old {
						continue
					}
					ref := at(i)
					l, err := b.layoutOf(ctx, ref.Queue)
					if err != nil {
						continue
					}
					if o, ok := b.oldPartOf(ref.Queue, l, leaseKey(ref)); ok {
						next.add(o, i)
					}
				default:
					if e, ok := m[codes[j]]; ok {
						errs[i] = e
					} else {
						errs[i] = callErr(op, fmt.Errorf("unknown code %q", codes[j]))
					}
				}
			}
		}
		order = next.order
	}
}

// Settle implements broker.Broker: one script call per partition.
func (b *Broker) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for _, s := range ss {
		if s.Kind < broker.SettleDone || s.Kind > broker.SettlePark {
			return nil, fmt.Errorf("tide: redisbroker: settle %s: unknown kind %d", s.Lease.ID, s.Kind)
		}
	}
	errs := make([]error, len(ss))
	b.perPartition(ctx, "settle", len(ss), func(i int) broker.LeaseRef { return ss[i].Lease }, errs,
		func(p part, idx []int) *call { return b.settleCall(p, ss, idx) },
		map[byte]error{'1': broker.ErrLeaseLost})
	return errs, nil
}

// settleCall is the call that applies the settlements at idx of ss, all
// of partition p: settle_plain.lua when they all delete plain tasks
// (plainDone), the partition's queue records no events and the partition
// was not found lately to need settle.lua (which then runs instead, with
// the same request, as for dequeueCall), else settle.lua.
func (b *Broker) settleCall(p part, ss []broker.Settlement, idx []int) *call {
	rid, cache, exp, edge := b.request(p)
	full := func() *call { return b.settleFullCall(p, ss, idx, rid, cache, exp) }
	if len(idx) > maxPlain || b.eventsArg(p) != "" || !b.plainOK(p.base) {
		return full()
	}
	for _, i := range idx {
		if !plainDone(ss[i]) {
			return full()
		}
	}
	args := make([]any, 0, 5+2*len(idx))
	args = append(args, p.layout, rid, b.plainExpiry(p, cache, exp, edge), b.today(), b.minute())
	for _, i := range idx {
		args = append(args, ss[i].Lease.ID, ss[i].Lease.Token)
	}
	c := &call{
		script: b.s.settlePlain,
		keys: []string{p.plainKeys[0], p.k("active"), p.k("result"), p.k("h"), p.k("stat"), p.plainKeys[4], cache,
			p.k("m"), p.k("lim"), p.k("pg"), p.k("wt"), p.k("oc")},
		args:  args,
		queue: p.queue,
		full:  full,
		base:  p.base,
	}
	return c.withExpiry(p, cache)
}

// plainDone reports whether settle_plain.lua may apply s: a plain task
// done and deleted (no retention, group, unique key, nor anyone following
// its end; the script checks the record again).
func plainDone(s broker.Settlement) bool {
	t := s.Task
	return s.Kind == broker.SettleDone && t != nil && t.Retention <= 0 && t.Group == "" && t.UniqueKey == "" && !broker.Followed(t.Headers)
}

// settleFullCall is settleCall's settle.lua call, for request rid.
func (b *Broker) settleFullCall(p part, ss []broker.Settlement, idx []int, rid, cache string, exp int64) *call {
	args := make([]any, 0, 12+9*len(idx))
	args = append(args, p.layout, rid, exp, p.channel, p.idx, b.today(), b.maxArchived, b.archiveTTL.Milliseconds(), b.minute(), b.doneChannel(p.queue), b.eventsArg(p), p.idTag)
	for _, i := range idx {
		s := ss[i]
		at := s.At
		if at.IsZero() {
			at = b.Now()
		}
		id, tok := s.Lease.ID, s.Lease.Token
		switch s.Kind {
		case broker.SettleDone:
			if s.Task != nil && s.Task.Retention > 0 {
				t := *s.Task
				t.State, t.CompletedAt = tidetype.StateCompleted, at
				args = append(args, "c", id, tok, codec.Encode(&t, tok), at.Add(t.Retention).UnixMilli(), at.UnixMilli())
			} else {
				args = append(args, "d", id, tok, "", "", at.UnixMilli())
			}
		case broker.SettleRetry:
			args = append(args, "r", id, tok, retryArg(s), at.UnixMilli(), s.Err)
		case broker.SettleArchive:
			args = append(args, "a", id, tok, "", at.UnixMilli(), s.Err)
		case broker.SettleDefer:
			op := "w"
			if s.Throttle {
				op = "t"
			}
			args = append(args, op, id, tok, retryArg(s), at.UnixMilli(), s.Err)
		case broker.SettlePark:
			args = append(args, "p", id, tok, retryArg(s), s.WaitFor, "tide: waiting for "+s.WaitFor)
		default: // broker.SettleRequeue (Settle checked the kinds)
			args = append(args, "q", id, tok, "", "", "")
		}
		var started int64
		if !s.Started.IsZero() {
			started = s.Started.UnixMilli()
		}
		group := "?" // unknown: the script looks it up
		if s.Task != nil {
			group = s.Task.Group
		}
		args = append(args, started, s.Server, group)
	}
	return &call{
		script: b.s.settle,
		keys:   append(append(append(p.keys("t", "active", "pending", "retry", "archived", "completed", "result", "scheduled", "u", "stat", "meta"), cache, p.k("h"), p.k("m"), p.k("lim")), append(p.groupKeys(), p.endKeys()...)...), p.k(eventsKey)),
		args:   args,
		queue:  p.queue,
	}
}

// retryArg is settle.lua's retry time of s: "+<ms>" for a RetryIn (counted
// on the Redis clock, rounded up to the millisecond so that a throttle
// lasts at least that long), else RetryAt in ms.
func retryArg(s broker.Settlement) string {
	if s.RetryIn > 0 {
		return "+" + strconv.FormatInt((s.RetryIn+time.Millisecond-1).Milliseconds(), 10)
	}
	return strconv.FormatInt(s.RetryAt.UnixMilli(), 10)
}

// SetResult implements broker.Broker.
func (b *Broker) SetResult(ctx context.Context, lease broker.LeaseRef, data []byte) error {
	return b.writeLeased(ctx, "set result", b.s.setResult, "result", lease, data)
}

// writeLeased runs script (setresult.lua, progress.lua: KEYS records, the
// hash named hash, layout meta; ARGV layout, ID, token, value; replies 0
// written, 1 lease lost, 3 not here) in the partitions where the leased
// task may be.
func (b *Broker) writeLeased(ctx context.Context, op string, script *redis.Script, hash string, lease broker.LeaseRef, value any) error {
	if err := b.check(); err != nil {
		return err
	}
	l, err := b.layoutOf(ctx, lease.Queue)
	if err != nil {
		return err
	}
	for _, p := range b.lookup(lease.Queue, l, leaseKey(lease)) {
		c := &call{script: script, keys: p.keys("t", hash, "meta"), args: []any{p.layout, lease.ID, lease.Token, value}, queue: lease.Queue}
		b.run(ctx, []*call{c})
		if c.err != nil {
			return callErr(op, c.err)
		}
		code, err := c.cmd.Int64()
		if err != nil {
			return callErr(op, fmt.Errorf("unexpected reply: %w", err))
		}
		switch code {
		case 0:
			return nil
		case 1:
			return broker.ErrLeaseLost
		}
	}
	return broker.ErrLeaseLost
}
