package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// env is a Redis with a key prefix of the test's own, and a client and
// inspector on it to arrange and check what the commands do.
type env struct {
	t      *testing.T
	addr   string
	prefix string
	b      *redisbroker.Broker
	c      *tide.Client
	in     *tide.Inspector
	vars   map[string]string
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopSQLServers()
	os.Exit(code)
}

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, addr: redistest.Addr(t), prefix: redistest.Prefix(t), vars: map[string]string{}}
	e.b = redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix))
	e.c = tide.NewClient(e.b)
	e.in = tide.NewInspector(e.b)
	return e
}

type result struct {
	code           int
	stdout, stderr string
}

// tide runs the command line against the env's Redis and prefix.
func (e *env) tide(args ...string) result {
	e.t.Helper()
	return e.tideCtx(context.Background(), args...)
}

func (e *env) tideCtx(ctx context.Context, args ...string) result {
	e.t.Helper()
	var out, errb testlog.Buffer
	full := append([]string{"--redis", e.addr, "--prefix", e.prefix}, args...)
	code := run(ctx, full, func(k string) string { return e.vars[k] }, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// noEnv runs a command line with an empty environment and no Redis flags.
func noEnv(args ...string) result {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, func(string) string { return "" }, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func (e *env) enqueue(typ, payload string, opts ...tide.Option) *tide.TaskInfo {
	e.t.Helper()
	info, err := e.c.Enqueue(context.Background(), tide.NewTask(typ, []byte(payload)), opts...)
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return info
}

func (r result) want(t *testing.T, code int, stdout ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
		}
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestHelp(t *testing.T) {
	r := noEnv("--help")
	r.want(t, exitOK, "Usage:", "Commands:", "Exit codes:", "3  the task, queue, workflow or batch was not found", "Examples:", "tasks", "TIDE_REDIS_ADDR")
	if r.stderr != "" {
		t.Errorf("stderr: %s", r.stderr)
	}
	noEnv("help").want(t, exitOK, "Commands:")
	noEnv("help", "tasks").want(t, exitOK, "Subcommands:", "archive")
	noEnv("tasks", "--help").want(t, exitOK, "Subcommands:")
	for _, c := range commands {
		args := append(strings.Fields(c.name), "--help")
		r := noEnv(args...)
		r.want(t, exitOK, "Usage: tide "+c.name, "Example")
		if r2 := noEnv(append([]string{"help"}, strings.Fields(c.name)...)...); r2.stdout != r.stdout {
			t.Errorf("'tide help %s' differs from 'tide %s --help'", c.name, c.name)
		}
	}
	noEnv("tasks", "ls", "-h").want(t, exitOK, "--state state", "--page N", "(default 20)")
}

func TestUsageErrors(t *testing.T) {
	// Usage errors are found before connecting: Redis is unreachable here.
	dead := closedPort(t)
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus", "queues"}, "-bogus"},
		{[]string{"tasks"}, "'tasks' needs a subcommand"},
		{[]string{"tasks", "frob"}, `unknown command "tasks frob"`},
		{[]string{"tasks", "ls"}, "usage: tide tasks ls <queue>"},
		{[]string{"tasks", "ls", "a", "b"}, "usage: tide tasks ls <queue>"},
		{[]string{"tasks", "ls", "q", "--state", "bogus"}, `--state "bogus": must be one of pending, active`},
		{[]string{"tasks", "ls", "q", "--page", "0"}, "--page 0: pages start at 1"},
		{[]string{"tasks", "ls", "q", "--size", "5000"}, "--size 5000: must be between 1 and 1000"},
		{[]string{"tasks", "ls", "bad queue"}, `queue name "bad queue" has invalid character`},
		{[]string{"tasks", "show", "q"}, "usage: tide tasks show <queue> <id>"},
		{[]string{"tasks", "delete", "q"}, "give a task ID, or --all --state S"},
		{[]string{"tasks", "delete", "q", "--all"}, "--state is required (one of pending, scheduled, retry, archived, completed, waiting)"},
		{[]string{"tasks", "delete", "q", "id", "--all", "--state", "pending"}, "give either a task ID or --all, not both"},
		{[]string{"tasks", "delete", "q", "id", "--state", "pending"}, "--state only goes with --all"},
		{[]string{"tasks", "delete", "q", "--all", "--state", "active"}, `--state "active": must be one of`},
		{[]string{"tasks", "run", "q", "--all", "--state", "pending"}, "must be one of scheduled, retry, archived"},
		{[]string{"tasks", "archive", "q", "--all", "--state", "archived"}, "must be one of pending, scheduled, retry"},
		{[]string{"stats", "--count", "3"}, "--count needs --watch"},
		{[]string{"stats", "--watch", "--interval", "0s"}, "must be positive"},
		{[]string{"stats", "--watch", "--interval", "soon"}, `invalid duration "soon"`},
		{[]string{"--partitions", "0", "queues"}, "--partitions 0 must be between 1 and 1024"},
		{[]string{"queues", "extra"}, "usage: tide queues"},
		{[]string{"pause"}, "usage: tide pause <queue>"},
		{[]string{"serve"}, "serve needs a token"},
		{[]string{"serve", "--token", "short"}, "token 1 is 5 characters"},
		{[]string{"serve", "--token", "0123456789abcdef0123", "--webhook-secret", "0123456789abcdef0123"}, "a webhook secret needs --webhook-allow"},
		{[]string{"serve", "--token", "0123456789abcdef0123", "--webhook-allow", "a.com"}, "--webhook-allow needs a webhook secret"},
		{[]string{"serve", "--token", "0123456789abcdef0123", "--webhook-secret", "short", "--webhook-allow", "a.com"}, "Secret is 5 bytes"},
		{[]string{"serve", "--token", "0123456789abcdef0123", "--webhook-secret", "0123456789abcdef0123", "--webhook-allow", "https://a.com/"}, "give a host name"},
		{[]string{"--redis", "redis://:pa55word@[bad", "queues"}, "--redis is not a valid redis:// URL"},
		// Flag errors name flags with two dashes, as the help does.
		{[]string{"--bogus", "queues"}, "unknown flag --bogus"},
		{[]string{"tasks", "ls", "q", "-bogus"}, "unknown flag --bogus"},
		{[]string{"tasks", "ls", "q", "--state"}, "--state needs a value"},
		{[]string{"stats", "--watch", "--interval", "soon"}, `--interval "soon": invalid duration "soon"`},
		{[]string{"tasks", "delete", "q", "--all=maybe", "--state", "archived"}, `--all is true or false, not "maybe"`},
		// Plurals are right.
		{[]string{"serve", "--token", "x"}, "token 1 is 1 character;"},
		// dash checks its token like serve, before connecting.
		{[]string{"dash", "--token", "short"}, "the token is 5 characters; use at least 16"},
	}
	singleDash := singleDashFlag()
	for _, c := range cases {
		args := append([]string{"--redis", dead}, c.args...)
		if len(c.args) > 1 && c.args[0] == "--redis" {
			args = c.args
		}
		r := noEnv(args...)
		if r.code != exitUsage {
			t.Errorf("tide %s: exit %d, want 2\n%s", strings.Join(c.args, " "), r.code, r.stderr)
			continue
		}
		if !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help' for usage") {
			t.Errorf("tide %s: stderr lacks %q:\n%s", strings.Join(c.args, " "), c.want, r.stderr)
		}
		if strings.Contains(r.stderr, "pa55word") {
			t.Errorf("the Redis password is echoed: %s", r.stderr)
		}
		if m := singleDash.FindString(r.stderr); m != "" {
			t.Errorf("tide %s: stderr names a flag with one dash (%q):\n%s", strings.Join(c.args, " "), m, r.stderr)
		}
	}
	// TIDE_DASH_TOKEN is checked like --token.
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--redis", dead, "dash"}, func(k string) string {
		if k == "TIDE_DASH_TOKEN" {
			return "short"
		}
		return ""
	}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "the token is 5 characters") {
		t.Errorf("dash with a short TIDE_DASH_TOKEN: exit %d: %s", code, errb.String())
	}
}

