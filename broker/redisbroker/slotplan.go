package redisbroker

import (
	"slices"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// The plan of a rebalance: the slot transfers and caps that bring each
// partition towards its fair holding of a queue's limits (planSlots), and
// how rate tokens are shared by demand (shareTokens, waterfill).

// give is one source's part of a plan: what it gives to whom.
type give struct {
	dest   *slotNode
	dc, dr int64
	force  bool // concurrency slots even if running tasks use them (bank debt)
}

// capSet is the cap a plan gives a partition (hasCt false: none).
type capSet struct {
	ct     int64
	hasCt  bool
	cs, rs bool
	hold   bool
	ru     int64
}

// planSlots computes the transfers and caps that bring ns (the bank first)
// towards each partition's fair holding of each limit.
//
// A bank in concurrency debt (a lowered limit: the partitions hold more
// slots than the limit), or running tasks that no slot covers (a limit
// switched on: the partitions hold none of the new era), are paid for with
// free slots only, every free slot of every partition and the bank's: the
// bank's debt first, then slots to cover the running tasks. Until all is
// paid every partition is held (a cap of 0): none starts a task, and the
// slots its tasks free go where they are owed. Taking slots that running
// tasks use would not do: the tasks over the new limit run on, and a
// partition that kept a free slot would start one more. So the tasks
// running at once never exceed the lowered limit after a start, only the
// tasks that ran before it keep running above it. debt reports such a
// plan; the rebalance plans again after it.
func planSlots(ns []*slotNode, lim tidetype.QueueLimits) (gives map[*slotNode][]give, caps map[*slotNode]capSet, debt bool) {
	gives = map[*slotNode][]give{}
	caps = map[*slotNode]capSet{}
	bank := ns[0]
	add := func(src, dst *slotNode, dc, dr int64, force bool) {
		for i, g := range gives[src] {
			if g.dest == dst && g.force == force {
				gives[src][i].dc += dc
				gives[src][i].dr += dr
				return
			}
		}
		gives[src] = append(gives[src], give{dest: dst, dc: dc, dr: dr, force: force})
	}
	// Each resource in turn: the partitions of the bank's era take part,
	// the current span's by their demand, the old span's to give all away.
	// A partition's concurrency share as planned bounds the tasks it could
	// start on rate tokens: tokens it could not use go where slots are.
	cshare := map[*slotNode]int64{}
	for _, kind := range []byte{'c', 'r'} {
		var total int64
		switch kind {
		case 'c':
			total = int64(lim.Concurrency)
		default:
			total = int64(lim.Rate.Limit)
		}
		hasBank := kind == 'c' && bank.hasC || kind == 'r' && bank.hasR
		if total <= 0 || !hasBank {
			continue
		}
		held := func(n *slotNode) int64 {
			if kind == 'c' {
				return n.c
			}
			return n.r
		}
		in := func(n *slotNode) bool {
			if n.bank || n.meta == "" || n.meta == "retired" {
				return false
			}
			if kind == 'c' {
				return n.hasC && n.ce == bank.ce
			}
			return n.hasR && n.re == bank.re
		}
		var cur, old []*slotNode
		var elsewhere int64 // starts in the period of partitions not taking part, and forgotten ones
		// keep is what the bank keeps whatever the demand: a token for
		// each forgotten start in the period (see dropUnbacked). They are
		// real starts: a token a partition held for one would start a task
		// while the period holds as many starts as the limit.
		var keep int64
		for _, n := range ns[1:] {
			if kind == 'r' && liveNode(n) {
				keep += max(n.forgot, 0)
			}
			switch {
			case !in(n):
				if kind == 'r' && liveNode(n) {
					elsewhere += max(n.used, 0)
				}
			case n.old:
				old = append(old, n)
			default:
				cur = append(cur, n)
			}
		}
		if len(cur) == 0 {
			continue
		}
		d := make([]int64, len(cur))
		for i, n := range cur {
			if kind == 'c' {
				d[i] = n.active + n.waiting
			} else {
				d[i] = n.waiting
				if c, ok := cshare[n]; ok {
					d[i] = min(d[i], max(c-n.active, 0))
				}
			}
		}
		var h []int64
		var contended bool
		var level []bool
		if kind == 'c' {
			h, contended, level = waterfill(total, d)
		} else {
			h, contended, level = shareTokens(total, cur, old, elsewhere+keep, d)
		}
		// The first moment a token in use becomes free: a partition held
		// at its share asks again from then on, as the token may free
		// where no task wants it (the sweep would find it, seconds later).
		frees := int64(-1)
		for _, n := range append(cur, old...) {
			if n.frees >= 0 && (frees < 0 || n.frees < frees) {
				frees = n.frees
			}
		}
		fair := map[*slotNode]int64{}
		for i, n := range cur {
			fair[n] = h[i]
			if kind == 'c' {
				cshare[n] = h[i]
			}
			cs := caps[n]
			if kind == 'c' {
				cs.hasCt, cs.ct, cs.cs = contended, h[i], contended && level[i]
			} else {
				cs.rs = contended && level[i]
				cs.ru = -1
				if cs.rs {
					cs.ru = frees
				}
			}
			caps[n] = cs
		}
		for _, n := range old {
			fair[n] = 0
			if kind == 'c' {
				caps[n] = capSet{hasCt: true, ct: 0}
			} else {
				// An old partition keeps the tokens its starts in the
				// period use (releaseSlots gives them away with their
				// ages before it is retired) and gives the free ones. It
				// gets none: its starts count against the tokens the
				// current span shares (shareTokens), backed or not, and
				// a token given to it could arrive after the release's
				// last look, to be lost when it is retired (a plan read
				// before its starts moved would give it one).
				fair[n] = min(max(n.used, 0), held(n))
			}
		}
		// Running tasks no slot covers: those of a partition when the
		// limit was switched on (a new era: it holds none), or left by a
		// version that took used slots for the bank's debt.
		over := map[*slotNode]int64{}
		if kind == 'c' {
			for _, n := range append(old, cur...) {
				if n.active > n.c {
					over[n] = n.active - n.c
				}
			}
		}
		inDebt := kind == 'c' && (held(bank) < 0 || len(over) > 0)
		if inDebt {
			debt = true
			for _, n := range append(old, cur...) {
				caps[n] = capSet{hasCt: true, ct: 0, cs: true, hold: true}
			}
		}
		// What each node can give without force, and what it should get.
		left := map[*slotNode]int64{}
		supply := func(n *slotNode) int64 {
			if n.bank {
				return max(held(n)-keep, 0)
			}
			s := held(n) - fair[n]
			if kind == 'c' {
				s = min(s, n.c-n.active)
				if inDebt {
					s = n.c - n.active // every free slot, fair or not
				}
			}
			return max(s, 0)
		}
		type need struct {
			n *slotNode
			k int64
		}
		var needs []need
		if held(bank) < keep {
			// A lowered limit's debt, or the tokens of forgotten
			// starts: taken back even where starts use them (below).
			needs = append(needs, need{bank, keep - held(bank)})
		}
		var wants []need
		for _, n := range append(old, cur...) {
			if k := over[n]; k > 0 {
				needs = append(needs, need{n, k})
			}
		}
		for _, n := range append(cur, old...) {
			if inDebt {
				break
			}
			if k := fair[n] - held(n); k > 0 {
				wants = append(wants, need{n, k})
			}
		}
		slices.SortStableFunc(wants, func(a, b need) int { return int(b.k - a.k) })
		needs = append(needs, wants...)
		srcs := append([]*slotNode{bank}, append(old, cur...)...)
		for _, s := range srcs {
			left[s] = supply(s)
		}
		for i := range needs {
			for _, s := range srcs {
				if needs[i].k == 0 {
					break
				}
				if s == needs[i].n || left[s] == 0 {
					continue
				}
				k := min(left[s], needs[i].k)
				left[s] -= k
				needs[i].k -= k
				if kind == 'c' {
					add(s, needs[i].n, k, 0, false)
				} else {
					add(s, needs[i].n, 0, k, false)
				}
			}
		}
		// A bank in rate debt (a lowered Rate), or short of the tokens
		// of forgotten starts, takes tokens back even where starts in the
		// period use them: they go with their ages and count where they
		// go. (Concurrency debt is paid with free
		// slots only, above.)
		if kind != 'c' && len(needs) > 0 && needs[0].n == bank && needs[0].k > 0 {
			k := needs[0].k
			given := func(n *slotNode) int64 {
				var g int64
				for _, x := range gives[n] {
					if kind == 'c' {
						g += x.dc
					} else {
						g += x.dr
					}
				}
				return g
			}
			for pass := 0; pass < 2 && k > 0; pass++ {
				for _, s := range append(old, cur...) {
					if k == 0 {
						break
					}
					room := held(s) - given(s)
					if pass == 0 {
						room -= fair[s]
					}
					if room <= 0 {
						continue
					}
					x := min(room, k)
					k -= x
					if kind == 'c' {
						add(s, bank, x, 0, true)
					} else {
						add(s, bank, 0, x, false)
					}
				}
			}
		}
	}
	return gives, caps, debt
}

// shareTokens shares a Rate's total tokens among the current partitions
// cur, whose demands are d (their waiting tasks). A token used by a start
// still in its period is used wherever that start was made: each partition
// keeps first the tokens its starts in the period use (n.used, which counts
// also starts no token backs: those made before the rate was switched on or
// its period lengthened, and those whose token went to pay a lowered
// limit's debt), and only the tokens no such start uses are shared by
// demand. So no partition holds a free token while another has more starts
// in its period than tokens, and the starts of any period over all
// partitions stay within total. The old span's partitions keep the tokens
// their starts use, so those count against the free tokens too, as do the
// starts elsewhere: those of partitions that hold no tokens of the rate
// yet (a rate switched on reaches them one by one), and the starts a
// rebalance forgot (dropUnbacked), whose tokens stay in the bank.
// Returns the fair holdings, whether the free tokens are contended, and
// which partitions are held at the sharing level (they would use more).
func shareTokens(total int64, cur, old []*slotNode, elsewhere int64, d []int64) (h []int64, contended bool, level []bool) {
	total -= elsewhere
	for _, n := range old {
		total -= max(n.used, 0)
	}
	total = max(total, 0)
	u := make([]int64, len(cur))
	var inUse int64
	for i, n := range cur {
		u[i] = max(n.used, 0)
		inUse += u[i]
	}
	if inUse >= total {
		// No token is free: each keeps what its starts use, as far as the
		// total goes; every partition with tasks waiting would use more.
		h, _, _ = waterfill(total, u)
		level = make([]bool, len(cur))
		for i := range cur {
			level[i] = d[i] > 0
		}
		return h, true, level
	}
	h, contended, level = waterfill(total-inUse, d)
	for i := range h {
		h[i] += u[i]
	}
	return h, contended, level
}

// waterfill shares total among demands d: when they add up to no more than
// total each gets its demand and the rest is spread evenly; else each gets
// its demand up to a level that shares total out (max-min fairness), and
// contended is true, level[i] telling those held at the level.
func waterfill(total int64, d []int64) (h []int64, contended bool, level []bool) {
	n := len(d)
	h, level = make([]int64, n), make([]bool, n)
	var sum int64
	for _, x := range d {
		sum += x
	}
	if sum <= total {
		spare := int(total - sum)
		for i := range d {
			h[i] = d[i] + int64(broker.Share(spare, n, i))
		}
		return h, false, level
	}
	lo, hi := int64(0), total
	for lo < hi {
		mid := (lo + hi + 1) / 2
		var s int64
		for _, x := range d {
			s += min(x, mid)
		}
		if s <= total {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	rem := total
	for i, x := range d {
		h[i] = min(x, lo)
		rem -= h[i]
	}
	for i, x := range d {
		if x > lo {
			level[i] = true
			if rem > 0 {
				h[i]++
				rem--
			}
		}
	}
	return h, true, level
}
