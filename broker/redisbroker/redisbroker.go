// Package redisbroker is the Redis implementation of broker.Broker.
//
// It takes a redis.UniversalClient, so a single node, Sentinel (failover
// client) and Redis Cluster all work. Every state change is one Lua script
// (embedded from scripts/*.lua) that touches the keys of a single queue
// partition, and all keys of a partition share one hash tag:
//
//	<prefix>:{<queue>:<p>}:t          hash: task ID -> compact record (internal/codec)
//	<prefix>:{<queue>:<p>}:pending    list of IDs (pushed left, popped right)
//	<prefix>:{<queue>:<p>}:active     zset: ID -> lease expiry (ms, Redis clock)
//	<prefix>:{<queue>:<p>}:scheduled  zset: ID -> due time (ms)
//	<prefix>:{<queue>:<p>}:retry      zset: ID -> retry time (ms)
//	<prefix>:{<queue>:<p>}:archived   zset: ID -> archive time (ms)
//	<prefix>:{<queue>:<p>}:completed  zset: ID -> expiry of retention (ms)
//	<prefix>:{<queue>:<p>}:result     hash: task ID -> result bytes
//	<prefix>:{<queue>:<p>}:paused     flag
//	<prefix>:{<queue>:<p>}:owner      the server maintaining the partition
//	<prefix>:{<queue>:<p>}:u:<digest> unique lock, value = task ID
//	<prefix>:queues                   set of known queue names
//	<prefix>:partitions               hash: queue -> partition count
//
// A task lives in partition broker.Partition(ID, P), so a lookup or Delete by
// ID goes straight to it. With P at least the number of cluster masters a
// single queue spreads over the whole cluster. Every process using a queue
// must be configured with the same number of partitions for it; the first
// to use a queue records its count, and a broker configured otherwise gets a
// clear error from Enqueue and Maintain instead of losing track of tasks.
//
// Work events are published on <prefix>:ev:<queue> from inside the scripts.
package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/codec"
)

// Defaults of the options.
const (
	DefaultPrefix      = "tide"
	DefaultMaxArchived = 10000
	DefaultArchiveTTL  = 90 * 24 * time.Hour
	maxPartitions      = 1024
	maintainLimit      = 2000 // tasks per step of one maintain call
)

// Option configures a Broker.
type Option func(*Broker) error

// WithPrefix sets the key prefix (default "tide"). It must be non-empty and
// must not contain '{' or '}'.
func WithPrefix(p string) Option {
	return func(b *Broker) error {
		if p == "" || strings.ContainsAny(p, "{}") {
			return fmt.Errorf("prefix %q must be non-empty and free of '{' and '}'", p)
		}
		b.prefix = p
		return nil
	}
}

// WithPartitions sets the number of partitions of every queue not named by
// WithQueuePartitions (default 1, at most 1024).
func WithPartitions(n int) Option {
	return func(b *Broker) error {
		if n < 1 || n > maxPartitions {
			return fmt.Errorf("partitions %d out of range 1..%d", n, maxPartitions)
		}
		b.defaultParts = n
		return nil
	}
}

// WithQueuePartitions sets the number of partitions of one queue.
func WithQueuePartitions(queue string, n int) Option {
	return func(b *Broker) error {
		if n < 1 || n > maxPartitions {
			return fmt.Errorf("partitions %d for queue %q out of range 1..%d", n, queue, maxPartitions)
		}
		b.parts[queue] = n
		return nil
	}
}

// WithMaxArchived bounds the number of archived tasks kept per partition
// (default 10000); the oldest are deleted first.
func WithMaxArchived(n int) Option {
	return func(b *Broker) error {
		if n < 0 {
			return fmt.Errorf("max archived %d is negative", n)
		}
		b.maxArchived = n
		return nil
	}
}

// WithArchiveTTL sets how long archived tasks are kept (default 90 days).
func WithArchiveTTL(d time.Duration) Option {
	return func(b *Broker) error {
		if d <= 0 {
			return fmt.Errorf("archive TTL %v must be positive", d)
		}
		b.archiveTTL = d
		return nil
	}
}

