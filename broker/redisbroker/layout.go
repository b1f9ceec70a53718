package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
)

// span is one generation of a queue's partitions: n partitions whose keys
// carry the epoch (none for epoch 0: "{q:3}"; "{q:3@2}" for epoch 2).
type span struct {
	n, epoch int
}

// tag is the span as it is recorded: "4", or "12@1".
func (s span) tag() string {
	if s.epoch == 0 {
		return strconv.Itoa(s.n)
	}
	return strconv.Itoa(s.n) + "@" + strconv.Itoa(s.epoch)
}

// layout is a queue's partitioning as recorded in Redis: the current span,
// and while a repartition runs the old span being drained into it.
type layout struct {
	tag string // the value of <prefix>:partitions[queue]: cur's tag, or "<cur><<old>" while migrating
	cur span
	old *span
	// events: the queue records task events (see events.go), as read with
	// the layout.
	events bool
	// parts names the current span's partitions, once when the layout is
	// loaded rather than on every call (nil in a layout not from loadLayout).
	parts []part
}

// total is the number of partitions to serve and maintain: the current
// span's, then the old span's while a repartition drains it.
func (l layout) total() int {
	if l.old != nil {
		return l.cur.n + l.old.n
	}
	return l.cur.n
}

// metaOf is what the meta key of a partition of span s says: its span's tag,
// and for the old span of a repartition, where it is going.
func (l layout) metaOf(old bool) string {
	if old {
		return l.old.tag() + ">" + l.cur.tag()
	}
	return l.cur.tag()
}

// partAt returns partition i of the layout: 0..cur.n-1 are the current
// span's, the rest the old span's while a repartition runs.
func (b *Broker) partAt(queue string, l layout, i int) part {
	if i < len(l.parts) {
		return l.parts[i]
	}
	if i < l.cur.n {
		return b.spanPart(queue, l, l.cur, i, i, false)
	}
	return b.spanPart(queue, l, *l.old, i-l.cur.n, i, true)
}

func (b *Broker) spanPart(queue string, l layout, s span, p, idx int, old bool) part {
	tag := queue + ":" + strconv.Itoa(p)
	if s.epoch > 0 {
		tag += "@" + strconv.Itoa(s.epoch)
	}
	base := b.prefix + ":{" + tag + "}:"
	pub := "p" + strconv.Itoa(idx) + " " + b.channel(queue)
	return part{
		queue:     queue,
		idx:       idx,
		old:       old,
		layout:    l.metaOf(old),
		events:    l.events,
		base:      base,
		channel:   b.channel(queue),
		one:       [5]any{base + "t", base + "pending", base + "meta", l.metaOf(old), pub},
		plainKeys: [5]string{base + "t", base + "pending", base + "scheduled", base + "retry", base + "meta"},
		idTag:     idTag(s.n, p),
	}
}

// idTags caches, per partition count n, idTag of each partition.
var idTags sync.Map // int -> []string

// idTag returns a hash tag that places a task ID in partition p of n
// (broker.Partition of "x{<tag>}" is p): the scripts name the follow-ups
// they store "tide:f<n>{<tag>}", so that they are found by ID where they
// are, whatever the ID of the task they follow.
func idTag(n, p int) string {
	if v, ok := idTags.Load(n); ok {
		return v.([]string)[p]
	}
	tags := make([]string, max(n, 1))
	left := len(tags)
	for k := 0; left > 0; k++ {
		t := "p" + strconv.Itoa(k)
		if i := broker.Partition(t, n); tags[i] == "" {
			tags[i] = t
			left--
		}
	}
	idTags.Store(n, tags)
	return tags[p]
}

// partOf returns the partition of task id in the current span.
func (b *Broker) partOf(queue string, l layout, id string) part {
	p := broker.Partition(id, l.cur.n)
	if p < len(l.parts) {
		return l.parts[p]
	}
	return b.spanPart(queue, l, l.cur, p, p, false)
}

// oldPartOf returns the partition of task id in the old span of a
// repartition; ok is false when none runs.
func (b *Broker) oldPartOf(queue string, l layout, id string) (part, bool) {
	if l.old == nil {
		return part{}, false
	}
	p := broker.Partition(id, l.old.n)
	return b.spanPart(queue, l, *l.old, p, l.cur.n+p, true), true
}

// Partitions implements broker.Broker.
func (b *Broker) Partitions(ctx context.Context, queue string) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	l, err := b.layoutOf(ctx, queue)
	if err != nil {
		return 0, err
	}
	return l.total(), nil
}

