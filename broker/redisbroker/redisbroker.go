package redisbroker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
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

// WithPartitions sets the number of partitions a queue gets when this broker
// is the first to use it (default 1, at most 1024). A queue that already
// exists keeps its recorded count.
func WithPartitions(n int) Option {
	return func(b *Broker) error {
		if n < 1 || n > maxPartitions {
			return fmt.Errorf("partitions %d out of range 1..%d", n, maxPartitions)
		}
		b.defaultParts = n
		return nil
	}
}

// WithQueuePartitions requires queue to have n partitions: it gets n when it
// is new, and a queue recorded with another count is refused (every call on
// it fails with an error wrapping broker.ErrLayout) rather than adopted.
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

// WithReplayWindow sets how long a request's reply is kept so that a re-sent
// request answers like the first run (see the package documentation). The
// default covers go-redis's retries with the client's options:
// (MaxRetries+1) × (ReadTimeout + WriteTimeout + MaxRetryBackoff) + 5s, at
// least 10s. It must be at least one second.
func WithReplayWindow(d time.Duration) Option {
	return func(b *Broker) error {
		if d < time.Second {
			return fmt.Errorf("replay window %v is under one second", d)
		}
		b.window = d
		return nil
	}
}

// WithIdempotencyWindow sets how long an idempotency key
// (tide.IdempotencyKey) is remembered: at least d and at most 2d after the
// Enqueue that used it. Default 24 hours; it must be at least one minute.
// The keys are kept per partition in hashes that expire whole, so the
// memory is about 100 bytes per key used in the last 2d.
func WithIdempotencyWindow(d time.Duration) Option {
	return func(b *Broker) error {
		if d < time.Minute {
			return fmt.Errorf("idempotency window %v is under one minute", d)
		}
		b.idemWindow = d
		return nil
	}
}

// WithLogger sets the logger of the broker's warnings (an eviction policy
// that may drop tasks). Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(b *Broker) error {
		if l == nil {
			return errors.New("nil logger")
		}
		b.log = l
		return nil
	}
}

// WithRequireNoEviction makes the broker refuse to work (every call fails
// with an error wrapping ErrEvictionPolicy) when Redis's maxmemory-policy is
// not noeviction, instead of logging a warning. With any other policy Redis
// may silently delete tasks when memory runs short.
func WithRequireNoEviction() Option {
	return func(b *Broker) error {
		b.strictEviction = true
		return nil
	}
}

// WithLocalClock replaces the local clock the broker corrects to Redis time
// (default time.Now). It exists for tests that simulate a process whose clock
// is off; nil is refused.
func WithLocalClock(now func() time.Time) Option {
	return func(b *Broker) error {
		if now == nil {
			return errors.New("nil local clock")
		}
		b.clock.local = now
		return nil
	}
}

// ErrEvictionPolicy is wrapped by the error a broker built WithRequireNoEviction
// reports when Redis may evict keys.
var ErrEvictionPolicy = errors.New("tide: redisbroker: Redis maxmemory-policy may evict tasks; set it to noeviction")

// Broker is a broker.Broker, broker.Admin, broker.Registry and broker.Clock
// on Redis. It is safe for concurrent use.
type Broker struct {
	rdb            redis.UniversalClient
	prefix         string
	flowSweepMu    sync.Mutex
	flowSweep      map[tidetype.FlowKind]float64 // where sweepFlowIndex goes on, per index
	defaultParts   int
	parts          map[string]int
	maxArchived    int
	archiveTTL     time.Duration
	window         time.Duration
	idemWindow     time.Duration
	eventsMax      int           // MAXLEN of a partition's events stream; 0: no events
	eventsDefault  bool          // queues without a recorded setting record events
	eventsAge      time.Duration // events kept at most this long; 0: no age bound
	log            *slog.Logger
	strictEviction bool
	err            error // invalid options, reported by every method
	s              *scripts
	clock          clock
	newID          func() string // broker.NewID; tests replace it

	coalesce coalescer
	solo     soloConn // a lone enqueue's kept connection
	closed   atomic.Bool
	waits    waitHub // Wait's subscriptions
	subsMu   sync.Mutex
	subs     map[int]func() // open subscriptions, ended by Close
	subSeq   int
	layouts  sync.Map // queue name -> layout
	// forgets counts forgetLayout calls: a layout read before one is not
	// cached (loadLayout), it may be the one just forgotten. forgetMu makes
	// a forget and loadLayout's check-then-store exclusive, so that no
	// layout read before a forget is stored after it.
	forgets  atomic.Uint64
	forgetMu sync.Mutex
	idSweeps sync.Map // partition base -> time of its last sweepIDs
	// cacheExpiry maps a partition's key prefix to the last of its reply
	// caches whose expiry a call of this process set (enqueuePlainCall).
	cacheExpiry sync.Map
	// plainOff maps a partition's key prefix to when (Unix ns) its calls
	// may try the plain lease and settle scripts again (plainOK).
	plainOff sync.Map
	// requests maps a partition's key prefix to the *atomic.Uint64 that
	// counts this process's requests on it (request).
	requests sync.Map
	// slots maps a partition's key prefix to the *slotSeq of this
	// process's single enqueues on it (replySlot); slotExpiry is
	// cacheExpiry for their reply slots.
	slots      sync.Map
	slotExpiry sync.Map
	oneSHA     any    // enqueue_one.lua's SHA, boxed once (enqueueOneCall)
	tag        string // names this process's reply caches (request)
	layoutMu   sync.Mutex
	evictMu    sync.Mutex
	evictDone  atomic.Bool
	evictErr   error
	nextStart  atomic.Uint32
	reb        rebalancer // background rebalances of the limits' slots (slots.go)
}

