package tide

import (
	"context"
	"fmt"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// TaskEvent is one step of a task's life (Inspector.Events); see
// tidetype.TaskEvent.
type TaskEvent = tidetype.TaskEvent

// TaskEventKind says what happened to a task in a TaskEvent; see
// tidetype.TaskEventKind.
type TaskEventKind = tidetype.TaskEventKind

// Task event kinds; see tidetype.TaskEventKind.
const (
	EventEnqueued  = tidetype.EventEnqueued
	EventStarted   = tidetype.EventStarted
	EventSucceeded = tidetype.EventSucceeded
	EventFailed    = tidetype.EventFailed
	EventRetrying  = tidetype.EventRetrying
	EventArchived  = tidetype.EventArchived
	EventDeleted   = tidetype.EventDeleted
	EventCancelled = tidetype.EventCancelled
)

// EventsOldest, as EventsFrom.After, starts with the oldest event the
// broker still keeps.
const EventsOldest = broker.EventsOldest

// Errors of Inspector.Events (re-exported from package broker, so that
// errors.Is works with either name).
var (
	// ErrBadEventToken: EventsFrom.After is malformed, altered, or the ID
	// of an event of other queues; the message says which.
	ErrBadEventToken = broker.ErrBadEventToken
	// ErrEventGap: events that followed EventsFrom.After were dropped
	// before they were read (events are kept for a bounded length and
	// age); read from EventsOldest, or from now, to go on.
	ErrEventGap = broker.ErrEventGap
	// ErrEventsOff: none of the queues records events; turn them on with
	// Inspector.SetQueueEvents.
	ErrEventsOff = broker.ErrEventsOff
)

// EventsFrom says which events Inspector.Events delivers.
type EventsFrom struct {
	// Queues are the queues to follow. With After set to an event's ID it
	// may be empty (the queues of that reading); otherwise it must hold
	// the same queues, in any order.
	Queues []string
	// After is where to start: "" for the events recorded after the call
	// ("from now"), EventsOldest for the oldest event still kept, or the
	// ID of the last event a consumer handled, to resume right after it
	// with no gap and no repeat.
	After string
}

// Events follows the lifecycle events of the queues' tasks: enqueued,
// started, succeeded, failed, retrying, archived, deleted, cancelled (see
// TaskEventKind). The broker records each event in the same atomic step as
// the state change it reports, so none is lost in between, and keeps them
// for a bounded length and age (the Redis broker: about 10,000 entries per
// partition and 24 hours by default, see redisbroker.WithEventRetention).
// A queue records events only once turned on (SetQueueEvents; recording
// costs throughput); reading queues none of which records any fails with
// ErrEventsOff.
//
// The channel delivers events at least once, in the order they were
// recorded within each partition of a queue (a task's events therefore come
// in order; events of different partitions or queues may interleave in any
// order), until ctx ends; then it closes, after every goroutine Events
// started has returned. Each event's ID is a resume token: a consumer that
// stops, and calls Events again with After set to the ID of the last event
// it handled, gets the next events with no gap and no repeat. A malformed
// or foreign token fails with ErrBadEventToken; one whose next events were
// already dropped fails with ErrEventGap. A consumer that falls so far
// behind that unread events are dropped sees its channel close early;
// resuming then reports the gap.
//
// While a queue is repartitioned the events of its old and new partitions
// are all delivered (tokens cover both); a task that moves has events in
// both, whose relative order is not defined. The old partitions' events go
// when the repartition retires them: a reading that starts after that
// (EventsOldest included) sees only the events of the new partitions, so
// a consumer that must see every event follows the queue while it is
// repartitioned. Deleting a queue drops its events.
//
// Events needs a broker that implements broker.EventReader (both shipped
// brokers do) and returns ErrNotSupported otherwise. It is safe for
// concurrent use; each call reads on its own (with the Redis broker, on a
// connection of its own, outside the client's pool, on a single node; one
// per partition on a cluster).
func (in *Inspector) Events(ctx context.Context, from EventsFrom) (<-chan TaskEvent, error) {
	r := in.b
	for _, q := range from.Queues {
		if err := ValidateQueueName(q); err != nil {
			return nil, err
		}
	}
	if len(from.Queues) == 0 && (from.After == "" || from.After == EventsOldest) {
		return nil, fmt.Errorf("%w: Events needs queues (or the ID of an event to resume after)", ErrInvalidTask)
	}
	return r.ReadEvents(ctx, from.Queues, from.After)
}

// SetQueueEvents turns the recording of queue's task events on or off (see
// Events). Queues record none until turned on: each state change then
// costs one more write per batch (with the Redis broker, about a tenth to a
// quarter more of Redis's time for small tasks), unless the broker is
// configured otherwise (redisbroker.WithEvents, membroker.WithEvents). The
// setting is kept in the broker for every process; with the Redis broker,
// servers see a change at once, other processes within half a minute.
func (in *Inspector) SetQueueEvents(ctx context.Context, queue string, on bool) error {
	r := in.b
	if err := ValidateQueueName(queue); err != nil {
		return err
	}
	return r.SetEvents(ctx, queue, on)
}