// singleDashFlag matches a tide flag named with one dash ("-state"), as the
// flag package words its errors.
func singleDashFlag() *regexp.Regexp {
	names := map[string]bool{}
	add := func(fs *flag.FlagSet) { fs.VisitAll(func(f *flag.Flag) { names[regexp.QuoteMeta(f.Name)] = true }) }
	for _, c := range commands {
		add(c.flagSet(&cmdOpts{}))
	}
	var g globals
	top := flag.NewFlagSet("", flag.ContinueOnError)
	g.register(top)
	add(top)
	names["bogus"] = true
	return regexp.MustCompile(`(^|[^-\w])-(` + strings.Join(slices.Sorted(maps.Keys(names)), "|") + `)\b`)
}

func TestUnreachableRedis(t *testing.T) {
	dead := closedPort(t)
	start := time.Now()
	r := noEnv("--redis", dead, "queues")
	if r.code != exitError {
		t.Fatalf("exit %d, want 1: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "tide: cannot reach Redis at "+dead) || !strings.Contains(r.stderr, "TIDE_REDIS_ADDR") {
		t.Errorf("stderr: %s", r.stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to give up", d)
	}
	// The environment variable is used, and a URL's password is not shown.
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"queues"}, func(k string) string {
		if k == "TIDE_REDIS_ADDR" {
			return "redis://:pa55word@" + dead + "/0"
		}
		return ""
	}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "cannot reach Redis at "+dead) || strings.Contains(errb.String(), "pa55word") {
		t.Errorf("TIDE_REDIS_ADDR URL: exit %d: %s", code, errb.String())
	}
}

