package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/dashboard"
	"github.com/tidequeue/tide/middleware"
)

// Metrics the CLI adds to the middleware's, from the Inspector. The queue
// ones have the attribute "queue" (label queue in Prometheus).
const (
	// metricUp is 1 when the last read of the queues reached Redis, else 0.
	metricUp = "tide.up"
	// metricScrapeErrors counts the reads of the queues that failed.
	metricScrapeErrors = "tide.scrape.errors"
	metricLatency      = "tide.queue.latency"
	metricPaused       = "tide.queue.paused"
	// metricProcessedToday and metricFailedToday are the queue's counters
	// in Redis, kept by every server: the whole fleet's throughput.
	metricProcessedToday = "tide.queue.processed.today"
	metricFailedToday    = "tide.queue.failed.today"
)

// metricsHelp documents /metrics, for the help of dash and serve.
const metricsHelp = `/metrics serves, in the Prometheus text format, read from Redis at each
scrape (at most once a second) and so covering every server of the fleet:
  tide_up                            1 when the scrape reached Redis, else 0:
                                     alert on tide_up == 0
  tide_scrape_errors_total           reads of Redis for /metrics that failed
  tide_queue_size{queue,state}       tasks per queue and state
  tide_queue_latency_seconds{queue}  age of the oldest pending task
  tide_queue_paused{queue}           1 when the queue is paused
  tide_queue_processed_today{queue}  attempts finished today (UTC), failed
                                     ones included; resets at midnight UTC
  tide_queue_failed_today{queue}     attempts failed today (UTC)
and the Go runtime and process metrics. target_info names the service:
OTEL_SERVICE_NAME, else %s.

/metrics needs no login, and so, like the dashboard's pages, it answers
only requests for localhost, an IP address or a host name given with
--allow-host; a request for another host (a web page's, through DNS
rebinding) gets "421 misdirected request". A Prometheus that scrapes by a
host name needs that name in --allow-host.`

// metrics is the /metrics endpoint: OpenTelemetry instruments exported in
// the Prometheus format, with the queue gauges fed by the Inspector.
type metrics struct {
	handler http.Handler
	// mw records attempts of the tasks this process runs (serve with a
	// webhook server).
	mw       tide.MiddlewareFunc
	provider *sdkmetric.MeterProvider
	snap     *queueSnapshot
}

