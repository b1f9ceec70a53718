package tide_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // CRON_TZ=Asia/Kolkata without the system's zone files

	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// logCounter is a slog.Handler that counts records by message.
type logCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func newLogCounter() *logCounter { return &logCounter{n: make(map[string]int)} }

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}

// count returns how many records have a message containing sub.
func (h *logCounter) count(sub string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.n {
		if strings.Contains(m, sub) {
			n += c
		}
	}
	return n
}

const (
	logEnqueued = "cron tick enqueued"
	logConflict = "cron tick already enqueued"
)

// tickOf parses the tick out of a cron task ID of entry.
func tickOf(t *testing.T, entry, id string) time.Time {
	t.Helper()
	rest, ok := strings.CutPrefix(id, "cron:"+entry+":")
	if !ok {
		t.Fatalf("task ID %q is not a tick of entry %s", id, entry)
	}
	ms, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		t.Fatalf("task ID %q: %v", id, err)
	}
	return time.UnixMilli(ms)
}

// recorder is a handler that counts calls per task ID.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
}

func newRecorder() *recorder { return &recorder{calls: make(map[string]int)} }

func (r *recorder) ProcessTask(ctx context.Context, _ *tide.Task) error {
	id, _ := tide.GetTaskID(ctx)
	r.mu.Lock()
	r.calls[id]++
	r.mu.Unlock()
	return nil
}

func (r *recorder) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.calls))
	for k, v := range r.calls {
		out[k] = v
	}
	return out
}

// Three schedulers run the same entry on the same Redis: every tick is
// enqueued, and processed, once.
func TestSchedulerReplicasEnqueueEachTickOnce(t *testing.T) {
	e := setup(t)
	rec := newRecorder()
	e.server(tide.Config{}, rec)

	task := tide.NewTask("report:heartbeat", []byte(`{"v":1}`))
	logs := make([]*logCounter, 3)
	scheds := make([]*tide.Scheduler, 3)
	ids := make([]string, 3)
	// The schedulers plan in their own goroutines, a moment after Start;
	// the tick before Start is only theirs to catch up when they plan
	// within its second. Begin just after a second starts, so that the
	// moment (tens of milliseconds on a loaded machine) cannot cross into
	// the next second and leave that tick to no one.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	start := time.Now()
	for i := range scheds {
		logs[i] = newLogCounter()
		s := tide.NewScheduler(e.broker(), &tide.SchedulerOpts{Logger: slog.New(logs[i]), SchedulerID: fmt.Sprint("replica-", i)})
		scheds[i] = s
		t.Cleanup(s.Shutdown)
		var err error
		switch i {
		case 0: // registers, then starts
			ids[i], err = s.Register("@every 1s", task, tide.Queue("default"))
			if err == nil {
				err = s.Start()
			}
		case 1: // starts, then registers
			if err = s.Start(); err == nil {
				ids[i], err = s.Register("@every 1s", task, tide.Queue("default"))
			}
		case 2: // another misfire policy (not part of the entry's identity)
			ids[i], err = s.RegisterEntry(tide.CronEntry{Spec: "@every 1s", Task: task, Options: []tide.Option{tide.Queue("default")}, Misfire: tide.MisfireRunOnce})
			if err == nil {
				err = s.Start()
			}
		}
		if err != nil {
			t.Fatalf("scheduler %d: %v", i, err)
		}
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("entry IDs differ between replicas: %q", ids)
	}
	entry := ids[0]

	time.Sleep(2500 * time.Millisecond)
	stop := time.Now()
	for _, s := range scheds {
		s.Shutdown()
	}

	// Every tick from the one before Start to shortly before Shutdown must
	// have been enqueued; wait until all enqueued ticks are processed.
	first := start.Truncate(time.Second)
	var must, maybe []string
	for tick := first; !tick.After(stop); tick = tick.Add(time.Second) {
		id := tide.CronTaskIDForTest(entry, tick)
		maybe = append(maybe, id)
		if tick.Before(stop.Add(-300 * time.Millisecond)) {
			must = append(must, id)
		}
	}
	in := tide.NewInspector(e.b)
	// waiting says which tick is not done yet, and how it stands.
	waiting := func() string {
		calls := rec.snapshot()
		for _, id := range must {
			if calls[id] == 0 {
				ti, err := in.GetTaskInfo(context.Background(), "default", id)
				if err != nil {
					return fmt.Sprintf("tick %s not processed (%v)", id, err)
				}
				return fmt.Sprintf("tick %s not processed: %s, retried %d, last error %q", id, ti.State, ti.Retried, ti.LastErr)
			}
		}
		for _, id := range maybe {
			ti, err := in.GetTaskInfo(context.Background(), "default", id)
			if err == nil && ti.State != tide.StateCompleted {
				return fmt.Sprintf("tick %s is %s, not completed (processed %d times, retried %d, last error %q)", id, ti.State, calls[id], ti.Retried, ti.LastErr)
			}
		}
		return ""
	}
	testwait.Until(t, 10*time.Second, func() error {
		if w := waiting(); w != "" {
			return errors.New(w)
		}
		return nil
	})

	calls := rec.snapshot()
	total := 0
	for id, n := range calls {
		total += n
		tick := tickOf(t, entry, id)
		if tick.Before(first) || tick.After(stop) || tick.UnixMilli()%1000 != 0 {
			t.Errorf("unexpected tick %v (task %s)", tick, id)
		}
		if n != 1 {
			t.Errorf("tick %v processed %d times", tick, n)
		}
	}
	if total != len(calls) {
		t.Errorf("%d handler calls for %d distinct ticks", total, len(calls))
	}
	if len(calls) < len(must) {
		t.Errorf("%d ticks processed, want at least %d", len(calls), len(must))
	}

	// The replicas raced for the ticks: one enqueue per tick, the others
	// found the ID taken.
	enq, conf := 0, 0
	for _, l := range logs {
		enq += l.count(logEnqueued)
		conf += l.count(logConflict)
	}
	t.Logf("%d ticks in %v; %d enqueued, %d conflicts", len(calls), stop.Sub(start).Round(time.Millisecond), enq, conf)
	if enq != len(calls) {
		t.Errorf("schedulers logged %d enqueues for %d ticks", enq, len(calls))
	}
	if conf < len(must) {
		t.Errorf("only %d ID conflicts for %d ticks run by 3 replicas", conf, len(must))
	}

	// A processed tick stays as completed, keeping its ID taken.
	ti := e.info("default", must[0])
	if ti.State != tide.StateCompleted || ti.Retention < time.Minute {
		t.Errorf("processed tick: state %v, retention %v; want completed, >= 1m", ti.State, ti.Retention)
	}
}