func TestQueues(t *testing.T) {
	e := setup(t)
	e.enqueue("email:send", `{"to":"ann"}`, tide.Queue("emails"))
	e.enqueue("email:send", `{"to":"bob"}`, tide.Queue("emails"))
	e.enqueue("order:cancel", `{"id":42}`, tide.Queue("orders"), tide.ProcessIn(time.Hour))
	if err := e.in.PauseQueue(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}

	r := e.tide("queues")
	r.want(t, exitOK, "QUEUE", "PAUSED", "PENDING", "SCHEDULED", "PROCESSED TODAY", "LATENCY")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", r.stdout)
	}
	if f := strings.Fields(lines[1]); f[0] != "emails" || f[1] != "no" || f[2] != "2" {
		t.Errorf("emails row: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "orders" || f[1] != "yes" || f[2] != "0" || f[4] != "1" {
		t.Errorf("orders row: %q", lines[2])
	}

	r = e.tide("queues", "--json")
	r.want(t, exitOK)
	var qs []queueJSON
	if err := json.Unmarshal([]byte(r.stdout), &qs); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if len(qs) != 2 || qs[0].Queue != "emails" || qs[0].Pending != 2 || qs[0].Size != 2 ||
		qs[1].Queue != "orders" || !qs[1].Paused || qs[1].Scheduled != 1 {
		t.Errorf("--json: %+v", qs)
	}

	// --json before the command works too; an empty prefix says so.
	e2 := setup(t)
	e2.tide("--json", "queues").want(t, exitOK, "[]")
	e2.tide("queues").want(t, exitOK, "No queues under prefix")
}