// Broker is a broker.Broker on Redis. It is safe for concurrent use.
type Broker struct {
	rdb          redis.UniversalClient
	prefix       string
	defaultParts int
	parts        map[string]int
	maxArchived  int
	archiveTTL   time.Duration
	err          error // invalid options, reported by every method
	s            *scripts

	batch     batcher
	closed    atomic.Bool
	subsMu    sync.Mutex
	subs      map[int]context.CancelFunc // open subscriptions, ended by Close
	subSeq    int
	known     sync.Map // queue name -> struct{}: registered in <prefix>:queues
	nextStart atomic.Uint32
}

var _ broker.Broker = (*Broker)(nil)

// New returns a Broker on rdb. The broker does not own rdb: Close leaves it
// open. An invalid option is reported by every method of the broker. New
// panics if rdb is nil.
func New(rdb redis.UniversalClient, opts ...Option) *Broker {
	if rdb == nil {
		panic("tide: redisbroker.New: nil client")
	}
	b := &Broker{
		rdb: rdb, prefix: DefaultPrefix, defaultParts: 1, parts: map[string]int{},
		maxArchived: DefaultMaxArchived, archiveTTL: DefaultArchiveTTL, s: loadScripts(),
	}
	b.batch.send = b.enqueueNow
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		hookClusterReload(cc)
	}
	var errs []error
	for _, o := range opts {
		if o == nil {
			errs = append(errs, errors.New("nil option"))
			continue
		}
		if err := o(b); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		b.err = fmt.Errorf("tide: redisbroker: invalid option: %w", errors.Join(errs...))
	}
	return b
}

// keys names the keys of one partition.
type keys struct {
	base    string // "<prefix>:{<queue>:<p>}:"
	queue   string
	part    int
	channel string
}

func (b *Broker) keysFor(queue string, p int) keys {
	return keys{
		base:    b.prefix + ":{" + queue + ":" + strconv.Itoa(p) + "}:",
		queue:   queue,
		part:    p,
		channel: b.channel(queue),
	}
}

func (b *Broker) channel(queue string) string { return b.prefix + ":ev:" + queue }

func (k keys) k(name string) string { return k.base + name }

func (b *Broker) check() error {
	if b.err != nil {
		return b.err
	}
	if b.closed.Load() {
		return broker.ErrClosed
	}
	return nil
}

// Partitions implements broker.Broker.
func (b *Broker) Partitions(queue string) int {
	if n, ok := b.parts[queue]; ok {
		return n
	}
	return b.defaultParts
}

func (b *Broker) partOf(queue, id string) int { return broker.Partition(id, b.Partitions(queue)) }

// Close implements broker.Broker: later calls fail with broker.ErrClosed and
// open subscriptions end. It does not close the Redis client.
func (b *Broker) Close() error {
	if b.closed.Swap(true) {
		return broker.ErrClosed
	}
	b.subsMu.Lock()
	defer b.subsMu.Unlock()
	for _, cancel := range b.subs {
		cancel()
	}
	b.subs = nil
	return nil
}

func validMessage(m *broker.Message) error {
	switch {
	case m == nil:
		return errors.New("tide: redisbroker: nil message")
	case m.ID == "":
		return errors.New("tide: redisbroker: message has an empty ID")
	case m.Queue == "" || strings.ContainsAny(m.Queue, "{}"):
		return fmt.Errorf("tide: redisbroker: invalid queue name %q", m.Queue)
	case m.Type == "":
		return errors.New("tide: redisbroker: message has an empty type")
	case len(m.UniqueKey) > codec.MaxUniqueKey:
		return fmt.Errorf("tide: redisbroker: unique key of %d bytes, over %d", len(m.UniqueKey), codec.MaxUniqueKey)
	case len(m.Payload) > codec.MaxBody/2:
		return fmt.Errorf("tide: redisbroker: payload of %d bytes is too large", len(m.Payload))
	case m.State != broker.StatePending && m.State != broker.StateScheduled:
		return fmt.Errorf("tide: redisbroker: cannot enqueue a message in state %s", m.State)
	}
	return nil
}

// group collects the indexes of elements bound for one partition.
type group struct {
	k   keys
	idx []int
}

