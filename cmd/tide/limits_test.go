package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want tide.Rate
		err  string
	}{
		{"100/1s", tide.Rate{Limit: 100, Per: time.Second}, ""},
		{"5/1m", tide.Rate{Limit: 5, Per: time.Minute}, ""},
		{"10/500ms", tide.Rate{Limit: 10, Per: 500 * time.Millisecond}, ""},
		{"100/s", tide.Rate{Limit: 100, Per: time.Second}, ""},
		{"3/1h30m", tide.Rate{Limit: 3, Per: 90 * time.Minute}, ""},
		{"none", tide.Rate{}, ""},
		{"0", tide.Rate{}, ""},
		{"100", tide.Rate{}, "want N/DURATION"},
		{"x/1s", tide.Rate{}, `the number of starts "x"`},
		{"0/1s", tide.Rate{}, `the number of starts "0" must be 1 to 1000`},
		{"2000/1s", tide.Rate{}, "must be 1 to 1000"},
		{"10/soon", tide.Rate{}, `the period "soon" is not a duration`},
		{"10/1500us", tide.Rate{}, "whole milliseconds"},
		{"10/0s", tide.Rate{}, "from 1ms to 168h"},
		{"10/-1s", tide.Rate{}, "from 1ms to 168h"},
		{"10/200h", tide.Rate{}, "from 1ms to 168h"},
	} {
		got, err := parseRate(c.in, 1000)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("parseRate(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("parseRate(%q): error %v, want one with %q", c.in, err, c.err)
		}
	}
	for d, want := range map[time.Duration]string{time.Second: "1s", time.Minute: "1m", 90 * time.Minute: "1h30m",
		time.Hour: "1h", 500 * time.Millisecond: "500ms", 61 * time.Second: "1m1s", 168 * time.Hour: "168h"} {
		if got := formatPer(d); got != want {
			t.Errorf("formatPer(%v) = %q, want %q", d, got, want)
		}
	}
}

// limitsOut is what tide limits get --json prints.
type limitsOut struct {
	Queue            string   `json:"queue"`
	Concurrency      int      `json:"concurrency"`
	Rate             *rateOut `json:"rate"`
	GroupConcurrency int      `json:"group_concurrency"`
	GroupRate        *rateOut `json:"group_rate"`
	Ordered          bool     `json:"ordered"`
}

type rateOut struct {
	Limit      int     `json:"limit"`
	PerSeconds float64 `json:"per_seconds"`
}

// limitsOf reads the limits tide limits get --json prints, refusing any
// field it does not know.
func limitsOf(t *testing.T, e *env, queue string) limitsOut {
	t.Helper()
	r := e.tide("limits", "get", queue, "--json")
	r.want(t, exitOK)
	var out limitsOut
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("limits get --json: %v\n%s", err, r.stdout)
	}
	return out
}

