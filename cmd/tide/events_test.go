package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
)

// tailLimit bounds a 'tide events tail' a test runs to its end: a broken
// tail fails the test instead of hanging it. It is not a timing assertion.
const tailLimit = 30 * time.Second

// tail runs 'tide events tail' with args, ended by tailLimit at worst.
func (e *env) tail(args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tailLimit)
	defer cancel()
	r := e.tideCtx(ctx, append([]string{"events", "tail"}, args...)...)
	if ctx.Err() != nil {
		e.t.Fatalf("tide events tail %s ran until the test's limit:\n%s%s", strings.Join(args, " "), r.stdout, r.stderr)
	}
	return r
}

// events reads NDJSON events.
func events(t *testing.T, out string) []gateway.Event {
	t.Helper()
	var evs []gateway.Event
	for line := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var ev gateway.Event
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ev); err != nil || ev.ID == "" || ev.At.IsZero() {
			t.Fatalf("not an event: %v\n%s", err, line)
		}
		evs = append(evs, ev)
	}
	return evs
}

// kinds lists the events as "kind:task" for comparison.
func kinds(evs []gateway.Event) string {
	var s []string
	for _, ev := range evs {
		s = append(s, ev.Kind+":"+ev.TaskID)
	}
	return strings.Join(s, " ")
}

// lastID returns the event ID the command printed on stderr at its end
// ({"note": ..., "last_id": ...} with --json).
func lastID(t *testing.T, r result) string {
	t.Helper()
	for line := range strings.SplitSeq(r.stderr, "\n") {
		var n struct {
			Note   string `json:"note"`
			LastID string `json:"last_id"`
		}
		if json.Unmarshal([]byte(line), &n) == nil && n.LastID != "" {
			return n.LastID
		}
		if m := lastIDText.FindStringSubmatch(line); m != nil {
			return m[1]
		}
	}
	t.Fatalf("no last event ID on stderr:\n%s", r.stderr)
	return ""
}

var lastIDText = regexp.MustCompile(`^tide: last event ID (\S+); go on after it with: tide events tail .* --after (\S+)$`)

// eventsOn reports whether queue records events, by reading them.
func (e *env) eventsOn(queue string) bool {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.in.Events(ctx, tide.EventsFrom{Queues: []string{queue}})
	cancel()
	if errors.Is(err, tide.ErrEventsOff) {
		return false
	}
	if err != nil {
		e.t.Fatalf("Events(%s): %v", queue, err)
	}
	for range ch {
	}
	return true
}

// makeQueues creates queues with a task each, by a broker of their own, so
// that the env's client reads their settings afresh.
func (e *env) makeQueues(queues ...string) {
	e.t.Helper()
	c := tide.NewClient(redisbroker.New(redistest.Client(e.t, e.addr), redisbroker.WithPrefix(e.prefix)))
	defer c.Close()
	for _, q := range queues {
		if _, err := c.Enqueue(context.Background(), tide.NewTask("seed", nil), tide.Queue(q), tide.ProcessIn(time.Hour)); err != nil {
			e.t.Fatal(err)
		}
	}
}