func groupBy[T any](b *Broker, items []T, loc func(T) (string, string)) []*group {
	if len(items) == 1 { // the common single Enqueue: no map
		q, id := loc(items[0])
		return []*group{{k: b.keysFor(q, b.partOf(q, id)), idx: []int{0}}}
	}
	byKey := map[string]*group{}
	var order []*group
	for i, it := range items {
		q, id := loc(it)
		p := b.partOf(q, id)
		key := q + "\x00" + strconv.Itoa(p)
		g := byKey[key]
		if g == nil {
			g = &group{k: b.keysFor(q, p)}
			byKey[key] = g
			order = append(order, g)
		}
		g.idx = append(g.idx, i)
	}
	return order
}

// Enqueue implements broker.Broker: one script call per partition, all in
// one pipeline. Concurrent calls share round trips: calls made while another
// is in flight are sent together when it returns. A call whose context ends
// while it waits returns the context's error; its tasks may still have been
// stored, as with any timeout.
func (b *Broker) Enqueue(ctx context.Context, msgs []*broker.Message) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if err := validMessage(m); err != nil {
			return nil, err
		}
	}
	if err := b.register(ctx, msgs); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	for _, m := range msgs {
		if m.WaitReplicas > 0 {
			// A replica wait can take its whole timeout: never make other
			// callers' tasks share it.
			return b.enqueueNow(ctx, msgs)
		}
	}
	return b.batch.enqueue(ctx, msgs)
}

func (b *Broker) enqueueNow(ctx context.Context, msgs []*broker.Message) ([]error, error) {
	groups := groupBy(b, msgs, func(m *broker.Message) (string, string) { return m.Queue, m.ID })
	calls := make([]*call, len(groups))
	for gi, g := range groups {
		args := make([]any, 0, 3+6*len(g.idx))
		args = append(args, g.k.channel, g.k.part, g.k.k("u:"))
		for _, i := range g.idx {
			m := msgs[i]
			kind := "p"
			if m.State == broker.StateScheduled {
				kind = "s"
			}
			args = append(args, m.ID, codec.Encode(m, 0), kind, m.ProcessAt.UnixMilli(), m.UniqueKey, m.UniqueTTL.Milliseconds())
		}
		calls[gi] = &call{script: b.s.enqueue, keys: []string{g.k.k("t"), g.k.k("pending"), g.k.k("scheduled"), g.k.k("retry")}, args: args}
	}
	replicas, timeout := 0, time.Duration(0)
	for _, m := range msgs {
		replicas, timeout = max(replicas, m.WaitReplicas), max(timeout, m.WaitTimeout)
	}
	var waits []*redis.Cmd
	if replicas > 0 {
		var err error
		if waits, err = b.runAndWait(ctx, calls, groups, replicas, timeout); err != nil {
			return nil, err
		}
	} else if err := runAll(ctx, b.rdb, calls); err != nil {
		return nil, err
	}
	errs := make([]error, len(msgs))
	for gi, g := range groups {
		if waits != nil {
			if n, err := waits[gi].Int64(); err != nil || int(n) < replicas {
				for _, i := range g.idx {
					if msgs[i].WaitReplicas > 0 && (err != nil || int(n) < msgs[i].WaitReplicas) {
						errs[i] = broker.ErrNotReplicated
					}
				}
			}
		}
		codes, err := calls[gi].cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: enqueue: %w", err)
		}
		if len(codes) != len(g.idx) {
			return nil, fmt.Errorf("tide: redisbroker: enqueue: %d replies for %d tasks", len(codes), len(g.idx))
		}
		for j, i := range g.idx {
			switch codes[j] {
			case 1:
				errs[i] = broker.ErrTaskIDConflict
			case 2:
				errs[i] = broker.ErrDuplicateTask
			}
			if codes[j] != 0 || errs[i] == nil {
				continue
			}
		}
	}
	return errs, nil
}

