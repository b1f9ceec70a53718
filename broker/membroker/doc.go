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
// it.
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
//   - Maintain recovers an active task whose lease has expired as the
//     contract says: to retry after MaintainRequest.RecoverBackoff (doubled
//     per retry used, at most an hour; pending at once when zero), Retried
//     incremented and LastErr "lease expired", or archived when its retries
//     are exhausted or it was cancelled. Recovered tasks count in
//     Recovered, not Forwarded.
//   - Dequeue never forwards due tasks itself; only Maintain does.
//   - Settlement.At and Settlement.RetryAt default to the Clock's now when
//     zero; a positive Settlement.RetryIn counts from the Clock's now.
//   - Events: EventPending is sent when tasks become pending in a queue that
//     had none (not while the queue is paused; Unpause sends one when tasks
//     wait), and when a settlement or a lease recovery frees a slot of a
//     queue's Concurrency with tasks waiting, grouped ones included.
//     EventScheduled is sent when a scheduled or retry task becomes the
//     queue's earliest. Events go to a buffered channel and are dropped when
//     it is full.
//   - Groups (TaskInfo.Group): a queue's ready tasks are served by a
//     rotation of lanes, one per group with ready tasks and one for the
//     ungrouped tasks; Dequeue takes the lane served least recently (a lane
//     that joins goes to the back) and starts its next task: a group's in
//     enqueue order, the ungrouped ones in pending-list order. A group that
//     may not start a task leaves the rotation (at the start that blocks
//     it, or at GroupConcurrency at its next turn), and a task made ready
//     does not bring it back while it is blocked: at GroupConcurrency or while
//     an earlier task of an Ordered group holds its place, until one of its
//     tasks leaves active or finishes (then EventPending); while throttled
//     (Settlement.Throttle) or over GroupRate, until that time (announced
//     by an EventPending with At, and judged by the first Dequeue from then
//     on). An Ordered group's place is held by its started task until it
//     finishes (done, archived, deleted); a holder that is ready again
//     (retry forwarded, requeued) starts before the group's other tasks.
//     SettleRequeue puts a grouped task back among its group's ready tasks
//     by its enqueue sequence, which is the head unless an earlier-enqueued
//     task became due meanwhile.
//   - Enqueue validates Group (broker.CheckGroup), answering per task; a
//     queue has one partition, so a grouped task takes any ID (an ID in use
//     by a task of another group, or by an ungrouped one, is an ID
//     conflict, or with Replace moves that task to the new group). A
//     waiting ungrouped task replaced (EnqueueOptions.Replace) goes to the
//     back of the pending list; a grouped one replaced in its group keeps
//     its enqueue sequence, a waiting one its attempt history; one that
//     changes group (or gains or loses one) is a new task, at the back. Replace with a UniqueKey that
//     another task holds is ErrDuplicateTask and changes nothing.
//   - Admin.Groups reports as ThrottledUntil the later of a throttle and,
//     for a group with tasks waiting, the end of its GroupRate hold.
//     Admin.ListTasks lists the pending ungrouped tasks merged with the
//     grouped ones by due time.
//   - After Close every method, Close included, returns broker.ErrClosed, and
//     all Subscribe channels are closed; ReadEvents readings end within a
//     second.
//   - Task events (broker.EventReader): each queue that records them
//     (SetEvents, or WithEvents for all) keeps them in one in-memory log,
//     written under the broker's lock in the step that changes the task,
//     bounded by WithEventRetention (default 10,000 events and 24 hours,
//     trimmed as events are added). A token holds each queue's event
//     number; logs outlive DeleteQueue.
package membroker