func TestLimitsSetGet(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.enqueue("t", "{}", tide.Queue("orders"))

	// None at first: every field says so.
	r := e.tide("limits", "get", "orders")
	r.want(t, exitOK, "Limits of queue orders:", "concurrency", "rate", "group concurrency", "group rate", "ordered")
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		if f := strings.Fields(line); f[len(f)-1] != "none" && f[len(f)-1] != "no" {
			t.Errorf("unset limit shown as %q", line)
		}
	}
	if l := limitsOf(t, e, "orders"); l != (limitsOut{Queue: "orders"}) {
		t.Errorf("no limits, --json: %+v", l)
	}

	// Every field, set and read back, by the CLI and by the library.
	r = e.tide("limits", "set", "orders", "--concurrency", "10", "--rate", "100/1s", "--group-concurrency", "2",
		"--group-rate", "5/1m", "--ordered")
	r.want(t, exitOK, "Limits of queue orders set:")
	want := tide.QueueLimits{Concurrency: 10, Rate: tide.Rate{Limit: 100, Per: time.Second}, GroupConcurrency: 2,
		GroupRate: tide.Rate{Limit: 5, Per: time.Minute}, Ordered: true}
	if l, err := e.in.QueueLimits(ctx, "orders"); err != nil || l != want {
		t.Fatalf("after set: %+v, %v; want %+v", l, err, want)
	}
	r = e.tide("limits", "get", "orders")
	r.want(t, exitOK)
	for _, w := range [][]string{{"concurrency", "10"}, {"rate", "100/1s"}, {"group", "concurrency", "2"}, {"group", "rate", "5/1m"}, {"ordered", "yes"}} {
		if !hasLine(r.stdout, w...) {
			t.Errorf("limits get lacks %q:\n%s", w, r.stdout)
		}
	}
	l := limitsOf(t, e, "orders")
	if l.Concurrency != 10 || l.Rate == nil || *l.Rate != (rateOut{100, 1}) || l.GroupConcurrency != 2 ||
		l.GroupRate == nil || *l.GroupRate != (rateOut{5, 60}) || !l.Ordered {
		t.Errorf("--json: %+v", l)
	}
	// The alias and the group default work.
	e.tide("limits", "orders").want(t, exitOK, "100/1s")
	e.tide("limits", "show", "orders").want(t, exitOK, "100/1s")

	// A partial update keeps the other fields; none and =false remove one.
	e.tide("limits", "set", "orders", "--rate", "10/500ms", "--ordered=false").want(t, exitOK)
	want.Rate, want.Ordered = tide.Rate{Limit: 10, Per: 500 * time.Millisecond}, false
	if l, err := e.in.QueueLimits(ctx, "orders"); err != nil || l != want {
		t.Fatalf("after a partial set: %+v, %v; want %+v", l, err, want)
	}
	e.tide("limits", "set", "orders", "--group-rate", "none", "--concurrency", "none").want(t, exitOK)
	want.GroupRate, want.Concurrency = tide.Rate{}, 0
	if l, err := e.in.QueueLimits(ctx, "orders"); err != nil || l != want {
		t.Fatalf("after removing two: %+v, %v; want %+v", l, err, want)
	}

	// queues shows them in a column, and in --json.
	r = e.tide("queues")
	r.want(t, exitOK, "LIMITS", "rate=10/500ms group-concurrency=2")
	r = e.tide("queues", "--json")
	var qs []queueJSON
	if err := json.Unmarshal([]byte(r.stdout), &qs); err != nil || len(qs) != 1 || qs[0].Limits.GroupConcurrency != 2 ||
		qs[0].Limits.Rate != (tide.Rate{Limit: 10, Per: 500 * time.Millisecond}) || !strings.Contains(r.stdout, `"per_seconds": 0.5`) {
		t.Errorf("queues --json: %v %+v", err, qs)
	}

	// --clear removes them all.
	r = e.tide("limits", "set", "orders", "--clear")
	r.want(t, exitOK, "Limits of queue orders removed:")
	if l, err := e.in.QueueLimits(ctx, "orders"); err != nil || l != (tide.QueueLimits{}) {
		t.Fatalf("after --clear: %+v, %v", l, err)
	}
	r = e.tide("queues")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasSuffix(lines[1], "  -") {
		t.Errorf("queues after --clear:\n%s", r.stdout)
	}

	// set --json prints the new limits.
	r = e.tide("limits", "set", "orders", "--concurrency", "3", "--json")
	r.want(t, exitOK, `"queue": "orders"`, `"concurrency": 3`, `"rate": null`)

	// Unknown queue: exit 3, unless --force.
	r = e.tide("limits", "set", "nosuch", "--concurrency", "3")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) || !strings.Contains(r.stderr, "--force") {
		t.Errorf("set on an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	e.tide("limits", "get", "nosuch").want(t, exitNotFound)
	r = e.tide("limits", "set", "fresh", "--concurrency", "3", "--force")
	r.want(t, exitOK, "Limits of queue fresh set:")
	if !strings.Contains(r.stderr, `no queue "fresh"`) {
		t.Errorf("--force gives no note: %q", r.stderr)
	}
	e.tide("limits", "get", "fresh").want(t, exitOK, "3")
}

// hasLine reports whether a line of s has exactly the words w.
func hasLine(s string, w ...string) bool {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Join(strings.Fields(line), " ") == strings.Join(w, " ") {
			return true
		}
	}
	return false
}

