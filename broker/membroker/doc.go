// Package membroker is an in-process implementation of broker.Broker.
//
// It is the embedded default for demos and for unit tests of code that uses
// tide: it needs no Redis and behaves like broker/redisbroker (both pass
// broker/brokertest). It keeps everything in memory, so nothing survives a
// restart, and it serves one process only: two processes never share a
// membroker.
//
// All time decisions (when a task is due, when a lease or a unique lock
// expires, how long completed and archived tasks are kept) use a Clock, the
// real clock by default; tests may pass a fake one with WithClock and advance
// it. Maintain forwards tasks due at or before MaintainRequest.Now, as the
// interface says; everything else compares with the Clock.
//
// Choices where the broker.Broker contract leaves room:
//
//   - Times are kept with millisecond precision (durations too), like the
//     Redis broker: they are truncated to the millisecond when stored.
//   - Enqueue stores a StateScheduled message whose ProcessAt is not after the
//     Clock's now as pending at once (its ProcessAt is kept), so a task
//     scheduled for "now" does not wait for Maintain. A message's Result is
//     ignored by Enqueue; only SetResult writes it.
//   - OutcomeRequeue puts the task at the front of its queue: it was taken
//     first, so it is handed out first again.
//   - OutcomeRetry keeps the task in retry until Maintain forwards it, even
//     when RetryAt has already passed.
//   - Maintain recovers an active task whose lease has expired straight to
//     pending (Retried incremented, LastErr and LastFailedAt set, ProcessAt =
//     now), or archives it when its retries are exhausted (Retried unchanged).
//     Recovered tasks count in Recovered, not Forwarded.
//   - Dequeue never forwards due tasks itself; only Maintain does.
//   - A zero MaintainRequest.Now means the Clock's now. Settlement.At and
//     Settlement.RetryAt default to the Clock's now when zero.
//   - Events: EventPending is sent when tasks become pending in a queue that
//     had none (not while the queue is paused; Unpause sends one when tasks
//     wait). EventScheduled is sent when a scheduled or retry task becomes the
//     queue's earliest. Events go to a buffered channel and are dropped when
//     it is full.
//   - After Close every method, Close included, returns broker.ErrClosed, and
//     all Subscribe channels are closed.
package membroker
