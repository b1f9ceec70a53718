package tide

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Prepare applies t's options and opts as Enqueue would at the current time
// and returns the task as Enqueue would store it, without storing it. It is
// for programs that keep a task elsewhere first, such as an outbox table
// written in the same database transaction as the change that asked for
// the task, and store it later with Client.EnqueuePrepared: a ProcessIn
// delay counts from Prepare, not from the later Enqueue, and every option
// is kept in the returned TaskInfo (its fields can be stored and read back).
// WaitForReplicas is the one option that is not part of the task; Prepare
// refuses it. The error wraps ErrInvalidTask. Prepare is safe for
// concurrent use.
func Prepare(t *Task, opts ...Option) (*TaskInfo, error) {
	info, eo, err := prepare(t, opts, time.Now())
	if err != nil {
		return nil, err
	}
	if eo.WaitReplicas > 0 {
		return nil, fmt.Errorf("%w: WaitForReplicas is an option of the Enqueue call, not of the task: it cannot be stored with the task", ErrInvalidTask)
	}
	if eo.Replace {
		return nil, fmt.Errorf("%w: Replace is an option of the Enqueue call, not of the task: it cannot be stored with the task", ErrInvalidTask)
	}
	return info, nil
}

// EnqueuePrepared stores a task that Prepare returned, possibly after a trip
// through other storage: the fields are checked again as untrusted input
// (the error wraps ErrInvalidTask and names the field). A task whose due
// time has passed is pending at once, otherwise it is scheduled for it;
// other fields are stored as given. info is not modified; the returned
// TaskInfo carries the ID the broker chose when info.ID is empty (with
// IdempotencyKey, the ID of the task first stored under the key). Errors
// are those of Enqueue.
func (c *Client) EnqueuePrepared(ctx context.Context, info *TaskInfo) (*TaskInfo, error) {
	if c.closed.Load() {
		return nil, ErrClientClosed
	}
	t, err := c.checkPrepared(info)
	if err != nil {
		return nil, err
	}
	if err := c.checkPlacement(ctx, t); err != nil {
		return nil, err
	}
	errs, err := c.b.Enqueue(ctx, []*TaskInfo{t}, broker.EnqueueOptions{})
	if err != nil {
		return nil, fmt.Errorf("tide: enqueue %s: %w", t.Type, err)
	}
	if err := errs[0]; err != nil {
		if stored(err) {
			return t, err
		}
		return nil, err
	}
	return t, nil
}

// checkPrepared validates a prepared task read back from storage and returns
// a copy ready for the broker.
func (c *Client) checkPrepared(info *TaskInfo) (*TaskInfo, error) {
	if info == nil {
		return nil, fmt.Errorf("%w: nil task", ErrInvalidTask)
	}
	if err := ValidateQueueName(info.Queue); err != nil {
		return nil, err
	}
	if err := validateName("task type", info.Type); err != nil {
		return nil, err
	}
	if err := checkReservedType(info.Type); err != nil {
		return nil, err
	}
	if info.ID != "" {
		if err := validateName("TaskID", info.ID); err != nil {
			return nil, err
		}
		if err := checkReservedID(info.ID); err != nil {
			return nil, err
		}
	}
	if err := checkReservedHeaders(info.Headers, true); err != nil {
		return nil, err
	}
	hsize := 0
	for k, v := range info.Headers {
		hsize += len(k) + len(v)
	}
	switch {
	case len(info.Payload) > MaxPayloadSize:
		return nil, fmt.Errorf("%w: %s payload is %d bytes, over the %d-byte limit (MaxPayloadSize)", ErrInvalidTask, info.Type, len(info.Payload), MaxPayloadSize)
	case hsize > MaxHeadersSize:
		return nil, fmt.Errorf("%w: %s headers are %d bytes, over the %d-byte limit (MaxHeadersSize)", ErrInvalidTask, info.Type, hsize, MaxHeadersSize)
	case info.MaxRetry < 0:
		return nil, fmt.Errorf("%w: MaxRetry %d is negative", ErrInvalidTask, info.MaxRetry)
	case info.Timeout < 0 || info.Retention < 0 || info.UniqueTTL < 0:
		return nil, fmt.Errorf("%w: negative Timeout, Retention or UniqueTTL", ErrInvalidTask)
	case (info.UniqueKey == "") != (info.UniqueTTL == 0):
		return nil, fmt.Errorf("%w: UniqueKey and UniqueTTL go together (got key %q, TTL %v)", ErrInvalidTask, info.UniqueKey, info.UniqueTTL)
	case len(info.UniqueKey) > MaxIdempotencyKey || len(info.IdempotencyKey) > MaxIdempotencyKey:
		return nil, fmt.Errorf("%w: a unique or idempotency key is over %d bytes", ErrInvalidTask, MaxIdempotencyKey)
	case info.NextProcessAt.IsZero():
		return nil, fmt.Errorf("%w: no due time (NextProcessAt): prepare the task with Prepare", ErrInvalidTask)
	}
	if info.Group != "" {
		if err := broker.CheckGroup(info.Group); err != nil {
			return nil, err
		}
		if info.UniqueKey != "" && broker.HashTag(info.UniqueKey) != info.Group {
			return nil, fmt.Errorf("%w: unique key %q of a task of group %q must end in {%s}: prepare the task with Prepare", ErrInvalidTask, info.UniqueKey, info.Group, info.Group)
		}
	}
	t := &TaskInfo{
		ID:             info.ID,
		Queue:          info.Queue,
		Type:           info.Type,
		Payload:        info.Payload,
		Headers:        maps.Clone(info.Headers),
		State:          StatePending,
		MaxRetry:       info.MaxRetry,
		NextProcessAt:  info.NextProcessAt.Truncate(time.Millisecond),
		EnqueuedAt:     info.EnqueuedAt.Truncate(time.Millisecond),
		Timeout:        info.Timeout,
		Deadline:       info.Deadline,
		Retention:      info.Retention,
		UniqueKey:      info.UniqueKey,
		UniqueTTL:      info.UniqueTTL,
		IdempotencyKey: info.IdempotencyKey,
		Group:          info.Group,
	}
	if t.EnqueuedAt.IsZero() {
		t.EnqueuedAt = c.now().Truncate(time.Millisecond)
	}
	if t.NextProcessAt.After(c.now()) {
		t.State = StateScheduled
	}
	return t, nil
}