func TestLimitsErrors(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("orders"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set", "orders"}, "give the limits to change"},
		{[]string{"limits", "set", "orders", "--clear", "--rate", "1/1s"}, "--clear removes every limit"},
		{[]string{"limits", "set", "orders", "--concurrency", "-1"}, `--concurrency "-1": want a number of tasks`},
		{[]string{"limits", "set", "orders", "--concurrency", "ten"}, `--concurrency "ten"`},
		{[]string{"limits", "set", "orders", "--group-concurrency", "9999999999"}, `--group-concurrency "9999999999"`},
		{[]string{"limits", "set", "orders", "--rate", "100"}, `--rate "100": want N/DURATION`},
		{[]string{"limits", "set", "orders", "--rate", "100/fortnight"}, `--rate "100/fortnight": the period`},
		{[]string{"limits", "set", "orders", "--rate", "100/1us"}, "--rate"},
		{[]string{"limits", "set", "orders", "--rate", "200000/1s"}, `--rate "200000/1s": the number of starts "200000" must be 1 to 100000`},
		{[]string{"limits", "set", "orders", "--group-rate", "5000/1s"}, `--group-rate "5000/1s": the number of starts "5000" must be 1 to 1000`},
		{[]string{"limits", "set", "orders", "--ordered=maybe"}, `--ordered is true or false, not "maybe"`},
		{[]string{"limits", "set", "bad queue", "--concurrency", "1"}, `queue name "bad queue"`},
		{[]string{"limits", "get"}, "usage: tide limits get <queue>"},
		{[]string{"limits", "get", "a", "b"}, "usage: tide limits get <queue>"},
		{[]string{"groups"}, "usage: tide groups <queue>"},
		{[]string{"groups", "orders", "--top", "0"}, "--top 0: must be between 1 and 1000"},
		{[]string{"groups", "orders", "--top", "1001"}, "--top 1001"},
	} {
		r := e.tide(c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("tide %s: exit %d, want 2 and %q:\n%s", strings.Join(c.args, " "), r.code, c.want, r.stderr)
		}
		if m := singleDashFlag().FindString(r.stderr); m != "" {
			t.Errorf("tide %s: a flag named with one dash (%q):\n%s", strings.Join(c.args, " "), m, r.stderr)
		}
	}
	if l, err := e.in.QueueLimits(context.Background(), "orders"); err != nil || l != (tide.QueueLimits{}) {
		t.Errorf("a refused command changed the limits: %+v, %v", l, err)
	}
	// --json: the usage error is JSON too.
	r := e.tide("limits", "set", "orders", "--rate", "1", "--json")
	if msg, code := jsonError(t, r); code != exitUsage || !strings.Contains(msg, "--rate") {
		t.Errorf("--json usage error: %d %q", code, msg)
	}

	// A limit below the partition count is the queue's like any other:
	// accepted.
	b4 := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithPartitions(4))
	if _, err := tide.NewClient(b4).Enqueue(context.Background(), tide.NewTask("t", nil), tide.Queue("wide")); err != nil {
		t.Fatal(err)
	}
	e.tide("limits", "set", "wide", "--concurrency", "2", "--rate", "3/1s").want(t, exitOK, "Limits of queue wide set:")
	if l, err := e.in.QueueLimits(context.Background(), "wide"); err != nil || l.Concurrency != 2 || l.Rate.Limit != 3 {
		t.Errorf("limits below the partition count: %+v, %v", l, err)
	}
}

// enqueueGroup enqueues n tasks of group g to queue.
func (e *env) enqueueGroup(queue, g string, n int) {
	e.t.Helper()
	for range n {
		e.enqueue("t", "{}", tide.Queue(queue), tide.Group(g))
	}
}