// newMetrics builds /metrics for the queues of in. service is the
// service.name of the resource (target_info in Prometheus); log gets a line
// when reading Redis starts and stops failing.
func newMetrics(in *tide.Inspector, service string, log *slog.Logger) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("tide: metrics: prometheus exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(service), semconv.ServiceVersion(buildVersion().Version)))
	if err != nil {
		return nil, fmt.Errorf("tide: metrics: resource: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	snap := &queueSnapshot{in: in, maxAge: time.Second, log: log}
	m := &metrics{provider: mp, handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), snap: snap}
	fail := func(err error) (*metrics, error) {
		_ = mp.Shutdown(context.Background())
		return nil, fmt.Errorf("tide: metrics: %w", err)
	}
	short := middleware.WithShortMetricAttributes() // queue="orders", not messaging_destination_name
	if m.mw, err = middleware.Metrics(middleware.WithMeterProvider(mp), short); err != nil {
		return fail(err)
	}
	// The gauges report what they could read; a failure shows in tide_up
	// and tide_scrape_errors_total (and once in the log), not as an error
	// the SDK would print at every scrape.
	_, err = middleware.RegisterQueueGauges(func(ctx context.Context) (map[string]map[tide.TaskState]int64, error) {
		r := snap.get(ctx)
		sizes := make(map[string]map[tide.TaskState]int64, len(r.infos))
		for _, q := range r.infos {
			sizes[q.Queue] = map[tide.TaskState]int64{
				tide.StatePending: int64(q.Pending), tide.StateActive: int64(q.Active), tide.StateScheduled: int64(q.Scheduled),
				tide.StateRetry: int64(q.Retry), tide.StateArchived: int64(q.Archived), tide.StateCompleted: int64(q.Completed),
			}
		}
		return sizes, nil
	}, middleware.WithMeterProvider(mp), short)
	if err != nil {
		return fail(err)
	}
	meter := mp.Meter("github.com/tidequeue/tide/cmd/tide")
	up, err1 := meter.Int64ObservableGauge(metricUp,
		metric.WithDescription("1 when this scrape read the queues from Redis, 0 when it could not reach Redis (the tide_queue series are then missing)."))
	scrapeErrs, err2 := meter.Int64ObservableCounter(metricScrapeErrors,
		metric.WithDescription("Reads of the queues from Redis for /metrics that failed, in whole or in part, since this process started."))
	lat, err3 := meter.Float64ObservableGauge(metricLatency, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest pending task of the queue has been waiting."))
	paused, err4 := meter.Int64ObservableGauge(metricPaused,
		metric.WithDescription("1 when the queue is paused, else 0."))
	processed, err5 := meter.Int64ObservableGauge(metricProcessedToday,
		metric.WithDescription("Task attempts finished today (UTC) in the queue by every server, failed ones included, as counted in Redis; resets at midnight UTC."))
	failed, err6 := meter.Int64ObservableGauge(metricFailedToday,
		metric.WithDescription("Task attempts that failed today (UTC) in the queue on every server, as counted in Redis; resets at midnight UTC."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return fail(err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		r := snap.get(ctx)
		var u int64
		if r.up {
			u = 1
		}
		o.ObserveInt64(up, u)
		o.ObserveInt64(scrapeErrs, r.errors)
		for _, q := range r.infos {
			attrs := metric.WithAttributeSet(attribute.NewSet(middleware.MetricAttrQueue.String(q.Queue)))
			o.ObserveFloat64(lat, q.Latency.Seconds(), attrs)
			var p int64
			if q.Paused {
				p = 1
			}
			o.ObserveInt64(paused, p, attrs)
			o.ObserveInt64(processed, int64(q.Processed), attrs)
			o.ObserveInt64(failed, int64(q.Failed), attrs)
		}
		return nil
	}, up, scrapeErrs, lat, paused, processed, failed)
	if err != nil {
		return fail(err)
	}
	return m, nil
}

func (m *metrics) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.provider.Shutdown(ctx)
}

// queueSnapshot caches the Inspector's view of every queue for maxAge, so
// that the gauges of one collection share one read of Redis.
type queueSnapshot struct {
	in     *tide.Inspector
	maxAge time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	at      time.Time
	last    snapshot
	failing bool // the last read failed (logged once)
}

// snapshot is one read of the queues.
type snapshot struct {
	infos  []*tide.QueueInfo
	up     bool  // the list of queues was read from Redis
	errors int64 // reads that failed so far, this one included
}

func (s *queueSnapshot) get(ctx context.Context) snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < s.maxAge {
		return s.last
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r := snapshot{errors: s.last.errors}
	qs, err := s.in.Queues(ctx)
	r.up = err == nil
	for _, q := range qs {
		qi, qerr := s.in.QueueInfo(ctx, q)
		if qerr != nil {
			err = errors.Join(err, fmt.Errorf("queue %s: %w", q, qerr))
			continue
		}
		r.infos = append(r.infos, qi)
	}
	if err != nil {
		r.errors++
		if !s.failing && s.log != nil {
			s.log.Warn("tide: /metrics cannot read the queues from Redis; tide_up and tide_scrape_errors_total report it", "err", err)
		}
	} else if s.failing && s.log != nil {
		s.log.Info("tide: /metrics reads the queues from Redis again")
	}
	s.failing = err != nil
	s.last, s.at = r, time.Now()
	return r
}

// metricsHandler returns m's /metrics behind the dashboard's Host check
// (dashboard.HostCheck), for the host names of --allow-host, else those of
// the environment variable env: without it, DNS rebinding would let any
// web page read the queue names and counts.
func (a *app) metricsHandler(o *cmdOpts, m *metrics, env string) (http.Handler, error) {
	if len(o.allowHosts) == 0 {
		_ = o.allowHosts.Set(a.env(env))
	}
	h, err := dashboard.HostCheck(o.allowHosts, m.handler)
	if err != nil {
		return nil, usagef(o.cmd, "--allow-host %s", strings.TrimPrefix(err.Error(), "tide/dashboard: AllowedHosts: "))
	}
	return h, nil
}
