package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/middleware"
)

// Metrics the CLI adds to the middleware's, per queue, from the Inspector.
const (
	metricLatency = "tide.queue.latency"
	metricPaused  = "tide.queue.paused"
)

// metrics is the /metrics endpoint: OpenTelemetry instruments exported in
// the Prometheus format, with the queue gauges fed by the Inspector.
type metrics struct {
	handler http.Handler
	// mw records attempts of the tasks this process runs (serve with a
	// webhook server).
	mw       tide.MiddlewareFunc
	provider *sdkmetric.MeterProvider
}

func newMetrics(in *tide.Inspector) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("tide: metrics: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	m := &metrics{provider: mp, handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	fail := func(err error) (*metrics, error) {
		_ = mp.Shutdown(context.Background())
		return nil, fmt.Errorf("tide: metrics: %w", err)
	}
	if m.mw, err = middleware.Metrics(middleware.WithMeterProvider(mp)); err != nil {
		return fail(err)
	}
	snap := &queueSnapshot{in: in, maxAge: time.Second}
	_, err = middleware.RegisterQueueGauges(func(ctx context.Context) (map[string]map[tide.TaskState]int64, error) {
		infos, err := snap.get(ctx)
		sizes := make(map[string]map[tide.TaskState]int64, len(infos))
		for _, q := range infos {
			sizes[q.Queue] = map[tide.TaskState]int64{
				tide.StatePending: int64(q.Pending), tide.StateActive: int64(q.Active), tide.StateScheduled: int64(q.Scheduled),
				tide.StateRetry: int64(q.Retry), tide.StateArchived: int64(q.Archived), tide.StateCompleted: int64(q.Completed),
			}
		}
		return sizes, err
	}, middleware.WithMeterProvider(mp))
	if err != nil {
		return fail(err)
	}
	meter := mp.Meter("github.com/tidequeue/tide/cmd/tide")
	lat, err1 := meter.Float64ObservableGauge(metricLatency, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest pending task of the queue has been waiting."))
	paused, err2 := meter.Int64ObservableGauge(metricPaused,
		metric.WithDescription("1 when the queue is paused, else 0."))
	if err := errors.Join(err1, err2); err != nil {
		return fail(err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		infos, err := snap.get(ctx)
		for _, q := range infos {
			attrs := metric.WithAttributes(semconv.MessagingDestinationName(q.Queue))
			o.ObserveFloat64(lat, q.Latency.Seconds(), attrs)
			var p int64
			if q.Paused {
				p = 1
			}
			o.ObserveInt64(paused, p, attrs)
		}
		return err
	}, lat, paused)
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

	mu    sync.Mutex
	at    time.Time
	infos []*tide.QueueInfo
	err   error
}

func (s *queueSnapshot) get(ctx context.Context) ([]*tide.QueueInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < s.maxAge {
		return s.infos, s.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s.infos, s.err = nil, nil
	qs, err := s.in.Queues(ctx)
	if err != nil {
		s.err = err
	}
	for _, q := range qs {
		qi, err := s.in.QueueInfo(ctx, q)
		if err != nil {
			s.err = err
			continue
		}
		s.infos = append(s.infos, qi)
	}
	s.at = time.Now()
	return s.infos, s.err
}
