package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Task lifecycle events (broker.EventReader): every script that changes a
// task's state appends what it did to its partition's stream
// <prefix>:{<queue>:<p>}:events, in the same atomic step. One stream entry
// holds the events of one script run (at most 64; see ev_add in lib.lua),
// so a batch of tasks costs one XADD. Streams are trimmed by length on
// every write (XADD MAXLEN ~) and by age when the partition is maintained
// (XTRIM MINID ~).

// eventsKey names a partition's events stream.
const eventsKey = "events"

// Defaults of WithEventRetention.
const (
	DefaultEventsMaxLen = 10000
	DefaultEventsMaxAge = 24 * time.Hour
)

// WithEventRetention bounds each partition's stream of task events (see
// the package documentation): about maxEntries entries (an entry holds the
// events of one state change, up to 64 when a batch of tasks changes
// together) and entries at most maxAge old (trimmed when the partition is
// maintained; 0 for no age bound). Defaults DefaultEventsMaxLen and
// DefaultEventsMaxAge. maxEntries 0 turns events off: nothing is recorded
// and readers see nothing new; a negative maxEntries or maxAge is refused.
// All processes using a queue should agree: the one that changes a task
// records its event by its own setting.
func WithEventRetention(maxEntries int, maxAge time.Duration) Option {
	return func(b *Broker) error {
		if maxEntries < 0 || maxAge < 0 {
			return fmt.Errorf("event retention %d entries / %v must not be negative", maxEntries, maxAge)
		}
		b.eventsMax, b.eventsAge = maxEntries, maxAge
		return nil
	}
}

// WithEvents sets whether queues record task events when no setting is
// recorded for them (SetEvents). Default false: events cost every state
// change one more write per batch (about a tenth of Redis's time for the
// scripts when processing small tasks), so a queue records them once
// turned on.
func WithEvents(on bool) Option {
	return func(b *Broker) error {
		b.eventsDefault = on
		return nil
	}
}

// eventsOn reads a queue's recorded setting ("1", "0", or "" for none).
func (b *Broker) eventsOn(flag string) bool {
	switch flag {
	case "1":
		return true
	case "0":
		return false
	}
	return b.eventsDefault
}

// eventsArg is the scripts' MAXLEN argument for partition p: "" when its
// queue records no events.
func (b *Broker) eventsArg(p part) string {
	if !p.events || b.eventsMax <= 0 {
		return ""
	}
	return strconv.Itoa(b.eventsMax)
}

// SetEvents implements broker.EventReader: the setting is recorded in the
// hash <prefix>:events, read with the queue's layout (cached for half a
// minute), and a layout event tells the processes subscribed to the queue
// to read it again at once.
func (b *Broker) SetEvents(ctx context.Context, queue string, on bool) error {
	if err := b.check(); err != nil {
		return err
	}
	if queue == "" || strings.ContainsAny(queue, "{}") {
		return fmt.Errorf("%w: invalid queue name %q", broker.ErrInvalidTask, queue)
	}
	v := "0"
	if on {
		v = "1"
	}
	if err := b.rdb.HSet(ctx, b.prefix+":"+eventsKey, queue, v).Err(); err != nil {
		return callErr("set events of "+queue, classify(err))
	}
	b.forgetLayout(queue)
	b.rdb.Publish(ctx, b.channel(queue), "l")
	return nil
}

var _ broker.EventReader = (*Broker)(nil)

// How the reader works (see evReader).
const (
	evBlock   = time.Second     // one XREAD BLOCK; also how long a reader may outlive ctx, which ReadEvents waits out
	evRefresh = 2 * time.Second // how often the queues' layouts are read again
	evCount   = 256             // entries per XREAD and stream
)