func TestSchedulerRegisterValidation(t *testing.T) {
	e := setup(t)
	s := tide.NewScheduler(e.b, nil)
	defer s.Shutdown()
	task := tide.NewTask("job", nil)

	for _, spec := range []string{
		"", "   ", "* * *", "* * * * * * *", "61 * * * * *", "0 25 * * *", "*/0 * * * *",
		"@every", "@every 500ms", "@every 1.5s", "@every -1s", "@every soon", "@fortnightly",
		"CRON_TZ=Nowhere/Atlantis 0 9 * * *", "CRON_TZ=UTC", "TZ= 0 9 * * *", "TZ=UTC TZ=UTC 0 9 * * *",
		"0 0 30 2 *", // February 30th: never fires
	} {
		_, err := s.Register(spec, task)
		if err == nil {
			t.Errorf("Register(%q) succeeded", spec)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", spec)) || !strings.HasPrefix(err.Error(), "tide: invalid cron spec") {
			t.Errorf("Register(%q): error %q does not name the spec", spec, err)
		}
	}

	for _, spec := range []string{
		"*/5 * * * *", "30 9 * * MON-FRI", "*/10 * * * * *", "0 30 9 * * *",
		"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
		"@every 1s", "@every 90s", "@every 1h30m", " @every 2m ",
		"CRON_TZ=Asia/Kolkata 30 9 * * *", "TZ=America/New_York @daily", "CRON_TZ=Europe/Berlin\t0 0 9 * * *",
	} {
		if _, err := s.Register(spec, task); err != nil {
			t.Errorf("Register(%q): %v", spec, err)
		}
	}

	bad := []struct {
		name string
		t    *tide.Task
		opts []tide.Option
	}{
		{"nil task", nil, nil},
		{"empty type", tide.NewTask("", nil), nil},
		{"big payload", tide.NewTask("job", make([]byte, tide.MaxPayloadSize+1)), nil},
		{"bad queue", task, []tide.Option{tide.Queue("no spaces")}},
		{"nil option", task, []tide.Option{nil}},
		{"bad option", task, []tide.Option{tide.MaxRetry(-1)}},
		{"TaskID", task, []tide.Option{tide.TaskID("mine")}},
		{"TaskID in task", tide.NewTask("job", nil, tide.TaskID("mine")), nil},
		{"ProcessIn", task, []tide.Option{tide.ProcessIn(time.Minute)}},
		{"ProcessAt", task, []tide.Option{tide.ProcessAt(time.Now().Add(time.Hour))}},
	}
	for _, c := range bad {
		if _, err := s.Register("@hourly", c.t, c.opts...); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("%s: err = %v, want ErrInvalidTask", c.name, err)
		}
	}
	for _, id := range []string{"has space", "slash/", strings.Repeat("x", 225)} {
		if _, err := s.RegisterEntry(tide.CronEntry{Spec: "@hourly", Task: task, ID: id}); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("entry ID %q: err = %v, want ErrInvalidTask", id, err)
		}
	}
	if _, err := s.RegisterEntry(tide.CronEntry{Spec: "@hourly", Task: task, Misfire: 7}); err == nil {
		t.Error("invalid misfire policy accepted")
	}

	// Unique works on a single-partition queue, and so does Group; on a
	// queue of several partitions both are refused.
	if _, err := s.Register("@every 5s", tide.NewTask("job:unique", nil), tide.Unique(time.Minute)); err != nil {
		t.Errorf("Unique entry: %v", err)
	}
	if _, err := s.Register("@every 5s", tide.NewTask("job:grouped", nil), tide.Group("tenant-1")); err != nil {
		t.Errorf("grouped entry: %v", err)
	}
	if err := tide.NewInspector(e.b).Repartition(context.Background(), "parted", 3, nil); err != nil {
		t.Fatal(err)
	}
	for _, o := range []tide.Option{tide.Unique(time.Minute), tide.Group("tenant-1")} {
		if _, err := s.Register("@every 5s", tide.NewTask("job:parted", nil), tide.Queue("parted"), o); !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), "3 partitions") {
			t.Errorf("Unique or Group on 3 partitions: %v, want ErrInvalidTask", err)
		}
	}

	// The same entry twice is refused, as is a name taken.
	if _, err := s.Register("@daily", task, tide.Queue("critical")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register("@daily", task, tide.Queue("critical")); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("duplicate entry: err = %v", err)
	}
	if _, err := s.RegisterEntry(tide.CronEntry{Spec: "@daily", Task: task, ID: "nightly"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RegisterEntry(tide.CronEntry{Spec: "@hourly", Task: task, ID: "nightly"}); err == nil {
		t.Error("duplicate entry name accepted")
	}
}

// Entry IDs are a function of the entry, so replicas agree on them.
func TestSchedulerEntryIDs(t *testing.T) {
	e := setup(t)
	s1, s2 := tide.NewScheduler(e.b, nil), tide.NewScheduler(e.broker(), nil)
	defer s1.Shutdown()
	defer s2.Shutdown()
	newTask := func() *tide.Task {
		t := tide.NewTask("report", []byte("p"), tide.MaxRetry(3))
		t.Headers()["k"] = "v"
		return t
	}
	id1, err1 := s1.Register("0 9 * * *", newTask(), tide.Queue("q"))
	id2, err2 := s2.Register("0 9 * * *", newTask(), tide.Queue("q"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if id1 != id2 || len(id1) != 16 {
		t.Fatalf("IDs %q and %q; want equal, 16 characters", id1, id2)
	}
	// Anything that changes the tasks changes the ID.
	seen := map[string]string{id1: "base"}
	other := tide.NewScheduler(e.b, &tide.SchedulerOpts{Location: time.FixedZone("X", 3600)})
	for _, v := range []struct {
		name string
		s    *tide.Scheduler
		spec string
		task *tide.Task
		opts []tide.Option
	}{
		{"spec", s1, "0 10 * * *", newTask(), []tide.Option{tide.Queue("q")}},
		{"zone", s1, "CRON_TZ=Asia/Kolkata 0 9 * * *", newTask(), []tide.Option{tide.Queue("q")}},
		{"location", other, "0 9 * * *", newTask(), []tide.Option{tide.Queue("q")}},
		{"type", s1, "0 9 * * *", tide.NewTask("other", []byte("p"), tide.MaxRetry(3)), []tide.Option{tide.Queue("q")}},
		{"payload", s1, "0 9 * * *", tide.NewTask("report", []byte("x"), tide.MaxRetry(3)), []tide.Option{tide.Queue("q")}},
		{"headers", s1, "0 9 * * *", tide.NewTask("report", []byte("p"), tide.MaxRetry(3)), []tide.Option{tide.Queue("q")}},
		{"queue", s1, "0 9 * * *", newTask(), []tide.Option{tide.Queue("q2")}},
		{"retry", s1, "0 9 * * *", newTask(), []tide.Option{tide.Queue("q"), tide.MaxRetry(4)}},
		{"timeout", s1, "0 9 * * *", newTask(), []tide.Option{tide.Queue("q"), tide.Timeout(time.Second)}},
		{"retention", s1, "0 9 * * *", newTask(), []tide.Option{tide.Queue("q"), tide.Retention(time.Hour)}},
	} {
		id, err := v.s.Register(v.spec, v.task, v.opts...)
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if prev, ok := seen[id]; ok {
			t.Errorf("%s and %s share entry ID %s", v.name, prev, id)
		}
		seen[id] = v.name
	}
	// A named entry keeps its name.
	id, err := s2.RegisterEntry(tide.CronEntry{Spec: "@daily", Task: newTask(), ID: "billing:nightly"})
	if err != nil || id != "billing:nightly" {
		t.Fatalf("RegisterEntry = %q, %v", id, err)
	}
}

func TestSchedulerCronSpecs(t *testing.T) {
	utc := time.UTC
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		spec  string
		loc   *time.Location
		after string
		want  string
	}{
		// Seconds are optional: 5 fields mean second 0.
		{"30 9 * * *", utc, "2026-03-02T08:00:00Z", "2026-03-02T09:30:00Z"},
		{"0 30 9 * * *", utc, "2026-03-02T08:00:00Z", "2026-03-02T09:30:00Z"},
		{"15 30 9 * * *", utc, "2026-03-02T08:00:00Z", "2026-03-02T09:30:15Z"},
		{"*/10 * * * * *", utc, "2026-03-02T08:00:03Z", "2026-03-02T08:00:10Z"},
		{"0 9 * * MON-FRI", utc, "2026-03-06T10:00:00Z", "2026-03-09T09:00:00Z"}, // Friday -> Monday
		// Time zones: a prefix, or the scheduler's Location.
		{"CRON_TZ=Asia/Kolkata 0 9 * * *", utc, "2026-03-02T00:00:00Z", "2026-03-02T03:30:00Z"},
		{"TZ=America/New_York 0 9 * * *", utc, "2026-03-02T00:00:00Z", "2026-03-02T14:00:00Z"},
		{"TZ=America/New_York 0 9 * * *", utc, "2026-03-09T00:00:00Z", "2026-03-09T13:00:00Z"}, // after the DST change
		{"0 9 * * *", kolkata, "2026-03-02T00:00:00Z", "2026-03-02T03:30:00Z"},
		{"@daily", kolkata, "2026-03-02T00:00:00Z", "2026-03-02T18:30:00Z"},
		{"CRON_TZ=UTC 0 9 * * *", kolkata, "2026-03-02T00:00:00Z", "2026-03-02T09:00:00Z"},
		// @every is aligned on the epoch, whatever the zone.
		{"@every 1h", kolkata, "2026-03-02T10:20:30Z", "2026-03-02T11:00:00Z"},
		{"@every 10s", utc, "2026-03-02T10:20:30Z", "2026-03-02T10:20:40Z"},
		{"@every 1s", utc, "2026-03-02T10:20:30.5Z", "2026-03-02T10:20:31Z"},
		{"@every 7m", utc, "2026-03-02T10:20:30Z", time.Unix((at("2026-03-02T10:20:30Z").Unix()/420+1)*420, 0).UTC().Format(time.RFC3339)},
	}
	for _, c := range cases {
		got, err := tide.CronNextForTest(c.spec, c.loc, at(c.after))
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if !got.Equal(at(c.want)) {
			t.Errorf("%q in %v after %s: next %s, want %s", c.spec, c.loc, c.after, got.UTC().Format(time.RFC3339), c.want)
		}
	}
}

// prev (the latest tick at or before a time) agrees with stepping forward.
func TestSchedulerPrevTick(t *testing.T) {
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	const year = 366 * 24 * time.Hour
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	// window: longer than the largest gap between ticks (or the lookback).
	for _, c := range []struct {
		spec   string
		window time.Duration
	}{
		{"@every 1s", 2 * time.Second}, {"@every 7s", 14 * time.Second}, {"@every 1h", 2 * time.Hour},
		{"*/10 * * * * *", 20 * time.Second}, {"30 9 * * MON-FRI", 4 * 24 * time.Hour}, {"0 0 1 * *", 32 * 24 * time.Hour},
		{"CRON_TZ=America/New_York 30 2 * * *", 3 * 24 * time.Hour}, {"0 9 * * *", 2 * 24 * time.Hour},
		{"@weekly", 8 * 24 * time.Hour}, {"@yearly", year}, {"0 0 0 29 2 *", year}, // Feb 29: none within a year
	} {
		for range 20 {
			now := base.Add(time.Duration(rng.Int64N(int64(60 * 24 * time.Hour))))
			now = now.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
			got, ok, err := tide.CronPrevForTest(c.spec, kolkata, now, year)
			if err != nil {
				t.Fatalf("%q: %v", c.spec, err)
			}
			var want time.Time
			tick, _ := tide.CronNextForTest(c.spec, kolkata, now.Add(-c.window))
			for !tick.IsZero() && !tick.After(now) {
				want = tick
				tick, _ = tide.CronNextForTest(c.spec, kolkata, tick)
			}
			if ok != !want.IsZero() || !got.Equal(want) {
				t.Errorf("%q at %s: prev %s (%v), want %s", c.spec, now.Format(time.RFC3339Nano), got, ok, want)
			}
		}
	}
}

// Misfire policies, on a simulated clock: Start after downtime, and a
// process suspended for hours.
func TestSchedulerMisfirePlan(t *testing.T) {
	at := func(hms string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, "2026-03-02T"+hms+"Z")
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	type step struct {
		now  string
		fire string // "" for none
	}
	cases := []struct {
		name   string
		policy tide.MisfirePolicy
		steps  []step
	}{
		{"skip: start long after a tick", tide.MisfireSkip, []step{
			{"10:30:00", ""}, {"11:00:00.004", "11:00:00"}, {"11:00:00.300", ""}, {"12:00:01", "12:00:00"},
		}},
		{"skip: start within the grace", tide.MisfireSkip, []step{
			{"10:00:30", "10:00:00"}, {"10:00:40", ""}, {"11:00:00", "11:00:00"},
		}},
		{"skip: suspended for hours", tide.MisfireSkip, []step{
			{"09:59:59", ""}, {"10:00:00", "10:00:00"}, {"13:30:00", ""}, {"13:40:00", ""}, {"14:00:00.1", "14:00:00"},
		}},
		{"run-once: start long after a tick", tide.MisfireRunOnce, []step{
			{"10:30:00", "10:00:00"}, {"10:30:01", ""}, {"11:00:00", "11:00:00"},
		}},
		{"run-once: suspended for hours", tide.MisfireRunOnce, []step{
			{"10:00:00.2", "10:00:00"}, {"13:30:00", "13:00:00"}, {"13:30:05", ""}, {"14:00:00", "14:00:00"},
		}},
		{"run-once: late but current", tide.MisfireRunOnce, []step{
			{"09:00:00", "09:00:00"}, {"10:20:00", "10:00:00"}, {"11:00:00", "11:00:00"},
		}},
	}
	for _, c := range cases {
		plan, err := tide.CronPlanForTest("0 * * * *", time.UTC, c.policy, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range c.steps {
			tick, fire := plan(at(st.now))
			got := ""
			if fire {
				got = tick.UTC().Format("15:04:05")
			}
			if got != st.fire {
				t.Errorf("%s: at %s fired %q, want %q", c.name, st.now, got, st.fire)
			}
		}
	}
}

// After downtime a MisfireRunOnce entry enqueues its latest tick at Start
// (read in the entry's time zone) and a MisfireSkip entry does not; the
// caught-up tick is not repeated by a later restart, even once processed.
func TestSchedulerMisfireAtStart(t *testing.T) {
	e := setup(t)
	rec := newRecorder()
	e.server(tide.Config{}, rec)

	// A daily tick two hours ago, written in Kolkata time (UTC+5:30), so a
	// zone ignored would move it by hours.
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Now().Add(-2 * time.Hour).Truncate(time.Second).In(kolkata)
	fields := fmt.Sprintf("%d %d %d * * *", tick.Second(), tick.Minute(), tick.Hour())

	register := func(s *tide.Scheduler) (runOnce, runOnceLoc, skip string) {
		t.Helper()
		var err error
		if runOnce, err = s.RegisterEntry(tide.CronEntry{Spec: "CRON_TZ=Asia/Kolkata " + fields, Task: tide.NewTask("catch-up", []byte("a")), Misfire: tide.MisfireRunOnce}); err != nil {
			t.Fatal(err)
		}
		// No prefix: SchedulerOpts.Location applies.
		if runOnceLoc, err = s.RegisterEntry(tide.CronEntry{Spec: fields, Task: tide.NewTask("catch-up", []byte("b")), Misfire: tide.MisfireRunOnce}); err != nil {
			t.Fatal(err)
		}
		if skip, err = s.Register("CRON_TZ=Asia/Kolkata "+fields, tide.NewTask("catch-up", []byte("c"))); err != nil {
			t.Fatal(err)
		}
		return
	}
	opts := func(l *logCounter) *tide.SchedulerOpts {
		return &tide.SchedulerOpts{Location: time.FixedZone("IST", 5*3600+1800), Logger: slog.New(l)}
	}

	l1 := newLogCounter()
	s1 := tide.NewScheduler(e.broker(), opts(l1))
	t.Cleanup(s1.Shutdown)
	a, b, c := register(s1)
	if err := s1.Start(); err != nil {
		t.Fatal(err)
	}
	idA, idB, idC := tide.CronTaskIDForTest(a, tick), tide.CronTaskIDForTest(b, tick), tide.CronTaskIDForTest(c, tick)
	e.waitState("default", idA, tide.StateCompleted)
	e.waitState("default", idB, tide.StateCompleted)
	// The three entries were planned together, so the skipped one is
	// known not to be enqueued by now.
	if _, err := tide.NewInspector(e.b).GetTaskInfo(context.Background(), "default", idC); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Errorf("MisfireSkip entry enqueued its missed tick (err %v)", err)
	}
	if ti := e.info("default", idA); ti.Retention < 48*time.Hour {
		t.Errorf("daily tick kept for %v, want at least 48h", ti.Retention)
	}
	if n := l1.count(logEnqueued); n != 2 {
		t.Errorf("%d ticks enqueued, want 2", n)
	}
	s1.Shutdown()

	// Restart: the caught-up tick is found, processed and kept, and is not
	// enqueued again.
	l2 := newLogCounter()
	s2 := tide.NewScheduler(e.broker(), opts(l2))
	t.Cleanup(s2.Shutdown)
	register(s2)
	if err := s2.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the restarted scheduler to find its ticks taken", func() bool { return l2.count(logConflict) == 2 })
	s2.Shutdown()
	if n := l2.count(logEnqueued); n != 0 {
		t.Errorf("restart enqueued %d ticks again", n)
	}
	calls := rec.snapshot()
	if len(calls) != 2 || calls[idA] != 1 || calls[idB] != 1 {
		t.Errorf("handler calls %v, want %s and %s once each", calls, idA, idB)
	}
}

// failingBroker fails the first n Enqueue calls.
type failingBroker struct {
	broker.Broker
	n atomic.Int32
}

func (b *failingBroker) Enqueue(ctx context.Context, msgs []*tidetype.TaskInfo, o broker.EnqueueOptions) ([]error, error) {
	if b.n.Add(-1) >= 0 {
		return nil, fmt.Errorf("%w: connection refused", broker.ErrUnavailable)
	}
	return b.Broker.Enqueue(ctx, msgs, o)
}

// A tick whose enqueue fails is retried with back-off, and every failure is
// reported.
func TestSchedulerEnqueueErrorRetried(t *testing.T) {
	e := setup(t)
	fb := &failingBroker{Broker: e.b}
	fb.n.Store(2)
	type report struct {
		typ string
		id  string
		err error
	}
	var mu sync.Mutex
	var reports []report
	s := tide.NewScheduler(fb, &tide.SchedulerOpts{
		Misfire: tide.MisfireRunOnce,
		Logger:  testLogger(t),
		EnqueueErrorHandler: func(task *tide.Task, opts []tide.Option, err error) {
			// The options repeat the attempt, ID included.
			info, eerr := tide.NewClient(e.b).Enqueue(context.Background(), task, append(opts, tide.ProcessIn(time.Hour))...)
			if eerr == nil {
				_ = tide.NewClient(e.b).Delete(context.Background(), info.Queue, info.ID)
			}
			mu.Lock()
			defer mu.Unlock()
			r := report{typ: task.Type(), err: err}
			if info != nil {
				r.id = info.ID
			}
			reports = append(reports, r)
		},
	})
	t.Cleanup(s.Shutdown)
	entry, err := s.Register("@hourly", tide.NewTask("flaky", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	id := tide.CronTaskIDForTest(entry, time.Now().Truncate(time.Hour))
	e.waitState("default", id, tide.StatePending)
	s.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 {
		t.Fatalf("%d failures reported, want 2: %v", len(reports), reports)
	}
	for _, r := range reports {
		if r.typ != "flaky" || r.id != id || r.err == nil || !strings.Contains(r.err.Error(), "connection refused") {
			t.Errorf("report %+v; want type flaky, ID %s, the broker's error", r, id)
		}
	}
}

// Entries are published for the CLI while the scheduler runs, and withdrawn
// at Shutdown.
func TestSchedulerPublishesEntries(t *testing.T) {
	e := setup(t)
	s := tide.NewScheduler(e.broker(), &tide.SchedulerOpts{SchedulerID: "sched-1", Logger: testLogger(t), Misfire: tide.MisfireRunOnce})
	t.Cleanup(s.Shutdown)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	id, err := s.Register("@every 1h", tide.NewTask("hourly", nil), tide.Queue("low"))
	if err != nil {
		t.Fatal(err)
	}
	in := tide.NewInspector(e.b)
	var got []tide.SchedulerEntry
	testwait.For(t, 5*time.Second, "the entry to be published", func() bool {
		got, err = in.SchedulerEntries(context.Background())
		return err == nil && len(got) == 1 && !got[0].Prev.IsZero()
	})
	g := got[0]
	hour := time.Now().Truncate(time.Hour)
	if g.SchedulerID != "sched-1" || g.ID != id || g.Spec != "@every 1h" || g.Type != "hourly" || g.Queue != "low" ||
		!g.Prev.Equal(hour) || !g.Next.Equal(hour.Add(time.Hour)) {
		t.Errorf("published %+v", g)
	}
	s.Shutdown()
	if got, err := in.SchedulerEntries(context.Background()); err != nil || len(got) != 0 {
		t.Errorf("after Shutdown: %v, %v", got, err)
	}
}

func TestSchedulerLifecycle(t *testing.T) {
	e := setup(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	s := tide.NewScheduler(e.b, &tide.SchedulerOpts{Logger: testLogger(t)})
	if _, err := s.Register("@every 1s", tide.NewTask("tick", nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Error("second Start succeeded")
	}
	time.Sleep(50 * time.Millisecond)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Shutdown() }()
	}
	wg.Wait()
	s.Shutdown()
	if err := s.Start(); !errors.Is(err, tide.ErrSchedulerClosed) {
		t.Errorf("Start after Shutdown: %v", err)
	}
	if err := s.Run(); !errors.Is(err, tide.ErrSchedulerClosed) {
		t.Errorf("Run after Shutdown: %v", err)
	}
	if _, err := s.Register("@hourly", tide.NewTask("late", nil)); !errors.Is(err, tide.ErrSchedulerClosed) {
		t.Errorf("Register after Shutdown: %v", err)
	}

	// Never started.
	tide.NewScheduler(e.b, nil).Shutdown()

	// Bad options are reported by Start.
	for _, o := range []tide.SchedulerOpts{{MisfireGrace: -time.Second}, {Misfire: 9}} {
		if err := tide.NewScheduler(e.b, &o).Start(); !errors.Is(err, tide.ErrInvalidConfig) {
			t.Errorf("%+v: Start = %v, want ErrInvalidConfig", o, err)
		}
	}

	defer func() {
		if recover() == nil {
			t.Error("NewScheduler(nil) did not panic")
		}
	}()
	tide.NewScheduler(nil, nil)
}
