package membroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// Defaults of WithEventRetention.
const (
	DefaultEventsMaxLen = 10000
	DefaultEventsMaxAge = 24 * time.Hour
)

// WithEventRetention bounds the task events kept per queue (see
// ReadEvents): at most maxEvents (default DefaultEventsMaxLen; 0 turns
// events off) and none older than maxAge on the broker's clock (default
// DefaultEventsMaxAge; 0 for no age bound). Negative values keep the
// defaults.
func WithEventRetention(maxEvents int, maxAge time.Duration) Option {
	return func(b *Broker) {
		if maxEvents >= 0 {
			b.events.max, b.events.maxSet = maxEvents, true
		}
		if maxAge >= 0 {
			b.events.age, b.events.ageSet = maxAge, true
		}
	}
}

// WithEvents sets whether queues record task events when SetEvents was
// not called for them. Default false, as in the Redis broker, where
// recording costs throughput.
func WithEvents(on bool) Option {
	return func(b *Broker) { b.events.def = on }
}

var _ broker.EventReader = (*Broker)(nil)

// SetEvents implements broker.EventReader; the change applies at once.
func (b *Broker) SetEvents(ctx context.Context, queue string, on bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return err
	}
	if queue == "" {
		return errors.New("membroker: events: empty queue name")
	}
	if b.events.on == nil {
		b.events.on = map[string]bool{}
	}
	b.events.on[queue] = on
	return nil
}

// recording reports whether queue records events.
func (e *eventLogs) recording(queue string) bool {
	if on, ok := e.on[queue]; ok {
		return on
	}
	return e.def
}

// eventLogs holds every queue's task events; it is guarded by Broker.mu.
// Logs outlive their queue's deletion, so that tokens stay valid.
type eventLogs struct {
	logs           map[string]*eventLog
	on             map[string]bool // SetEvents
	def            bool            // WithEvents
	wake           chan struct{}   // closed and replaced at every event
	max            int
	age            time.Duration
	maxSet, ageSet bool
}

// eventLog is one queue's events, oldest first; seqs count from 1.
type eventLog struct {
	events []tidetype.TaskEvent // ID and Queue unset
	seqs   []uint64
	next   uint64 // the seq of the next event
}

func (e *eventLogs) limits() (int, time.Duration) {
	m, a := DefaultEventsMaxLen, DefaultEventsMaxAge
	if e.maxSet {
		m = e.max
	}
	if e.ageSet {
		a = e.age
	}
	return m, a
}

func (e *eventLogs) log(queue string) *eventLog {
	if e.logs == nil {
		e.logs = map[string]*eventLog{}
	}
	l := e.logs[queue]
	if l == nil {
		l = &eventLog{next: 1}
		e.logs[queue] = l
	}
	return l
}

// event records what happened to t, with b.mu held: in the same step as
// the change, so that no reader sees one without the other.
func (b *Broker) event(q *queue, t *task, kind tidetype.TaskEventKind, errMsg string) {
	maxLen, age := b.events.limits()
	if maxLen == 0 || !b.events.recording(q.name) {
		return
	}
	if len(errMsg) > tidetype.MaxEventErr {
		errMsg = errMsg[:tidetype.MaxEventErr]
	}
	now := msTime(b.clock.Now())
	l := b.events.log(q.name)
	l.events = append(l.events, tidetype.TaskEvent{TaskID: t.msg.ID, Type: t.msg.Type, Kind: kind, At: now, Err: errMsg})
	l.seqs = append(l.seqs, l.next)
	l.next++
	drop := 0
	for drop < len(l.events) && (len(l.events)-drop > maxLen || age > 0 && l.events[drop].At.Before(now.Add(-age))) {
		drop++
	}
	if drop > 0 {
		l.events, l.seqs = slices.Clone(l.events[drop:]), slices.Clone(l.seqs[drop:])
	}
	if b.events.wake != nil {
		close(b.events.wake)
		b.events.wake = nil
	}
}