// layoutTTL is how long a queue's layout is trusted without reading it
// again. A process that missed a repartition is refused by the scripts
// anyway; reading again only makes it serve new partitions sooner.
const layoutTTL = 30 * time.Second

// cachedLayout is a layout and when it was read.
type cachedLayout struct {
	l  layout
	at time.Time
}

// layoutOf returns queue's layout, reading (and, for a new queue, recording)
// it on first use and again after layoutTTL. It also keeps the clock's
// offset fresh.
func (b *Broker) layoutOf(ctx context.Context, queue string) (layout, error) {
	b.syncClock(ctx)
	if v, ok := b.layouts.Load(queue); ok {
		if c := v.(cachedLayout); time.Since(c.at) < layoutTTL {
			return c.l, nil
		}
	}
	return b.loadLayout(ctx, queue)
}

// knownLayout is layoutOf for a queue that is registered: a queue that is
// not (deleted with DeleteQueue, its limits kept) is left unregistered and
// known is false. A background step (a rebalance of the queue's slots) uses
// it, so that it never brings a deleted queue back into Queues.
func (b *Broker) knownLayout(ctx context.Context, queue string) (l layout, known bool, err error) {
	if v, ok := b.layouts.Load(queue); ok {
		if c := v.(cachedLayout); time.Since(c.at) < layoutTTL {
			return c.l, true, nil
		}
	}
	known, err = b.rdb.SIsMember(ctx, b.prefix+":queues", queue).Result()
	if err != nil {
		return layout{}, false, fmt.Errorf("tide: redisbroker: queue %q: %w", queue, classify(err))
	}
	if !known {
		return layout{}, false, nil
	}
	l, err = b.layoutOf(ctx, queue)
	return l, err == nil, err
}

// forgetLayout drops the cached layout of queue after a script refused it, so
// that the next call reads the recorded one again. A read under way that
// began before (loadLayout) does not cache what it read.
func (b *Broker) forgetLayout(queue string) {
	b.forgetMu.Lock()
	defer b.forgetMu.Unlock()
	b.forgets.Add(1)
	b.layouts.Delete(queue)
}

// beforeLayoutStore, when set (by tests), runs in loadLayout after it found
// no forget since its read began, before it stores what it read.
var beforeLayoutStore atomic.Pointer[func(queue string)]

// loadLayout records queue in <prefix>:queues, records its partition count
// unless one is recorded already, checks it against the configuration and
// makes sure every partition's meta key says the same.
func (b *Broker) loadLayout(ctx context.Context, queue string) (layout, error) {
	if err := b.checkEviction(ctx); err != nil {
		return layout{}, err
	}
	b.layoutMu.Lock() // one reader per process at a time; others then hit the cache
	defer b.layoutMu.Unlock()
	if v, ok := b.layouts.Load(queue); ok {
		if c := v.(cachedLayout); time.Since(c.at) < layoutTTL {
			return c.l, nil
		}
	}
	forgets := b.forgets.Load()
	var l layout
	for attempt := 0; ; attempt++ {
		var moved bool
		var err error
		if l, moved, err = b.readLayout(ctx, queue); err == nil {
			break
		}
		// Read while a repartition records its layout and marks the old
		// partitions (the registry before, the meta keys after): the
		// registry says more now, read it all again.
		if !moved || attempt == 3 {
			return layout{}, err
		}
	}
	l.parts = make([]part, l.cur.n)
	for i := range l.parts {
		l.parts[i] = b.spanPart(queue, l, l.cur, i, i, false)
	}
	// A layout forgotten while it was read (a repartition that recorded
	// its new one meanwhile) may be the old one: it answers this call
	// only, and the next reads again.
	// The check and the store are one step against forgetLayout: a forget
	// between them would delete nothing and leave this stale read cached
	// (a repartition's own next read then got the old layout).
	b.forgetMu.Lock()
	if b.forgets.Load() == forgets {
		if h := beforeLayoutStore.Load(); h != nil {
			(*h)(queue)
		}
		b.layouts.Store(queue, cachedLayout{l: l, at: time.Now()})
	}
	b.forgetMu.Unlock()
	return l, nil
}

