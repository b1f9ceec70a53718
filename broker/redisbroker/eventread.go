package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// evPos is a position in a stream: the last entry delivered and, when
// skip is positive, how many of its events were. The scripts number a
// stream's entries 0-1, 0-2, ... (ms is always 0), with no holes but those
// trimming makes at the start.
type evPos struct {
	ms, seq uint64
	skip    int
}

func (p evPos) id() string { return strconv.FormatUint(p.ms, 10) + "-" + strconv.FormatUint(p.seq, 10) }

// from is the ID to read after: the entry itself is read again while some
// of its events are left.
func (p evPos) from() string {
	switch {
	case p.skip == 0:
		return p.id()
	case p.seq > 0:
		return evPos{ms: p.ms, seq: p.seq - 1}.id()
	default:
		return strconv.FormatUint(p.ms-1, 10) + "-18446744073709551615"
	}
}

func (p evPos) cmp(ms, seq uint64) int {
	switch {
	case p.ms != ms:
		if p.ms < ms {
			return -1
		}
		return 1
	case p.seq != seq:
		if p.seq < seq {
			return -1
		}
		return 1
	}
	return 0
}

// follows reports whether entry ms-seq is the one after p: the next entry,
// or p's own when it is unfinished.
func (p evPos) follows(ms, seq uint64) bool {
	if p.skip > 0 {
		return p.cmp(ms, seq) == 0
	}
	return ms == p.ms && seq == p.seq+1
}

func parseStreamID(s string) (ms, seq uint64, err error) {
	a, c, ok := strings.Cut(s, "-")
	if ms, err = strconv.ParseUint(a, 10, 64); err != nil || !ok {
		return 0, 0, fmt.Errorf("bad stream ID %q", s)
	}
	if seq, err = strconv.ParseUint(c, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("bad stream ID %q", s)
	}
	return ms, seq, nil
}

// evStream is one partition's stream as a reader follows it.
type evStream struct {
	queue       string
	epoch, part int
	key         string
	pos         evPos
	live        bool // in the queue's layout; otherwise read to its end, then dropped
	loose       bool // the next entry may come after a gap (reading from the oldest kept)
}

// evReader is one ReadEvents call. Its positions are owned by the merging
// goroutine (run); the goroutines that read streams hand it batches tagged
// with the generation of the stream set they read, and batches of an older
// generation are dropped (the new readers start from the delivered
// positions).
type evReader struct {
	b       *Broker
	queues  []string
	cluster bool
	streams map[string]*evStream // by key

	gen     int
	stop    context.CancelFunc // the current generation's readers
	wg      sync.WaitGroup
	batches chan evBatch
}

type evBatch struct {
	gen  int
	key  string
	msgs []redis.XMessage
}

// streamKey names the events stream of partition part of span epoch.
func (r *evReader) streamKey(queue string, epoch, part int) string {
	tag := queue + ":" + strconv.Itoa(part)
	if epoch > 0 {
		tag += "@" + strconv.Itoa(epoch)
	}
	return r.b.prefix + ":{" + tag + "}:" + eventsKey
}

// layouts reads the queues' recorded layouts, without registering a queue.
func (r *evReader) layouts(ctx context.Context) (map[string]layout, error) {
	vals, err := r.b.rdb.HMGet(ctx, r.b.prefix+":partitions", r.queues...).Result()
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: events: %w", classify(err))
	}
	out := map[string]layout{}
	for i, q := range r.queues {
		s, _ := vals[i].(string)
		if s == "" {
			// No queue yet: its first partition is where it will start
			// (a new queue's span has epoch 0).
			out[q] = layout{cur: span{n: 1}}
			continue
		}
		l, err := parseLayout(s)
		if err != nil {
			return nil, fmt.Errorf("%w: queue %q: %v", broker.ErrLayout, q, err)
		}
		out[q] = l
	}
	return out, nil
}

// apply makes the streams of the layouts live (new ones start at their
// beginning) and the others draining; it reports whether the set changed.
func (r *evReader) apply(ls map[string]layout) bool {
	changed := false
	live := map[string]bool{}
	for q, l := range ls {
		for i := range l.total() {
			s, p := l.cur, i
			if i >= l.cur.n {
				s, p = *l.old, i-l.cur.n
			}
			k := r.streamKey(q, s.epoch, p)
			live[k] = true
			if r.streams[k] == nil {
				r.streams[k] = &evStream{queue: q, epoch: s.epoch, part: p, key: k}
				changed = true
			}
		}
	}
	for k, s := range r.streams {
		s.live = live[k]
	}
	return changed
}