// ReadEvents implements broker.EventReader. Each queue is one stream of
// events (partition 0); a token holds the number of the last event
// delivered of each queue. A reader whose next events were dropped (more
// than the retention while it was slow) ends: its channel closes, and
// reading again after its last event reports the gap
// (broker.ErrEventGap).
func (b *Broker) ReadEvents(ctx context.Context, queues []string, after string) (<-chan tidetype.TaskEvent, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	pos := map[string]uint64{}
	switch after {
	case "", broker.EventsOldest:
		if len(queues) == 0 {
			return nil, errors.New("membroker: events: no queues to read")
		}
		queues = slices.Clone(queues)
		slices.Sort(queues)
		queues = slices.Compact(queues)
		for _, q := range queues {
			if q == "" {
				return nil, errors.New("membroker: events: empty queue name")
			}
			if after == "" {
				pos[q] = b.events.log(q).next - 1
			}
		}
	default:
		ps, err := broker.DecodeEventToken(after)
		if err != nil {
			return nil, err
		}
		if queues, err = broker.CheckTokenQueues(queues, ps); err != nil {
			return nil, err
		}
		for _, p := range ps {
			if p.Epoch != 0 || p.Partition != 0 || p.Seq != 0 || p.Skip != 0 {
				return nil, fmt.Errorf("%w: it names partition %d (epoch %d) of queue %q; an in-memory broker has one per queue", broker.ErrBadEventToken, p.Partition, p.Epoch, p.Queue)
			}
			l := b.events.log(p.Queue)
			if p.Ms >= l.next {
				return nil, fmt.Errorf("%w: it is past the last event of queue %q (a token of another broker?)", broker.ErrBadEventToken, p.Queue)
			}
			if len(l.seqs) > 0 && p.Ms+1 < l.seqs[0] || len(l.seqs) == 0 && p.Ms+1 < l.next {
				return nil, fmt.Errorf("%w: queue %q", broker.ErrEventGap, p.Queue)
			}
			pos[p.Queue] = p.Ms
		}
	}
	on := false
	for _, q := range queues {
		on = on || b.events.recording(q)
	}
	if maxLen, _ := b.events.limits(); !on || maxLen == 0 {
		return nil, fmt.Errorf("%w (queues %q)", broker.ErrEventsOff, queues)
	}
	out := make(chan tidetype.TaskEvent)
	go b.readEvents(ctx, queues, pos, out)
	return out, nil
}

// readEvents sends the queues' events after pos to out until ctx ends or
// the broker closes.
func (b *Broker) readEvents(ctx context.Context, queues []string, pos map[string]uint64, out chan<- tidetype.TaskEvent) {
	defer close(out)
	token := func() string {
		ps := make([]broker.EventPosition, len(queues))
		for i, q := range queues {
			ps[i] = broker.EventPosition{Queue: q, Ms: pos[q]}
		}
		return broker.EncodeEventToken(ps)
	}
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		var batch []tidetype.TaskEvent
		var from []string
		for _, q := range queues {
			l := b.events.log(q)
			i, _ := slices.BinarySearch(l.seqs, pos[q]+1)
			if pos[q]+1 < l.next && (i >= len(l.seqs) || l.seqs[i] != pos[q]+1) {
				b.mu.Unlock()
				return // dropped before this reader got to them: resuming reports the gap
			}
			for ; i < len(l.events) && len(batch) < 256; i++ {
				batch = append(batch, l.events[i])
				from = append(from, q)
			}
		}
		var wake chan struct{}
		if len(batch) == 0 {
			if b.events.wake == nil {
				b.events.wake = make(chan struct{})
			}
			wake = b.events.wake
		}
		b.mu.Unlock()
		for i, ev := range batch {
			pos[from[i]]++
			ev.Queue, ev.ID = from[i], token()
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		if wake == nil {
			continue
		}
		t := time.NewTimer(time.Second) // look at b.closed now and then
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}
