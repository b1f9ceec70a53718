package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/webhook"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// start runs a long-running command until the test ends and returns the
// base URL it listens on.
func (e *env) start(args ...string) (base string, stop func() result) {
	e.t.Helper()
	base, _, stop = e.startLive(args...)
	return base, stop
}

// startLive is start that also returns the command's stderr as it grows.
func (e *env) startLive(args ...string) (base string, stderr func() string, stop func() result) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	full := append([]string{"--redis", e.addr, "--prefix", e.prefix}, args...)
	go func() { done <- run(ctx, full, func(k string) string { return e.vars[k] }, &out, &errb) }()
	var once sync.Once
	var res result
	stop = func() result {
		once.Do(func() {
			cancel()
			select {
			case code := <-done:
				res = result{code, out.String(), errb.String()}
			case <-time.After(20 * time.Second):
				e.t.Errorf("%s did not stop", args[0])
			}
		})
		return res
	}
	e.t.Cleanup(func() { stop() })
	var addr string
	testwait.Until(e.t, 10*time.Second, func() error {
		if m := listening.FindStringSubmatch(errb.String()); m != nil {
			addr = m[1]
			return nil
		}
		select {
		case code := <-done:
			e.t.Fatalf("%s exited with %d:\n%s", args[0], code, errb.String())
		default:
		}
		return fmt.Errorf("%s did not start listening:\n%s", args[0], errb.String())
	})
	return addr, errb.String, stop
}

func get(t *testing.T, url string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServe(t *testing.T) {
	e := setup(t)
	const token = "gateway-token-0123456789"
	const secret = "webhook-secret-0123456789"
	got := make(chan error, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- webhook.Verify([]byte(secret), r.Header.Get(webhook.SignatureHeader), body, time.Minute)
	}))
	defer recv.Close()
	e.vars["TIDE_GATEWAY_TOKENS"] = "other-token-0123456789abc, " + token
	e.vars["TIDE_WEBHOOK_SECRET"] = secret
	base, stop := e.start("serve", "--addr", "127.0.0.1:0", "--webhook-allow", "127.0.0.1", "--webhook-allow-private")

	// The gateway enqueues.
	code, body := post(t, base+"/v1/tasks", token, `{"type":"order:cancel","payload":{"order_id":42},"task_id":"oc-42","delay":"15m"}`)
	if code != http.StatusCreated || !strings.Contains(body, `"state":"scheduled"`) {
		t.Fatalf("POST /v1/tasks: %d %s", code, body)
	}
	if ti, err := e.in.GetTaskInfo(context.Background(), "default", "oc-42"); err != nil || ti.State != tide.StateScheduled {
		t.Fatalf("the task: %+v %v", ti, err)
	}
	if code, _ := post(t, base+"/v1/tasks", "wrong-token-0123456789", `{"type":"a"}`); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}

	// A webhook task enqueued through the gateway is sent, signed.
	code, body = post(t, base+"/v1/tasks", token, `{"type":"tide:webhook","payload":{"url":"`+recv.URL+`/hook","body":"{\"paid\":true}"}}`)
	if code != http.StatusCreated || !strings.Contains(body, `"queue":"webhooks"`) {
		t.Fatalf("POST webhook: %d %s", code, body)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("the receiver could not verify the signature: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook was not sent")
	}

	// /metrics: queue gauges from the Inspector, attempt metrics from the
	// middleware (once the attempt is recorded), Go runtime metrics.
	var metrics string
	testwait.For(t, 10*time.Second, "/metrics to count the processed task", func() bool {
		var status int
		status, metrics = get(t, base+"/metrics")
		if status != http.StatusOK {
			t.Fatalf("/metrics: %d", status)
		}
		return strings.Contains(metrics, "tide_tasks_processed")
	})
	// The labels are the short queue and state (they were
	// messaging_destination_name and messaging_tide_task_state).
	for _, want := range []string{"tide_queue_size", `queue="default"`, `state="scheduled"`,
		"tide_tasks_processed", "tide_queue_latency", "tide_queue_paused", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	fams := parseMetrics(t, metrics)
	wantSample(t, fams, 1, "tide_up")
	wantSample(t, fams, 1, "tide_queue_size", "queue", "default", "state", "scheduled")
	wantSample(t, fams, 1, "tide_tasks_processed_total", "queue", "webhooks", "type", "tide:webhook")
	wantSample(t, fams, 1, "target_info", "service_name", "tide-serve")
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}

	r := stop()
	if r.code != exitOK || !strings.Contains(r.stderr, "gateway stopped") {
		t.Errorf("serve exited with %d:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, token) || strings.Contains(r.stderr, secret) {
		t.Errorf("a secret was logged:\n%s", r.stderr)
	}
}