func TestEventsOnOff(t *testing.T) {
	e := setup(t)
	e.makeQueues("a", "b")

	// A queue that never had a task is refused, and nothing changes.
	r := e.tide("events", "on", "a", "nosuch")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) || !strings.Contains(r.stderr, "(queues: a, b)") ||
		!strings.Contains(r.stderr, "--force") {
		t.Fatalf("events on of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	if e.eventsOn("a") || e.eventsOn("nosuch") {
		t.Fatal("a refused 'events on' turned events on")
	}

	e.tide("events", "on", "a", "b").want(t, exitOK, "Queue a records task events now ('tide events tail a' follows them).",
		"Queue b records task events now")
	if !e.eventsOn("a") || !e.eventsOn("b") {
		t.Fatal("events are not on")
	}
	r = e.tide("events", "off", "b", "nosuch")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("events off of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	if !e.eventsOn("b") {
		t.Fatal("a refused 'events off' turned events off")
	}

	r = e.tide("events", "off", "b", "--json")
	r.want(t, exitOK)
	var sw []eventsSwitchJSON
	if err := json.Unmarshal([]byte(r.stdout), &sw); err != nil || len(sw) != 1 || sw[0] != (eventsSwitchJSON{"b", false}) {
		t.Fatalf("events off --json: %v\n%s", err, r.stdout)
	}
	if e.eventsOn("b") || !e.eventsOn("a") {
		t.Fatal("events off b: wrong queues changed")
	}
	e.tide("events", "off", "a").want(t, exitOK, "Queue a records no task events now.")
	if e.eventsOn("a") {
		t.Fatal("events off a: still on")
	}

	// --force: with a note.
	r = e.tide("events", "on", "later", "--force")
	r.want(t, exitOK, "Queue later records task events now")
	if !strings.Contains(r.stderr, `tide: note: no queue "later"`) || !strings.Contains(r.stderr, "turning its events on anyway (--force)") {
		t.Errorf("stderr: %s", r.stderr)
	}
	if !e.eventsOn("later") {
		t.Fatal("--force did not turn events on")
	}
	e.tide("events", "off", "later", "--force").want(t, exitOK, "Queue later records no task events now.")
	if e.eventsOn("later") {
		t.Fatal("--force did not turn events off")
	}

	// Tailing queues that record nothing says how to turn them on.
	r = e.tide("events", "tail", "a")
	if r.code != exitError || !strings.Contains(r.stderr, "tide: queue a records no task events (they are off by default)") ||
		!strings.Contains(r.stderr, "Turn them on with: tide events on a\n") {
		t.Errorf("tail of a queue without events: exit %d\n%s", r.code, r.stderr)
	}
	r = e.tide("events", "tail", "a", "b", "--json")
	if msg, code := jsonError(t, r); code != exitError || !strings.Contains(msg, "none of the queues a, b records task events") ||
		!strings.Contains(msg, "tide events on a b") {
		t.Errorf("tail of queues without events: %d %q", code, msg)
	}
	// ... and a queue that does not exist is most likely a typo.
	r = e.tide("events", "tail", "nosuch")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) || !strings.Contains(r.stderr, "tide events on nosuch --force") {
		t.Errorf("tail of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
}

func TestEventsTail(t *testing.T) {
	e := setup(t)
	e.tide("events", "on", "q", "--force").want(t, exitOK)
	flowServer(t, e, "q")
	e.enqueue("job", "{}", tide.Queue("q"), tide.TaskID("t1"))

	// --oldest --count: t1's life, in order.
	r := e.tail("q", "--oldest", "--count", "3", "--json")
	r.want(t, exitOK)
	evs := events(t, r.stdout)
	if got := kinds(evs); got != "enqueued:t1 started:t1 succeeded:t1" {
		t.Fatalf("events: %s\n%s", got, r.stdout)
	}
	for _, ev := range evs {
		if ev.Queue != "q" || ev.Type != "job" || ev.Error != "" {
			t.Errorf("event: %+v", ev)
		}
	}
	if id := lastID(t, r); id != evs[2].ID {
		t.Errorf("last ID on stderr %q, want the third event's %q", id, evs[2].ID)
	}

	// The same as text lines.
	r = e.tail("q", "--oldest", "--count", "3")
	r.want(t, exitOK)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	line := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  q  (enqueued |started  |succeeded)  t1  job$`)
	if len(lines) != 3 {
		t.Fatalf("want 3 lines:\n%s", r.stdout)
	}
	for i, want := range []string{"enqueued", "started", "succeeded"} {
		if m := line.FindStringSubmatch(lines[i]); m == nil || strings.TrimSpace(m[1]) != want {
			t.Errorf("line %d is not a %s event: %q", i+1, want, lines[i])
		}
	}
	if !lastIDText.MatchString(strings.Split(r.stderr, "\n")[1]) || lastID(t, r) != evs[2].ID {
		t.Errorf("stderr: %s", r.stderr)
	}

	// --after prints exactly the events after the event given, with or
	// without the queues.
	r = e.tail("q", "--after", evs[0].ID, "--count", "2", "--json")
	r.want(t, exitOK)
	if got := kinds(events(t, r.stdout)); got != "started:t1 succeeded:t1" {
		t.Errorf("after the first event: %s", got)
	}
	e.enqueue("job", "{}", tide.Queue("q"), tide.TaskID("t2"))
	r = e.tail("--after", evs[2].ID, "--count", "3", "--json")
	r.want(t, exitOK)
	after := events(t, r.stdout)
	if got := kinds(after); got != "enqueued:t2 started:t2 succeeded:t2" {
		t.Errorf("after t1's last event: %s", got)
	}
	// Nothing after the last: --timeout ends it, and the last ID is still
	// the one given.
	r = e.tail("q", "--after", after[2].ID, "--timeout", "200ms", "--json")
	r.want(t, exitOK)
	if r.stdout != "" {
		t.Errorf("events after the last one: %s", r.stdout)
	}
	if id := lastID(t, r); id != after[2].ID {
		t.Errorf("last ID %q, want the one given", id)
	}

	// From now, until Ctrl-C: only what happens after the start.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--redis", e.addr, "--prefix", e.prefix, "events", "tail", "q", "--json"}, func(k string) string { return e.vars[k] }, &out, &errb)
	}()
	testwait.For(t, 15*time.Second, "tail to start", func() bool {
		select {
		case code := <-done:
			t.Fatalf("tail exited with %d: %s", code, errb.String())
		default:
		}
		return strings.Contains(errb.String(), "following the task events of queue q from now; Ctrl-C to stop")
	})
	e.enqueue("job", "{}", tide.Queue("q"), tide.TaskID("t3"))
	testwait.For(t, 15*time.Second, "t3's events", func() bool { return strings.Count(out.String(), "\n") >= 3 })
	cancel()
	var code int
	select {
	case code = <-done:
	case <-time.After(tailLimit):
		t.Fatal("tail did not stop when its context ended")
	}
	r = result{code, out.String(), errb.String()}
	r.want(t, exitOK)
	now := events(t, r.stdout)
	if got := kinds(now); got != "enqueued:t3 started:t3 succeeded:t3" {
		t.Errorf("from now: %s", got)
	}
	if id := lastID(t, r); id != now[2].ID {
		t.Errorf("last ID after Ctrl-C %q, want %q", id, now[2].ID)
	}
}

func TestEventsTailEscapes(t *testing.T) {
	e := setup(t)
	const id = "id\u009b2J\u202e"
	const typ = "evil\u202etype\u0085"
	e.tide("events", "on", "q", "--force").want(t, exitOK)
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error { return errors.New(evilErr) })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	e.enqueue(typ, "{}", tide.Queue("q"), tide.TaskID(id), tide.MaxRetry(0))

	r := e.tail("q", "--oldest", "--count", "4")
	r.want(t, exitOK, `id\u009b2J\u202e`, `evil\u202etype\u0085`, `boom\x1b[2J\x1b]0;pwned\x07 \u009b31m\u202egnp.exe second line indented`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("events tail prints %s raw:\n%q", c, r.stdout)
	}
	if n := strings.Count(r.stdout, "\n"); n != 4 {
		t.Errorf("%d lines for 4 events (an error's newline must not start a line):\n%s", n, r.stdout)
	}
	for i, k := range []string{" enqueued ", " started ", " failed ", " archived "} {
		if l := strings.Split(r.stdout, "\n")[i]; !strings.Contains(l, k) {
			t.Errorf("line %d is not %q: %q", i+1, k, l)
		}
	}

	// --json is exact.
	r = e.tail("q", "--oldest", "--count", "4", "--json")
	r.want(t, exitOK)
	evs := events(t, r.stdout)
	if got := kinds(evs); got != "enqueued:"+id+" started:"+id+" failed:"+id+" archived:"+id {
		t.Fatalf("events: %q", got)
	}
	if evs[2].Error != evilErr || evs[2].Type != typ {
		t.Errorf("failed event is not exact: %+v", evs[2])
	}
}

func TestEventsTailGap(t *testing.T) {
	e := setup(t)
	e.tide("events", "on", "g", "--force").want(t, exitOK)
	e.enqueue("t", "{}", tide.Queue("g"), tide.TaskID("first"))
	r := e.tail("g", "--oldest", "--count", "1", "--json")
	r.want(t, exitOK)
	first := events(t, r.stdout)[0].ID

	// A producer that keeps few events trims those that followed.
	small := tide.NewClient(redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithEventRetention(5, 0)))
	defer small.Close()
	for range 400 {
		if _, err := small.Enqueue(context.Background(), tide.NewTask("t", nil), tide.Queue("g")); err != nil {
			t.Fatal(err)
		}
	}
	r = e.tail("g", "--after", first)
	if r.code != exitError || !strings.Contains(r.stderr, "already dropped") || !strings.Contains(r.stderr, "trimmed") ||
		!strings.Contains(r.stderr, "tide events tail g --oldest") {
		t.Errorf("resume across a gap: exit %d\n%s", r.code, r.stderr)
	}
	// --oldest goes on from what is kept.
	r = e.tail("g", "--oldest", "--count", "1", "--json")
	r.want(t, exitOK)
	if evs := events(t, r.stdout); evs[0].Kind != "enqueued" || evs[0].TaskID == "first" {
		t.Errorf("oldest kept after trimming: %+v", evs[0])
	}
}

func TestEventsUsageErrors(t *testing.T) {
	// A real token, made by a reading, to try against other queues.
	e := setup(t)
	e.tide("events", "on", "q", "--force").want(t, exitOK)
	e.enqueue("t", "{}", tide.Queue("q"))
	tok := events(t, e.tail("q", "--oldest", "--count", "1", "--json").stdout)[0].ID

	// Usage errors are found before connecting: Redis is unreachable here.
	dead := closedPort(t)
	singleDash := singleDashFlag()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events"}, "'events' needs a subcommand"},
		{[]string{"events", "frob"}, `unknown command "events frob"`},
		{[]string{"events", "on"}, "usage: tide events on <queue>..."},
		{[]string{"events", "off"}, "usage: tide events off <queue>..."},
		{[]string{"events", "on", "a", "bad queue"}, `queue name "bad queue" has invalid character`},
		{[]string{"events", "on", "a", "--force=maybe"}, `--force is true or false, not "maybe"`},
		{[]string{"events", "tail"}, "give the queues to follow (or --after ID to go on after an event)"},
		{[]string{"events", "tail", "bad{queue}"}, `queue name "bad{queue}"`},
		{[]string{"events", "tail", "q", "--after", tok, "--oldest"}, "give either --after or --oldest, not both"},
		{[]string{"events", "tail", "q", "--after", ""}, "--after is empty"},
		{[]string{"events", "tail", "q", "--after"}, "--after needs a value"},
		{[]string{"events", "tail", "q", "--after", "garbage"}, `--after: invalid event resume token: "garbage" does not start with "e1"`},
		{[]string{"events", "tail", "q", "--after", tok[:len(tok)-2] + "AA"}, "--after: invalid event resume token: checksum mismatch"},
		{[]string{"events", "tail", "other", "--after", tok}, `--after: invalid event resume token: it is for queues ["q"], not ["other"]`},
		{[]string{"events", "tail", "q", "--count", "-1"}, "--count -1 is negative"},
		{[]string{"events", "tail", "q", "--count", "x"}, `--count "x"`},
		{[]string{"events", "tail", "q", "--timeout", "0s"}, "must be positive"},
		{[]string{"events", "tail", "q", "--timeout", "soon"}, `--timeout "soon": invalid duration "soon"`},
		{[]string{"events", "tail", "q", "--since", "1h"}, "unknown flag --since"},
	} {
		r := noEnv(append([]string{"--redis", dead}, c.args...)...)
		if r.code != exitUsage {
			t.Errorf("tide %s: exit %d, want 2\n%s", strings.Join(c.args, " "), r.code, r.stderr)
			continue
		}
		if !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help' for usage") {
			t.Errorf("tide %s: stderr lacks %q:\n%s", strings.Join(c.args, " "), c.want, r.stderr)
		}
		if m := singleDash.FindString(r.stderr); m != "" {
			t.Errorf("tide %s: stderr names a flag with one dash (%q):\n%s", strings.Join(c.args, " "), m, r.stderr)
		}
	}
	// With --json the error is JSON too.
	r := noEnv("--redis", dead, "events", "tail", "q", "--after", "garbage", "--json")
	if msg, code := jsonError(t, r); code != exitUsage || !strings.Contains(msg, "--after: invalid event resume token") {
		t.Errorf("--json: %d %q", code, msg)
	}
}

// TestEventsTailStopsOnContext: a tail with nothing to print ends with its
// context (Ctrl-C), and says it saw no events.
func TestEventsTailStopsOnContext(t *testing.T) {
	e := setup(t)
	e.tide("events", "on", "quiet", "--force").want(t, exitOK)
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	defer once.Do(cancel)
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--redis", e.addr, "--prefix", e.prefix, "events", "tail", "quiet"}, func(k string) string { return e.vars[k] }, &out, &errb)
	}()
	testwait.For(t, 15*time.Second, "tail to start", func() bool { return strings.Contains(errb.String(), "following the task events of queue quiet") })
	once.Do(cancel)
	select {
	case code := <-done:
		if code != exitOK || out.String() != "" || !strings.HasSuffix(errb.String(), "tide: no events\n") {
			t.Errorf("exit %d\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
		}
	case <-time.After(tailLimit):
		t.Fatal("tail did not stop when its context ended")
	}
}