// runAndWait runs the calls and then one WAIT on every primary they touch:
// WAIT counts the replicas that have the connection's earlier writes, so each
// primary gets one pipeline holding its partitions' scripts followed by a
// single WAIT, and the primaries are waited on in parallel. It returns the
// WAIT reply that covers each call.
func (b *Broker) runAndWait(ctx context.Context, calls []*call, groups []*group, replicas int, timeout time.Duration) ([]*redis.Cmd, error) {
	cc, cluster := b.rdb.(*redis.ClusterClient)
	for attempt := 0; ; attempt++ {
		// Group the calls by primary (one group for a non-cluster client).
		type node struct {
			c     redis.Cmdable
			calls []int
			wait  *redis.Cmd
		}
		var nodes []*node
		byAddr := map[string]*node{}
		for gi := range calls {
			var c redis.Cmdable = b.rdb
			addr := ""
			if cluster {
				m, err := cc.MasterForKey(ctx, groups[gi].k.k("t"))
				if err != nil {
					return nil, fmt.Errorf("tide: redisbroker: enqueue: find primary: %w", err)
				}
				c, addr = m, m.Options().Addr
			}
			n := byAddr[addr]
			if n == nil {
				n = &node{c: c}
				byAddr[addr] = n
				nodes = append(nodes, n)
			}
			n.calls = append(n.calls, gi)
		}
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(func() {
				for _, useEval := range []bool{false, true} {
					pipe := n.c.Pipeline()
					for _, gi := range n.calls {
						c := calls[gi]
						if useEval {
							c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
						} else {
							c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
						}
					}
					n.wait = pipe.Do(ctx, "WAIT", replicas, timeout.Milliseconds())
					_, _ = pipe.Exec(ctx) // errors are read per command
					if !anyNoScript(calls, n.calls) {
						return
					}
				}
			})
		}
		wg.Wait()
		waits := make([]*redis.Cmd, len(calls))
		redirected := false
		for _, n := range nodes {
			for _, gi := range n.calls {
				waits[gi] = n.wait
				if err := calls[gi].cmd.Err(); err != nil && isRedirect(err) {
					redirected = true
				}
			}
		}
		// A redirect means the script did not run on that node: the slot
		// moved (a failover). Learn the new layout and send again, once.
		if !redirected || !cluster || attempt > 0 {
			return waits, nil
		}
		cc.ReloadState(ctx)
	}
}

func anyNoScript(calls []*call, idx []int) bool {
	for _, gi := range idx {
		if err := calls[gi].cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// isRedirect reports a cluster reply that means "not here": the command was
// not executed.
func isRedirect(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "CLUSTERDOWN") || strings.HasPrefix(s, "TRYAGAIN")
}

// register records unseen queues (once per process): their names in
// <prefix>:queues and their partition counts in <prefix>:partitions. A queue
// whose recorded partition count differs from this broker's is refused: tasks
// would be looked for in the wrong partitions and never found.
func (b *Broker) register(ctx context.Context, msgs []*broker.Message) error {
	for i, m := range msgs {
		if i > 0 && m.Queue == msgs[i-1].Queue {
			continue // batches are usually one queue; registerQueue caches anyway
		}
		if err := b.registerQueue(ctx, m.Queue); err != nil {
			return err
		}
	}
	return nil
}

func (b *Broker) registerQueue(ctx context.Context, queue string) error {
	if _, ok := b.known.Load(queue); ok {
		return nil
	}
	want := b.Partitions(queue)
	pipe := b.rdb.Pipeline()
	pipe.SAdd(ctx, b.prefix+":queues", queue)
	pipe.HSetNX(ctx, b.prefix+":partitions", queue, want)
	got := pipe.HGet(ctx, b.prefix+":partitions", queue)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: register queue %q: %w", queue, err)
	}
	if n, err := got.Int(); err != nil || n != want {
		return fmt.Errorf("tide: redisbroker: queue %q has %s partitions in Redis but this broker is configured with %d; configure every process the same (WithPartitions / WithQueuePartitions)", queue, got.Val(), want)
	}
	b.known.Store(queue, struct{}{})
	return nil
}