// infos runs XINFO STREAM on the streams; a stream that does not exist has
// a nil entry.
func (r *evReader) infos(ctx context.Context, keys []string) ([]*redis.XInfoStream, error) {
	pipe := r.b.rdb.Pipeline()
	cmds := make([]*redis.XInfoStreamCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.XInfoStream(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]*redis.XInfoStream, len(keys))
	for i, c := range cmds {
		info, err := c.Result()
		switch {
		case err == nil:
			out[i] = info
		case isTransport(err):
			return nil, fmt.Errorf("tide: redisbroker: events: %w", classify(err))
		case !strings.Contains(err.Error(), "no such key"):
			return nil, fmt.Errorf("tide: redisbroker: events: %s: %w", keys[i], classify(err))
		}
	}
	return out, nil
}

// start reads the layouts and sets the starting positions: the streams'
// ends for "", their beginnings for broker.EventsOldest, else the token's
// (streams the token does not know start at their beginning). It checks
// that no event after a token's positions was trimmed.
func (r *evReader) start(ctx context.Context, after string, token []broker.EventPosition) error {
	ls, err := r.layouts(ctx)
	if err != nil {
		return err
	}
	r.apply(ls)
	for _, p := range token {
		k := r.streamKey(p.Queue, p.Epoch, p.Partition)
		s := r.streams[k]
		if s == nil {
			s = &evStream{queue: p.Queue, epoch: p.Epoch, part: p.Partition, key: k}
			r.streams[k] = s
		}
		s.pos = evPos{ms: p.Ms, seq: p.Seq, skip: p.Skip}
	}
	if after == broker.EventsOldest {
		for _, s := range r.streams {
			s.loose = true
		}
		return nil
	}
	keys := r.keys()
	infos, err := r.infos(ctx, keys)
	if err != nil {
		return err
	}
	for i, k := range keys {
		s, info := r.streams[k], infos[i]
		var last evPos
		if info != nil {
			if last, err = toPos(info.LastGeneratedID); err != nil {
				return fmt.Errorf("tide: redisbroker: events: %s: %w", k, err)
			}
		}
		if after == "" {
			s.pos = last
			continue
		}
		if info == nil && retired(ls[s.queue], s.epoch) && s.pos != (evPos{}) {
			// A partition that a repartition retired since the token: its
			// stream was kept for the events' age and is gone now, with
			// whatever came after the token in it.
			return fmt.Errorf("%w: queue %q partition %d of a layout replaced since (a repartition)", broker.ErrEventGap, s.queue, s.part)
		}
		if info == nil || last.cmp(s.pos.ms, s.pos.seq) < 0 {
			// Deleted with its queue, or made anew since: all it holds
			// comes after the token.
			s.pos = evPos{}
			if info == nil {
				continue
			}
		}
		if info.Length == 0 {
			if last.cmp(s.pos.ms, s.pos.seq) > 0 {
				return fmt.Errorf("%w: queue %q partition %d", broker.ErrEventGap, s.queue, s.part)
			}
			continue
		}
		ms, seq, err := parseStreamID(info.FirstEntry.ID)
		if err != nil {
			return fmt.Errorf("tide: redisbroker: events: %s: %w", k, err)
		}
		if s.pos.cmp(ms, seq) < 0 && !s.pos.follows(ms, seq) {
			return fmt.Errorf("%w: queue %q partition %d", broker.ErrEventGap, s.queue, s.part)
		}
	}
	return nil
}

// retired reports whether the partitions of span epoch were retired by a
// repartition of a queue whose layout is now l: an earlier epoch than the
// current span's that is not the old span of a running repartition. (A
// queue deleted and used again starts anew at epoch 0, never below a
// token's epoch.)
func retired(l layout, epoch int) bool {
	if l.old != nil && l.old.epoch == epoch {
		return false
	}
	return epoch < l.cur.epoch
}

func toPos(id string) (evPos, error) {
	ms, seq, err := parseStreamID(id)
	return evPos{ms: ms, seq: seq}, err
}

