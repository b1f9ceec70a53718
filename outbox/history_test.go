package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestHistoryRecordsAttempts(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		hist, err := NewHistory(e.db, d, WithHistoryLogger(testLogger(t)), WithServerName("worker-1"), WithFlushInterval(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if err := hist.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := hist.Migrate(ctx); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		defer hist.Close()

		var calls atomic.Int64
		finished := make(chan string, 10)
		mux := tide.NewServeMux()
		mux.Use(hist.Middleware())
		mux.HandleFunc("flaky", func(ctx context.Context, task *tide.Task) error {
			if calls.Add(1) < 3 {
				return errors.New("not yet")
			}
			id, _ := tide.GetTaskID(ctx)
			defer func() { finished <- id }()
			return nil
		})
		var deferredOnce atomic.Bool
		mux.HandleFunc("later", func(ctx context.Context, task *tide.Task) error {
			if !deferredOnce.Swap(true) {
				return fmt.Errorf("rate limited: %w", tide.RetryAfter(0))
			}
			id, _ := tide.GetTaskID(ctx)
			defer func() { finished <- id }()
			return nil
		})
		mux.HandleFunc("broken", func(ctx context.Context, task *tide.Task) error {
			id, _ := tide.GetTaskID(ctx)
			defer func() { finished <- id }()
			return fmt.Errorf("bad payload: %w", tide.SkipRetry)
		})
		srv := tide.NewServer(e.rdb, tide.Config{Concurrency: 2, Queues: map[string]int{"h": 1}, Logger: testLogger(t),
			RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 0 }})
		if err := srv.Start(mux); err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown()
		flaky, err := e.client.Enqueue(ctx, tide.NewTask("flaky", nil), tide.Queue("h"), tide.MaxRetry(5))
		if err != nil {
			t.Fatal(err)
		}
		broken, err := e.client.Enqueue(ctx, tide.NewTask("broken", nil), tide.Queue("h"))
		if err != nil {
			t.Fatal(err)
		}
		later, err := e.client.Enqueue(ctx, tide.NewTask("later", nil), tide.Queue("h"), tide.MaxRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			select {
			case <-finished:
			case <-time.After(60 * time.Second):
				t.Fatal("tasks did not finish")
			}
		}
		// The middleware records after the handler returns: wait for the
		// records, then write them.
		testwait.For(t, 60*time.Second, "the attempts to be written", func() bool {
			if err := hist.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			as, err := hist.Attempts(ctx, "h", flaky.ID)
			if err != nil {
				t.Fatal(err)
			}
			bs, err := hist.Attempts(ctx, "h", broken.ID)
			if err != nil {
				t.Fatal(err)
			}
			ls, err := hist.Attempts(ctx, "h", later.ID)
			if err != nil {
				t.Fatal(err)
			}
			return len(as) == 3 && len(bs) == 1 && len(ls) == 2
		})
		// RetryAfter uses no retry: a task with MaxRetry 0 runs again, and
		// both attempts are its first.
		ls, _ := hist.Attempts(ctx, "h", later.ID)
		if ls[0].State != StateDeferred || ls[0].Attempt != 1 || ls[1].State != StateDone || ls[1].Attempt != 1 {
			t.Errorf("deferred task's attempts: %+v", ls)
		}
		as, _ := hist.Attempts(ctx, "h", flaky.ID)
		for i, a := range as {
			want := StateRetry
			if i == 2 {
				want = StateDone
			}
			if a.State != want || a.Attempt != i+1 || a.Type != "flaky" || a.Server != "worker-1" || a.Queue != "h" || a.ID != flaky.ID ||
				a.Started.IsZero() || a.Finished.Before(a.Started) {
				t.Errorf("attempt %d: %+v, want state %s", i+1, a, want)
			}
			if (a.Error != "") != (want == StateRetry) {
				t.Errorf("attempt %d: error %q", i+1, a.Error)
			}
		}
		bs, _ := hist.Attempts(ctx, "h", broken.ID)
		if bs[0].State != StateArchived || bs[0].Error == "" {
			t.Errorf("broken: %+v, want archived with its error", bs[0])
		}
		if hist.Dropped() != 0 {
			t.Errorf("%d dropped", hist.Dropped())
		}
		if _, err := hist.Attempts(ctx, "a b", "x"); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("bad queue: %v", err)
		}
	})
}