// Dequeue implements broker.Broker. Queues are tried in order; the
// partitions of a queue from a rotating start, so that all get served.
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
		parts := b.Partitions(q)
		for i := 0; i < parts && len(out) < n; i++ {
			k := b.keysFor(q, (start+i)%parts)
			res, err := b.s.dequeue.Run(ctx, b.rdb,
				[]string{k.k("t"), k.k("pending"), k.k("active"), k.k("paused"), k.k("archived"), k.k("result"), k.k("scheduled"), k.k("retry")},
				n-len(out), lease.Milliseconds(), time.Now().UnixMilli()).Slice()
			if err != nil && !errors.Is(err, redis.Nil) {
				// One unreachable partition (a cluster node failing over)
				// must not starve the others: try them, report the error
				// only when nothing could be had.
				if firstErr == nil {
					firstErr = fmt.Errorf("tide: redisbroker: dequeue %s: %w", q, err)
				}
				continue
			}
			for j := 0; j+1 < len(res); j += 2 {
				id, _ := res[j].(string)
				rec, _ := res[j+1].(string)
				m, tok, derr := codec.Decode(q, id, []byte(rec))
				if derr == nil && m.Type == "" {
					derr = fmt.Errorf("%w: empty task type", codec.ErrCorrupt)
				}
				if derr != nil {
					b.archiveUndecodable(ctx, k, id, []byte(rec), derr)
					continue
				}
				out = append(out, &broker.Delivery{Message: m, Token: tok, LeaseFor: lease})
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

// archiveUndecodable archives a leased task whose body could not be decoded.
func (b *Broker) archiveUndecodable(ctx context.Context, k keys, id string, rec []byte, derr error) {
	tok, _ := codec.Token(rec)
	now := time.Now().UnixMilli()
	_ = b.s.settle.Run(ctx, b.rdb, b.settleKeys(k),
		k.channel, k.part, k.k("u:"), today(), "a", id, tok, "", now, "tide: undecodable task record: "+derr.Error()).Err()
}

func (b *Broker) settleKeys(k keys) []string {
	return []string{k.k("t"), k.k("active"), k.k("pending"), k.k("retry"), k.k("archived"), k.k("completed"), k.k("result"), k.k("scheduled")}
}

// Extend implements broker.Broker: one script call per partition.
func (b *Broker) Extend(ctx context.Context, leases []broker.LeaseRef, d time.Duration) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	groups := groupBy(b, leases, func(l broker.LeaseRef) (string, string) { return l.Queue, l.ID })
	calls := make([]*call, len(groups))
	for gi, g := range groups {
		args := []any{d.Milliseconds()}
		for _, i := range g.idx {
			args = append(args, leases[i].ID, leases[i].Token)
		}
		calls[gi] = &call{script: b.s.extend, keys: []string{g.k.k("t"), g.k.k("active")}, args: args}
	}
	return b.codes(ctx, "extend", calls, groups, len(leases))
}

// codes runs the calls and maps each reply code 1 to ErrLeaseLost.
func (b *Broker) codes(ctx context.Context, op string, calls []*call, groups []*group, n int) ([]error, error) {
	if len(calls) == 0 {
		return make([]error, n), nil
	}
	if err := runAll(ctx, b.rdb, calls); err != nil {
		return nil, err
	}
	errs := make([]error, n)
	for gi, g := range groups {
		codes, err := calls[gi].cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("tide: redisbroker: %s: %w", op, err)
		}
		if len(codes) != len(g.idx) {
			return nil, fmt.Errorf("tide: redisbroker: %s: %d replies for %d items", op, len(codes), len(g.idx))
		}
		for j, i := range g.idx {
			if codes[j] == 1 {
				errs[i] = broker.ErrLeaseLost
			}
		}
	}
	return errs, nil
}

// Settle implements broker.Broker: one script call per partition.
func (b *Broker) Settle(ctx context.Context, ss []broker.Settlement) ([]error, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	groups := groupBy(b, ss, func(s broker.Settlement) (string, string) { return s.Lease.Queue, s.Lease.ID })
	calls := make([]*call, len(groups))
	for gi, g := range groups {
		args := make([]any, 0, 4+6*len(g.idx))
		args = append(args, g.k.channel, g.k.part, g.k.k("u:"), today())
		for _, i := range g.idx {
			s := ss[i]
			at := s.At
			if at.IsZero() {
				at = time.Now()
			}
			id, tok := s.Lease.ID, s.Lease.Token
			switch s.Outcome {
			case broker.OutcomeDone:
				if s.Message != nil && s.Message.Retention > 0 {
					m := *s.Message
					m.State, m.CompletedAt = broker.StateCompleted, at
					args = append(args, "c", id, tok, codec.Encode(&m, tok), at.Add(m.Retention).UnixMilli(), "")
				} else {
					args = append(args, "d", id, tok, "", "", "")
				}
			case broker.OutcomeRetry:
				args = append(args, "r", id, tok, s.RetryAt.UnixMilli(), at.UnixMilli(), s.Err)
			case broker.OutcomeArchive:
				args = append(args, "a", id, tok, "", at.UnixMilli(), s.Err)
			case broker.OutcomeRequeue:
				args = append(args, "q", id, tok, "", "", "")
			default:
				return nil, fmt.Errorf("tide: redisbroker: settle %s: unknown outcome %d", id, s.Outcome)
			}
		}
		calls[gi] = &call{script: b.s.settle, keys: b.settleKeys(g.k), args: args}
	}
	return b.codes(ctx, "settle", calls, groups, len(ss))
}