// The notifications (NotifyURL) of the tasks serve runs obey its webhook
// restrictions: without --webhook-allow-private, and with 127.0.0.1 not an
// allowed host, a notification to 127.0.0.1 is refused and archived. With
// them it arrives, signed with the webhook secret.
func TestServeNotificationsObeyWebhookHosts(t *testing.T) {
	e := setup(t)
	const secret = "webhook-secret-0123456789"
	// hits gets, for each request, webhook.Verify of its signature.
	hits := make(chan error, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hits <- webhook.Verify([]byte(secret), r.Header.Get(webhook.SignatureHeader), body, time.Minute)
	}))
	defer recv.Close()
	e.vars["TIDE_GATEWAY_TOKENS"] = "gateway-token-0123456789"
	e.vars["TIDE_WEBHOOK_SECRET"] = secret
	_, stop := e.start("serve", "--addr", "127.0.0.1:0", "--webhook-allow", "hooks.example.test")

	// A webhook to a host that is not allowed is archived at once; its
	// notification goes to the receiver on 127.0.0.1.
	tk, err := webhook.NewTask(webhook.Payload{URL: "https://elsewhere.example.test/hook", Body: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(context.Background(), tk, tide.NotifyURL(recv.URL+"/notify?token=SECRET")); err != nil {
		t.Fatal(err)
	}
	var notes []*tide.TaskInfo
	testwait.For(t, 15*time.Second, "the notification to be sent or archived", func() bool {
		if len(hits) > 0 {
			return true
		}
		ts, err := e.in.ListTasks(context.Background(), webhook.DefaultQueue, tide.StateArchived, 1, 10)
		if err != nil {
			t.Fatal(err)
		}
		notes = slices.DeleteFunc(ts, func(ti *tide.TaskInfo) bool { return ti.Type != tide.NotifyType })
		return len(notes) > 0
	})
	if len(hits) > 0 {
		t.Fatal("a notification reached 127.0.0.1")
	}
	if err := notes[0].LastErr; !strings.Contains(err, `host "127.0.0.1:`) || !strings.Contains(err, "is not in Config.NotifyAllowedHosts") || strings.Contains(err, "SECRET") {
		t.Errorf("the notification's error: %q", err)
	}
	stop()

	_, stop = e.start("serve", "--addr", "127.0.0.1:0", "--webhook-allow", "hooks.example.test,127.0.0.1", "--webhook-allow-private")
	defer stop()
	if _, err := e.c.Enqueue(context.Background(), tk, tide.NotifyURL(recv.URL+"/notify")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-hits:
		if err != nil {
			t.Errorf("the notification's signature: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the notification was not sent")
	}
}

func TestDash(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("visible-queue"))
	e.vars["TIDE_DASH_TOKEN"] = "dash-token-0123456789abcdef"
	base, stop := e.start("dash", "--addr", "127.0.0.1:0", "--title", "staging")
	code, body := get(t, base+"/")
	if code != http.StatusOK || !strings.Contains(body, "staging") || !strings.Contains(body, "visible-queue") {
		t.Errorf("GET /: %d\n%.500s", code, body)
	}
	code, body = get(t, base+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `tide_queue_size{`) || !strings.Contains(body, "visible-queue") {
		t.Errorf("GET /metrics: %d\n%.2000s", code, body)
	}
	fams := parseMetrics(t, body)
	wantSample(t, fams, 1, "tide_up")
	wantSample(t, fams, 1, "tide_queue_size", "queue", "visible-queue", "state", "pending")
	wantSample(t, fams, 1, "target_info", "service_name", "tide-dash")
	r := stop()
	if r.code != exitOK || strings.Contains(r.stderr, "read-only") {
		t.Errorf("dash exited with %d:\n%s", r.code, r.stderr)
	}
}

func TestListenError(t *testing.T) {
	e := setup(t)
	e.vars["TIDE_GATEWAY_TOKENS"] = "gateway-token-0123456789"
	r := e.tide("serve", "--addr", "256.0.0.1:1")
	if r.code != exitError || !strings.Contains(r.stderr, "cannot listen on 256.0.0.1:1") {
		t.Errorf("exit %d: %s", r.code, r.stderr)
	}
}

func TestListenLoopbackByDefault(t *testing.T) {
	for _, c := range []*command{cmdDash, cmdServe} {
		var o cmdOpts
		if err := c.flagSet(&o).Parse(nil); err != nil || o.addr != "127.0.0.1:8080" {
			t.Errorf("tide %s listens on %q by default, want 127.0.0.1:8080 (%v)", c.name, o.addr, err)
		}
		noEnv(c.name, "--help").want(t, exitOK, "(default 127.0.0.1:8080)", "--addr :8080")
	}
}

func TestDashWarnsWhenExposed(t *testing.T) {
	e := setup(t)
	// Loopback: this machine only, no warning.
	_, stop := e.start("dash", "--addr", "127.0.0.1:0")
	r := stop()
	if !strings.Contains(r.stderr, "(this machine only") || strings.Contains(r.stderr, "warning") {
		t.Errorf("dash on loopback:\n%s", r.stderr)
	}
	// Every interface and no token: a warning that reading needs no login.
	_, stop = e.start("dash", "--addr", "0.0.0.0:0")
	r = stop()
	if !strings.Contains(r.stderr, "(every network interface") ||
		!regexp.MustCompile(`tide: warning: the dashboard listens on (0\.0\.0\.0|\[::\]):\d+ and it has no token: anyone who reaches it can read`).MatchString(r.stderr) {
		t.Errorf("dash on every interface without a token:\n%s", r.stderr)
	}
	// With a token changes need it, but reading still does not: said too.
	e.vars["TIDE_DASH_TOKEN"] = "dash-token-0123456789abcdef"
	_, stop = e.start("dash", "--addr", "0.0.0.0:0")
	r = stop()
	if !strings.Contains(r.stderr, "warning: the dashboard listens on ") || !strings.Contains(r.stderr, "reading needs no login") ||
		strings.Contains(r.stderr, "no token") {
		t.Errorf("dash on every interface with a token:\n%s", r.stderr)
	}
}

// getHost GETs url with the Host header host.
func getHost(t *testing.T, url, host string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDashAllowHost(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("visible-queue"))
	port := func(base string) string { return base[strings.LastIndexByte(base, ':')+1:] }

	// By default a host name is refused (DNS rebinding), localhost is not.
	base, _ := e.start("dash", "--addr", "127.0.0.1:0")
	if code, _ := getHost(t, base+"/", "tide.example.test:"+port(base)); code != http.StatusMisdirectedRequest {
		t.Errorf("a host name without --allow-host: %d, want 421", code)
	}
	if code, _ := getHost(t, base+"/", "localhost:"+port(base)); code != http.StatusOK {
		t.Errorf("localhost: %d", code)
	}

	// --allow-host, repeated and comma-separated; a name:port only on it.
	base, _ = e.start("dash", "--addr", "127.0.0.1:0", "--allow-host", "tide.example.test", "--allow-host", "other.example.test:1,Third.Example.Test")
	for host, want := range map[string]int{
		"tide.example.test:" + port(base):  http.StatusOK,
		"third.example.test:" + port(base): http.StatusOK,
		"other.example.test:" + port(base): http.StatusMisdirectedRequest,
		"evil.example.test:" + port(base):  http.StatusMisdirectedRequest,
	} {
		code, body := getHost(t, base+"/", host)
		if code != want || want == http.StatusOK && !strings.Contains(body, "visible-queue") {
			t.Errorf("Host %s: %d, want %d", host, code, want)
		}
	}
	// TIDE_DASH_ALLOW_HOSTS too.
	e.vars["TIDE_DASH_ALLOW_HOSTS"] = "env.example.test"
	base, _ = e.start("dash", "--addr", "127.0.0.1:0")
	if code, _ := getHost(t, base+"/", "env.example.test:"+port(base)); code != http.StatusOK {
		t.Errorf("TIDE_DASH_ALLOW_HOSTS: %d", code)
	}
}

func TestDashReadToken(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("visible-queue"))
	const readToken = "read-token-0123456789abcdef"
	e.vars["TIDE_DASH_READ_TOKEN"] = readToken
	e.vars["TIDE_DASH_TOKEN"] = "dash-token-0123456789abcdef"
	// On every interface with a read token: no warning, reading needs a login.
	base, stop := e.start("dash", "--addr", "0.0.0.0:0")
	base = strings.Replace(base, "0.0.0.0", "127.0.0.1", 1)
	base = strings.Replace(base, "[::]", "127.0.0.1", 1)
	if code, body := get(t, base+"/"); code != http.StatusUnauthorized || strings.Contains(body, "visible-queue") {
		t.Errorf("GET / without a login: %d", code)
	}
	if code, body := get(t, base+"/", "Authorization", "Bearer "+readToken); code != http.StatusOK || !strings.Contains(body, "visible-queue") {
		t.Errorf("GET / with the read token: %d", code)
	}
	r := stop()
	if strings.Contains(r.stderr, "warning") || strings.Contains(r.stderr, readToken) {
		t.Errorf("dash with a read token:\n%s", r.stderr)
	}
	// --read-token, checked like --token before connecting.
	dead := closedPort(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dash", "--read-token", "short"}, "the read token is 5 characters; use at least 16"},
		{[]string{"dash", "--read-token", "same-token-0123456789", "--token", "same-token-0123456789"}, "the read token is the same as the token"},
		{[]string{"dash", "--allow-host", "https://tide.example.test/"}, `--allow-host "https://tide.example.test/" is not a host name or host:port`},
	} {
		r := noEnv(append([]string{"--redis", dead}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("tide %s: exit %d\n%s", strings.Join(c.args, " "), r.code, r.stderr)
		}
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--redis", dead, "dash"}, func(k string) string {
		if k == "TIDE_DASH_READ_TOKEN" {
			return "short"
		}
		return ""
	}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "the read token is 5 characters") {
		t.Errorf("TIDE_DASH_READ_TOKEN short: exit %d: %s", code, errb.String())
	}
}