var (
	_ broker.Broker   = (*Broker)(nil)
	_ broker.Admin    = (*Broker)(nil)
	_ broker.Registry = (*Broker)(nil)
	_ broker.Clock    = (*Broker)(nil)
)

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
		log: slog.Default(), window: defaultWindow(rdb), idemWindow: 24 * time.Hour, newID: broker.NewID,
		eventsMax: DefaultEventsMaxLen, eventsAge: DefaultEventsMaxAge,
	}
	b.clock.local = time.Now
	b.coalesce.send = b.enqueueNow
	b.oneSHA = b.s.enqueueOne.Hash()
	b.reb.ctx, b.reb.stop = context.WithCancel(context.Background())
	// 72 random bits: a single Enqueue's reply slot is named by this tag,
	// a slice and a count (replySlot), so two processes drawing the same
	// tag in the same slice would take each other's slots and answer a
	// first run as a re-send, storing nothing.
	var tag [9]byte
	_, _ = rand.Read(tag[:])
	b.tag = base64.RawURLEncoding.EncodeToString(tag[:])
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

// defaultWindow derives the replay window from the client's retry options.
func defaultWindow(rdb redis.UniversalClient) time.Duration {
	retries, read, write, backoff := 3, 3*time.Second, 3*time.Second, 512*time.Millisecond
	pick := func(r int, rt, wt, bo time.Duration) {
		if r > 0 {
			retries = r
		} else if r < 0 {
			retries = 0
		}
		if rt > 0 {
			read = rt
		}
		if wt > 0 {
			write = wt
		}
		if bo > 0 {
			backoff = bo
		}
	}
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		pick(o.MaxRetries, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff)
	case *redis.ClusterClient:
		o := c.Options()
		pick(o.MaxRetries, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff)
		retries = max(retries, 1) * max(o.MaxRedirects, 1)
	}
	return max(time.Duration(retries+1)*(read+write+backoff)+5*time.Second, 10*time.Second)
}

// part names one partition of a queue under its layout.
type part struct {
	queue   string
	idx     int    // index among the layout's partitions (events, Maintain)
	old     bool   // in the old span of a running repartition
	layout  string // what the partition's meta key says (the scripts check it)
	events  bool   // the queue records task events
	base    string // "<prefix>:{<queue>:<p>[@<epoch>]}:"
	channel string
	// one holds enqueue_one.lua's keys and arguments that are the
	// partition's, boxed once: the records, pending and meta keys, the
	// layout, and "p<idx> <channel>" (what to publish, and where).
	one [5]any
	// plainKeys are the keys of enqueue_plain.lua but the reply cache,
	// named with the partition.
	plainKeys [5]string
	// idTag places an ID in this partition (see idTag).
	idTag string
}

func (b *Broker) channel(queue string) string { return b.prefix + ":ev:" + queue }

// k names one key of the partition.
func (p part) k(name string) string { return p.base + name }

// groupKeys names the partition's keys for grouped tasks, in the order of
// groups.lua's g_keys.
func (p part) groupKeys() []string { return p.keys("gq", "gr", "gw", "gs", "gid", "gl") }

// endKeys names the partition's progress hash and the waiter keys, in the
// order the scripts that end tasks take them (lib.lua's w_keys).
func (p part) endKeys() []string { return p.keys("pg", "wt", "oc", "ocx") }

// keys names several keys of the partition.
func (p part) keys(names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p.base + n
	}
	return out
}

func (b *Broker) check() error {
	if b.err != nil {
		return b.err
	}
	if b.closed.Load() {
		return broker.ErrClosed
	}
	return nil
}

// Close implements broker.Broker: later calls fail with broker.ErrClosed,
// open subscriptions end and background rebalances of limits' slots stop
// (Close waits for them). It does not close the Redis client.
func (b *Broker) Close() error {
	if b.closed.Swap(true) {
		return broker.ErrClosed
	}
	b.reb.mu.Lock()
	b.reb.stop()
	b.reb.mu.Unlock()
	b.reb.wg.Wait()
	b.solo.close()
	b.subsMu.Lock()
	defer b.subsMu.Unlock()
	for _, cancel := range b.subs {
		cancel()
	}
	b.subs = nil
	return nil
}

// minute is the Unix minute the live view's counters are kept under, on the
// Redis clock.
func (b *Broker) minute() int64 { return b.Now().Unix() / 60 }

// today is the UTC day the day counters are kept under, on the Redis clock.
func (b *Broker) today() string { return b.Now().UTC().Format(time.DateOnly) }
