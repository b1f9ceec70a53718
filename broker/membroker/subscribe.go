package membroker

import (
	"context"
	"errors"
	"slices"

	"github.com/tidequeue/tide/broker"
)

// Subscribe implements broker.Broker. The channel is buffered; events that
// do not fit are dropped.
func (b *Broker) Subscribe(ctx context.Context, queues []string) (<-chan broker.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if len(queues) == 0 {
		return nil, errors.New("membroker: subscribe: no queues")
	}
	for _, qn := range queues {
		if qn == "" {
			return nil, errors.New("membroker: subscribe: empty queue name")
		}
	}
	queues = slices.Clone(queues)
	s := &subscription{ch: make(chan broker.Event, eventBuffer), queues: queues}
	for _, qn := range queues {
		q := b.queue(qn)
		if q.subs == nil {
			q.subs = make(map[*subscription]struct{})
		}
		q.subs[s] = struct{}{}
	}
	b.subs[s] = struct{}{}
	s.stop = context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.unsubscribe(s)
	})
	return s.ch, nil
}

func (b *Broker) unsubscribe(s *subscription) {
	if s.closed {
		return
	}
	s.closed = true
	for _, qn := range s.queues {
		if q := b.queues[qn]; q != nil {
			delete(q.subs, s)
		}
	}
	delete(b.subs, s)
	close(s.ch)
}