// SetResult implements broker.Broker.
func (b *Broker) SetResult(ctx context.Context, l broker.LeaseRef, data []byte) error {
	if err := b.check(); err != nil {
		return err
	}
	k := b.keysFor(l.Queue, b.partOf(l.Queue, l.ID))
	code, err := b.s.setResult.Run(ctx, b.rdb, []string{k.k("t"), k.k("result")}, l.ID, l.Token, data).Int64()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: set result: %w", err)
	}
	if code == 1 {
		return broker.ErrLeaseLost
	}
	return nil
}

// Maintain implements broker.Broker.
func (b *Broker) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	if err := b.check(); err != nil {
		return broker.MaintainResult{}, err
	}
	if err := b.registerQueue(ctx, req.Queue); err != nil {
		return broker.MaintainResult{}, err
	}
	k := b.keysFor(req.Queue, req.Partition)
	ttl := max(req.OwnerTTL.Milliseconds(), 1)
	res, err := b.s.maintain.Run(ctx, b.rdb,
		[]string{k.k("owner"), k.k("t"), k.k("pending"), k.k("active"), k.k("scheduled"), k.k("retry"), k.k("archived"), k.k("completed"), k.k("result")},
		req.Owner, ttl, req.Now.UnixMilli(), k.channel, k.part, k.k("u:"), b.maxArchived, b.archiveTTL.Milliseconds(), maintainLimit, today(),
		map[bool]string{true: "0", false: "1"}[req.NoTrim],
	).Int64Slice()
	if err != nil {
		return broker.MaintainResult{}, fmt.Errorf("tide: redisbroker: maintain %s/%d: %w", req.Queue, req.Partition, err)
	}
	if len(res) != 7 {
		return broker.MaintainResult{}, fmt.Errorf("tide: redisbroker: maintain: unexpected reply of %d values", len(res))
	}
	// A refused claim in its last millisecond reports 0 left; round up so
	// callers never spin.
	out := broker.MaintainResult{
		Owned:     res[0] == 1,
		RetryIn:   time.Duration(max(res[1], 1)) * time.Millisecond,
		Pending:   int(res[2]),
		Forwarded: int(res[3]),
		Recovered: int(res[4]),
	}
	if res[5] >= 0 {
		out.NextDue = time.UnixMilli(res[5])
	}
	if res[6] >= 0 {
		out.NextLeaseIn = time.Duration(res[6]) * time.Millisecond
	}
	return out, nil
}

// GetTask implements broker.Broker.
func (b *Broker) GetTask(ctx context.Context, queue, id string) (*broker.Message, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	k := b.keysFor(queue, b.partOf(queue, id))
	pipe := b.rdb.Pipeline()
	rec := pipe.HGet(ctx, k.k("t"), id)
	result := pipe.HGet(ctx, k.k("result"), id)
	_, _ = pipe.Exec(ctx)
	raw, err := rec.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, broker.ErrTaskNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: get task: %w", err)
	}
	m, err := codec.DecodeHeader(queue, id, raw)
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: task %s/%s: %w", queue, id, err)
	}
	if r, err := result.Bytes(); err == nil {
		m.Result = r
	} else if !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("tide: redisbroker: get result: %w", err)
	}
	return m, nil
}

// Delete implements broker.Broker.
func (b *Broker) Delete(ctx context.Context, queue, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	k := b.keysFor(queue, b.partOf(queue, id))
	code, err := b.s.delete.Run(ctx, b.rdb,
		[]string{k.k("t"), k.k("pending"), k.k("scheduled"), k.k("retry"), k.k("archived"), k.k("completed"), k.k("result"), k.k("active")},
		id, k.k("u:")).Int64()
	if err != nil {
		return fmt.Errorf("tide: redisbroker: delete: %w", err)
	}
	switch code {
	case 0:
		return broker.ErrTaskNotFound
	case 2:
		return broker.ErrTaskActive
	}
	return nil
}