func TestGroups(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.enqueue("t", "{}", tide.Queue("mail"))
	e.tide("groups", "mail").want(t, exitOK, "No groups in queue mail")
	e.tide("groups", "mail", "--json").want(t, exitOK, "[]")
	e.tide("groups", "nosuch").want(t, exitNotFound)

	e.enqueueGroup("mail", "acme", 3)
	e.enqueueGroup("mail", "globex", 5)
	e.enqueueGroup("mail", "initech", 1)
	bidi := "evil\u202egpj.exe"
	e.enqueueGroup("mail", bidi, 2)

	r := e.tide("groups", "mail")
	r.want(t, exitOK, "GROUP", "WAITING", "RUNNING", "THROTTLED FOR")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 {
		t.Fatalf("want a header and 4 groups:\n%s", r.stdout)
	}
	for i, w := range [][]string{{"globex", "5", "0", "-"}, {"acme", "3", "0", "-"}, {`evil\u202egpj.exe`, "2", "0", "-"}, {"initech", "1", "0", "-"}} {
		if f := strings.Fields(lines[i+1]); strings.Join(f, " ") != strings.Join(w, " ") {
			t.Errorf("row %d: %q, want %q", i+1, lines[i+1], w)
		}
	}
	// The bidi override is escaped in the table, exact in --json.
	if strings.Contains(r.stdout, "\u202e") {
		t.Errorf("the group name's U+202E is printed raw:\n%s", r.stdout)
	}
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("raw control characters in the output: %q", c)
	}

	r = e.tide("groups", "mail", "--top", "2")
	r.want(t, exitOK, "globex", "acme", "(the top 2 groups; --top shows more)")
	if strings.Contains(r.stdout, "initech") {
		t.Errorf("--top 2 shows a third group:\n%s", r.stdout)
	}

	r = e.tide("groups", "mail", "--json")
	r.want(t, exitOK)
	var gs []groupJSON
	if err := json.Unmarshal([]byte(r.stdout), &gs); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if len(gs) != 4 || gs[0] != (groupJSON{"mail", "globex", 5, 0, nil}) || gs[2].Group != bidi || gs[2].Waiting != 2 {
		t.Errorf("--json: %+v", gs)
	}

	// A running task and a throttled group show: acme's tasks run until
	// the test ends, initech's throttles its group for an hour.
	var throttled atomic.Bool
	release := make(chan struct{})
	srv := tide.NewServer(e.b, tide.Config{Concurrency: 4, Queues: map[string]int{"mail": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		switch g, _ := tide.GetGroup(ctx); g {
		case "initech":
			throttled.Store(true)
			return fmt.Errorf("slow down: %w", tide.ThrottleGroup(time.Hour))
		case "acme":
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	defer close(release)
	testwait.For(t, 15*time.Second, "a throttle and a running task", func() bool {
		gs, err := e.in.Groups(ctx, "mail", 10)
		if err != nil || !throttled.Load() {
			return false
		}
		var running, held bool
		for _, g := range gs {
			running = running || g.Group == "acme" && g.Running > 0
			held = held || g.Group == "initech" && !g.ThrottledUntil.IsZero()
		}
		return running && held
	})
	r = e.tide("groups", "mail")
	r.want(t, exitOK)
	var sawRunning, sawHeld bool
	for _, line := range strings.Split(r.stdout, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "acme" && f[2] != "0" {
			sawRunning = true
		}
		if len(f) == 4 && f[0] == "initech" && (strings.HasPrefix(f[3], "59m") || f[3] == "1h0m") {
			sawHeld = true
		}
	}
	if !sawRunning || !sawHeld {
		t.Errorf("groups with a running task and a throttled group:\n%s", r.stdout)
	}
	r = e.tide("groups", "mail", "--json")
	gs = nil
	if err := json.Unmarshal([]byte(r.stdout), &gs); err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Group == "initech" && (g.ThrottledUntil == nil || time.Until(*g.ThrottledUntil) < 58*time.Minute) {
			t.Errorf("--json: initech's throttle: %+v", g)
		}
	}
}
