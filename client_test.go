package tide_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// Input is checked before it reaches the broker, so the in-memory broker
// serves: no Redis needed.
func TestEnqueueRejectsBadInput(t *testing.T) {
	t.Parallel()
	e := struct{ c *tide.Client }{tide.NewClient(membroker.New())}
	ctx := context.Background()
	cases := []struct {
		name string
		task *tide.Task
		opts []tide.Option
		want string
	}{
		{"nil task", nil, nil, "nil task"},
		{"empty type", tide.NewTask("", nil), nil, "empty task type"},
		{"control char in type", tide.NewTask("a\nb", nil), nil, "control character"},
		{"long type", tide.NewTask(strings.Repeat("x", 300), nil), nil, "over the 256 limit"},
		{"negative delay", tide.NewTask("t", nil), []tide.Option{tide.ProcessIn(-time.Second)}, "negative delay"},
		{"absurd delay", tide.NewTask("t", nil), []tide.Option{tide.ProcessIn(20 * 365 * 24 * time.Hour)}, "over the"},
		{"absurd process-at", tide.NewTask("t", nil), []tide.Option{tide.ProcessAt(time.Now().AddDate(50, 0, 0))}, "ahead"},
		{"zero process-at", tide.NewTask("t", nil), []tide.Option{tide.ProcessAt(time.Time{})}, "zero time"},
		{"bad queue chars", tide.NewTask("t", nil), []tide.Option{tide.Queue("orders {eu}")}, "invalid character"},
		{"empty queue", tide.NewTask("t", nil), []tide.Option{tide.Queue("")}, "empty queue name"},
		{"negative max retry", tide.NewTask("t", nil), []tide.Option{tide.MaxRetry(-1)}, "MaxRetry(-1)"},
		{"empty task id", tide.NewTask("t", nil), []tide.Option{tide.TaskID("")}, "empty TaskID"},
		{"negative timeout", tide.NewTask("t", nil), []tide.Option{tide.Timeout(-1)}, "Timeout"},
		{"zero deadline", tide.NewTask("t", nil), []tide.Option{tide.Deadline(time.Time{})}, "Deadline"},
		{"short unique", tide.NewTask("t", nil), []tide.Option{tide.Unique(time.Millisecond)}, "at least 1s"},
		{"negative retention", tide.NewTask("t", nil), []tide.Option{tide.Retention(-time.Hour)}, "Retention"},
		{"nil option", tide.NewTask("t", nil), []tide.Option{nil}, "nil Option"},
		{"payload too big", tide.NewTask("t", bytes.Repeat([]byte{1}, tide.MaxPayloadSize+1)), nil, "MaxPayloadSize"},
		{"bad default option", tide.NewTask("t", nil, tide.MaxRetry(-5)), nil, "MaxRetry(-5)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.Enqueue(ctx, tc.task, tc.opts...)
			if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Enqueue error = %v, want ErrInvalidTask mentioning %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "tide: ") {
				t.Fatalf("error %q lacks the tide: prefix", err)
			}
		})
	}
	t.Run("headers too big", func(t *testing.T) {
		task := tide.NewTask("t", nil)
		task.Headers()["big"] = strings.Repeat("h", tide.MaxHeadersSize)
		if _, err := e.c.Enqueue(ctx, task); !errors.Is(err, tide.ErrInvalidTask) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("max payload is accepted", func(t *testing.T) {
		if _, err := e.c.Enqueue(ctx, tide.NewTask("t", bytes.Repeat([]byte{1}, tide.MaxPayloadSize))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("past process-at means now", func(t *testing.T) {
		info, err := e.c.Enqueue(ctx, tide.NewTask("t", nil), tide.ProcessAt(time.Now().Add(-time.Hour)))
		if err != nil || info.State != tide.StatePending {
			t.Fatalf("info=%+v err=%v", info, err)
		}
	})
}

func TestEnqueueOptionsOverrideTaskDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	task := tide.NewTask("t", nil, tide.Queue("a"), tide.MaxRetry(3), tide.Timeout(time.Minute))
	info, err := e.c.Enqueue(context.Background(), task, tide.Queue("b"), tide.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if info.Queue != "b" || info.MaxRetry != 3 || info.Timeout != time.Minute || info.State != tide.StateScheduled {
		t.Fatalf("info = %+v", info)
	}
	// Due times are on the broker's clock, which may run a little ahead of
	// this process's.
	if d := time.Until(info.NextProcessAt); d < 59*time.Minute || d > time.Hour+time.Second {
		t.Fatalf("NextProcessAt in %v, want about 1h", d)
	}
	got := e.info("b", info.ID)
	if got.Timeout != time.Minute || got.MaxRetry != 3 || got.State != tide.StateScheduled {
		t.Fatalf("stored = %+v", got)
	}
}

func TestTaskIDConflictAndDelete(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	id := tide.TaskID("order-cancel:42")
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil), id, tide.ProcessIn(15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil), id); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("second enqueue = %v, want ErrTaskIDConflict", err)
	}
	if err := e.c.Delete(ctx, "default", "order-cancel:42"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := e.c.Delete(ctx, "default", "order-cancel:42"); !errors.Is(err, tide.ErrTaskNotFound) {
		t.Fatalf("second Delete = %v, want ErrTaskNotFound", err)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("order:cancel", nil), id); err != nil {
		t.Fatalf("enqueue after delete: %v", err)
	}
	if err := e.c.Delete(ctx, "bad queue", "x"); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("Delete with a bad queue name = %v", err)
	}
}

func TestDeleteActiveIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		close(started)
		<-release
		return nil
	}))
	info, err := e.c.Enqueue(ctx, tide.NewTask("t", nil))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	err = e.c.Delete(ctx, "default", info.ID)
	close(release)
	if !errors.Is(err, tide.ErrTaskActive) || !strings.Contains(err.Error(), "cancel") {
		t.Fatalf("Delete(active) = %v, want ErrTaskActive naming the alternative", err)
	}
}

