package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
)

// scrape GETs /metrics from h and parses the Prometheus text format.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return parseMetrics(t, rec.Body.String())
}

func parseMetrics(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("/metrics is not the text format: %v\n%s", err, text)
	}
	return fams
}

// sample returns the value of the series of family name whose labels
// include the given name, value pairs; ok is false when there is none.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		}
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// wantSample checks one series' value and returns nothing.
func wantSample(t *testing.T, fams map[string]*dto.MetricFamily, want float64, name string, labels ...string) {
	t.Helper()
	v, ok := sample(fams, name, labels...)
	if !ok {
		t.Errorf("no series %s%q", name, labels)
	} else if v != want {
		t.Errorf("%s%q = %v, want %v", name, labels, v, want)
	}
}

func TestMetricsRedisDown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: closedPort(t), MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	b := redisbroker.New(rdb, redisbroker.WithPrefix("down"))
	defer b.Close()
	var logs testlog.Buffer
	m, err := newMetrics(tide.NewInspector(b), "tide-dash", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.shutdown()
	m.snap.maxAge = time.Hour // one read per scrape, however slow the machine: the test expires it

	fams := scrape(t, m.handler)
	wantSample(t, fams, 0, "tide_up")
	wantSample(t, fams, 1, "tide_scrape_errors_total")
	if f := fams["tide_scrape_errors_total"]; f != nil && f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("tide_scrape_errors_total is a %v, want a counter", f.GetType())
	}
	m.snap.mu.Lock()
	m.snap.at = time.Time{} // expire the cache: the next scrape reads Redis again
	m.snap.mu.Unlock()
	fams = scrape(t, m.handler)
	wantSample(t, fams, 0, "tide_up")
	wantSample(t, fams, 2, "tide_scrape_errors_total")
	// The failure is logged once, not at every scrape.
	if n := strings.Count(logs.String(), "cannot read the queues from Redis"); n != 1 {
		t.Errorf("%d log lines about the failure, want 1:\n%s", n, logs.String())
	}
}

func TestMetricsFleet(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	// Another process (a server of the fleet) runs tasks: 3 attempts, 1
	// failed; one more task waits in a paused queue.
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"mq": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(_ context.Context, t *tide.Task) error {
		if string(t.Payload()) == "fail" {
			return errors.New("failed")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	for _, p := range []string{"ok", "ok", "fail"} {
		e.enqueue("job", p, tide.Queue("mq"), tide.MaxRetry(0))
	}
	testwait.Until(t, 10*time.Second, func() error {
		qi, err := e.in.QueueInfo(ctx, "mq")
		if err == nil && qi.Processed == 3 {
			return nil
		}
		return fmt.Errorf("the tasks were not processed: %+v %v", qi, err)
	})
	e.enqueue("job", "ok", tide.Queue("held"))
	if err := e.in.PauseQueue(ctx, "held"); err != nil {
		t.Fatal(err)
	}

	m, err := newMetrics(e.in, "tide-dash", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer m.shutdown()
	fams := scrape(t, m.handler)
	wantSample(t, fams, 1, "tide_up")
	wantSample(t, fams, 0, "tide_scrape_errors_total")
	wantSample(t, fams, 3, "tide_queue_processed_today", "queue", "mq")
	wantSample(t, fams, 1, "tide_queue_failed_today", "queue", "mq")
	wantSample(t, fams, 1, "tide_queue_size", "queue", "mq", "state", "archived")
	wantSample(t, fams, 1, "tide_queue_size", "queue", "held", "state", "pending")
	wantSample(t, fams, 1, "tide_queue_paused", "queue", "held")
	wantSample(t, fams, 0, "tide_queue_paused", "queue", "mq")
	if _, ok := sample(fams, "tide_queue_latency_seconds", "queue", "held"); !ok {
		t.Error("no tide_queue_latency_seconds of the queue")
	}
	for _, name := range []string{"tide_up", "tide_scrape_errors_total", "tide_queue_processed_today", "tide_queue_failed_today"} {
		if f := fams[name]; f == nil || len(f.GetHelp()) < 20 {
			t.Errorf("%s has no help text", name)
		}
	}
	// Short label names, and the service named.
	for name, f := range fams {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if strings.HasPrefix(l.GetName(), "messaging_") {
					t.Errorf("%s has the label %s", name, l.GetName())
				}
				if strings.Contains(l.GetValue(), "unknown_service") {
					t.Errorf("%s has %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	wantSample(t, fams, 1, "target_info", "service_name", "tide-dash")
}

// /metrics of serve and dash needs no login, so it answers only requests
// for localhost, an IP address or a host of --allow-host: a web page's,
// through DNS rebinding, is refused before it can read the queue names.
func TestMetricsChecksHost(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("secret-queue"))
	e.vars["TIDE_GATEWAY_TOKENS"] = "gateway-token-0123456789"
	port := func(base string) string { return base[strings.LastIndexByte(base, ':')+1:] }
	check := func(what, base string, want map[string]int) {
		t.Helper()
		for host, code := range want {
			host += ":" + port(base)
			got, body := getHost(t, base+"/metrics", host)
			switch {
			case got != code:
				t.Errorf("%s: /metrics for Host %s: %d, want %d", what, host, got, code)
			case code == http.StatusOK && !strings.Contains(body, `queue="secret-queue"`):
				t.Errorf("%s: /metrics for Host %s lacks the queue:\n%s", what, host, body)
			case code != http.StatusOK && (strings.Contains(body, "secret-queue") || !strings.Contains(body, "does not answer to host")):
				t.Errorf("%s: /metrics for Host %s: %s", what, host, body)
			}
		}
	}
	for _, cmd := range []string{"serve", "dash"} {
		base, _ := e.start(cmd, "--addr", "127.0.0.1:0")
		check(cmd, base, map[string]int{"localhost": 200, "127.0.0.1": 200, "rebind.attacker.example": 421, "metrics.example.test": 421})
		base, _ = e.start(cmd, "--addr", "127.0.0.1:0", "--allow-host", "metrics.example.test")
		check(cmd+" --allow-host", base, map[string]int{"metrics.example.test": 200, "localhost": 200, "rebind.attacker.example": 421})
	}
	e.vars["TIDE_SERVE_ALLOW_HOSTS"] = "env.example.test"
	base, _ := e.start("serve", "--addr", "127.0.0.1:0")
	check("serve with TIDE_SERVE_ALLOW_HOSTS", base, map[string]int{"env.example.test": 200, "rebind.attacker.example": 421})

	r := e.tide("serve", "--addr", "127.0.0.1:0", "--allow-host", "bad host")
	if r.code != exitUsage || !strings.Contains(r.stderr, `--allow-host "bad host" is not a host name`) {
		t.Errorf("serve --allow-host 'bad host': exit %d\n%s", r.code, r.stderr)
	}
}