// jsonLines parses every line of s as a JSON object.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("stderr line is not a JSON object: %q", line)
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestJSONNotesAndWarnings(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("q"))
	// The --force note.
	r := e.tide("pause", "later", "--force", "--json")
	r.want(t, exitOK, `"paused": true`)
	if ls := jsonLines(t, r.stderr); len(ls) != 1 || !strings.HasPrefix(fmt.Sprint(ls[0]["note"]), `no queue "later"`) || len(ls[0]) != 1 {
		t.Errorf("pause --force --json stderr: %s", r.stderr)
	}
	// The dashboard's notes and warnings, and its log lines.
	_, stop := e.start("dash", "--addr", "0.0.0.0:0", "--json")
	r = stop()
	var notes, warnings []string
	var url string
	for _, m := range jsonLines(t, r.stderr) {
		if s, ok := m["note"].(string); ok {
			notes = append(notes, s)
		}
		if s, ok := m["warning"].(string); ok {
			warnings = append(warnings, s)
		}
		if s, ok := m["url"].(string); ok {
			url = s
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "it has no token: anyone who reaches it can read") ||
		!strings.HasPrefix(url, "http://") || !slices.ContainsFunc(notes, func(s string) bool { return strings.Contains(s, "read-only") }) ||
		!slices.ContainsFunc(notes, func(s string) bool { return strings.HasPrefix(s, "dashboard listening on "+url) }) ||
		!slices.Contains(notes, "dashboard stopped") {
		t.Errorf("dash --json stderr:\n%s", r.stderr)
	}
	// Without --json they stay text.
	r = e.tide("pause", "later2", "--force")
	if !strings.HasPrefix(r.stderr, `tide: note: no queue "later2"`) {
		t.Errorf("text note: %s", r.stderr)
	}
}