func TestUnique(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 4} {
		t.Run(map[int]string{1: "one partition", 4: "four partitions"}[parts], func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			mk := func() *tide.Task { return tide.NewTask("report", []byte("2026-11"), tide.Unique(time.Hour)) }
			first, err := e.c.Enqueue(ctx, mk(), tide.ProcessIn(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			for range 10 {
				if _, err := e.c.Enqueue(ctx, mk()); !errors.Is(err, tide.ErrDuplicateTask) {
					t.Fatalf("duplicate = %v, want ErrDuplicateTask", err)
				}
			}
			// A different payload or queue is not a duplicate.
			if _, err := e.c.Enqueue(ctx, tide.NewTask("report", []byte("2026-12"), tide.Unique(time.Hour))); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Enqueue(ctx, mk(), tide.Queue("other")); err != nil {
				t.Fatal(err)
			}
			// Deleting releases the lock.
			if err := e.c.Delete(ctx, "default", first.ID); err != nil {
				t.Fatal(err)
			}
			second, err := e.c.Enqueue(ctx, mk())
			if err != nil {
				t.Fatalf("enqueue after delete: %v", err)
			}
			// Finishing releases it too.
			e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
			e.waitGone("default", second.ID)
			if _, err := e.c.Enqueue(ctx, mk()); err != nil {
				t.Fatalf("enqueue after the task finished: %v", err)
			}
			if parts > 1 {
				_, err := e.c.Enqueue(ctx, mk(), tide.TaskID("x"), tide.Queue("q2"))
				if !errors.Is(err, tide.ErrInvalidTask) {
					t.Fatalf("Unique+TaskID on a partitioned queue = %v, want ErrInvalidTask", err)
				}
			}
		})
	}
}

func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(3))
	ctx := context.Background()
	ts := make([]*tide.Task, 100)
	for i := range ts {
		ts[i] = tide.NewTask("bulk", []byte{byte(i)})
	}
	ts[50] = tide.NewTask("bulk", nil, tide.TaskID("fixed"))
	infos, err := e.c.EnqueueMany(ctx, ts, tide.Queue("bulk"))
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 100 || infos[50].ID != "fixed" {
		t.Fatalf("infos: %d, [50]=%+v", len(infos), infos[50])
	}
	// A second batch with a conflicting ID stores the rest and names the index.
	again := []*tide.Task{tide.NewTask("bulk", nil), tide.NewTask("bulk", nil, tide.TaskID("fixed"))}
	infos, err = e.c.EnqueueMany(ctx, again, tide.Queue("bulk"))
	if !errors.Is(err, tide.ErrTaskIDConflict) || !strings.Contains(err.Error(), "task 1") {
		t.Fatalf("err = %v", err)
	}
	if infos[0] == nil || infos[1] != nil {
		t.Fatalf("infos = %v", infos)
	}
	// Invalid tasks reject the whole batch before anything is stored.
	_, err = e.c.EnqueueMany(ctx, []*tide.Task{tide.NewTask("ok", nil), tide.NewTask("", nil)})
	if !errors.Is(err, tide.ErrInvalidTask) || !strings.Contains(err.Error(), "task 1") {
		t.Fatalf("err = %v", err)
	}
	var n int
	done := make(chan struct{})
	e.server(tide.Config{Queues: map[string]int{"bulk": 1}, Concurrency: 1}, tide.HandlerFunc(func(context.Context, *tide.Task) error {
		n++
		if n == 101 {
			close(done)
		}
		return nil
	}))
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("processed %d of 101 tasks", n)
	}
}

