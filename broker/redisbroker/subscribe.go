package redisbroker

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
)

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
	ctx, done, ok := b.track(ctx)
	if !ok {
		return nil, broker.ErrClosed
	}
	ps := b.rdb.Subscribe(ctx, chans...)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		done()
		return nil, callErr("subscribe", classify(err))
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
			if ev.Kind == broker.EventLayout {
				b.forgetLayout(ev.Queue)
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

// parseEvent reads "p<partition>", "p<partition>:<ms>" (room under the rate
// limit from ms on), "s<partition>:<ms>", "r<partition>", "c<task ID>" or
// "l".
func parseEvent(queue, s string) (broker.Event, bool) {
	if queue == "" || len(s) < 1 || (len(s) < 2 && s != "l") {
		return broker.Event{}, false
	}
	if s == "l" {
		return broker.Event{Kind: broker.EventLayout, Queue: queue}, true
	}
	switch s[0] {
	case 'c':
		return broker.Event{Kind: broker.EventCancel, Queue: queue, ID: s[1:]}, true
	case 'p', 'r':
		ps, ms, timed := strings.Cut(s[1:], ":")
		p, err := strconv.Atoi(ps)
		if err != nil || p < 0 || (timed && s[0] != 'p') {
			return broker.Event{}, false
		}
		kind := broker.EventPending
		if s[0] == 'r' {
			kind = broker.EventReleased
		}
		ev := broker.Event{Kind: kind, Queue: queue, Partition: p}
		if timed {
			at, err := strconv.ParseInt(ms, 10, 64)
			if err != nil {
				return broker.Event{}, false
			}
			ev.At = time.UnixMilli(at)
		}
		return ev, true
	case 's':
		ps, ms, ok := strings.Cut(s[1:], ":")
		if !ok {
			return broker.Event{}, false
		}
		p, err1 := strconv.Atoi(ps)
		at, err2 := strconv.ParseInt(ms, 10, 64)
		if err1 != nil || err2 != nil || p < 0 {
			return broker.Event{}, false
		}
		return broker.Event{Kind: broker.EventScheduled, Queue: queue, Partition: p, At: time.UnixMilli(at)}, true
	}
	return broker.Event{}, false
}

// track returns a context derived from ctx that Close cancels, for a
// subscription or reader that must end with the broker, and the function
// that cancels it and forgets it (call it when the subscription ends). ok
// is false, and nothing is tracked, after Close.
func (b *Broker) track(ctx context.Context) (_ context.Context, release func(), ok bool) {
	ctx, cancel := context.WithCancel(ctx)
	b.subsMu.Lock()
	defer b.subsMu.Unlock()
	if b.closed.Load() {
		cancel()
		return ctx, func() {}, false
	}
	if b.subs == nil {
		b.subs = map[int]func(){}
	}
	b.subSeq++
	seq := b.subSeq
	b.subs[seq] = cancel
	return ctx, func() {
		cancel()
		b.subsMu.Lock()
		delete(b.subs, seq)
		b.subsMu.Unlock()
	}, true
}
