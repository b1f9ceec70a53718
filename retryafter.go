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

// RetryAfterError is the error RetryAfter returns; errors.As finds it in a
// wrapped error.
type RetryAfterError struct {
	Delay time.Duration
}

// Error returns "tide: retry after <Delay>".
func (e *RetryAfterError) Error() string { return fmt.Sprintf("tide: retry after %v", e.Delay) }

// retryAfter reports the wait a handler's error asks for.
func retryAfter(err error) (time.Duration, bool) {
	var ra *RetryAfterError
	if !errors.As(err, &ra) {
		return 0, false
	}
	return min(max(ra.Delay, 0), MaxRetryAfter), true
}