// ReadEvents implements broker.EventReader. It reads every partition's
// stream of the queues: on a single node with one XREAD BLOCK over all of
// them, on Redis Cluster with one per partition (their keys are in
// different slots). It merges them into one channel. The resume token of
// each event holds the position in every stream.
//
// Each XREAD runs on a connection of its own, not on one of the client's
// pool, so that readings (an HTTP event stream may last hours) never take
// the connections other calls need: ReadEvents opens one connection on a
// single node, one per partition on a cluster (to the primary that holds
// it), and closes them when ctx ends. They are dialled with the options of
// the client New was given, *redis.Client (Sentinel's included) or
// *redis.ClusterClient, but without its hooks (AddHook); with another kind
// of client, readings use that client and its pool. Every reading is one
// more client of Redis (mind its maxclients); cap readings where outsiders
// open them (the gateway does: gateway.Config.MaxEventStreams).
//
// A queue that does not exist yet is read from its creation on; reading
// never creates or registers a queue. The layouts are read again every two
// seconds: when a repartition starts, the new partitions' streams are read
// from their beginning; the old partitions' streams are read to their end
// and dropped once they are retired (a retired partition's stream expires
// after the events' maximum age, or a day when there is none). A task that
// moved has its earlier events in its old partition's stream and its later
// ones in the new one; their order across the two is not defined. Deleting
// a queue deletes its streams with it: a reader starts them over when the
// queue is created again.
//
// A reader that falls so far behind that entries it has not read are
// trimmed ends: its channel closes, and reading again after its last event
// reports the gap (broker.ErrEventGap).
func (b *Broker) ReadEvents(ctx context.Context, queues []string, after string) (<-chan tidetype.TaskEvent, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	var token []broker.EventPosition
	if after != "" && after != broker.EventsOldest {
		var err error
		if token, err = broker.DecodeEventToken(after); err != nil {
			return nil, err
		}
		if queues, err = broker.CheckTokenQueues(queues, token); err != nil {
			return nil, err
		}
	} else {
		if len(queues) == 0 {
			return nil, errors.New("tide: redisbroker: events: no queues to read")
		}
		queues = slices.Clone(queues)
		slices.Sort(queues)
		queues = slices.Compact(queues)
	}
	for _, q := range queues {
		if q == "" || strings.ContainsAny(q, "{}") {
			return nil, fmt.Errorf("%w: invalid queue name %q", broker.ErrInvalidTask, q)
		}
	}
	flags, err := b.rdb.HMGet(ctx, b.prefix+":"+eventsKey, queues...).Result()
	if err != nil {
		return nil, callErr("events", classify(err))
	}
	on := false
	for _, f := range flags {
		s, _ := f.(string)
		on = on || b.eventsOn(s)
	}
	if !on || b.eventsMax <= 0 {
		return nil, fmt.Errorf("%w (queues %q)", broker.ErrEventsOff, queues)
	}
	r := &evReader{b: b, queues: queues, streams: map[string]*evStream{}}
	_, r.cluster = b.rdb.(*redis.ClusterClient)
	if err := r.start(ctx, after, token); err != nil {
		return nil, err
	}
	ctx, release, ok := b.track(ctx)
	if !ok {
		return nil, broker.ErrClosed
	}
	out := make(chan tidetype.TaskEvent)
	go func() {
		defer release()
		r.run(ctx, out)
	}()
	return out, nil
}

// eventKinds maps the scripts' kind bytes (ev_add in lib.lua).
var eventKinds = [256]tidetype.TaskEventKind{
	'e': tidetype.EventEnqueued, 's': tidetype.EventStarted, 'd': tidetype.EventSucceeded, 'f': tidetype.EventFailed,
	'r': tidetype.EventRetrying, 'a': tidetype.EventArchived, 'x': tidetype.EventDeleted, 'c': tidetype.EventCancelled,
}

// decodeEvents reads a stream entry's value: '\x01', the Redis time in ms
// (6 bytes), then per event a kind byte, the big-endian 2-byte lengths of
// ID, type and error, and the three strings. It returns the events read
// before a problem, and the problem.
func decodeEvents(v string) (time.Time, []tidetype.TaskEvent, error) {
	if len(v) < 7 || v[0] != 1 {
		return time.Time{}, nil, errors.New("not a version 1 events entry")
	}
	var ms int64
	for i := 1; i < 7; i++ {
		ms = ms<<8 | int64(v[i])
	}
	at := time.UnixMilli(ms)
	var out []tidetype.TaskEvent
	b := v[7:]
	for len(b) > 0 {
		if len(b) < 7 {
			return at, out, errors.New("entry cut short")
		}
		k, kind := b[0], eventKinds[b[0]]
		li, lt, le := int(b[1])<<8|int(b[2]), int(b[3])<<8|int(b[4]), int(b[5])<<8|int(b[6])
		b = b[7:]
		if len(b) < li+lt+le {
			return at, out, errors.New("entry cut short")
		}
		if kind == 0 {
			return at, out, fmt.Errorf("unknown event kind %q", k)
		}
		out = append(out, tidetype.TaskEvent{Kind: kind, TaskID: b[:li], Type: b[li : li+lt], Err: b[li+lt : li+lt+le]})
		b = b[li+lt+le:]
	}
	return at, out, nil
}