// readLayout reads queue's recorded layout (recording a new queue) and
// checks the configuration and the partitions' meta keys against it. When a
// meta key disagrees it reads the registry again: moved reports that the
// layout recorded there changed meanwhile.
func (b *Broker) readLayout(ctx context.Context, queue string) (l layout, moved bool, err error) {
	want, explicit := b.parts[queue]
	if !explicit {
		want = b.defaultParts
	}
	reg := b.prefix + ":partitions"
	pipe := b.rdb.Pipeline()
	pipe.SAdd(ctx, b.prefix+":queues", queue)
	pipe.HSetNX(ctx, reg, queue, want)
	got := pipe.HGet(ctx, reg, queue)
	evFlag := pipe.HGet(ctx, b.prefix+":"+eventsKey, queue)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return layout{}, false, fmt.Errorf("tide: redisbroker: register queue %q: %w", queue, classify(err))
	}
	if l, err = parseLayout(got.Val()); err != nil {
		return layout{}, false, fmt.Errorf("%w: queue %q: %v", broker.ErrLayout, queue, err)
	}
	l.events = b.eventsOn(evFlag.Val())
	if f := afterLayoutRead.Load(); f != nil {
		if err := (*f)(queue); err != nil {
			return layout{}, false, err
		}
	}
	if explicit && (l.cur.n != want || l.old != nil) {
		return layout{}, false, fmt.Errorf("%w: queue %q has %s recorded in Redis but this process is configured with %d (WithQueuePartitions); "+
			"drop the option to adopt the recorded count, or change the queue with `tide queues repartition %s %d`", broker.ErrLayout, queue, l.describe(), want, queue, want)
	}
	// Each partition's meta key lets the scripts refuse a caller with
	// another layout. The current span's is written once; a different value
	// means the partitions belong to another layout than the registry says.
	// The old span's were written by the repartition that drains it.
	pipe = b.rdb.Pipeline()
	metas := make([]*redis.StringCmd, l.total())
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		if !p.old {
			pipe.SetNX(ctx, p.k("meta"), p.layout, 0)
		}
		metas[i] = pipe.Get(ctx, p.k("meta"))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return layout{}, false, fmt.Errorf("tide: redisbroker: register queue %q: %w", queue, classify(err))
	}
	for i, m := range metas {
		p := b.partAt(queue, l, i)
		if got := m.Val(); got != p.layout && !(p.old && (got == "retired" || got == "" || got == l.old.tag())) {
			now, rerr := b.rdb.HGet(ctx, reg, queue).Result()
			return layout{}, rerr == nil && now != l.tag, fmt.Errorf("%w: partition %d of queue %q records layout %q but the queue's is %q", broker.ErrLayout, i, queue, got, l.tag)
		}
	}
	return l, false, nil
}

// afterLayoutRead, when set (by tests), runs in readLayout after the
// registry is read and before the partitions' meta keys are; an error it
// returns is the read's.
var afterLayoutRead atomic.Pointer[func(queue string) error]

// describe says what the layout is, for error messages.
func (l layout) describe() string {
	if l.old != nil {
		return fmt.Sprintf("%d partitions (being repartitioned from %d)", l.cur.n, l.old.n)
	}
	return fmt.Sprintf("%d partitions", l.cur.n)
}

// parseLayout reads a recorded layout: "<n>", "<n>@<epoch>", or
// "<span><<old span>" while a repartition runs.
func parseLayout(s string) (layout, error) {
	cur, rest, migrating := strings.Cut(s, "<")
	l := layout{tag: s}
	var err error
	if l.cur, err = parseSpan(cur); err != nil {
		return layout{}, err
	}
	if migrating {
		old, err := parseSpan(rest)
		if err != nil {
			return layout{}, err
		}
		if old.epoch >= l.cur.epoch {
			return layout{}, fmt.Errorf("recorded layout %q drains epoch %d into older epoch %d", s, old.epoch, l.cur.epoch)
		}
		l.old = &old
	}
	return l, nil
}

func parseSpan(s string) (span, error) {
	ns, es, hasEpoch := strings.Cut(s, "@")
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 || n > maxPartitions {
		return span{}, fmt.Errorf("recorded partition count %q is not a number from 1 to %d", s, maxPartitions)
	}
	sp := span{n: n}
	if hasEpoch {
		if sp.epoch, err = strconv.Atoi(es); err != nil || sp.epoch < 1 {
			return span{}, fmt.Errorf("recorded layout %q has a bad epoch", s)
		}
	}
	return sp, nil
}

