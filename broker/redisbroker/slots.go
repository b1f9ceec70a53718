package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// This file moves the slots of a queue's Concurrency and Rate between its
// partitions (and its bank) as their backlogs change; slots.lua holds the
// steps and the package documentation ("Limits") the argument.

// bankKey names queue's bank: the slots of its limits that no partition
// holds. It shares the hash slot of the limits record ("{<prefix>:limits}"
// is the whole name of that record), so that recording a new limit and
// changing the bank by the difference are one step.
func (b *Broker) bankKey(queue string) string { return "{" + b.limitsKey() + "}:bank:" + queue }

// slotNode is what a rebalance read of one node: a partition, or the bank.
type slotNode struct {
	p    part // zero for the bank
	bank bool
	old  bool   // a partition of the old span of a running repartition
	id   string // "B" for the bank, else the partition's tag after "<queue>:"
	meta string

	c, r       int64 // slots held
	hasC, hasR bool  // the node holds slots of that limit (else it has none)
	ce, re     string
	ct         int64
	hasCt      bool
	cs, rs     bool
	xo         string

	active, waiting, used int64
	// frees is the ms until the oldest start in the rate's period leaves
	// it (-1: no start in the period).
	frees int64
	// forgot counts the partition's forgotten starts in the rate's period
	// (see dropUnbacked): starts no token backs, counted against the
	// tokens shared out.
	forgot int64
	// pn is the shorter rate period, ms, that waits to come in on the
	// partition ("" none; see comePeriod).
	pn string
}

// nodeID is partition p's tag after "<queue>:" ("3", "3@2"), the name a
// transfer record gives it.
func (b *Broker) nodeID(p part) string {
	return p.base[len(b.prefix)+2+len(p.queue)+1 : len(p.base)-2]
}

// slotCall runs op of slots.lua on node n.
func (b *Broker) slotCall(queue string, n *slotNode, op string, args ...any) *call {
	if n.bank {
		return &call{script: b.s.slots, keys: []string{b.bankKey(queue)}, args: append([]any{"b", "", op}, args...), queue: queue}
	}
	p := n.p
	return &call{
		script: b.s.slots,
		keys:   p.keys("lim", "starts", "active", "pending", "meta", "scheduled", "retry", "gq", "gr", "gw", "forgot"),
		args:   append([]any{"p", p.layout, op}, args...),
		queue:  queue,
	}
}

// slotNodes returns the nodes of queue under layout l: the bank first, then
// every partition (the current span's, then the old span's).
func (b *Broker) slotNodes(queue string, l layout) []*slotNode {
	ns := []*slotNode{{bank: true, id: "B"}}
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		ns = append(ns, &slotNode{p: p, old: p.old, id: b.nodeID(p)})
	}
	return ns
}