// keys returns the streams' keys, sorted.
func (r *evReader) keys() []string {
	keys := make([]string, 0, len(r.streams))
	for k := range r.streams {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// run merges the readers' batches into out until ctx ends, then stops the
// readers, waits for them and closes out.
func (r *evReader) run(ctx context.Context, out chan<- tidetype.TaskEvent) {
	defer close(out)
	defer r.wg.Wait()
	r.batches = make(chan evBatch)
	r.restart(ctx)
	defer func() { r.stop() }()
	tick := time.NewTicker(evRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case bt := <-r.batches:
			if bt.gen != r.gen {
				continue
			}
			if !r.deliver(ctx, bt, out) {
				return
			}
		case <-tick.C:
			if !r.refresh(ctx) {
				return
			}
		}
	}
}

// restart stops the readers and starts new ones from the delivered
// positions: one for all streams on a single node, one per stream on a
// cluster.
func (r *evReader) restart(ctx context.Context) {
	if r.stop != nil {
		r.stop()
	}
	r.gen++
	rctx, cancel := context.WithCancel(ctx)
	r.stop = cancel
	keys := r.keys()
	groups := [][]string{keys}
	if r.cluster {
		groups = groups[:0]
		for _, k := range keys {
			groups = append(groups, []string{k})
		}
	}
	for _, g := range groups {
		ids := make([]string, len(g))
		for i, k := range g {
			ids[i] = r.streams[k].pos.from()
		}
		gen := r.gen
		r.wg.Go(func() { r.read(rctx, gen, g, ids) })
	}
}

// read is one reader: XREAD BLOCK over its streams on a connection of its
// own (evConn), batches handed to the merger, errors retried with back-off
// until ctx ends. The end of ctx closes the connection, which ends a
// blocked XREAD at once.
func (r *evReader) read(ctx context.Context, gen int, keys, ids []string) {
	conn := &evConn{rdb: r.b.rdb, key: keys[0]}
	defer conn.close()
	defer context.AfterFunc(ctx, conn.close)()
	wait := 50 * time.Millisecond
	for ctx.Err() == nil {
		c, err := conn.get(ctx)
		var res []redis.XStream
		if err == nil {
			res, err = c.XRead(ctx, &redis.XReadArgs{Streams: append(slices.Clone(keys), ids...), Count: evCount, Block: evBlock}).Result()
		}
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			conn.failed(ctx, err)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			wait = min(2*wait, 5*time.Second)
			continue
		}
		wait = 50 * time.Millisecond
		for _, st := range res {
			i := slices.Index(keys, st.Stream)
			if len(st.Messages) == 0 || i < 0 {
				continue
			}
			ids[i] = st.Messages[len(st.Messages)-1].ID
			select {
			case r.batches <- evBatch{gen: gen, key: st.Stream, msgs: st.Messages}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// deliver sends a batch's events that come after the stream's position;
// it reports false when ctx ended or the stream has a gap (trimmed before
// it was read: the reading ends, and resuming reports it).
func (r *evReader) deliver(ctx context.Context, bt evBatch, out chan<- tidetype.TaskEvent) bool {
	s := r.streams[bt.key]
	if s == nil {
		return true
	}
	for _, m := range bt.msgs {
		ms, seq, err := parseStreamID(m.ID)
		if err != nil {
			continue
		}
		first := 0
		switch c := s.pos.cmp(ms, seq); {
		case c > 0:
			continue // delivered before
		case c == 0:
			if s.pos.skip == 0 {
				continue
			}
			first = s.pos.skip
		case !s.loose && !s.pos.follows(ms, seq):
			r.b.log.Warn("tide: redisbroker: events: a reader fell behind and events it had not read were trimmed; ending it (resuming reports the gap)",
				"queue", s.queue, "partition", s.part)
			return false
		}
		s.loose = false
		raw, _ := m.Values["e"].(string)
		at, evs, err := decodeEvents(raw)
		if err != nil {
			r.b.log.Warn("tide: redisbroker: events: skipping an unreadable stream entry", "stream", s.key, "entry", m.ID, "err", err)
		}
		if first >= len(evs) {
			s.pos = evPos{ms: ms, seq: seq}
			continue
		}
		for i := first; i < len(evs); i++ {
			if i == len(evs)-1 {
				s.pos = evPos{ms: ms, seq: seq}
			} else {
				s.pos = evPos{ms: ms, seq: seq, skip: i + 1}
			}
			ev := evs[i]
			ev.Queue, ev.At, ev.ID = s.queue, at, r.token()
			select {
			case out <- ev:
			case <-ctx.Done():
				return false
			}
		}
	}
	return true
}

// token encodes the positions in every stream.
func (r *evReader) token() string {
	ps := make([]broker.EventPosition, 0, len(r.streams))
	for _, s := range r.streams {
		ps = append(ps, broker.EventPosition{Queue: s.queue, Epoch: s.epoch, Partition: s.part, Ms: s.pos.ms, Seq: s.pos.seq, Skip: s.pos.skip})
	}
	return broker.EncodeEventToken(ps)
}

// refresh follows layout changes, drops the streams that left the layout
// once read to their end, and starts over a stream that was deleted or
// made anew (its queue deleted and created again). It reports false when
// reading must end.
func (r *evReader) refresh(ctx context.Context) bool {
	ls, err := r.layouts(ctx)
	if err != nil {
		return ctx.Err() == nil // Redis unreachable: the readers retry too
	}
	changed := r.apply(ls)
	keys := r.keys()
	infos, err := r.infos(ctx, keys)
	if err != nil {
		if changed {
			r.restart(ctx)
		}
		return ctx.Err() == nil
	}
	for i, k := range keys {
		s, info := r.streams[k], infos[i]
		var last evPos
		if info != nil {
			last, _ = toPos(info.LastGeneratedID)
		}
		switch c := last.cmp(s.pos.ms, s.pos.seq); {
		case !s.live && (info == nil || c <= 0 && s.pos.skip == 0):
			delete(r.streams, k) // read to its end, and written no more
			changed = true
		case c < 0:
			s.pos, s.loose = evPos{}, false // deleted, or made anew
			changed = true
		}
	}
	if changed {
		r.restart(ctx)
	}
	return true
}

// evConn is the connection a reader's XREAD BLOCK runs on. A reading
// blocks in Redis for up to evBlock at a time, again and again, for as
// long as its consumer follows the events (an HTTP event stream: hours).
// On the client's pool, every reading would hold one of the connections
// that enqueues and scripts need: with more readings than the pool has
// connections (go-redis's default is 10 per CPU), every other call of the
// process would wait for a reader's XREAD to end. So a reader dials a
// client of its own, with one connection, from the options of the
// broker's client: the same address, credentials, TLS, timeouts and
// dialer (a Sentinel client's dialer finds the current primary); on a
// cluster, the primary that holds the reader's stream (one stream per
// reader there). It does not carry hooks added to the broker's client
// (AddHook). A client of another kind (redis.Ring, a wrapper) is used as
// it is, pool and all.
type evConn struct {
	rdb redis.UniversalClient
	key string // a stream the reader reads: on a cluster, names the node

	mu     sync.Mutex
	c      *redis.Client // nil until dialled, and after a failure
	closed bool
}

// get returns the client to read with, making it when there is none.
func (e *evConn) get(ctx context.Context) (redis.Cmdable, error) {
	var opt redis.Options
	switch c := e.rdb.(type) {
	case *redis.Client:
		opt = *c.Options()
	case *redis.ClusterClient:
		e.mu.Lock()
		made := e.c != nil
		e.mu.Unlock()
		if !made {
			node, err := c.MasterForKey(ctx, e.key)
			if err != nil {
				return nil, err
			}
			opt = *node.Options()
		}
	default:
		return e.rdb, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return nil, redis.ErrClosed
	case e.c != nil:
		return e.c, nil
	}
	// One connection, kept while the reader reads; no client-side cache
	// (XREAD is not cached) and no connection opened in advance. The
	// broker client's push processor and maintenance-notification
	// settings are not shared (go-redis registers handlers on the one and
	// updates the other as it connects); maintenance notifications are
	// off: a reader that loses its connection dials again anyway.
	opt.PoolSize, opt.MaxActiveConns, opt.MinIdleConns, opt.MaxIdleConns = 1, 1, 0, 1
	opt.ClientSideCache, opt.ClientSideCacheConfig = nil, nil
	opt.PushNotificationProcessor = nil
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	denormalize(&opt)
	e.c = redis.NewClient(&opt)
	return e.c, nil
}

// denormalize turns the "none" of a client's options back into the form
// NewClient takes: the client normalized them (a ReadTimeout of -1, no
// timeout, became 0), and NewClient normalizes again (0 would become the
// default).
func denormalize(opt *redis.Options) {
	for _, d := range []*time.Duration{&opt.ReadTimeout, &opt.WriteTimeout} {
		switch *d {
		case 0:
			*d = -1 // no timeout
		case -1:
			*d = -2 // no deadline set at all
		}
	}
	for _, d := range []*time.Duration{&opt.MinRetryBackoff, &opt.MaxRetryBackoff} {
		if *d == 0 {
			*d = -1
		}
	}
	if opt.MaxRetries == 0 {
		opt.MaxRetries = -1
	}
}

// failed drops the client after err, so that the next try dials anew (on a
// cluster, to the node that holds the stream then), and asks a cluster
// client to reload its slot map when err says the topology may have
// changed.
func (e *evConn) failed(ctx context.Context, err error) {
	e.mu.Lock()
	c := e.c
	e.c = nil
	e.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	if cc, ok := e.rdb.(*redis.ClusterClient); ok && topologyError(err) && ctx.Err() == nil {
		cc.ReloadState(context.WithoutCancel(ctx))
	}
}

// close closes the client for good; a reader blocked on it returns at once.
func (e *evConn) close() {
	e.mu.Lock()
	c := e.c
	e.c, e.closed = nil, true
	e.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}