func TestClosedClient(t *testing.T) {
	t.Parallel()
	c := tide.NewClient(membroker.New())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(context.Background(), tide.NewTask("t", nil)); !errors.Is(err, tide.ErrClientClosed) {
		t.Fatalf("Enqueue after Close = %v", err)
	}
}

func TestPauseQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	if err := in.PauseQueue(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 1)
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error { ran <- struct{}{}; return nil }))
	info, err := e.c.Enqueue(ctx, tide.NewTask("t", nil))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Fatal("a paused queue's task ran")
	case <-time.After(300 * time.Millisecond):
	}
	if st := e.info("default", info.ID); st.State != tide.StatePending {
		t.Fatalf("state = %v", st.State)
	}
	if err := in.UnpauseQueue(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("task did not run after unpause")
	}
}

// A queue paused for a while resumes by itself: the server runs its task
// after the pause, without an unpause.
func TestPauseQueueFor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	in := tide.NewInspector(e.b)
	const d = 500 * time.Millisecond
	paused := time.Now()
	if err := in.PauseQueueFor(ctx, "default", d); err != nil {
		t.Fatal(err)
	}
	ran := make(chan time.Time, 1)
	e.server(tide.Config{}, tide.HandlerFunc(func(context.Context, *tide.Task) error { ran <- time.Now(); return nil }))
	if _, err := e.c.Enqueue(ctx, tide.NewTask("t", nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ran:
		if at.Sub(paused) < d {
			t.Fatalf("the task ran %v after a pause of %v", at.Sub(paused), d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not run after the timed pause ended")
	}
	for _, bad := range []time.Duration{0, -time.Second, tide.MaxPauseFor + time.Hour} {
		if err := in.PauseQueueFor(ctx, "default", bad); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("PauseQueueFor(%v): %v, want ErrInvalidTask", bad, err)
		}
	}
}

// TestGeneratedIDsAreDistinct: generated IDs are 12 characters and distinct;
// what happens when one does collide is the subject of redisbroker's
// TestRedrawOnlyProvenCollisions.
func TestGeneratedIDsAreDistinct(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ts := make([]*tide.Task, 2000)
	for i := range ts {
		ts[i] = tide.NewTask("t", nil)
	}
	infos, err := e.c.EnqueueMany(context.Background(), ts)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, in := range infos {
		if len(in.ID) != 12 || seen[in.ID] {
			t.Fatalf("ID %q (len %d, seen %v)", in.ID, len(in.ID), seen[in.ID])
		}
		seen[in.ID] = true
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 4} {
		t.Run(map[int]string{1: "one partition", 4: "four partitions"}[parts], func(t *testing.T) {
			t.Parallel()
			e := setup(t, redisbroker.WithPartitions(parts))
			ctx := context.Background()
			first, err := e.c.Enqueue(ctx, tide.NewTask("charge", []byte("1")), tide.IdempotencyKey("req-7"), tide.ProcessIn(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			// A retried request, even with another body, stores nothing and
			// answers with the first task.
			for range 5 {
				again, err := e.c.Enqueue(ctx, tide.NewTask("charge", []byte("2")), tide.IdempotencyKey("req-7"))
				if err != nil {
					t.Fatalf("repeated key: %v, want nil", err)
				}
				if again.ID != first.ID {
					t.Fatalf("repeated key: ID %q, want %q", again.ID, first.ID)
				}
			}
			if n, err := tide.NewInspector(e.b).QueueInfo(ctx, "default"); err != nil || n.Scheduled != 1 || n.Pending != 0 {
				t.Fatalf("queue after repeats: %+v, %v; want one scheduled task", n, err)
			}
			if _, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.IdempotencyKey("")); !errors.Is(err, tide.ErrInvalidTask) {
				t.Fatalf("empty key: %v, want ErrInvalidTask", err)
			}
			// TaskID with its own key (an outbox row's): a repeat is
			// recognised in the ID's partition and is not a conflict.
			for range 2 {
				got, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.TaskID("order-1"), tide.IdempotencyKey("row-8"))
				if err != nil || got.ID != "order-1" {
					t.Fatalf("TaskID with its own key: %+v, %v", got, err)
				}
			}
			if _, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.TaskID("order-2"), tide.IdempotencyKey("order-2")); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.TaskID("order-2"), tide.IdempotencyKey("order-2")); err != nil {
				t.Fatalf("TaskID repeated with itself as the key: %v, want nil", err)
			}
		})
	}
}
