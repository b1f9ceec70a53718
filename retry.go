package tide

import (
	"math/rand/v2"
	"time"
)

// RetryDelayFunc returns how long to wait before retry number n (1 for the
// first retry) of t, which failed with err.
type RetryDelayFunc func(n int, err error, t *Task) time.Duration

// DefaultRetryDelay is the default RetryDelayFunc: exponential back-off from
// 10 seconds, doubling per retry up to 12 hours, with "equal jitter" (a
// random delay between half and all of that), so that tasks failing together
// do not retry together. It is safe for concurrent use.
func DefaultRetryDelay(n int, _ error, _ *Task) time.Duration {
	const base, limit = 10 * time.Second, 12 * time.Hour
	d := limit
	if n < 1 {
		n = 1
	}
	if n <= 13 { // 10s << 12 > 12h
		d = min(base<<(n-1), limit)
	}
	return d/2 + rand.N(d/2+1)
}

// RetrySchedule returns a RetryDelayFunc that waits delays[n-1] before retry
// n and the last delay for every retry after the schedule ends. It panics when
// delays is empty or holds a negative duration.
func RetrySchedule(delays ...time.Duration) RetryDelayFunc {
	if len(delays) == 0 {
		panic("tide: RetrySchedule: no delays")
	}
	ds := make([]time.Duration, len(delays))
	for i, d := range delays {
		if d < 0 {
			panic("tide: RetrySchedule: negative delay")
		}
		ds[i] = d
	}
	return func(n int, _ error, _ *Task) time.Duration {
		if n < 1 {
			n = 1
		}
		return ds[min(n, len(ds))-1]
	}
}

// NotificationRetryDelay is a RetryDelayFunc with the schedule webhook and
// notification senders commonly use: 15s, 3m, 10m, 30m, 1h, 2h, 6h, then
// every 15h. Pair it with MaxRetry(8) to give up after about a day.
func NotificationRetryDelay(n int, err error, t *Task) time.Duration {
	return notificationSchedule(n, err, t)
}

var notificationSchedule = RetrySchedule(15*time.Second, 3*time.Minute, 10*time.Minute, 30*time.Minute, time.Hour, 2*time.Hour, 6*time.Hour, 15*time.Hour)