func TestTasksListAndShow(t *testing.T) {
	e := setup(t)
	e.enqueue("order:cancel", `{"order_id":42}`, tide.Queue("orders"), tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute))
	e.enqueue("order:cancel", "\x00\x01binary", tide.Queue("orders"), tide.TaskID("bin"), tide.ProcessIn(time.Hour))
	for i := range 3 {
		e.enqueue("email:send", `{}`, tide.Queue("orders"), tide.TaskID("p"+strconv.Itoa(i)))
	}

	e.tide("tasks", "ls", "orders").want(t, exitOK, "ID", "TYPE", "READY", "p0", "p1", "p2", "email:send", "0/25")
	r := e.tide("tasks", "ls", "orders", "--state", "scheduled")
	r.want(t, exitOK, "DUE", "order-cancel:42", "in 1")
	if strings.Contains(r.stdout, "p0") {
		t.Errorf("pending task listed as scheduled:\n%s", r.stdout)
	}
	// Paging: a full page points to the next one.
	e.tide("tasks", "ls", "orders", "--size", "2").want(t, exitOK, "Next: tide tasks ls orders --state pending --page 2 --size 2")
	r = e.tide("tasks", "ls", "orders", "--size", "2", "--page", "2")
	r.want(t, exitOK, "p2")
	e.tide("tasks", "ls", "orders", "--page", "9").want(t, exitOK, "No pending tasks in queue orders on page 9")
	e.tide("tasks", "ls", "orders", "--state", "retry").want(t, exitOK, "No retry tasks in queue orders.")

	r = e.tide("tasks", "ls", "orders", "--state", "scheduled", "--json")
	r.want(t, exitOK)
	var ts []gateway.Task
	if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	var payload bytes.Buffer
	if len(ts) == 2 {
		_ = json.Compact(&payload, ts[0].Payload)
	}
	if len(ts) != 2 || ts[0].ID != "order-cancel:42" || payload.String() != `{"order_id":42}` || ts[0].State != "scheduled" {
		t.Errorf("--json: %+v", ts)
	}

	r = e.tide("tasks", "show", "orders", "order-cancel:42")
	r.want(t, exitOK, "ID:", "order-cancel:42", "State:", "scheduled", "Retried:", "0 of 25", `{"order_id":42}  (JSON, 15 bytes)`, "Last error:")
	e.tide("tasks", "show", "orders", "bin").want(t, exitOK, "(base64, 8 bytes)")
	r = e.tide("tasks", "show", "orders", "order-cancel:42", "--json")
	var one gateway.Task
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || one.ID != "order-cancel:42" || one.NextProcessAt == nil {
		t.Errorf("show --json: %v %s", err, r.stdout)
	}

	// Not found: exit 3, for a task and for a queue.
	r = e.tide("tasks", "show", "orders", "nope")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `tide: no task "nope" in queue "orders"`) {
		t.Errorf("show missing: %d %s", r.code, r.stderr)
	}
	r = e.tide("tasks", "ls", "ordrs")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "ordrs"`) || !strings.Contains(r.stderr, "queues: orders") {
		t.Errorf("ls missing queue: %d %s", r.code, r.stderr)
	}
}

func TestTaskActions(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	state := func(id string) string {
		ti, err := e.in.GetTaskInfo(ctx, "q", id)
		if err != nil {
			return "gone"
		}
		return ti.State.String()
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		e.enqueue("t", "{}", tide.Queue("q"), tide.TaskID(id), tide.ProcessIn(time.Hour))
	}

	e.tide("tasks", "archive", "q", "a").want(t, exitOK, "Task a in queue q archived.")
	if s := state("a"); s != "archived" {
		t.Fatalf("a is %s", s)
	}
	e.tide("tasks", "run", "q", "a").want(t, exitOK, "Task a in queue q made pending.")
	if s := state("a"); s != "pending" {
		t.Fatalf("a is %s", s)
	}
	e.tide("tasks", "delete", "q", "a").want(t, exitOK, "Task a in queue q deleted.")
	if s := state("a"); s != "gone" {
		t.Fatalf("a is %s", s)
	}
	r := e.tide("tasks", "delete", "q", "a")
	if r.code != exitNotFound {
		t.Errorf("deleting a deleted task: exit %d %s", r.code, r.stderr)
	}
	// Running a pending task is refused by the broker: exit 1.
	e.tide("tasks", "run", "q", "b").want(t, exitOK)
	r = e.tide("tasks", "run", "q", "b")
	if r.code != exitError || !strings.Contains(r.stderr, "tide: ") {
		t.Errorf("run of a pending task: exit %d %s", r.code, r.stderr)
	}

	e.tide("tasks", "archive", "q", "--all", "--state", "scheduled").want(t, exitOK, "Archived 2 tasks (scheduled) in queue q.")
	r = e.tide("tasks", "run", "q", "--all", "--state", "archived", "--json")
	r.want(t, exitOK)
	var res struct {
		Count int    `json:"count"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Count != 2 || res.State != "archived" {
		t.Errorf("run --all --json: %v %s", err, r.stdout)
	}
	e.tide("tasks", "delete", "q", "--all", "--state", "pending").want(t, exitOK, "Deleted 3 tasks (pending) in queue q.")
	if qi, _ := e.in.QueueInfo(ctx, "q"); qi.Size != 0 {
		t.Errorf("queue still holds %d tasks", qi.Size)
	}

	// cancel: only running tasks.
	e.enqueue("t", "{}", tide.Queue("q"), tide.TaskID("e"))
	r = e.tide("tasks", "cancel", "q", "e")
	if r.code != exitError || !strings.Contains(r.stderr, `task "e" is pending, not running`) {
		t.Errorf("cancel of a pending task: exit %d %s", r.code, r.stderr)
	}
	r = e.tide("tasks", "cancel", "q", "zzz")
	if r.code != exitNotFound {
		t.Errorf("cancel of a missing task: exit %d %s", r.code, r.stderr)
	}
}

