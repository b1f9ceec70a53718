package redisbroker

import (
	"math/rand/v2"
	"strconv"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// The script call an enqueue sends to each partition: which script (one
// plain task, several plain tasks, or the general one) and its keys and
// arguments.

// group collects the indexes of items bound for one partition.
type group struct {
	p   part
	idx []int
}

func (b *Broker) groupItems(items []item, idx []int) []*group {
	if len(idx) == 1 { // the common single Enqueue: no map
		// The group and the slice that holds it share one allocation.
		it := items[idx[0]]
		one := &oneGroup{g: group{p: b.partOf(it.t.Queue, it.lay, storeKey(it.t)), idx: idx}}
		one.s[0] = &one.g
		return one.s[:]
	}
	var gs grouping
	for _, i := range idx {
		it := items[i]
		gs.add(b.partOf(it.t.Queue, it.lay, storeKey(it.t)), i)
	}
	return gs.order
}

// oneGroup holds a lone group and the slice naming it, allocated together
// (groupItems for one element).
type oneGroup struct {
	g group
	s [1]*group
}

// grouping collects element indexes by partition, in the order partitions
// first appear.
type grouping struct {
	by    map[part]*group
	order []*group
}

func (gs *grouping) add(p part, i int) {
	g := gs.by[p]
	if g == nil {
		if gs.by == nil {
			gs.by = map[part]*group{}
		}
		g = &group{p: p}
		gs.by[p] = g
		gs.order = append(gs.order, g)
	}
	g.idx = append(g.idx, i)
}

func (b *Broker) enqueueCall(p part, items []item, idx []int) *call {
	plain := b.eventsArg(p) == "" && plainItems(items, idx)
	if plain && len(idx) == 1 && items[idx[0]].t.State == tidetype.StatePending {
		return b.enqueueOneCall(p, items[idx[0]])
	}
	rid, cache, exp, edge := b.request(p)
	if plain {
		return b.enqueuePlainCall(p, items, idx, rid, cache, exp, edge)
	}
	w := b.idemWindow.Milliseconds()
	n := b.Now().UnixMilli() / w
	args := make([]any, 0, 8+8*len(idx))
	args = append(args, p.layout, rid, exp, p.channel, p.idx, (n+2)*w, b.Now().Add(waitRegistration).UnixMilli(), b.eventsArg(p))
	for _, i := range idx {
		t := items[i].t
		kind := taskKind(items[i])
		if items[i].replace {
			kind += "r"
		}
		if items[i].watch {
			kind += "w"
		}
		if broker.FreeGroupID(t.ID, t.Group) {
			kind += "f"
		}
		if items[i].move {
			kind += "m"
		}
		g := t.Group
		if items[i].claim != "" {
			g += "\x00" + items[i].claim
		}
		args = append(args, t.ID, codec.Encode(t, 0), kind, t.NextProcessAt.UnixMilli(), t.UniqueKey, t.UniqueTTL.Milliseconds(), t.IdempotencyKey, g)
	}
	keys := append(p.keys("t", "pending", "scheduled", "retry", "u", "meta"), cache,
		p.k("ik:"+strconv.FormatInt(n, 10)), p.k("ik:"+strconv.FormatInt(n-1, 10)))
	keys = append(append(keys, p.keys("active", "archived", "completed", "result", "h")...), p.groupKeys()...)
	keys = append(keys, p.k("wt"), p.k(eventsKey), p.k("xr"))
	return &call{
		script: b.s.enqueue,
		keys:   keys,
		args:   args,
		queue:  p.queue,
	}
}

// plainItems reports whether the tasks at idx are all plain: no unique key,
// idempotency key, group, Replace or waiter. With events off for their
// partition, enqueue_plain.lua stores them, or enqueue_one.lua a single
// pending one.
func plainItems(items []item, idx []int) bool {
	for _, i := range idx {
		it := items[i]
		if it.replace || it.watch || it.t.UniqueKey != "" || it.t.IdempotencyKey != "" || it.t.Group != "" {
			return false
		}
	}
	return true
}

// taskKind is the enqueue scripts' kind of a task: 'p' pending or 's'
// scheduled, upper case when the broker chose its ID.
func taskKind(it item) string {
	switch {
	case it.t.State == tidetype.StateScheduled && it.own:
		return "S"
	case it.t.State == tidetype.StateScheduled:
		return "s"
	case it.own:
		return "P"
	}
	return "p"
}

// enqueuePlainCall is enqueueCall for plain tasks (plainItems) in a
// partition that records no events: enqueue_plain.lua, with 6 keys and 4
// arguments a task rather than 22 and 8. Its replies read as enqueue.lua's.
// It sets the reply cache's expiry unless this process has seen a call do
// so; and always when it is the first or last request of its cache (edge),
// and now and then, in case the cache was deleted meanwhile.
func (b *Broker) enqueuePlainCall(p part, items []item, idx []int, rid, cache string, exp int64, edge bool) *call {
	setExp := ""
	if b.setsExpiry(p.base, cache, edge) {
		setExp = "1"
	}
	args := make([]any, 0, 6+4*len(idx))
	args = append(args, p.layout, rid, exp, p.channel, p.idx, setExp)
	for _, i := range idx {
		t := items[i].t
		args = append(args, t.ID, codec.Encode(t, 0), taskKind(items[i]), t.NextProcessAt.UnixMilli())
	}
	keys := make([]string, len(p.plainKeys)+1)
	copy(keys, p.plainKeys[:])
	keys[len(p.plainKeys)] = cache
	c := &call{
		script: b.s.enqueuePlain,
		keys:   keys,
		args:   args,
		queue:  p.queue,
	}
	if setExp != "" {
		c.expiry = [2]string{p.base, cache}
	}
	return c
}

// setsExpiry reports whether a call on reply cache cache of partition base
// must set the cache's expiry: unless this process has seen a call do so;
// and always when it is the first or last request of its cache (edge), and
// now and then, in case the cache was deleted meanwhile.
func (b *Broker) setsExpiry(base, cache string, edge bool) bool {
	v, ok := b.cacheExpiry.Load(base)
	return !ok || v.(string) != cache || edge || rand.N(64) == 0
}

// enqueueOneCall is enqueuePlainCall for one pending task:
// enqueue_one.lua, with 4 keys and 6 arguments rather than 6 and 10, no
// helper defined unless the task meets another, and its request named by
// a reply slot (replySlot) rather than a random ID in a reply cache. Its
// reply reads as enqueue.lua's.
func (b *Broker) enqueueOneCall(p part, it item) *call {
	key, slot, edge := b.replySlot(p)
	v, ok := b.slotExpiry.Load(p.base)
	setExp := !ok || v.(string) != key.name || edge || rand.N(64) == 0
	exp := key.boxed[1]
	if !setExp {
		exp = key.boxed[2]
	}
	// The bit that claims the slot tells the script who chose the ID.
	bit := slotBits[slot]
	if !it.own {
		bit = slotBits[repliesPerCache+slot]
	}
	t := it.t
	// The call and its command share one allocation.
	oc := &oneCall{argv: [13]any{"evalsha", b.oneSHA, 4, p.one[0], p.one[1], p.one[2], key.boxed[0],
		p.one[3], bit, exp, p.one[4], t.ID, codec.Encode(t, 0)}}
	c := &oc.call
	c.script, c.argv, c.queue = b.s.enqueueOne, oc.argv[:], p.queue
	if setExp {
		c.expiry = [2]string{p.base, key.name}
		c.slots = true
	}
	return c
}

// oneCall is enqueueOneCall's call with its EVALSHA command beside it.
type oneCall struct {
	call
	argv [13]any
}

// slotBits are the bits that claim reply slots (enqueue_one.lua's
// ARGV[2]): for a task with an ID the broker chose, 8 × slot + 1 for
// slots 0 to 49, then for one with the caller's ID, 8 × slot.
var slotBits = func() []any {
	s := make([]any, 2*repliesPerCache)
	for i := range repliesPerCache {
		s[i] = strconv.Itoa(8*i + 1)
		s[repliesPerCache+i] = strconv.Itoa(8 * i)
	}
	return s
}()
