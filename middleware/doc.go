// Package middleware provides tide.MiddlewareFunc values for a tide.ServeMux:
// Recover (panics become errors), Logging (one slog line per attempt),
// Timeout (a bound on every attempt), RateLimit (a token bucket shared by
// the handlers it wraps), and OpenTelemetry tracing and metrics
// (Tracing, TracingClient, Metrics, RegisterQueueGauges).
//
// Middleware registered first with ServeMux.Use is outermost. A good order
// is observers first, then Recover, then limits:
//
//	mw, err := middleware.Metrics()
//	if err != nil { ... }
//	mux.Use(
//		middleware.Tracing(),        // one CONSUMER span per attempt
//		mw,                          // counters and histograms
//		middleware.Logging(logger),  // one line per attempt, inside the span
//		middleware.Recover(),        // observers above see panics as errors
//		middleware.Timeout(time.Minute),
//	)
//
// # Tracing across the queue
//
// The root tide package does not depend on OpenTelemetry; this package
// carries the trace context in the task's headers. On the producer side,
// wrap the client:
//
//	c := middleware.NewTracingClient(tide.NewClient(b))
//	info, err := c.Enqueue(ctx, task, tide.ProcessIn(time.Minute))
//
// Enqueue starts a PRODUCER span ("send <queue>") and injects its context
// into task.Headers(); the Tracing middleware extracts it and starts each
// attempt's CONSUMER span ("process <queue>") as its child, so the whole
// life of a task, retries included, is one trace. InjectTrace and
// ExtractTrace do the header part alone. Both sides use the global
// TracerProvider and propagator unless WithTracerProvider and WithPropagator
// say otherwise; note that the global propagator propagates nothing until
// otel.SetTextMapPropagator is called.
//
// Span attributes follow the OpenTelemetry messaging semantic conventions
// (messaging.system "tide", messaging.operation.type "send" or "process",
// messaging.destination.name, messaging.message.id) with tide's own under
// messaging.tide (AttrTaskType, AttrRetryCount).
//
// # Metrics
//
// Metrics records, per task type and queue, the instruments named by the
// Metric* constants: attempts processed and failed, attempts in flight, the
// duration of attempts and their lateness (start minus due time). Failed
// attempts also carry their outcome, "retried" or "archived", as the server
// will decide it (see Metrics for the rule). RegisterQueueGauges reports
// queue sizes by state from a callback, so any source of sizes (such as an
// Inspector) can feed it.
//
// In the Prometheus format (the OpenTelemetry Prometheus exporter) the
// instruments are tide_tasks_processed_total, tide_tasks_failed_total,
// tide_tasks_active, tide_task_duration_seconds, tide_task_lateness_seconds
// and tide_queue_size. Their labels are by default the semantic-convention
// keys (messaging_tide_task_type, messaging_destination_name,
// messaging_tide_outcome, messaging_tide_task_state);
// WithShortMetricAttributes makes them type, queue, outcome and state:
//
//	mw, err := middleware.Metrics(middleware.WithShortMetricAttributes())
//	// sum by (type) (rate(tide_tasks_failed_total{outcome="archived"}[5m]))
//
// Task types and queues can come from outside (clients of the HTTP gateway
// choose them), and every distinct value is a new set of series, so the
// number of values is capped: the first 100 task types and 50 queues that a
// Metrics middleware (or a RegisterQueueGauges gauge) sees are reported under
// their names, later ones under "other" (DefaultMaxMetricTypes,
// DefaultMaxMetricQueues, OtherValue; WithMetricLimits changes the limits).
// Create the middleware once per process and share it between muxes, so the
// limits hold for the process.
//
// # Outside a server
//
// Handlers wrapped in this middleware can be called directly, for example
// through ServeMux.ProcessTask in a unit test. tide.GetTaskID and its
// siblings then report nothing, and the attributes they would provide (ID,
// queue, attempt, retry count, lateness) are left out; nothing panics.
package middleware
