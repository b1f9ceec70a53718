// Package gateway is an HTTP+JSON front for tide, so that applications in
// any language (PHP, Java, ...) can enqueue, inspect and delete tasks that Go
// servers process.
//
//	h, err := gateway.New(tide.NewClient(b), tide.NewInspector(b), gateway.Config{
//		Tokens: []string{os.Getenv("TIDE_GATEWAY_TOKEN")},
//	})
//	http.ListenAndServe(":8080", h)
//
// The tide CLI runs it as `tide serve`.
//
// # Authentication
//
// Every endpoint but GET /healthz needs "Authorization: Bearer <token>" with
// one of Config.Tokens (compared in constant time). Without it the answer is
// 401 with a WWW-Authenticate header. Serve the gateway over TLS (or behind a
// proxy that terminates it): the token is a password.
//
// # Endpoints
//
// POST /v1/tasks enqueues a task. The body (Content-Type: application/json,
// at most Config.MaxBodyBytes) is one object; only "type" is required:
//
//	{
//	  "type":           "order:cancel",            // the task type (selects the handler)
//	  "payload":        {"order_id": 42},          // any JSON value, stored as compact JSON ...
//	  "payload_base64": "AAEC",                    // ... or raw bytes in base64 (not both)
//	  "queue":          "orders",                  // default "default" ("webhooks" for tide:webhook)
//	  "task_id":        "order-cancel:42",         // your ID; a second task with it gets 409
//	  "delay":          "15m",                     // Go duration: "90s", "15m", "1h30m" ...
//	  "delay_seconds":  900,                       // ... or seconds ...
//	  "process_at":     "2030-01-02T15:04:05Z",    // ... or an RFC 3339 time (at most one of the three)
//	  "max_retry":      8,                         // 0 to 10000, default 25
//	  "timeout":        "30s",                     // per attempt
//	  "deadline":       "2030-01-02T16:00:00Z",    // for all attempts
//	  "retention":      "24h",                     // keep the finished task (and its result)
//	  "unique":         "1h",                      // refuse a same queue+type+payload task for up to 1h
//	  "headers":        {"traceparent": "00-..."}, // string values, carried with the task
//	  "group":          "tenant-42",               // served round-robin with other groups; group limits apply
//	  "replace":        true                       // with task_id: replace the waiting task with that ID (debounce)
//	}
//
// A task_id given with a group is kept as given ("order-42" in group
// "tenant-42"); see tide.Group.
//
// A field given as null counts as absent. Unknown and repeated fields are
// refused. A "tide:webhook" task's payload is checked at once (see package
// webhook). The answer is 201 with the task (see Task; without the payload)
// and a Location header naming it:
//
//	{"id": "order-cancel:42", "queue": "orders", "type": "order:cancel", "state": "scheduled",
//	 "max_retry": 25, "retried": 0, "next_process_at": "2030-01-02T15:04:05Z"}
//
// GET /v1/queues/{queue}/tasks/{id} returns the task as Task: the state,
// "payload" (when it is JSON) and "payload_base64", "last_error", "retried",
// "next_process_at", "result" when a handler wrote one, "progress" when it
// reported some, ...
//
// GET /v1/queues/{queue}/tasks/{id}?wait=30s waits up to the given time (at
// most MaxWait, a minute) for the task to be completed or archived and then
// answers as above; when the time runs out it answers with the task as it
// is. Nothing polls: the step that ends the task wakes the request. A task
// deleted when it succeeded (no "retention") is answered with its id, queue,
// "state": "completed" and "completed_at" only; give it a retention to read
// its result. The request/response shape from any language:
//
//	curl -XPOST .../v1/tasks -d '{"type":"image:resize","payload":{...},"retention":"10m"}'
//	curl '.../v1/queues/default/tasks/<id>?wait=30s'
//
// DELETE /v1/queues/{queue}/tasks/{id} deletes a task that is not running
// (the order-paid case: delete the pending cancel task): 204.
//
// POST /v1/queues/{queue}/tasks/{id}/cancel asks the server running an
// active task to cancel it: 202. The task is archived if its handler then
// fails.
//
// GET /v1/events?queue=orders&queue=emails streams the queues' task events
// (tide.Inspector.Events) as server-sent events (text/event-stream), so a
// browser's EventSource or any HTTP client follows them. Each event's id
// line is its resume token and its data line is Event as JSON:
//
//	id: e1AQZvcmRlcnMB...
//	data: {"id":"e1AQZvcmRlcnMB...","queue":"orders","task_id":"order-cancel:42",
//	       "type":"order:cancel","kind":"failed","at":"2030-01-02T15:04:05.123Z","error":"card declined"}
//
// kind is one of enqueued, started, succeeded, failed, retrying, archived,
// deleted, cancelled. The stream starts with the events recorded after the
// request; with a Last-Event-ID header (sent by EventSource when it
// reconnects) or an after= parameter it resumes right after that event,
// with no gap and no repeat; after=0 starts with the oldest event kept.
// A comment line (": keep-alive") comes every Config.EventsHeartbeat while
// no event does. Queues must be allowed (Config.AllowedQueues) and must
// record events (tide.Inspector.SetQueueEvents); a bad resume token is 400,
// one whose next events were dropped 410 events_gap, queues that record no
// events 409 events_off. The stream ends when the client goes away, or
// when the reading cannot go on without a gap (reconnecting says so).
//
// Streams are bounded so that they cannot starve the gateway. Each reads
// Redis on a connection of its own, not on the pool that enqueues use (see
// redisbroker.Broker.ReadEvents), and at most Config.MaxEventStreams (100)
// are open at once, at most Config.MaxEventStreamsPerToken (20) with any
// one token: one more is answered 429 too_many_streams with a Retry-After
// header. Each write to a stream must finish within
// Config.EventsWriteTimeout (10s), or the client, which has stopped
// reading, is disconnected. A stream lasts at most Config.EventsMaxLifetime
// (30m): then it ends with a comment saying so, and the client reconnects
// with its resume token (an EventSource does by itself, after the "retry:"
// delay the stream starts with; other clients send the id of the last
// event as Last-Event-ID or after=). A stream opened without a token that
// has had no event since ends instead right after its next event, so that
// reconnecting never skips one.
//
// # Workflows and batches
//
// POST /v1/workflows enqueues a workflow (see tide.NewWorkflow): a DAG of
// named steps, each a task object as POST /v1/tasks takes (without
// "task_id": a step's task ID is "<id>/<name>"):
//
//	{"id": "fulfil-order-42", "steps": [
//	  {"name": "charge",  "task": {"type": "order:charge", "payload": {"order": 42}}},
//	  {"name": "reserve", "task": {"type": "stock:reserve", "queue": "stock"}},
//	  {"name": "ship",    "task": {"type": "order:ship"}, "after": ["charge", "reserve"]},
//	  {"name": "report",  "task": {"type": "order:report"}, "after": ["ship"],
//	   "on_dependency_failure": "run"}]}   // "cancel" (the default) or "run"
//
// It answers 201 with the workflow (see Workflow) and a Location header.
// The same request again is answered 201 as well (the ID is an
// idempotency key); other steps under an ID in use are 409
// workflow_exists. GET /v1/workflows/{id} returns the workflow with each
// step's state ("waiting", "enqueued" with the task's "task_state",
// "succeeded", "failed", "cancelled"); POST /v1/workflows/{id}/cancel
// cancels it (202); an unknown ID is 404 workflow_not_found.
//
// POST /v1/batches enqueues a batch (tide.Client.EnqueueBatch): {"tasks":
// [task, ...], "on_done": task}, where "on_done", optional, is the callback
// that runs once when every task has finished. It answers 201 with the batch
// (see Batch: "id", "total", "succeeded", "failed", "failed_ids",
// "callback_id"); GET /v1/batches/{id} returns it as it is now, and POST
// /v1/workflows/{id}/cancel cancels a batch too. Errors inside a step or
// task name the field by its path: "steps[2].task.delay", "tasks[7].queue".
// A large batch needs a MaxBodyBytes to match.
//
// Config.AllowedQueues covers workflows and batches whole. Creating one
// needs every step's queue, and the callback's, allowed (otherwise 403
// queue_not_allowed, naming the field). A workflow or batch with a step or
// a callback in another queue does not exist for the gateway: GET
// /v1/workflows/{id}, GET /v1/batches/{id} and POST
// /v1/workflows/{id}/cancel answer 404 workflow_not_found, word for word
// what an unknown ID gets, and leave it alone. (A task URL names its queue,
// so a task in another queue is 403 before anything is read; a workflow
// URL names none, and a 403 would tell which IDs exist in other queues.)
// There are no list endpoints. IDs are one namespace: POST /v1/workflows
// with the ID of another queue's workflow still gets 409 workflow_exists.
// With AllowedQueues set, reading or cancelling a batch reads its steps to
// check their queues.
//
// GET /healthz answers 200 {"status": "ok"} without authentication, for load
// balancers. It does not contact Redis.
//
// IDs and queue names in URLs are path-escaped ("order-cancel%3A42" and
// "order-cancel:42" are the same; an ID with a slash is "a%2Fb"); an ID
// that is "." or ".." must be written %2E or %2E%2E. The Location header of
// a 201 is always escaped correctly.
//
// # Errors
//
// Every error is JSON with a stable code, a message for people and, when one
// field is at fault, its name:
//
//	{"error": {"code": "invalid_request", "field": "delay",
//	           "message": "\"delay\": invalid duration \"15 minutes\": use Go syntax such as \"90s\", \"15m\" or \"1h30m\" ..."}}
//
//	400 invalid_request         malformed JSON, an unknown field, a wrong type or value
//	401 unauthorized            no or malformed Authorization header
//	401 invalid_token           a token that is not configured
//	403 queue_not_allowed       the queue is not in Config.AllowedQueues
//	404 task_not_found          no such task (it may have finished)
//	404 workflow_not_found      no such workflow or batch (or it ended over a day ago,
//	                            or it has a step in a queue outside Config.AllowedQueues)
//	404 not_found               no such endpoint
//	405 method_not_allowed      see the Allow header
//	409 task_id_conflict        the queue already has a task with this task_id
//	409 duplicate_task          "unique" refused the task
//	409 task_active             DELETE of a running task: cancel it first
//	409 task_not_active         cancel of a task that is not running
//	409 events_off              GET /v1/events of queues that record no events
//	410 events_gap              GET /v1/events resuming after events that were dropped
//	409 workflow_exists         a workflow with other steps has this id
//	413 request_too_large       the body is over Config.MaxBodyBytes
//	429 too_many_streams        GET /v1/events over Config.MaxEventStreams or
//	                            Config.MaxEventStreamsPerToken; see Retry-After
//	415 unsupported_media_type  the body is not sent as application/json
//	503 unavailable             Redis could not be reached; retry later
//
// 409 task_id_conflict makes task_id an idempotency key: a client that
// retries a POST after a timeout gets 409 instead of a second task.
//
// # Example
//
//	curl -sS -X POST https://tide.internal/v1/tasks \
//	  -H "Authorization: Bearer $TIDE_TOKEN" -H 'Content-Type: application/json' \
//	  -d '{"type":"order:cancel","payload":{"order_id":42},"queue":"orders",
//	       "task_id":"order-cancel:42","delay":"15m"}'
//	curl -sS -X DELETE https://tide.internal/v1/queues/orders/tasks/order-cancel:42 \
//	  -H "Authorization: Bearer $TIDE_TOKEN"
package gateway