// Pause implements broker.Broker.
func (b *Broker) Pause(ctx context.Context, queue string) error { return b.setPaused(ctx, queue, true) }

// Unpause implements broker.Broker.
func (b *Broker) Unpause(ctx context.Context, queue string) error {
	return b.setPaused(ctx, queue, false)
}

func (b *Broker) setPaused(ctx context.Context, queue string, on bool) error {
	if err := b.check(); err != nil {
		return err
	}
	pipe := b.rdb.Pipeline()
	for p := range b.Partitions(queue) {
		k := b.keysFor(queue, p).k("paused")
		if on {
			pipe.Set(ctx, k, "1", 0)
		} else {
			pipe.Del(ctx, k)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: pause %s: %w", queue, err)
	}
	if !on {
		// Wake idle servers: the queue may hold work.
		for p := range b.Partitions(queue) {
			b.rdb.Publish(ctx, b.channel(queue), "p"+strconv.Itoa(p))
		}
	}
	return nil
}

// Subscribe implements broker.Broker with Redis pub/sub.
func (b *Broker) Subscribe(ctx context.Context, queues []string) (<-chan broker.Event, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	chans := make([]string, len(queues))
	byChan := make(map[string]string, len(queues))
	for i, q := range queues {
		chans[i] = b.channel(q)
		byChan[chans[i]] = q
	}
	ctx, cancel := context.WithCancel(ctx)
	b.subsMu.Lock()
	if b.closed.Load() {
		b.subsMu.Unlock()
		cancel()
		return nil, broker.ErrClosed
	}
	if b.subs == nil {
		b.subs = map[int]context.CancelFunc{}
	}
	b.subSeq++
	seq := b.subSeq
	b.subs[seq] = cancel
	b.subsMu.Unlock()
	done := func() {
		cancel()
		b.subsMu.Lock()
		delete(b.subs, seq)
		b.subsMu.Unlock()
	}
	ps := b.rdb.Subscribe(ctx, chans...)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		done()
		return nil, fmt.Errorf("tide: redisbroker: subscribe: %w", err)
	}
	out := make(chan broker.Event, 64)
	go func() {
		defer close(out)
		defer done()
		defer ps.Close()
		// A blocked read does not see ctx; closing the connection ends it.
		stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
		defer stop()
		for {
			msg, err := ps.ReceiveTimeout(ctx, subscriptionIdle)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && ps.Ping(ctx) == nil {
					continue // quiet, and the connection still answers
				}
				// The connection broke: events may have been missed while
				// go-redis would re-dial quietly. End the subscription so
				// the caller re-subscribes and looks for missed work.
				return
			}
			m, ok := msg.(*redis.Message)
			if !ok {
				continue // subscription confirmations and pongs
			}
			ev, ok := parseEvent(byChan[m.Channel], m.Payload)
			if !ok {
				continue
			}
			select {
			case out <- ev:
			default: // hints; the consumer is busy anyway
			}
		}
	}()
	return out, nil
}

// subscriptionIdle is how long a subscription may be silent before it is
// pinged to find out whether its connection still works.
const subscriptionIdle = 15 * time.Second

// today is the UTC day the day counters are kept under.
func today() string { return time.Now().UTC().Format(time.DateOnly) }

// parseEvent reads "p<partition>", "s<partition>:<ms>" or "c<task ID>".
func parseEvent(queue, s string) (broker.Event, bool) {
	if queue == "" || len(s) < 2 {
		return broker.Event{}, false
	}
	switch s[0] {
	case 'c':
		return broker.Event{Kind: broker.EventCancel, Queue: queue, ID: s[1:]}, true
	case 'p':
		p, err := strconv.Atoi(s[1:])
		if err != nil {
			return broker.Event{}, false
		}
		return broker.Event{Kind: broker.EventPending, Queue: queue, Partition: p}, true
	case 's':
		ps, ms, ok := strings.Cut(s[1:], ":")
		if !ok {
			return broker.Event{}, false
		}
		p, err1 := strconv.Atoi(ps)
		at, err2 := strconv.ParseInt(ms, 10, 64)
		if err1 != nil || err2 != nil {
			return broker.Event{}, false
		}
		return broker.Event{Kind: broker.EventScheduled, Queue: queue, Partition: p, At: time.UnixMilli(at)}, true
	}
	return broker.Event{}, false
}