// TestRedisDownIsQuiet stops Redis under dash and serve: go-redis reports
// every failed dial, many a second, which the CLI logs at debug level only.
func TestRedisDownIsQuiet(t *testing.T) {
	for _, level := range []string{"", "debug"} {
		srv := redistest.Start(t)
		e := &env{t: t, addr: srv.Addr, prefix: "quiet", vars: map[string]string{
			"TIDE_GATEWAY_TOKENS": "gateway-token-0123456789",
			"TIDE_WEBHOOK_SECRET": "webhook-secret-0123456789",
			"TIDE_LOG_LEVEL":      level,
		}}
		dash, dashErr, stopDash := e.startLive("dash", "--addr", "127.0.0.1:0")
		gw, serveErr, stopServe := e.startLive("serve", "--addr", "127.0.0.1:0", "--webhook-allow", "hooks.example.test")
		before := map[string]int{"dash": len(dashErr()), "serve": len(serveErr())}
		srv.Stop()
		// A few seconds of Redis down, scraped now and then; the webhook
		// server of serve polls Redis all along.
		for range 4 {
			var wg sync.WaitGroup
			for _, base := range []string{dash, gw} {
				wg.Go(func() {
					if resp, err := http.Get(base + "/metrics"); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
			time.Sleep(300 * time.Millisecond)
		}
		for name, stop := range map[string]func() result{"dash": stopDash, "serve": stopServe} {
			r := stop()
			lines := strings.Split(strings.TrimSpace(r.stderr[before[name]:]), "\n")
			lines = slices.DeleteFunc(lines, func(l string) bool { return strings.Contains(l, "stopped") })
			t.Logf("%s, TIDE_LOG_LEVEL=%q, %d lines after Redis stopped:\n%s", name, level, len(lines), strings.Join(lines, "\n"))
			redisLines := slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return !strings.Contains(l, "go-redis: ") })
			switch level {
			case "":
				if len(lines) > 2 || len(redisLines) > 0 {
					t.Errorf("%s with Redis down printed %d lines, want at most 2:\n%s", name, len(lines), strings.Join(lines, "\n"))
				}
			case "debug":
				// The messages reach the CLI's logger, as debug lines: the
				// logger of the latest run of this process, serve's.
				if name == "serve" && (len(redisLines) == 0 || !strings.Contains(redisLines[0], "level=DEBUG") || !strings.Contains(redisLines[0], "dial")) {
					t.Errorf("%s with TIDE_LOG_LEVEL=debug logged no go-redis line:\n%s", name, strings.Join(lines, "\n"))
				}
			}
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--redis", closedPort(t), "dash"}, func(k string) string {
		if k == "TIDE_LOG_LEVEL" {
			return "loud"
		}
		return ""
	}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), `TIDE_LOG_LEVEL "loud": use debug, info, warn or error`) {
		t.Errorf("TIDE_LOG_LEVEL=loud: exit %d %s", code, errb.String())
	}
}