// readSlots reads every node's state (slots.lua "state"). A queue limited
// in a resource gets a bank for it if it has none (slots recorded before
// the bank existed, era '0').
func (b *Broker) readSlots(ctx context.Context, queue string, ns []*slotNode, lim tidetype.QueueLimits) error {
	pipe := b.rdb.Pipeline()
	if lim.Concurrency > 0 {
		pipe.HSetNX(ctx, b.bankKey(queue), "c", 0)
	}
	if lim.Rate.Limit > 0 {
		pipe.HSetNX(ctx, b.bankKey(queue), "r", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return callErr("rebalance "+queue, classify(err))
	}
	most := int64(max(lim.Concurrency, lim.Rate.Limit))
	per := ""
	if lim.Rate.Limit > 0 {
		per = strconv.FormatInt(lim.Rate.Per.Milliseconds(), 10)
	}
	calls := make([]*call, len(ns))
	for i, n := range ns {
		calls[i] = b.slotCall(queue, n, "state", most, per)
	}
	if err := b.runAll(ctx, "rebalance "+queue, calls); err != nil {
		return err
	}
	for i, n := range ns {
		v, err := calls[i].cmd.Slice()
		if err != nil || len(v) != 15 {
			return callErr("rebalance "+queue, fmt.Errorf("unexpected state reply %v (%v)", calls[i].cmd.Val(), err))
		}
		str := func(j int) string { s, _ := v[j].(string); return s }
		i64 := func(j int) int64 {
			switch x := v[j].(type) {
			case int64:
				return x
			case string:
				n, _ := strconv.ParseInt(x, 10, 64)
				return n
			}
			return 0
		}
		n.meta = str(0)
		n.hasC, n.hasR = str(1) != "", str(3) != ""
		n.c, n.r = i64(1), i64(3)
		n.ce, n.re = str(2), str(4)
		n.hasCt = str(5) != ""
		n.ct = i64(5)
		n.xo = str(6)
		n.active, n.waiting, n.used = i64(7), i64(8), i64(9)
		n.cs, n.rs = str(10) == "1", str(11) == "1"
		n.frees = -1
		if str(12) != "" {
			n.frees = i64(12)
		}
		n.forgot = i64(13)
		n.pn = str(14)
	}
	return nil
}

// transfer is one parsed outstanding record of a node: its parts.
type transfer struct {
	src    *slotNode
	seq    string
	ce, re string
	parts  []transferPart
}

type transferPart struct {
	dest   string
	dc, dr int64
	ages   string
}

func parseTransfer(src *slotNode, rec string) (transfer, error) {
	f := strings.Split(rec, "|")
	if len(f) < 4 {
		return transfer{}, fmt.Errorf("transfer record %q of node %s", rec, src.id)
	}
	t := transfer{src: src, seq: f[0], ce: f[1], re: f[2]}
	for _, p := range f[3:] {
		g := strings.Split(p, ",")
		if len(g) != 4 {
			return transfer{}, fmt.Errorf("transfer record %q of node %s", rec, src.id)
		}
		dc, err1 := strconv.ParseInt(g[1], 10, 64)
		dr, err2 := strconv.ParseInt(g[2], 10, 64)
		if err1 != nil || err2 != nil {
			return transfer{}, fmt.Errorf("transfer record %q of node %s", rec, src.id)
		}
		t.parts = append(t.parts, transferPart{dest: g[0], dc: dc, dr: dr, ages: g[3]})
	}
	return t, nil
}

// destNode finds the node a transfer names among ns; a partition not in the
// layout (a span retired since) gets a node of its own, on which the apply
// step finds the partition retired: the part goes to the bank (complete).
func (b *Broker) destNode(queue string, ns []*slotNode, id string) *slotNode {
	for _, n := range ns {
		if n.id == id {
			return n
		}
	}
	base := b.prefix + ":{" + queue + ":" + id + "}:"
	return &slotNode{id: id, p: part{queue: queue, idx: -1, base: base, channel: b.channel(queue)}}
}

// complete applies the transfers at their destinations and then clears
// them at their sources.
func (b *Broker) complete(ctx context.Context, queue string, ns []*slotNode, ts []transfer) error {
	var applies []*call
	var owner []int          // the transfer of each apply
	var parts []transferPart // and its part
	for ti, t := range ts {
		for _, p := range t.parts {
			d := b.destNode(queue, ns, p.dest)
			idx := ""
			if !d.bank && d.p.idx >= 0 {
				idx = strconv.Itoa(d.p.idx)
			}
			applies = append(applies, b.slotCall(queue, d, "apply", t.src.id, t.seq, t.ce, t.re, p.dc, p.dr, p.ages, b.channel(queue), idx, broker.MaxRatePer.Milliseconds()))
			owner = append(owner, ti)
			parts = append(parts, p)
		}
	}
	b.run(ctx, applies)
	done := make([]bool, len(ts))
	for i := range done {
		done[i] = true
	}
	var firstErr error
	fail := func(ti int, err error) {
		done[ti] = false
		if firstErr == nil {
			firstErr = callErr("rebalance "+queue, err)
		}
	}
	// A part that reached its partition after the partition was retired
	// (a plan read while it still ran a task no slot covered, given after
	// the repartition's last look) goes to the bank, or the queue would
	// have lost it for good. The bank counts it once whatever the number of
	// tries: it keeps the last record applied per source and retired
	// partition, and a retired partition replies gone only for a part it
	// never applied. The starts that came with rate tokens are not
	// recorded there (the bank keeps none); no plan gives an old partition
	// rate tokens, so only transfers written before it did carry them.
	var reroutes []*call
	var rowner []int
	for i, c := range applies {
		if c.err != nil {
			fail(owner[i], c.err)
			continue
		}
		if v, _ := c.cmd.Val().(string); v == "gone" {
			t, p := ts[owner[i]], parts[i]
			reroutes = append(reroutes, b.slotCall(queue, ns[0], "apply", t.src.id+">"+p.dest, t.seq, t.ce, t.re, p.dc, p.dr, "", b.channel(queue), "", broker.MaxRatePer.Milliseconds()))
			rowner = append(rowner, owner[i])
		}
	}
	if len(reroutes) > 0 {
		b.run(ctx, reroutes)
		for i, c := range reroutes {
			if c.err != nil {
				fail(rowner[i], c.err)
			}
		}
	}
	var clears []*call
	for i, t := range ts {
		if done[i] {
			clears = append(clears, b.slotCall(queue, t.src, "clear", t.seq))
		}
	}
	if err := b.runAll(ctx, "rebalance "+queue, clears); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

// outstanding parses the nodes' outstanding records.
func outstanding(ns []*slotNode) ([]transfer, error) {
	var ts []transfer
	for _, n := range ns {
		if n.xo == "" {
			continue
		}
		t, err := parseTransfer(n, n.xo)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// rebalance moves queue's slots towards where tasks wait: it finishes the
// transfers a crash (or another process) left outstanding, then computes
// each partition's fair holding and moves free slots from those above it to
// those below it, sets caps on partitions that hold more than their fair
// holding while others want slots, and takes slots back from the partitions
// when a lowered limit left the bank in debt. It is safe to run anywhere at
// any time, also in several processes at once: every step is one atomic
// script on one node, and a transfer is applied once however often it is
// completed (see slots.lua).
func (b *Broker) rebalance(ctx context.Context, queue string) error {
	if err := b.check(); err != nil {
		return err
	}
	v, lim, ok, err := b.readLimits(ctx, queue)
	if err != nil || !ok || (lim.Concurrency == 0 && lim.Rate.Limit == 0) {
		return err
	}
	replanned, periodRead, recapped := false, false, 0
	for attempt := 0; ; attempt++ {
		l, known, err := b.knownLayout(ctx, queue)
		if err != nil || !known {
			return err
		}
		ns := b.slotNodes(queue, l)
		if err := b.readSlots(ctx, queue, ns, lim); err != nil {
			return err
		}
		ts, err := outstanding(ns)
		if err != nil {
			return callErr("rebalance "+queue, err)
		}
		if len(ts) > 0 {
			if err := b.complete(ctx, queue, ns, ts); err != nil || attempt >= 2 {
				return err
			}
			continue
		}
		if h := rebalanceRead.Load(); h != nil {
			(*h)(queue)
		}
		if err := b.comePeriod(ctx, queue, v, ns); err != nil {
			return err
		}
		forgot, err := b.dropUnbacked(ctx, queue, ns, lim)
		plan := lim
		if errors.Is(err, errForgetBusy) {
			// Another rebalance forgets starts, and plans the rate
			// tokens after: this one's counts may hold the starts it
			// forgets, so it plans the concurrency slots alone.
			plan.Rate, err = tidetype.Rate{}, nil
		}
		if err != nil {
			return err
		}
		if forgot {
			if h := rebalanceForgot.Load(); h != nil {
				(*h)(queue)
			}
			if attempt < 2 {
				// A forget may have sent tokens to the bank (slots.lua):
				// the plan is made from the slots as they are now.
				continue
			}
		}
		gives, caps, debt := planSlots(ns, plan)
		refused, err := b.execute(ctx, queue, v, ns, gives, caps)
		if err == nil && refused && recapped < maxRecaps {
			// Another rebalance changed a node between the read and its
			// cap: plan again from the slots as they are now.
			recapped++
			continue
		}
		if err == nil && !periodRead && periodWaits(ns) {
			// A shorter period waits for the tokens to come down to the
			// limit, which this plan may have done: read again.
			periodRead = true
			continue
		}
		if err != nil || !debt || replanned {
			return err
		}
		// A plan that paid a concurrency debt held every partition: plan
		// again, so that the slots go where tasks wait at once if the
		// debt is paid now.
		replanned = true
	}
}

// maxRecaps is how many times one rebalance plans again after a cap it
// wrote was refused (execute). Each time another process's rebalance
// changed a node in between; that one's own caps are then current.
const maxRecaps = 2

// periodWaits reports whether a live partition of ns waits for a shorter
// rate period to come in.
func periodWaits(ns []*slotNode) bool {
	for _, n := range ns[1:] {
		if liveNode(n) && n.pn != "" {
			return true
		}
	}
	return false
}

// comePeriod lets a shorter rate period come in (slots.lua "period") on the
// partitions of ns that wait for it, once the tokens they hold add up to
// no more than the limit of version v. A Rate changed to a shorter period
// (13 per 3 s to 6 per 2 s) leaves the partitions the old limit's tokens
// until a rebalance takes them back into the bank, and share.lua keeps
// them counting over the longer period until then: over the shorter one
// those tokens would start 13 in 2 s, over both rates (the flow-control
// model, seed 92). The nodes' tokens add up to the latest limit, so the
// bank holding all it needs (its debt paid, a token for each forgotten
// start in the period) means the partitions hold no more than the limit
// less the forgotten starts. ns was read with no transfer outstanding; a
// limits change since then is refused by version (the partition has the
// new version's settings) or came after the tokens were counted under v,
// which the new limits' call then rebalances.
func (b *Broker) comePeriod(ctx context.Context, queue string, v int64, ns []*slotNode) error {
	bank := ns[0]
	if !bank.hasR || !periodWaits(ns) {
		return nil
	}
	var keep int64
	for _, n := range ns[1:] {
		if liveNode(n) {
			keep += n.forgot
		}
	}
	if bank.r < keep {
		return nil
	}
	var calls []*call
	for _, n := range ns[1:] {
		if liveNode(n) && n.pn != "" {
			calls = append(calls, b.slotCall(queue, n, "period", v, n.p.channel, n.p.idx))
		}
	}
	return b.runAll(ctx, "rebalance "+queue, calls)
}

// unbacked returns the starts the live partitions of ns count in the
// Rate's period beyond the limit total, and the partitions with starts. The
// tokens the nodes hold add up to the latest limit (a lowered one leaves
// the bank in debt): with a limit raised since total was read, they tell
// the larger one.
func unbacked(ns []*slotNode, total int64) (excess int64, with []*slotNode) {
	bank := ns[0]
	var sum, tokens int64 = 0, bank.r
	for _, n := range ns[1:] {
		if !liveNode(n) {
			continue
		}
		if tokenNode(n, bank) {
			tokens += n.r
		}
		if n.used > 0 {
			sum += n.used
			with = append(with, n)
		}
	}
	return sum - max(total, tokens), with
}

// errForgetBusy is dropUnbacked's report that another rebalance holds the
// queue's forget lock.
var errForgetBusy = errors.New("tide: redisbroker: another rebalance is forgetting starts")

// rebalanceRead, when set (by tests), runs in rebalance after it read the
// slots and found no transfer outstanding, before it forgets or plans.
var rebalanceRead atomic.Pointer[func(queue string)]

// rebalanceForgot, when set (by tests), runs in rebalance after it forgot
// starts in excess and before it moves any slot.
var rebalanceForgot atomic.Pointer[func(queue string)]

// tokenNode reports whether n is a partition that holds rate tokens of the
// bank's era.
func tokenNode(n, bank *slotNode) bool {
	return liveNode(n) && n.hasR && n.re == bank.re
}

// liveNode reports whether n is a partition that is not retired: its
// starts count against the queue's Rate, whether it holds tokens of the
// rate yet or not (a rate switched on reaches the partitions one by one).
func liveNode(n *slotNode) bool {
	return !n.bank && n.meta != "" && n.meta != "retired"
}

// forgetBatch is the most starts one forget call names.
const forgetBatch = 1000

// forgetLockTTL is how long a rebalance holds the queue's forget lock at
// most (longer than a background rebalance may take). A lock left by a
// rebalance that died holding it stops forgetting for that long: the rate
// then starts nothing until its starts leave the period or the lock runs
// out, and never exceeds it. It is not shorter on purpose: a forget sent
// before the lock ran out may reach Redis later (held up by the network,
// as the fault proxy does for seconds), after another rebalance took the
// lock and counted the starts it was about to forget, which would then be
// forgotten twice.
const forgetLockTTL = 10 * time.Second

// dropUnbacked keeps the starts the partitions count in the Rate's period
// within the Rate's limit. More starts than tokens in a period happen when a
// rate is switched on or its period lengthened after them (they count: see
// the package documentation, "Limits"): then no token is free, and the
// excess starts, the oldest of the whole queue, are forgotten. That keeps
// every partition's starts under its tokens (planSlots gives each the
// tokens its starts use first), and is safe: no task starts until a start
// in the period leaves it, and the forgotten ones, older than every start
// counted, have left by then. A forget gives no partition room: the tokens
// it frees where the forgotten starts were (they backed tokens there, the
// excess being elsewhere or a lowered limit's debt unpaid) go to the bank
// as a transfer in the same step (slots.lua), so forgot reports that the
// slots were changed and must be read again before a plan.
//
// The excess is a count over several partitions, so two rebalances must
// not both forget it: one that read the counts before another forgot would
// forget as many again, starts that back tokens, and that many tasks would
// start over the limit. So the forgetting rebalance holds the queue's
// forget lock (on the bank), reads the slots again under it and forgets
// only what is still in excess. One that finds the lock taken forgets
// nothing and reports errForgetBusy: its counts may hold starts the other
// forgets, and a plan of the rate tokens made from them would give
// partitions tokens those starts no longer use (the flow-control model,
// seed 39: a stale plan gave a partition 5 tokens for its 4 counted starts
// while the queue's period held 40), so it plans the concurrency slots
// alone and leaves the rate tokens to the rebalance that forgot.
func (b *Broker) dropUnbacked(ctx context.Context, queue string, ns []*slotNode, lim tidetype.QueueLimits) (forgot bool, err error) {
	bank := ns[0]
	total := int64(lim.Rate.Limit)
	if total <= 0 || !bank.hasR {
		return false, nil
	}
	if excess, _ := unbacked(ns, total); excess <= 0 {
		return false, nil
	}
	token := strconv.FormatUint(rand.Uint64(), 36)
	lock := b.slotCall(queue, bank, "lock", token, forgetLockTTL.Milliseconds())
	if err := b.runAll(ctx, "rebalance "+queue, []*call{lock}); err != nil {
		return false, err
	}
	if ok, _ := lock.cmd.Int64(); ok != 1 {
		return false, errForgetBusy
	}
	defer func() {
		// A lock left behind (this call failed) only delays the next
		// forgetting until it runs out.
		b.run(context.WithoutCancel(ctx), []*call{b.slotCall(queue, bank, "unlock", token)})
	}()
	// Read again under the lock: counts read before another rebalance
	// forgot hold the starts it forgot, and a plan made from them would
	// give partitions tokens their starts no longer use.
	if err := b.readSlots(ctx, queue, ns, lim); err != nil {
		return false, err
	}
	if ts, err := outstanding(ns); err != nil || len(ts) > 0 {
		return true, err // a transfer to complete first
	}
	excess, with := unbacked(ns, total)
	if excess <= 0 || !bank.hasR {
		return false, nil
	}
	tokens := bank.r
	for _, n := range ns[1:] {
		if tokenNode(n, bank) {
			tokens += n.r
		}
	}
	calls := make([]*call, len(with))
	for i, n := range with {
		calls[i] = b.slotCall(queue, n, "oldest", min(excess, n.used), lim.Rate.Per.Milliseconds())
	}
	if err := b.runAll(ctx, "rebalance "+queue, calls); err != nil {
		return false, err
	}
	type start struct {
		n      *slotNode
		member string
		age    int64
	}
	var all []start
	var fresh int64
	for i, n := range with {
		v, err := calls[i].cmd.StringSlice()
		if err != nil || len(v)%2 != 1 {
			return false, callErr("rebalance "+queue, fmt.Errorf("unexpected oldest reply %v (%v)", calls[i].cmd.Val(), err))
		}
		u, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return false, callErr("rebalance "+queue, fmt.Errorf("unexpected oldest reply %v", v))
		}
		n.used = u
		fresh += u
		for j := 1; j < len(v); j += 2 {
			age, err := strconv.ParseInt(v[j+1], 10, 64)
			if err != nil {
				return false, callErr("rebalance "+queue, fmt.Errorf("unexpected oldest reply %v", v))
			}
			all = append(all, start{n, v[j], age})
		}
	}
	// Counted once more by the oldest op. (Starts made since the read
	// only add to the count, and the nodes without starts then are left
	// out: both make it forget fewer.)
	excess = min(excess, fresh-max(total, tokens))
	if excess <= 0 {
		return false, nil
	}
	slices.SortStableFunc(all, func(a, b start) int { return int(b.age - a.age) })
	all = all[:min(int64(len(all)), excess)]
	byNode := map[*slotNode][]any{}
	for _, s := range all {
		byNode[s.n] = append(byNode[s.n], s.member)
	}
	var forgets []*call
	for _, n := range with {
		ms := byNode[n]
		n.used -= int64(len(ms))
		n.forgot += int64(len(ms))
		for len(ms) > 0 {
			k := min(len(ms), forgetBatch)
			forgets = append(forgets, b.slotCall(queue, n, "forget", append([]any{broker.MaxRatePer.Milliseconds()}, ms[:k]...)...))
			ms = ms[k:]
		}
	}
	return len(forgets) > 0, b.runAll(ctx, "rebalance "+queue, forgets)
}

// execute runs a plan computed from limits version v: the gives and caps
// at once, then the transfers' applies and clears.
func (b *Broker) execute(ctx context.Context, queue string, v int64, ns []*slotNode, gives map[*slotNode][]give, caps map[*slotNode]capSet) (refused bool, err error) {
	var calls []*call
	var srcs []*slotNode
	for _, n := range ns {
		gs := gives[n]
		if len(gs) == 0 {
			continue
		}
		args := []any{n.id}
		for _, g := range gs {
			f := ""
			if g.force {
				f = "1"
			}
			args = append(args, g.dest.id, g.dc, g.dr, f)
		}
		calls = append(calls, b.slotCall(queue, n, "give", args...))
		srcs = append(srcs, n)
	}
	nGive := len(calls)
	// A cap is written only if the node's slots are as the plan expects
	// (slots.lua): a node that gives runs its give first, in the same
	// pipeline, so its cap expects the slots it keeps. Checked against the
	// slots read, every giver's cap was refused, and a giver kept a stale
	// cap and fair-share flag: one at its fair share (cs) by a cap of old
	// asked for no slot when tasks came, one without a cap freed a slot
	// with nothing to run and told nobody.
	after := func(n *slotNode) (c, r int64) {
		c, r = n.c, n.r
		for _, g := range gives[n] {
			c -= g.dc
			r -= g.dr
		}
		return c, r
	}
	var holds []*call
	firstCap := len(calls)
	for _, n := range ns {
		c, ok := caps[n]
		// A partition held at its rate share gets its cap again with each
		// plan: the moment its share is stale moves on.
		if !ok || n.bank || (c.hasCt == n.hasCt && (!c.hasCt || c.ct == n.ct) && c.cs == n.cs && c.rs == n.rs && (!c.rs || c.ru < 0)) {
			continue
		}
		if c.hold {
			holds = append(holds, b.slotCall(queue, n, "hold", v))
			continue
		}
		ct := ""
		if c.hasCt {
			ct = strconv.FormatInt(c.ct, 10)
		}
		kc, kr := after(n)
		calls = append(calls, b.slotCall(queue, n, "cap", ct, flag(c.cs), flag(c.rs), n.p.channel, n.p.idx,
			field(n.hasC, kc), field(n.hasR, kr), field(n.hasCt, n.ct), v, field(c.rs && c.ru >= 0, c.ru)))
	}
	// Holds go first: no partition starts a task on a free slot while the
	// gives are on their way.
	calls = append(holds, calls...)
	if len(calls) == 0 {
		return false, nil
	}
	b.run(ctx, calls)
	var firstErr error
	var ts []transfer
	for j, c := range calls {
		if c.err != nil {
			if firstErr == nil {
				firstErr = callErr("rebalance "+queue, c.err)
			}
			continue
		}
		i := j - len(holds) // the give's index in srcs
		if i >= firstCap {
			// A cap is refused (0) when the node's slots or cap changed
			// since the read: another rebalance moved or capped them.
			// The node keeps a cap and fair-share flags from an older
			// plan, which may leave it silent when it frees a slot with
			// nothing to run while another partition, told it holds its
			// fair share, does not ask: the caller plans again.
			if n, err := c.cmd.Int64(); err == nil && n == 0 {
				refused = true
			}
			continue
		}
		if i < 0 || i >= nGive {
			continue
		}
		v, err := c.cmd.Slice()
		if err != nil || len(v) != 2 {
			return refused, callErr("rebalance "+queue, fmt.Errorf("unexpected give reply %v (%v)", c.cmd.Val(), err))
		}
		if rec, _ := v[1].(string); rec != "" {
			t, err := parseTransfer(srcs[i], rec)
			if err != nil {
				return refused, callErr("rebalance "+queue, err)
			}
			ts = append(ts, t)
		}
	}
	if len(ts) > 0 {
		if err := b.complete(ctx, queue, ns, ts); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return refused, firstErr
}

// field is a hash field's value as slots.lua compares it: "" when missing.
func field(has bool, v int64) string {
	if !has {
		return ""
	}
	return strconv.FormatInt(v, 10)
}

func flag(v bool) string {
	if v {
		return "1"
	}
	return ""
}

// releaseAttempts is how many reads releaseSlots makes of an old
// partition's slots before it gives up; releaseBackoff the first wait
// between two of them, doubled each time up to releaseBackoffMax. Other
// processes' rebalances move tokens meanwhile: one that completes a
// transfer, or backs the old partition's starts with tokens again, makes
// the next read find something to do. Back to back, three reads gave up in
// 44 ms (the flow-control model, seed 95).
const (
	releaseAttempts   = 12
	releaseBackoff    = 10 * time.Millisecond
	releaseBackoffMax = 500 * time.Millisecond
)

// releaseRead, when set (by tests), runs in releaseSlots after each read of
// the slots.
var releaseRead atomic.Pointer[func(o part, attempt int)]

// releaseSlots gives every slot of old partition o, which holds no task any
// more, to the new span before the repartition retires it: its concurrency
// slots to the bank, its rate tokens (used ones with the ages of their
// starts) to a new partition, then the starts it still keeps (copyStarts).
// It is done only when a read finds o holding nothing and the starts moved
// while it held nothing: a rebalance elsewhere may give o tokens to back
// its starts at any moment until they are gone, and tokens o held when it
// is retired would be lost to the queue.
func (b *Broker) releaseSlots(ctx context.Context, l layout, o part) error {
	queue := o.queue
	ns := b.slotNodes(queue, l)
	var src *slotNode
	for _, n := range ns {
		if !n.bank && n.p.base == o.base {
			src = n
		}
	}
	if src == nil {
		return nil
	}
	_, lim, _, err := b.readLimits(ctx, queue)
	if err != nil {
		return err
	}
	wait, pause := releaseBackoff, false
	for attempt := 0; attempt < releaseAttempts; attempt++ {
		// A read right after this call's own give checks it; one after
		// another process's move waits for it to settle.
		if pause {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			wait = min(2*wait, releaseBackoffMax)
		}
		if err := b.readSlots(ctx, queue, ns, lim); err != nil {
			return err
		}
		if h := releaseRead.Load(); h != nil {
			(*h)(o, attempt)
		}
		ts, err := outstanding(ns)
		if err != nil {
			return callErr("rebalance "+queue, err)
		}
		pause = true
		if len(ts) > 0 {
			if err := b.complete(ctx, queue, ns, ts); err != nil {
				return err
			}
			continue
		}
		c, r := max(src.c, 0), max(src.r, 0)
		if !src.hasC {
			c = 0
		}
		if !src.hasR {
			r = 0
		}
		dest := ns[1+(o.idx-l.cur.n)%l.cur.n]
		if c == 0 && r == 0 {
			moved, err := b.copyStarts(ctx, queue, src, dest)
			if err != nil || moved {
				return err
			}
			continue
		}
		gs := []give{}
		if c > 0 {
			gs = append(gs, give{dest: ns[0], dc: c})
		}
		if r > 0 {
			gs = append(gs, give{dest: dest, dr: r})
		}
		if _, err := b.execute(ctx, queue, 0, ns, map[*slotNode][]give{src: gs}, nil); err != nil {
			return err
		}
		pause = false
	}
	return fmt.Errorf("%w: repartition %s: the slots of an old partition would not move; run the repartition again", broker.ErrUnavailable, queue)
}

// copyStarts moves the starts old partition src keeps (those no token
// carried away: all of them under no rate) to partition dest of the new
// span, with their ages, so that a rate set or lengthened after the
// repartition counts them as it would have in src (see the package
// documentation, "Limits"), and its forgotten starts to dest's, so that a
// limit raised after the repartition still counts them. src holds no task
// and starts nothing more. Each page is entered at dest first, then
// dropped at src (slots.lua "vacate"; counted twice in between, never
// nowhere), unless src holds slots again: a rebalance gave it tokens to
// back those starts, which must move first (moved is false then). With
// its starts gone, src is given nothing more.
func (b *Broker) copyStarts(ctx context.Context, queue string, src, dest *slotNode) (moved bool, err error) {
	keep := broker.MaxRatePer.Milliseconds()
	for _, which := range []string{"", "f"} {
		// Every page dropped at src, the next is read from the start;
		// the bound stops a loop on starts that would not go.
		for range broker.MaxQueueRate/forgetBatch + 2 {
			rd := b.slotCall(queue, src, "starts", keep, 0, forgetBatch, which)
			if err := b.runAll(ctx, "repartition "+queue, []*call{rd}); err != nil {
				return false, err
			}
			v, err := rd.cmd.StringSlice()
			if err != nil || len(v)%2 != 0 {
				return false, callErr("repartition "+queue, fmt.Errorf("unexpected starts reply %v (%v)", rd.cmd.Val(), err))
			}
			if len(v) == 0 {
				break
			}
			args := []any{src.id, keep}
			members := []any{which}
			for i, x := range v {
				args = append(args, x)
				if i%2 == 0 {
					members = append(members, x)
				}
			}
			if err := b.runAll(ctx, "repartition "+queue, []*call{b.slotCall(queue, dest, "adopt"+which, args...)}); err != nil {
				return false, err
			}
			vc := b.slotCall(queue, src, "vacate", members...)
			if err := b.runAll(ctx, "repartition "+queue, []*call{vc}); err != nil {
				return false, err
			}
			if n, err := vc.cmd.Int64(); err != nil || n < 0 {
				if err != nil {
					return false, callErr("repartition "+queue, fmt.Errorf("unexpected vacate reply %v (%v)", vc.cmd.Val(), err))
				}
				return false, nil
			}
		}
	}
	// Tokens given to src since its last read, its starts gone with them
	// or not, must move too.
	vc := b.slotCall(queue, src, "vacate", "")
	if err := b.runAll(ctx, "repartition "+queue, []*call{vc}); err != nil {
		return false, err
	}
	n, err := vc.cmd.Int64()
	if err != nil {
		return false, callErr("repartition "+queue, fmt.Errorf("unexpected vacate reply %v (%v)", vc.cmd.Val(), err))
	}
	return n >= 0, nil
}
