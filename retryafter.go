package tide

import (
	"errors"
	"fmt"
	"time"
)

// MaxRetryAfter is the longest wait RetryAfter accepts; longer ones are
// cut to it.
const MaxRetryAfter = 30 * 24 * time.Hour

// RetryAfter returns an error that a handler returns (alone or wrapped, as
// in fmt.Errorf("rate limited by the API: %w", tide.RetryAfter(d))) to run
// the task again in d without using up a retry: the downstream said "not
// now" (an HTTP 429 or 503 with Retry-After, a lock held elsewhere). The
// task waits in state retry with the error as its last error and an
// attempt recorded as "deferred"; RetryDelayFunc and ErrorHandler are not
// called, and the attempt counts as neither processed nor failed. A task
// past its Deadline, or cancelled, is archived as usual. d below zero is
// taken as zero and d above MaxRetryAfter as MaxRetryAfter. Because no
// retry is used, a handler that always returns RetryAfter runs forever:
// bound it with Deadline or by counting in the handler.
func RetryAfter(d time.Duration) error {
	return &RetryAfterError{Delay: min(max(d, 0), MaxRetryAfter)}
}

// ThrottleGroup returns an error that a handler returns to hold back the
// whole group of its task (Group) for d: no task of the group starts
// before d has passed, on any server, and this task runs again after it,
// like RetryAfter (no retry used, attempt recorded as "deferred"). d is
// counted on the broker's clock from when the broker records the throttle,
// so a server whose own clock is off does not shorten it. Use it
// when a tenant's downstream answers "slow down": the other groups keep
// running. Tasks of the group already running finish. For a task without a
// group it is RetryAfter. d is bounded like RetryAfter's.
func ThrottleGroup(d time.Duration) error {
	return &RetryAfterError{Delay: min(max(d, 0), MaxRetryAfter), Group: true}
}

// RetryAfterError is the error RetryAfter and ThrottleGroup return;
// errors.As finds it in a wrapped error.
type RetryAfterError struct {
	Delay time.Duration
	// Group is set by ThrottleGroup: the task's whole group waits.
	Group bool
}

// Error returns "tide: retry after <Delay>" or, for ThrottleGroup, "tide:
// group throttled for <Delay>".
func (e *RetryAfterError) Error() string {
	if e.Group {
		return fmt.Sprintf("tide: group throttled for %v", e.Delay)
	}
	return fmt.Sprintf("tide: retry after %v", e.Delay)
}

// retryAfter reports the wait a handler's error asks for, and whether it
// holds back the task's whole group.
func retryAfter(err error) (d time.Duration, group, ok bool) {
	var ra *RetryAfterError
	if !errors.As(err, &ra) {
		return 0, false, false
	}
	return min(max(ra.Delay, 0), MaxRetryAfter), ra.Group, true
}
