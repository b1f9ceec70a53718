// Package tide runs background and delayed tasks on Redis.
//
// An application enqueues typed tasks with a Client ("cancel order 42 in 15
// minutes unless it is paid"); a Server runs workers that dispatch each task
// through a handler registry (ServeMux) and a middleware chain. Storage is a
// broker.Broker: broker/redisbroker for production (single node, Sentinel or
// Cluster through a redis.UniversalClient) and broker/membroker in process,
// for demos and unit tests.
//
// # Enqueueing
//
//	c := tide.NewClient(redisbroker.New(rdb))
//	info, err := c.Enqueue(ctx, tide.NewTask("order:cancel", payload),
//		tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute))
//	...
//	err = c.Delete(ctx, "default", "order-cancel:42") // the order was paid
//
// Options given to NewTask are defaults for the task; options given to Enqueue
// override them. Invalid input (an empty type, a negative delay, a queue name
// with spaces, a payload over MaxPayloadSize) is rejected by Enqueue with an
// error wrapping ErrInvalidTask that names the problem.
//
// # Processing
//
//	mux := tide.NewServeMux()
//	mux.HandleFunc("order:cancel", cancelOrder)
//	tide.HandleArgs(mux, sendEmail) // typed: func(ctx, EmailArgs) error
//	srv := tide.NewServer(b, tide.Config{Concurrency: 20})
//	err := srv.Run(mux) // until SIGINT/SIGTERM
//
// # Guarantees
//
// Delivery is at least once. A task is handed to a worker together with a
// lease that the server renews while the handler runs; if the worker dies,
// hangs or loses Redis, the lease runs out and the task is retried after a
// back-off (the lost attempt counts as one). Every settlement carries the
// lease's fencing token, which never repeats for a queue and task ID, so a
// worker that comes back late cannot settle the newer delivery, not even of
// a task re-created with the same ID. There is no state in which a task is
// active without a lease. A request that Redis runs twice (a client re-sends
// it after a lost reply) answers like the first run and stores nothing
// twice. Handlers should still be idempotent: a task runs again when its
// worker dies after the handler succeeded but before the settlement was
// written.
//
// A failed task is retried after Config.RetryDelayFunc (exponential back-off
// with jitter by default) until MaxRetry is used up; then, or at once when the
// error wraps SkipRetry, it is archived with its last error. Handler panics
// are recovered and become errors with the stack.
//
// Due times are kept in milliseconds. Servers do not poll on a fixed interval:
// a per-partition timer fires at the next due time and is re-armed early when
// an earlier task arrives; idle workers wait for a wake-up that enqueueing
// publishes.
//
// # Queue limits
//
// A queue can be limited across all servers together: at most Concurrency
// of its tasks running at once, and at most Rate.Limit of them starting in
// any period of Rate.Per:
//
//	srv := tide.NewServer(b, tide.Config{
//		Queues: map[string]int{"payments": 1},
//		QueueLimits: map[string]tide.QueueLimits{
//			"payments": {Concurrency: 8, Rate: tide.Rate{Limit: 100, Per: time.Second}},
//		},
//	})
//
// Limits are kept in the broker: Start writes Config.QueueLimits, and
// Inspector.SetQueueLimits changes them on running servers, which obey the
// new limits from their next fetch. They are checked when a task is handed
// out, in the same atomic step, so they hold on any number of servers and on
// Redis Cluster; a task counts against Concurrency until it is settled or,
// when its server died, until its lease expires and it is recovered. A task
// held back by a limit stays pending and uses no retry. A queue at its
// limit does not make servers poll: they are woken when a running task of
// the queue finishes or, under a rate limit, when the next start is allowed.
//
// The limits are the queue's whatever its partition count: the Redis broker
// lets each limit's slots follow the backlog between the queue's partitions
// (tasks waiting in one partition run up to the whole Concurrency), never
// holding more than the limit in all, also while a repartition runs.
//
// # Groups
//
// Group puts a task in a group of its queue (a tenant, a customer). The
// groups that have tasks ready are served round-robin, one task per turn,
// the tasks without a group taking their turns as one more group, so a
// group with a million tasks waiting never starves one with ten. The
// queue's group limits apply to each group on its own: GroupConcurrency
// tasks running at once and GroupRate starts per period, over all servers;
// with Ordered, a group is a sequence whose tasks start one at a time in
// enqueue order, the next after the previous finished (a task waiting to be
// retried keeps its place):
//
//	client.Enqueue(ctx, task, tide.Queue("emails"), tide.Group("tenant-42"))
//	in.SetQueueLimits(ctx, "emails", tide.QueueLimits{GroupConcurrency: 2})
//
// A group's tasks live together (in one partition of the queue), so group
// limits are never split and are checked in the step that leases, on Redis
// Cluster too. On a queue of one partition, the default, a grouped task
// takes any ID (TaskID("order-cancel:42") with Group("shop-7")); on a queue
// of several the ID carries the group as its hash tag ("…{shop-7}", see
// Group). A handler returns
// ThrottleGroup(d) to hold its task's whole group back for d. Replace with
// TaskID debounces: a waiting task with the ID takes the new payload and
// due time. Inspector.Groups lists the largest backlogs.
//
// # Composition
//
// A Workflow is a DAG of named steps (Add, After); EnqueueWorkflow stores
// it and each step starts when the steps it depends on have succeeded,
// reading their results with StepResult. EnqueueBatch enqueues tasks whose
// OnBatchDone callback runs once, when all have finished (GetBatch in the
// callback). A step's end is recorded in the same atomic step as its
// outcome (a FlowType follow-up task), so a crash never strands a workflow.
// Client.Wait and EnqueueAndWait wait for a task's outcome without polling;
// ReportProgress records a running task's progress; NotifyURL POSTs the
// outcome to a URL, signed and guarded as webhooks are (no private
// addresses unless Config.NotifyAllowPrivate, optional
// Config.NotifyAllowedHosts); ServeMux.HandleBatch hands a handler many
// tasks at once.
//
// # Durable handlers
//
// A handler can keep what it did across retries, crashes and waits. Step
// runs its fn once and stores the result (JSON) with the task, fenced by
// the attempt's lease; every later attempt gets the stored result without
// running fn: fn runs at least once, and exactly once whenever its result
// was stored. Sleep and WaitSignal park the task (StateWaiting) holding no
// worker, lease or concurrency slot: they return an error wrapping
// ErrSuspended that the handler returns (a handler that swallows it is
// parked all the same), and the task runs again from the top when its time
// comes or Client.Signal sends the signal, its steps replaying from
// storage. A signal and its wait's time-out are decided in one step of the
// broker: one wins (WaitSignal gets ErrSignalTimeout, or Signal does).
//
//	func order(ctx context.Context, t *tide.Task) error {
//		if _, err := tide.Step(ctx, "reserve", reserve); err != nil {
//			return err
//		}
//		p, err := tide.WaitSignal[Payment](ctx, "paid", 15*time.Minute)
//		if errors.Is(err, tide.ErrSignalTimeout) {
//			_, err = tide.Step(ctx, "cancel", cancel)
//			return err
//		}
//		if err != nil {
//			return err // ErrSuspended: parked until paid or timed out
//		}
//		_, err = tide.Step(ctx, "confirm", func(ctx context.Context) (bool, error) { return confirm(ctx, p) })
//		return err
//	}
//
// Bounds: MaxSteps steps per task, MaxStepBytes of results, MaxSignalSize
// per signal, MaxSleep per sleep or wait. Cost: the lease brings the
// task's stored records, so a step replayed costs no broker call and a
// step run costs one (the store of its result), as does a Sleep or
// WaitSignal on first reach. In a batch handler
// (HandleBatch) each task is durable through its own context,
// Task.Context; the batch's context is refused (ErrNotDurable).
package tide