func TestCancelRunningTask(t *testing.T) {
	e := setup(t)
	started := make(chan struct{})
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(ctx context.Context, _ *tide.Task) error {
		close(started)
		<-ctx.Done()
		return context.Cause(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	e.enqueue("slow", "{}", tide.Queue("q"), tide.TaskID("slow"))
	<-started

	r := e.tide("tasks", "delete", "q", "slow")
	if r.code != exitError || !strings.Contains(r.stderr, "it is running; cancel it first with 'tide tasks cancel q slow'") {
		t.Errorf("delete of a running task: exit %d %s", r.code, r.stderr)
	}
	e.tide("servers").want(t, exitOK, "ID", "HOST", "q=1", "/10")

	e.tide("tasks", "cancel", "q", "slow").want(t, exitOK, "Cancellation of task slow in queue q requested.")
	testwait.Until(t, 10*time.Second, func() error {
		ti, err := e.in.GetTaskInfo(context.Background(), "q", "slow")
		if err == nil && ti.State == tide.StateArchived {
			return nil
		}
		return fmt.Errorf("the cancelled task was not archived: %+v %v", ti, err)
	})
}

func TestServers(t *testing.T) {
	e := setup(t)
	e.tide("servers").want(t, exitOK, "No live servers.")
	started := time.Now().Add(-time.Hour)
	err := e.b.RegisterServer(context.Background(), tidetype.ServerInfo{
		ID: "web-1:42:abc", Host: "web-1", PID: 42, Concurrency: 20, Queues: map[string]int{"critical": 6, "default": 3},
		StrictPriority: true, StartedAt: started,
		Active: []tidetype.ActiveTask{{Queue: "critical", ID: "pay-7", Type: "payment:capture", StartedAt: time.Now().Add(-3 * time.Second)}},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.tide("servers").want(t, exitOK, "web-1:42:abc", "critical=6,default=3 (strict)", "1/20", "1h0m ago",
		"SERVER", "RUNNING FOR", "pay-7", "payment:capture", "3")
	r := e.tide("servers", "--json")
	var ss []serverJSON
	if err := json.Unmarshal([]byte(r.stdout), &ss); err != nil || len(ss) != 1 || !ss[0].Strict || ss[0].Queues["critical"] != 6 ||
		len(ss[0].Active) != 1 || ss[0].Active[0].ID != "pay-7" {
		t.Errorf("servers --json: %v %s", err, r.stdout)
	}
}

func TestPauseUnpause(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("q"))
	paused := func() bool {
		qi, err := e.in.QueueInfo(context.Background(), "q")
		if err != nil {
			t.Fatal(err)
		}
		return qi.Paused
	}
	e.tide("pause", "q").want(t, exitOK, "Queue q paused.")
	if !paused() {
		t.Fatal("not paused")
	}
	e.tide("unpause", "q", "--json").want(t, exitOK, `"paused": false`)
	if paused() {
		t.Fatal("still paused")
	}
	// A queue without tasks yet is refused (most likely a typo that would
	// leave a hidden pause), with the known queues and the way out.
	r := e.tide("pause", "later")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "later"`) || !strings.Contains(r.stderr, "(queues: q)") ||
		!strings.Contains(r.stderr, "--force") {
		t.Errorf("pause of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	if r := e.tide("unpause", "nosuch"); r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) {
		t.Errorf("unpause of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	// Neither touched the queues (any change would have recorded them).
	if qs, err := e.in.Queues(context.Background()); err != nil || !slices.Equal(qs, []string{"q"}) {
		t.Fatalf("queues after the refusals: %q %v", qs, err)
	}
	// With --force it can be paused (before its first task), with a note.
	r = e.tide("pause", "later", "--force")
	r.want(t, exitOK, "Queue later paused.")
	if !strings.Contains(r.stderr, `note: no queue "later"`) {
		t.Errorf("stderr: %s", r.stderr)
	}
	if qi, err := e.in.QueueInfo(context.Background(), "later"); err != nil || !qi.Paused {
		t.Fatalf("--force did not pause: %+v %v", qi, err)
	}
	// That pause can be lifted without --force: the queue is known now.
	e.tide("unpause", "later").want(t, exitOK, "Queue later unpaused.")
	if qi, err := e.in.QueueInfo(context.Background(), "later"); err != nil || qi.Paused {
		t.Fatalf("still paused: %+v %v", qi, err)
	}
}

func TestStats(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("q"))
	e.tide("stats").want(t, exitOK, "QUEUE", "PROCESSED", "ERROR RATE", "q")

	r := e.tide("stats", "--watch", "--count", "3", "--interval", "10ms")
	r.want(t, exitOK)
	if n := strings.Count(r.stdout, "QUEUE"); n != 3 {
		t.Errorf("%d tables, want 3:\n%s", n, r.stdout)
	}
	if strings.Contains(r.stdout, "\x1b[") {
		t.Error("the screen is cleared though stdout is not a terminal")
	}

	r = e.tide("stats", "--watch", "--count", "2", "--interval", "10ms", "--json")
	r.want(t, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), r.stdout)
	}
	for i, l := range lines {
		var s statsJSON
		if err := json.Unmarshal([]byte(l), &s); err != nil || len(s.Queues) != 1 || s.Queues[0].Pending != 1 {
			t.Errorf("line %d: %v %s", i, err, l)
		}
		if (s.Queues[0].PerSecond != nil) != (i > 0) {
			t.Errorf("line %d: processed_per_second %v", i, s.Queues[0].PerSecond)
		}
	}

	// Without --count, --watch runs until the context ends (SIGINT in main).
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	r = e.tideCtx(ctx, "stats", "--watch", "--interval", "20ms")
	r.want(t, exitOK, "Ctrl-C to stop")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("--watch ran %v after its context ended", d)
	}
}

func TestCronLs(t *testing.T) {
	e := setup(t)
	e.tide("cron", "ls").want(t, exitOK, "No periodic tasks")
	next := time.Now().Add(150 * time.Minute).Truncate(time.Second)
	err := e.b.RegisterSchedulerEntries(context.Background(), "sched-1", []tidetype.SchedulerEntry{
		{SchedulerID: "sched-1", ID: "nightly", Spec: "0 3 * * *", Type: "report:nightly", Queue: "reports", Next: next},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.tide("cron", "ls").want(t, exitOK, "SPEC", "nightly", "0 3 * * *", "report:nightly", "reports", "in 2h30m", "sched-1")
	r := e.tide("cron", "list", "--json")
	var es []cronJSON
	if err := json.Unmarshal([]byte(r.stdout), &es); err != nil || len(es) != 1 || !es[0].Next.Equal(next) || es[0].Prev != nil {
		t.Errorf("cron ls --json: %v %s", err, r.stdout)
	}
}

func TestPartitionsAreReadFromRedis(t *testing.T) {
	e := setup(t)
	b4 := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithPartitions(4))
	c4 := tide.NewClient(b4)
	for i := range 20 {
		if _, err := c4.Enqueue(context.Background(), tide.NewTask("t", nil), tide.Queue("wide"), tide.TaskID("id"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Without --partitions 4 every task is still found.
	for i := range 20 {
		e.tide("tasks", "show", "wide", "id"+strconv.Itoa(i)).want(t, exitOK)
	}
	r := e.tide("queues", "--json")
	var qs []queueJSON
	if err := json.Unmarshal([]byte(r.stdout), &qs); err != nil || len(qs) != 1 || qs[0].Pending != 20 {
		t.Errorf("queues: %v %s", err, r.stdout)
	}
}

func TestParseInterleaved(t *testing.T) {
	var o cmdOpts
	fs := cmdTasksLs.flagSet(&o)
	pos, err := parseInterleaved(fs, []string{"orders", "--state", "retry", "--size=5", "--", "--page"})
	if err != nil || len(pos) != 2 || pos[0] != "orders" || pos[1] != "--page" || o.state != "retry" || o.size != 5 {
		t.Errorf("got %q %+v %v", pos, o, err)
	}
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 850 * time.Millisecond: "850ms", 4240 * time.Millisecond: "4.2s", 59990 * time.Millisecond: "1m0s",
		192 * time.Second: "3m12s", time.Hour - time.Millisecond: "1h0m", 5*time.Hour + 3*time.Minute: "5h3m",
		52 * time.Hour: "2d4h", -time.Second: "0s",
	} {
		if got := short(d); got != want {
			t.Errorf("short(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestQueuesRepartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 30 {
		e.enqueue("job", fmt.Sprint(i), tide.Queue("orders"), tide.ProcessIn(time.Hour), tide.TaskID(fmt.Sprint("o-", i)))
	}
	if r := e.tide("queues", "repartition", "orders", "0"); r.code != exitUsage || !strings.Contains(r.stderr, "must be a number from 1 to 1024") {
		t.Fatalf("bad count: %d %s", r.code, r.stderr)
	}
	if r := e.tide("queues", "repartition", "nosuch", "4"); r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) {
		t.Fatalf("unknown queue: %d %s", r.code, r.stderr)
	}
	e.tide("queues", "repartition", "orders", "4").want(t, exitOK, "Queue orders now has 4 partitions.")
	fresh := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix))
	if n, err := fresh.Partitions(context.Background(), "orders"); err != nil || n != 4 {
		t.Fatalf("partitions after the command: %d, %v", n, err)
	}
	for i := range 30 {
		if ti, err := e.in.GetTaskInfo(context.Background(), "orders", fmt.Sprint("o-", i)); err != nil || ti.State != tide.StateScheduled {
			t.Fatalf("task o-%d after the repartition: %+v, %v", i, ti, err)
		}
	}
	r := e.tide("queues")
	if r.code != exitOK || !strings.Contains(r.stdout, "orders") {
		t.Fatalf("tide queues after the repartition: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// One partition is "1 partition".
	e.tide("queues", "repartition", "orders", "1").want(t, exitOK, "Queue orders now has 1 partition.\n")
}

// evilErr is an error a handler might return with text from outside: ESC
// sequences that clear the screen and set the window title, BEL, a carriage
// return, a C1 CSI (U+009B) and a right-to-left override.
const evilErr = "boom\x1b[2J\x1b]0;pwned\x07\r\u009b31m\u202egnp.exe\nsecond line\tindented"

// rawControls reports the first character in s that a terminal would act
// on: the ones evilErr and the test's other strings hold, and bytes that are
// not UTF-8 (0x9b alone is CSI to an 8-bit terminal).
func rawControls(s string) string {
	if i := strings.IndexAny(s, "\x1b\x07\r\u009b\u0085\u202e\u2066"); i >= 0 {
		return strconv.QuoteToASCII(s[i:min(i+12, len(s))])
	}
	if !utf8.ValidString(s) {
		return "a byte that is not UTF-8"
	}
	return ""
}

func TestEscapesStoredText(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const typ = "evil\u202etype\u0085"
	const id = "id\u009b2J"
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(context.Context, *tide.Task) error {
		return errors.New(evilErr)
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	task := tide.NewTask(typ, []byte("{\"note\":\"\u202eevil\u2066\"}"))
	task.Headers()["x-evil"] = "\x1b]0;title\x07\x9b"
	if _, err := e.c.Enqueue(ctx, task, tide.Queue("q"), tide.TaskID(id), tide.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the failed task to be archived", func() bool {
		ti, err := e.in.GetTaskInfo(ctx, "q", id)
		return err == nil && ti.State == tide.StateArchived
	})

	r := e.tide("tasks", "ls", "q", "--state", "archived")
	r.want(t, exitOK, `id\u009b2J`, `evil\u202etype\u0085`, `boom\x1b[2J\x1b]0;pwned\x07 \u009b31m\u202egnp.exe …`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("tasks ls prints %s raw:\n%q", c, r.stdout)
	}
	r = e.tide("tasks", "show", "q", id)
	r.want(t, exitOK, `id\u009b2J`, `evil\u202etype\u0085`, `x-evil: \x1b]0;title\x07\x9b`, `\u202eevil\u2066`,
		"Last error:\n  boom\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\u009b31m\\u202egnp.exe\n  second line\tindented\n")
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("tasks show prints %s raw:\n%q", c, r.stdout)
	}
	// --json stays exact: JSON escapes control characters itself.
	r = e.tide("tasks", "show", "q", id, "--json")
	var one gateway.Task
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || one.LastError != evilErr || one.Type != typ || one.ID != id {
		t.Errorf("show --json is not exact: %v\n%s", err, r.stdout)
	}

	// Servers, periodic tasks and queue names come from Redis too.
	err := e.b.RegisterServer(ctx, tidetype.ServerInfo{
		ID: "srv\x1b[8m", Host: "web\x1b]0;x\x07", PID: 1, Concurrency: 1, Queues: map[string]int{"q": 1}, StartedAt: time.Now(),
		Active: []tidetype.ActiveTask{{Queue: "q", ID: id, Type: typ, StartedAt: time.Now()}},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r = e.tide("servers")
	r.want(t, exitOK, `web\x1b]0;x\x07`, `srv\x1b[8m`, `evil\u202etype\u0085`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("servers prints %s raw:\n%q", c, r.stdout)
	}
	err = e.b.RegisterSchedulerEntries(ctx, "sched\u202e", []tidetype.SchedulerEntry{
		{SchedulerID: "sched\u202e", ID: "n\x1b[2J", Spec: "@every 1h", Type: typ, Queue: "q", Next: time.Now().Add(time.Hour)},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r = e.tide("cron", "ls")
	r.want(t, exitOK, `n\x1b[2J`, `sched\u202e`)
	if c := rawControls(r.stdout); c != "" {
		t.Errorf("cron ls prints %s raw:\n%q", c, r.stdout)
	}
	// A queue name that only a direct write to Redis could make: listed,
	// and named in the error about an unknown queue.
	if err := redistest.Client(t, e.addr).SAdd(ctx, e.prefix+":queues", "q\x1b]0;x\x07").Err(); err != nil {
		t.Fatal(err)
	}
	r = e.tide("queues")
	if r.code != exitError || !strings.Contains(r.stderr, `queue q\x1b]0;x\x07`) {
		t.Errorf("queues with an invalid queue name: exit %d\n%s", r.code, r.stderr)
	}
	if c := rawControls(r.stderr); c != "" {
		t.Errorf("the error prints %s raw:\n%q", c, r.stderr)
	}
	r = e.tide("tasks", "ls", "nosuch")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `q\x1b]0;x\x07`) {
		t.Errorf("tasks ls of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	if c := rawControls(r.stderr); c != "" {
		t.Errorf("the error prints %s raw:\n%q", c, r.stderr)
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain text: é, 日本, ✓, emoji 🙂, a\\x1b backslash": "plain text: é, 日本, ✓, emoji 🙂, a\\x1b backslash",
		"\x1b[31mred\x1b[0m":           `\x1b[31mred\x1b[0m`,
		"\x00\x07\x08\x7f":             `\x00\x07\x08\x7f`,
		"a\tb\nc\rd":                   `a\x09b\x0ac\x0dd`,
		"\u0085\u009b":                 `\u0085\u009b`,
		"\u202eabc\u202c \u2066\u2069": `\u202eabc\u202c \u2066\u2069`,
		"zero\u200bwidth\u200d\ufeff":  `zero\u200bwidth\u200d\ufeff`,
		"line\u2028para\u2029":         `line\u2028para\u2029`,
		"tag\U000e0041":                `tag\U000e0041`,
		"bad \xff\x9b byte, ok \ufffd": `bad \xff\x9b byte, ok ` + "\ufffd",
	} {
		if got := escape(in); got != want {
			t.Errorf("escape(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := escapeLines("panic: x\r\n\tmain.go:1\x1b[2J\rover"), "panic: x\n\tmain.go:1\\x1b[2J\\x0dover"; got != want {
		t.Errorf("escapeLines = %q, want %q", got, want)
	}
	// Table cells: tabs and newlines become spaces (they would break the
	// columns), the rest is escaped.
	var b strings.Builder
	tb := newTable(&b)
	tb.row("a\tb\nc\x1b[2J")
	tb.flush()
	if got := b.String(); got != "a b c\\x1b[2J\n" {
		t.Errorf("table row: %q", got)
	}
}

// jsonError parses stderr as the one JSON object errors are with --json.
func jsonError(t *testing.T, r result) (msg string, code int) {
	t.Helper()
	var e struct {
		Error *string `json:"error"`
		Code  *int    `json:"code"`
	}
	dec := json.NewDecoder(strings.NewReader(r.stderr))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == nil || e.Code == nil || dec.More() {
		t.Fatalf("stderr is not one JSON object {\"error\", \"code\"} (%v):\n%s", err, r.stderr)
	}
	if *e.Code != r.code {
		t.Errorf("code %d in JSON, exit code %d", *e.Code, r.code)
	}
	return *e.Error, *e.Code
}

func TestJSONErrors(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("orders"))
	dead := closedPort(t)

	r := e.tide("--json", "tasks", "show", "orders", "nope")
	if msg, code := jsonError(t, r); code != exitNotFound || !strings.HasPrefix(msg, `no task "nope" in queue "orders"`) {
		t.Errorf("not found: %d %q", code, msg)
	}
	if r.stdout != "" {
		t.Errorf("stdout: %s", r.stdout)
	}
	r = e.tide("pause", "ordrs", "--json")
	if msg, code := jsonError(t, r); code != exitNotFound || !strings.Contains(msg, "(queues: orders)") {
		t.Errorf("pause of an unknown queue: %d %q", code, msg)
	}
	r = noEnv("--redis", dead, "--json", "queues")
	if msg, code := jsonError(t, r); code != exitError || !strings.Contains(msg, "cannot reach Redis at "+dead) {
		t.Errorf("unreachable Redis: %d %q", code, msg)
	}
	for _, args := range [][]string{
		{"--json", "--bogus", "queues"}, // before the flags are parsed
		{"tasks", "ls", "q", "--size", "0", "--json"},
		{"--json"}, // no command: no help text either
		{"--json", "tasks"},
	} {
		r = noEnv(append([]string{"--redis", dead}, args...)...)
		if _, code := jsonError(t, r); code != exitUsage {
			t.Errorf("tide %s: code %d", strings.Join(args, " "), code)
		}
	}
	// Without --json, errors stay text.
	r = e.tide("tasks", "show", "orders", "nope")
	if r.code != exitNotFound || !strings.HasPrefix(r.stderr, `tide: no task "nope"`) {
		t.Errorf("text error: %d %s", r.code, r.stderr)
	}
}

func TestVersion(t *testing.T) {
	// Test binaries, like builds from a source checkout, have no module
	// version: "(devel)".
	r := noEnv("version")
	r.want(t, exitOK, "tide (devel), built with "+runtime.Version()+" for "+runtime.GOOS+"/"+runtime.GOARCH)
	r = noEnv("version", "--json")
	r.want(t, exitOK)
	var v versionJSON
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version != "(devel)" || v.Go != runtime.Version() ||
		v.OS != runtime.GOOS || v.Arch != runtime.GOARCH {
		t.Errorf("version --json: %v %s", err, r.stdout)
	}
	noEnv("version", "extra").want(t, exitUsage)
}