// layoutRefused reports a script's refusal of the caller's layout (the
// TIDELAYOUT error reply) and forgets the cached layout of queue.
func (b *Broker) layoutRefused(queue string, err error) (error, bool) {
	if err == nil {
		return nil, false
	}
	var re redis.Error
	if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "TIDELAYOUT ") {
		return nil, false
	}
	b.forgetLayout(queue)
	return fmt.Errorf("%w: %w: queue %q: a partition records layout %q, not the one this process used; it reads the layout again on the next call",
		broker.ErrUnavailable, broker.ErrLayout, queue, strings.TrimPrefix(re.Error(), "TIDELAYOUT ")), true
}

// checkEviction looks once per broker at Redis's maxmemory-policy (on every
// primary of a cluster): with any policy but noeviction Redis may delete
// tasks when memory runs short. It logs an error, or fails with
// ErrEvictionPolicy under WithRequireNoEviction. A policy that cannot be
// read (CONFIG refused by an ACL and INFO too) is logged and let pass.
func (b *Broker) checkEviction(ctx context.Context) error {
	if b.evictDone.Load() {
		return b.evictErr
	}
	b.evictMu.Lock()
	defer b.evictMu.Unlock()
	if b.evictDone.Load() {
		return b.evictErr
	}
	func() {
		policies := map[string]bool{}
		var err error
		switch c := b.rdb.(type) {
		case *redis.Client:
			var p string
			if p, err = evictionPolicy(ctx, c); err == nil {
				policies[p] = true
			}
		case *redis.ClusterClient:
			var mu sync.Mutex
			err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				p, err := evictionPolicy(ctx, n)
				if err == nil {
					mu.Lock()
					policies[p] = true
					mu.Unlock()
				}
				return err
			})
		default:
			err = errors.New("not a single-node or cluster client")
		}
		if err != nil {
			if isTransport(err) {
				return // Redis unreachable: look again on the next call
			}
			b.log.Warn("tide: redisbroker: could not read Redis's maxmemory-policy; make sure it is noeviction, or Redis may delete tasks", "err", err)
			b.evictDone.Store(true)
			return
		}
		b.evictDone.Store(true)
		for p := range policies {
			if p == "noeviction" {
				continue
			}
			if b.strictEviction {
				b.evictErr = fmt.Errorf("%w (it is %q)", ErrEvictionPolicy, p)
				return
			}
			b.log.Error("tide: redisbroker: Redis maxmemory-policy is not noeviction: when memory runs short Redis may silently delete tasks. "+
				"Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction), or use WithRequireNoEviction to refuse to run", "policy", p)
		}
	}()
	return b.evictErr
}

func evictionPolicy(ctx context.Context, c *redis.Client) (string, error) {
	if kv, err := c.ConfigGet(ctx, "maxmemory-policy").Result(); err == nil {
		if p, ok := kv["maxmemory-policy"]; ok {
			return p, nil
		}
	}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
			return v, nil
		}
	}
	return "", errors.New("INFO memory has no maxmemory_policy")
}

// lookup returns where task id may be: its partition in the current span,
// then, while a repartition runs, its partition in the old span.
func (b *Broker) lookup(queue string, l layout, id string) []part {
	ps := []part{b.partOf(queue, l, id)}
	if o, ok := b.oldPartOf(queue, l, id); ok {
		ps = append(ps, o)
	}
	return ps
}

// freshLayout returns queue's layout after checking every partition's
// layout key, reading the layout again when one disagrees: for the paths
// that run no script (admin reads, pause), which would otherwise act on the
// partitions of a layout that changed under them. An old partition that the
// repartition has retired agrees: it holds nothing any more, and the
// layout stays the same until every old partition is retired (callers that
// run scripts on old partitions skip the retired ones).
func (b *Broker) freshLayout(ctx context.Context, queue string) (layout, error) {
	for attempt := 0; ; attempt++ {
		l, err := b.layoutOf(ctx, queue)
		if err != nil {
			return layout{}, err
		}
		pipe := b.rdb.Pipeline()
		metas := make([]*redis.StringCmd, l.total())
		for i := range l.total() {
			metas[i] = pipe.Get(ctx, b.partAt(queue, l, i).k("meta"))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return layout{}, fmt.Errorf("tide: redisbroker: queue %q: %w", queue, classify(err))
		}
		stale := false
		for i, m := range metas {
			p := b.partAt(queue, l, i)
			if got := m.Val(); got != p.layout && !(p.old && got == "retired") {
				stale = true
			}
		}
		if !stale {
			return l, nil
		}
		if attempt > 0 {
			return layout{}, fmt.Errorf("%w: %w: queue %q is changing its layout; try again", broker.ErrUnavailable, broker.ErrLayout, queue)
		}
		b.forgetLayout(queue)
	}
}