func TestHistoryRetentionAndBuffer(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		db, _ := servers[d].NewDB(t)
		ctx := context.Background()
		hist, err := NewHistory(db, d, WithHistoryLogger(testLogger(t)), WithRetention(time.Hour), WithHistoryBuffer(3),
			WithHistoryTable("hist"), WithFlushInterval(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := hist.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		old := Attempt{Queue: "q", ID: "old", Type: "t", State: StateDone, Attempt: 1, Started: now.Add(-3 * time.Hour), Finished: now.Add(-2 * time.Hour), Server: "s"}
		fresh := old
		fresh.ID, fresh.Started, fresh.Finished = "fresh", now.Add(-time.Second), now
		hist.Record(old)
		hist.Record(fresh)
		if err := hist.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := hist.prune(ctx); err != nil {
			t.Fatal(err)
		}
		if as, err := hist.Attempts(ctx, "q", "old"); err != nil || len(as) != 0 {
			t.Fatalf("old attempt after pruning: %v, %v", as, err)
		}
		as, err := hist.Attempts(ctx, "q", "fresh")
		if err != nil || len(as) != 1 {
			t.Fatalf("fresh attempt: %v, %v", as, err)
		}
		if !as[0].Finished.Equal(now.Truncate(time.Microsecond)) {
			t.Errorf("finished %v, want %v", as[0].Finished, now)
		}

		if err := hist.Close(); err != nil {
			t.Fatal(err)
		}
		hist.Record(fresh) // ignored after Close, no panic
		if hist.Dropped() != 0 {
			t.Fatalf("%d dropped", hist.Dropped())
		}

		// A full buffer drops instead of blocking: with the writer held
		// (never started), 3 of 10 records fit.
		held, err := NewHistory(db, d, WithHistoryBuffer(3), WithHistoryTable("hist"))
		if err != nil {
			t.Fatal(err)
		}
		held.start.Do(func() {})
		for range 10 {
			held.Record(fresh)
		}
		if held.Dropped() != 7 {
			t.Fatalf("%d dropped, want 7", held.Dropped())
		}
		if err := hist.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestHistoryMiddlewareRecordsPanics(t *testing.T) {
	t.Parallel()
	hist, err := NewHistory(servers[Postgres].NewDBHandle(t), Postgres, WithServerName("s1"))
	if err != nil {
		t.Fatal(err)
	}
	hist.start.Do(func() {}) // hold the writer: records stay in the buffer
	h := hist.Middleware()(tide.HandlerFunc(func(context.Context, *tide.Task) error { panic("boom") }))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = h.ProcessTask(context.Background(), tide.NewTask("t", nil))
	}()
	select {
	case a := <-hist.ch:
		if a.Error != "panic: boom" || a.Type != "t" || a.Server != "s1" || a.Attempt != 1 {
			t.Fatalf("recorded %+v", a)
		}
	default:
		t.Fatal("the panicking attempt was not recorded")
	}
}

func TestHistoryTaskAttempts(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		db, _ := servers[d].NewDB(t)
		ctx := context.Background()
		hist, err := NewHistory(db, d, WithHistoryLogger(testLogger(t)), WithFlushInterval(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer hist.Close()
		if err := hist.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		states := []string{StateRetry, StateDeferred, StateLost, StateRequeued, StateCanceled, StateArchived, StateDone, "odd"}
		want := []string{"retry", "deferred", "lease expired", "requeued", "canceled", "archive", "done", "odd"}
		for i, s := range states {
			hist.Record(Attempt{Queue: "q", ID: "t1", Type: "t", State: s, Attempt: i + 1, Error: fmt.Sprintf("err %d <b>", i),
				Started: base.Add(time.Duration(i) * time.Minute), Finished: base.Add(time.Duration(i)*time.Minute + time.Second), Server: "srv"})
		}
		hist.Record(Attempt{Queue: "q", ID: "other", Type: "t", State: StateDone, Attempt: 1, Started: base, Finished: base, Server: "srv"})
		if err := hist.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		as, err := hist.TaskAttempts(ctx, "q", "t1")
		if err != nil {
			t.Fatal(err)
		}
		if len(as) != len(states) {
			t.Fatalf("%d attempts, want %d: %+v", len(as), len(states), as)
		}
		for i, a := range as {
			start := base.Add(time.Duration(i) * time.Minute)
			if a.Outcome != want[i] || !a.Started.Equal(start) || !a.Ended.Equal(start.Add(time.Second)) ||
				a.Server != "srv" || a.Err != fmt.Sprintf("err %d <b>", i) {
				t.Errorf("attempt %d: %+v, want outcome %q", i, a, want[i])
			}
		}
		if as, err := hist.TaskAttempts(ctx, "q", "missing"); err != nil || len(as) != 0 {
			t.Errorf("missing task: %v, %v", as, err)
		}
		if _, err := hist.TaskAttempts(ctx, "a b", "x"); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("bad queue: %v", err)
		}
	})
}
