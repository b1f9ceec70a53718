package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestCommitAndRollback(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		var kept, dropped *tide.TaskInfo
		e.inTx(true, func(tx *sql.Tx) {
			var err error
			kept, err = e.ob.Enqueue(ctx, tx, tide.NewTask("order:created", []byte(`{"order":1}`)), tide.Queue("q"))
			if err != nil {
				t.Fatal(err)
			}
		})
		e.inTx(false, func(tx *sql.Tx) {
			var err error
			dropped, err = e.ob.Enqueue(ctx, tx, tide.NewTask("order:created", []byte(`{"order":2}`)), tide.Queue("q"))
			if err != nil {
				t.Fatal(err)
			}
		})
		if kept.ID == "" || dropped.ID == "" || kept.ID == dropped.ID {
			t.Fatalf("IDs %q and %q: Enqueue must choose distinct IDs", kept.ID, dropped.ID)
		}
		e.relay(e.ob)
		e.waitEmpty()
		got, err := e.insp.GetTaskInfo(ctx, "q", kept.ID)
		if err != nil {
			t.Fatalf("committed task: %v", err)
		}
		if string(got.Payload) != `{"order":1}` || got.State != tide.StatePending {
			t.Fatalf("committed task stored as %+v", got)
		}
		if _, err := e.insp.GetTaskInfo(ctx, "q", dropped.ID); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("rolled-back task: %v, want ErrTaskNotFound", err)
		}
		if n := e.count("q"); n != 1 {
			t.Fatalf("queue holds %d tasks, want 1", n)
		}
	})
}

func TestOptionsIntact(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		deadline := time.Now().Add(48 * time.Hour).Truncate(time.Millisecond)
		task := tide.NewTask("order:cancel", []byte(`{"order":42}`), tide.MaxRetry(3))
		task.Headers()["tenant"] = "acme"
		before := time.Now()
		info := e.enqueue(task, tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute), tide.Queue("orders"),
			tide.Timeout(time.Minute), tide.Retention(time.Hour), tide.Deadline(deadline))
		after := time.Now()
		if info.ID != "order-cancel:42" || info.IdempotencyKey == "" {
			t.Fatalf("Enqueue returned %+v", info)
		}
		if info.NextProcessAt.Before(before.Add(15*time.Minute).Truncate(time.Millisecond)) || info.NextProcessAt.After(after.Add(15*time.Minute)) {
			t.Fatalf("due %v: want 15m after the Enqueue call (%v..%v)", info.NextProcessAt, before, after)
		}
		// A Unique task without TaskID: the broker chooses the ID; the
		// second, identical one is refused as a duplicate and its row done.
		u1 := e.enqueue(tide.NewTask("report", []byte("daily")), tide.Queue("reports"), tide.Unique(time.Hour))
		u2 := e.enqueue(tide.NewTask("report", []byte("daily")), tide.Queue("reports"), tide.Unique(time.Hour))
		if u1.ID != "" || u2.ID != "" {
			t.Fatalf("Unique without TaskID got IDs %q, %q; want the broker's choice", u1.ID, u2.ID)
		}
		var relayed sync.Map
		ob2, err := New(e.db, d, WithLogger(testLogger(t)), WithPollInterval(20*time.Millisecond),
			OnRelayed(func(r Relayed) { relayed.Store(r.Row, r) }))
		if err != nil {
			t.Fatal(err)
		}
		e.relay(ob2)
		e.waitEmpty()

		got, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:42")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != tide.StateScheduled || got.MaxRetry != 3 || got.Timeout != time.Minute || got.Retention != time.Hour ||
			got.Headers["tenant"] != "acme" || string(got.Payload) != `{"order":42}` || got.Type != "order:cancel" {
			t.Fatalf("stored %+v", got)
		}
		// The delay counted from Enqueue: the due time is exactly the one
		// Enqueue returned, however late the relay ran.
		if !got.NextProcessAt.Equal(info.NextProcessAt) {
			t.Fatalf("due %v, want %v (from Enqueue)", got.NextProcessAt, info.NextProcessAt)
		}
		if !got.Deadline.Equal(deadline) {
			t.Fatalf("deadline %v, want %v", got.Deadline, deadline)
		}
		if n := e.count("reports"); n != 1 {
			t.Fatalf("reports queue holds %d tasks, want 1 (the second Unique task is a duplicate)", n)
		}
		ids := map[string]bool{}
		relayed.Range(func(_, v any) bool {
			r := v.(Relayed)
			if r.Queue == "reports" && !r.Duplicate {
				ids[r.ID] = true
			}
			return true
		})
		dups := 0
		relayed.Range(func(_, v any) bool {
			if v.(Relayed).Duplicate {
				dups++
			}
			return true
		})
		if len(ids) != 1 || dups != 1 {
			t.Fatalf("relayed Unique tasks under IDs %v, want one ID", ids)
		}
		for id := range ids {
			if _, err := e.insp.GetTaskInfo(ctx, "reports", id); err != nil {
				t.Fatalf("Unique task %s: %v", id, err)
			}
		}
	})
}

func TestBadInput(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		task := tide.NewTask("t", nil)
		for name, c := range map[string]struct {
			err  error
			want error
		}{
			"nil tx":          {first(e.ob.Enqueue(ctx, nil, task)), ErrInvalidArgument},
			"nil task":        {first(e.ob.Enqueue(ctx, tx, nil)), tide.ErrInvalidTask},
			"empty type":      {first(e.ob.Enqueue(ctx, tx, tide.NewTask("", nil))), tide.ErrInvalidTask},
			"negative delay":  {first(e.ob.Enqueue(ctx, tx, task, tide.ProcessIn(-time.Second))), tide.ErrInvalidTask},
			"bad queue":       {first(e.ob.Enqueue(ctx, tx, task, tide.Queue("a b"))), tide.ErrInvalidTask},
			"nil option":      {first(e.ob.Enqueue(ctx, tx, task, nil)), tide.ErrInvalidTask},
			"replicas":        {first(e.ob.Enqueue(ctx, tx, task, tide.WaitForReplicas(1, time.Second))), tide.ErrInvalidTask},
			"huge payload":    {first(e.ob.Enqueue(ctx, tx, tide.NewTask("t", make([]byte, tide.MaxPayloadSize+1)))), tide.ErrInvalidTask},
			"delete nil tx":   {second(e.ob.Delete(ctx, nil, "q", "x")), ErrInvalidArgument},
			"delete bad q":    {second(e.ob.Delete(ctx, tx, "a b", "x")), tide.ErrInvalidTask},
			"delete empty id": {second(e.ob.Delete(ctx, tx, "q", "")), tide.ErrInvalidTask},
			"delete ctl id":   {second(e.ob.Delete(ctx, tx, "q", "a\x00b")), tide.ErrInvalidTask},
			"new nil db":      {second(New(nil, d)), ErrInvalidArgument},
			"new no dialect":  {second(New(e.db, Dialect{})), ErrInvalidArgument},
			"new bad table":   {second(New(e.db, d, WithTable("Robert'); DROP"))), ErrInvalidArgument},
			"new nil option":  {second(New(e.db, d, nil)), ErrInvalidArgument},
			"new batch 0":     {second(New(e.db, d, WithBatchSize(0))), ErrInvalidArgument},
			"new claim 1ms":   {second(New(e.db, d, WithClaimTimeout(time.Millisecond))), ErrInvalidArgument},
			"relay nil":       {e.ob.Relay(ctx, nil), ErrInvalidArgument},
			"history nil db":  {second(NewHistory(nil, d)), ErrInvalidArgument},
			"history bad dlt": {second(NewHistory(e.db, Dialect{})), ErrInvalidArgument},
		} {
			if !errors.Is(c.err, c.want) {
				t.Errorf("%s: %v, want %v", name, c.err, c.want)
			} else if msg := c.err.Error(); len(msg) < 8 || (msg[:7] != "outbox:" && !errors.Is(c.err, tide.ErrInvalidTask)) {
				t.Errorf("%s: error %q does not start with outbox:", name, msg)
			}
		}
		// Nothing was written by the failed calls.
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+e.ob.Table()).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows after bad input (%v)", n, err)
		}
	})
}

func first[T any](_ T, err error) error  { return err }
func second[T any](_ T, err error) error { return err }

// TestRelayKilledMidBatch stops a relay dead after it sent some rows of its
// batch to Redis and before it deleted them; another relay takes the rows
// over once the claim runs out: every task arrives, none twice.
func TestRelayKilledMidBatch(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithClaimTimeout(time.Second), WithBatchSize(50), WithConcurrency(4))
		const n = 50
		ids := map[string]bool{}
		e.inTx(true, func(tx *sql.Tx) {
			for i := range n {
				info, err := e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", fmt.Appendf(nil, "%d", i)), tide.Queue("q"))
				if err != nil {
					t.Fatal(err)
				}
				ids[info.ID] = true
			}
		})
		var sends atomic.Int64
		e.ob.afterSend = func(int64) error {
			if sends.Add(1) == 20 {
				return errAbandon
			}
			return nil
		}
		if err := e.ob.Relay(context.Background(), e.client); !errors.Is(err, errAbandon) {
			t.Fatalf("killed relay returned %v", err)
		}
		if got := e.rows(); got != n {
			t.Fatalf("%d rows left after the relay died, want all %d (none deleted)", got, n)
		}
		if c := e.count("q"); c < 20 || c >= n {
			t.Fatalf("%d tasks in Redis after the dead relay, want 20..%d", c, n-1)
		}

		var resent atomic.Int64
		ob2, err := New(e.db, d, WithLogger(testLogger(t)), WithPollInterval(20*time.Millisecond), WithClaimTimeout(time.Second),
			OnRelayed(func(Relayed) { resent.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		e.relay(ob2)
		e.waitEmpty()
		if c := e.count("q"); c != n {
			t.Fatalf("%d tasks in Redis, want exactly %d", c, n)
		}
		for id := range ids {
			if _, err := e.insp.GetTaskInfo(context.Background(), "q", id); err != nil {
				t.Fatalf("task %s: %v", id, err)
			}
		}
		if resent.Load() != n {
			t.Fatalf("the second relay sent %d rows, want all %d (the first deleted none)", resent.Load(), n)
		}
	})
}

// TestRelayStoppedMidBatch cancels a relay's context in the middle of a
// batch: the rows it sent are deleted, the rest are left for the next.
func TestRelayStoppedMidBatch(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithBatchSize(40), WithConcurrency(1))
		const n = 40
		e.inTx(true, func(tx *sql.Tx) {
			for i := range n {
				if _, err := e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", fmt.Appendf(nil, "%d", i)), tide.Queue("q")); err != nil {
					t.Fatal(err)
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		var sends atomic.Int64
		e.ob.afterSend = func(int64) error {
			if sends.Add(1) == 10 {
				cancel()
			}
			return nil
		}
		if err := e.ob.Relay(ctx, e.client); err != nil {
			t.Fatalf("stopped relay returned %v", err)
		}
		left := e.rows()
		if c := e.count("q"); c+left != n || left == 0 {
			t.Fatalf("%d tasks in Redis and %d rows left, want them to add up to %d with some left", c, left, n)
		}
		e.ob.afterSend = nil
		e.relay(e.ob)
		e.waitEmpty()
		if c := e.count("q"); c != n {
			t.Fatalf("%d tasks in Redis, want %d", c, n)
		}
	})
}

func TestTwoRelaysRace(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		const n = 1000
		e.inTx(true, func(tx *sql.Tx) {
			for i := range n {
				if _, err := e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", fmt.Appendf(nil, "%d", i)), tide.Queue("q")); err != nil {
					t.Fatal(err)
				}
			}
		})
		var mu sync.Mutex
		sentBy := map[int64][]int{}
		for r := range 2 {
			ob, err := New(e.db, d, WithLogger(testLogger(t)), WithPollInterval(20*time.Millisecond), WithBatchSize(50),
				OnRelayed(func(x Relayed) {
					mu.Lock()
					sentBy[x.Row] = append(sentBy[x.Row], r)
					mu.Unlock()
				}))
			if err != nil {
				t.Fatal(err)
			}
			e.relay(ob)
		}
		e.waitEmpty()
		mu.Lock()
		defer mu.Unlock()
		per := [2]int{}
		for row, by := range sentBy {
			if len(by) != 1 {
				t.Fatalf("row %d sent %d times (by relays %v)", row, len(by), by)
			}
			per[by[0]]++
		}
		if len(sentBy) != n {
			t.Fatalf("%d rows sent, want %d", len(sentBy), n)
		}
		if c := e.count("q"); c != n {
			t.Fatalf("%d tasks in Redis, want %d", c, n)
		}
		t.Logf("relay 0 sent %d rows, relay 1 sent %d", per[0], per[1])
	})
}

func TestRedisDown(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		srv := redistest.Start(t)
		db, dsn := servers[d].NewDB(t)
		e := newEnvOn(t, d, db, dsn, srv.Addr)
		srv.Stop()
		const n = 30
		for i := range n {
			e.enqueue(tide.NewTask("t", fmt.Appendf(nil, "%d", i)), tide.Queue("q"))
		}
		e.relay(e.ob)
		// The relay tried and failed: the rows stay.
		testwait.For(t, 60*time.Second, "a failed relay attempt", func() bool {
			var tried int
			if err := db.QueryRow(`SELECT COUNT(*) FROM ` + e.ob.Table() + ` WHERE attempts > 0`).Scan(&tried); err != nil {
				t.Fatal(err)
			}
			return tried > 0
		})
		if got, oldest, err := e.ob.Backlog(context.Background()); err != nil || got != n || oldest.IsZero() {
			t.Fatalf("backlog while Redis is down: %d rows, oldest %v, %v; want %d rows", got, oldest, err, n)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		e.waitEmpty()
		if c := e.count("q"); c != n {
			t.Fatalf("%d tasks in Redis after it came back, want %d", c, n)
		}
		if got, oldest, err := e.ob.Backlog(context.Background()); err != nil || got != 0 || !oldest.IsZero() {
			t.Fatalf("backlog after: %d rows, oldest %v, %v", got, oldest, err)
		}
	})
}

func TestDeleteBeforeRelay(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		a := e.enqueue(tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:1"), tide.Queue("orders"))
		// Deleted in a later transaction, before any relay ran.
		e.inTx(true, func(tx *sql.Tx) {
			ok, err := e.ob.Delete(ctx, tx, "orders", a.ID)
			if err != nil || !ok {
				t.Fatalf("Delete: %v, %v; want true (the row was waiting)", ok, err)
			}
		})
		// Enqueued and deleted in the same transaction.
		e.inTx(true, func(tx *sql.Tx) {
			if _, err := e.ob.Enqueue(ctx, tx, tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:2"), tide.Queue("orders")); err != nil {
				t.Fatal(err)
			}
			ok, err := e.ob.Delete(ctx, tx, "orders", "order-cancel:2")
			if err != nil || !ok {
				t.Fatalf("Delete in the enqueueing tx: %v, %v", ok, err)
			}
		})
		// A Delete that rolls back removes nothing.
		c := e.enqueue(tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:3"), tide.Queue("orders"))
		e.inTx(false, func(tx *sql.Tx) {
			if ok, err := e.ob.Delete(ctx, tx, "orders", c.ID); err != nil || !ok {
				t.Fatalf("Delete: %v, %v", ok, err)
			}
		})
		if got := e.rows(); got != 3 {
			t.Fatalf("%d rows, want 3 (order-cancel:3's, and the cancels of 1 and 2)", got)
		}
		e.relay(e.ob)
		e.waitEmpty()
		if n := e.count("orders"); n != 1 {
			t.Fatalf("%d tasks in Redis, want only order-cancel:3", n)
		}
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:3"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDeleteAfterRelay(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		e.enqueue(tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:9"), tide.Queue("orders"), tide.ProcessIn(time.Hour))
		e.relay(e.ob)
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:9"); err != nil {
			t.Fatal(err)
		}
		e.inTx(true, func(tx *sql.Tx) {
			ok, err := e.ob.Delete(ctx, tx, "orders", "order-cancel:9")
			if err != nil || ok {
				t.Fatalf("Delete: %v, %v; want false (the task is in Redis)", ok, err)
			}
		})
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:9"); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("after the cancel: %v, want ErrTaskNotFound", err)
		}
		// Relayed, enqueued again (that row still waits), then deleted: the
		// waiting row goes, and the task already in Redis is cancelled.
		e.enqueue(tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:10"), tide.Queue("orders"), tide.ProcessIn(time.Hour))
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:10"); err != nil {
			t.Fatal(err)
		}
		e.inTx(true, func(tx *sql.Tx) {
			if _, err := e.ob.Enqueue(ctx, tx, tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:10"), tide.Queue("orders"), tide.ProcessIn(time.Hour)); err != nil {
				t.Fatal(err)
			}
			ok, err := e.ob.Delete(ctx, tx, "orders", "order-cancel:10")
			if err != nil || !ok {
				t.Fatalf("Delete: %v, %v; want true (the second row was waiting)", ok, err)
			}
		})
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:10"); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("the relayed task after the Delete: %v, want ErrTaskNotFound (cancelled)", err)
		}
		// A cancel of a task that never existed is done, not failed.
		e.inTx(true, func(tx *sql.Tx) {
			if ok, err := e.ob.Delete(ctx, tx, "orders", "no-such-task"); err != nil || ok {
				t.Fatalf("Delete: %v, %v", ok, err)
			}
		})
		e.waitEmpty()
		if f, err := e.ob.Failed(ctx, 10); err != nil || len(f) != 0 {
			t.Fatalf("failed rows %v, %v", f, err)
		}
	})
}

// TestCancelFollowsEnqueue: a row that a relay already tried cannot be
// removed (Redis may have the task), so Delete records a cancel, which is
// relayed after the enqueue: the task ends up cancelled, not alive.
func TestCancelFollowsEnqueue(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		e.enqueue(tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:5"), tide.Queue("orders"), tide.ProcessIn(time.Hour))
		// As a relay that claimed the row and died would leave it.
		if _, err := e.db.Exec(`UPDATE ` + e.ob.Table() + ` SET attempts = 1`); err != nil {
			t.Fatal(err)
		}
		e.inTx(true, func(tx *sql.Tx) {
			if ok, err := e.ob.Delete(ctx, tx, "orders", "order-cancel:5"); err != nil || ok {
				t.Fatalf("Delete: %v, %v; want false", ok, err)
			}
		})
		var mu sync.Mutex
		var order []bool
		ob, err := New(e.db, d, WithLogger(testLogger(t)), WithPollInterval(20*time.Millisecond),
			OnRelayed(func(r Relayed) { mu.Lock(); order = append(order, r.Cancel); mu.Unlock() }))
		if err != nil {
			t.Fatal(err)
		}
		e.relay(ob)
		e.waitEmpty()
		mu.Lock()
		defer mu.Unlock()
		if len(order) != 2 || order[0] || !order[1] {
			t.Fatalf("relayed (cancel?) %v, want the enqueue then the cancel", order)
		}
		if _, err := e.insp.GetTaskInfo(ctx, "orders", "order-cancel:5"); !errors.Is(err, tide.ErrTaskNotFound) {
			t.Fatalf("task: %v, want ErrTaskNotFound", err)
		}
	})
}

func TestCorruptRowsKept(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		tb := e.ob.Table()
		ph := func(n int) string { return d.ph(n) }
		for _, r := range []struct {
			kind  int
			queue string
			id    any
			info  string
		}{
			{1, "q", []byte("x1"), `not json`},
			{1, "q", []byte("x2"), `{"Queue":"other","ID":"x2","Type":"t","IdempotencyKey":"k","NextProcessAt":"2020-01-01T00:00:00Z"}`},
			{1, "q", []byte("x3"), `{"Queue":"q","ID":"x3","Type":"","IdempotencyKey":"k","NextProcessAt":"2020-01-01T00:00:00Z"}`},
			{7, "q", []byte("x4"), `{}`},
			{2, "q", nil, `{}`},
		} {
			if _, err := e.db.Exec(`INSERT INTO `+tb+` (kind, queue, task_id, info) VALUES (`+ph(1)+`,`+ph(2)+`,`+ph(3)+`,`+ph(4)+`)`,
				r.kind, r.queue, r.id, []byte(r.info)); err != nil {
				t.Fatal(err)
			}
		}
		good := e.enqueue(tide.NewTask("t", nil), tide.Queue("q"))
		// A TaskID conflict: the queue already holds another task with the ID.
		if _, err := e.client.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID("taken")); err != nil {
			t.Fatal(err)
		}
		e.enqueue(tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID("taken"))
		e.relay(e.ob)
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "q", good.ID); err != nil {
			t.Fatalf("the good row: %v", err)
		}
		failed, err := e.ob.Failed(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(failed) != 6 {
			t.Fatalf("%d failed rows, want 6: %+v", len(failed), failed)
		}
		for _, f := range failed {
			if f.Error == "" || f.FailedAt.IsZero() || f.Attempts != 1 {
				t.Errorf("failed row %+v: want its error, time and one attempt", f)
			}
		}
		if !containsErr(failed, "ID already in use") {
			t.Errorf("no failed row names the ID conflict: %+v", failed)
		}
		if !containsErr(failed, "does not decode") || !containsErr(failed, "does not match") || !containsErr(failed, "unknown kind") {
			t.Errorf("failed rows do not name their problems: %+v", failed)
		}
	})
}

func containsErr(fs []FailedRow, s string) bool {
	for _, f := range fs {
		if contains(f.Error, s) {
			return true
		}
	}
	return false
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestNotifyWakesRelay: with a poll interval of an hour, only LISTEN/NOTIFY
// can bring the row over.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Postgres, WithPollInterval(time.Hour))
	arrived := make(chan Relayed, 1)
	ob, err := New(e.db, Postgres, WithLogger(testLogger(t)), WithPollInterval(time.Hour),
		OnRelayed(func(r Relayed) { arrived <- r }))
	if err != nil {
		t.Fatal(err)
	}
	e.relay(ob)
	// Let the relay run its first (empty) poll and start listening: wait
	// until the listening connection shows up.
	testwait.For(t, 60*time.Second, "the relay to listen", func() bool {
		var n int
		if err := e.db.QueryRow(`SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	for i := range 3 {
		info := e.enqueue(tide.NewTask("t", nil), tide.Queue("q"))
		select {
		case r := <-arrived:
			if r.ID != info.ID {
				t.Fatalf("relayed %s, want %s", r.ID, info.ID)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("row %d not relayed: the notification did not wake the relay", i)
		}
	}
}

func TestMigrateIdempotent(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithTable("custom_box"))
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- e.ob.Migrate(context.Background()) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if e.ob.Table() != "custom_box" {
			t.Fatal(e.ob.Table())
		}
	})
}

func TestDBTimeScan(t *testing.T) {
	t.Parallel()
	want := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	for _, v := range []any{want, []byte("2026-01-02 03:04:05.123456"), "2026-01-02T03:04:05.123456Z"} {
		var d dbTime
		if err := d.Scan(v); err != nil || !d.t.Equal(want) {
			t.Errorf("Scan(%v): %v, %v", v, d.t, err)
		}
	}
	var d dbTime
	if err := d.Scan(nil); err != nil || !d.t.IsZero() {
		t.Errorf("Scan(nil): %v, %v", d.t, err)
	}
	for _, v := range []any{"yesterday", 42} {
		if err := d.Scan(v); err == nil {
			t.Errorf("Scan(%v): no error", v)
		}
	}
}

// TestFailedRowsRetryDiscard: a row refused for an ID conflict is kept;
// once the conflicting task is gone, Retry relays it; Discard drops one.
func TestFailedRowsRetryDiscard(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		for _, id := range []string{"a", "b"} {
			if _, err := e.client.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID(id), tide.ProcessIn(time.Hour)); err != nil {
				t.Fatal(err)
			}
			e.enqueue(tide.NewTask("t", []byte("from the outbox")), tide.Queue("q"), tide.TaskID(id))
		}
		e.relay(e.ob)
		e.waitEmpty()
		failed, err := e.ob.Failed(ctx, 10)
		if err != nil || len(failed) != 2 {
			t.Fatalf("failed rows %+v, %v; want 2", failed, err)
		}
		if err := e.client.Delete(ctx, "q", "a"); err != nil {
			t.Fatal(err)
		}
		if ok, err := e.ob.Retry(ctx, failed[0].Row); err != nil || !ok {
			t.Fatalf("Retry: %v, %v", ok, err)
		}
		if ok, err := e.ob.Discard(ctx, failed[1].Row); err != nil || !ok {
			t.Fatalf("Discard: %v, %v", ok, err)
		}
		if ok, err := e.ob.Discard(ctx, failed[1].Row); err != nil || ok {
			t.Fatalf("second Discard: %v, %v", ok, err)
		}
		e.waitEmpty()
		got, err := e.insp.GetTaskInfo(ctx, "q", "a")
		if err != nil || string(got.Payload) != "from the outbox" {
			t.Fatalf("retried row: %+v, %v", got, err)
		}
		if f, err := e.ob.Failed(ctx, 10); err != nil || len(f) != 0 {
			t.Fatalf("failed rows after: %+v, %v", f, err)
		}
		if _, err := e.ob.Failed(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Failed(0): %v", err)
		}
	})
}

// TestDeleteRacesRelay deletes tasks while two relays move them: whatever
// the interleaving, a deleted task ends up absent from Redis and every
// other task present, once each.
func TestDeleteRacesRelay(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithBatchSize(20))
		ctx := context.Background()
		ob2, err := New(e.db, d, WithLogger(testLogger(t)), WithPollInterval(20*time.Millisecond), WithBatchSize(20))
		if err != nil {
			t.Fatal(err)
		}
		e.relay(e.ob)
		e.relay(ob2)
		const n = 200
		var wg sync.WaitGroup
		deleted := make([]bool, n)
		removed := make([]bool, n)
		errs := make(chan error, n)
		for i := range n {
			id := fmt.Sprintf("task-%d", i)
			// Delayed tasks, so that a cancel finds them waiting.
			e.enqueue(tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID(id), tide.ProcessIn(time.Hour))
			if i%2 == 0 {
				deleted[i] = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						tx, err := e.db.BeginTx(ctx, nil)
						if err != nil {
							errs <- err
							return
						}
						ok, err := e.ob.Delete(ctx, tx, "q", id)
						if err == nil {
							err = tx.Commit()
						} else {
							_ = tx.Rollback()
						}
						if err != nil && d == MySQL && contains(err.Error(), "Deadlock") {
							continue // InnoDB picked this transaction as a deadlock victim: retry it
						}
						if err != nil {
							errs <- fmt.Errorf("delete %s: %w", id, err)
						}
						removed[i] = ok
						return
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		e.waitEmpty()
		nRemoved := 0
		for i := range n {
			_, err := e.insp.GetTaskInfo(ctx, "q", fmt.Sprintf("task-%d", i))
			switch {
			case deleted[i] && !errors.Is(err, tide.ErrTaskNotFound):
				t.Errorf("task-%d was deleted (removed before relay: %v) but Redis has it: %v", i, removed[i], err)
			case !deleted[i] && err != nil:
				t.Errorf("task-%d: %v", i, err)
			}
			if removed[i] {
				nRemoved++
			}
		}
		if c := e.count("q"); c != n/2 {
			t.Fatalf("%d tasks in Redis, want %d", c, n/2)
		}
		t.Logf("%d of %d deletes removed the row before it was relayed", nRemoved, n/2)
	})
}

// TestListenerReconnects: the relay's listening connection is killed; the
// relay listens again and notifications wake it (the poll interval is an
// hour, so nothing else could).
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Postgres, WithPollInterval(time.Hour))
	arrived := make(chan Relayed, 1)
	ob, err := New(e.db, Postgres, WithLogger(testLogger(t)), WithPollInterval(time.Hour),
		OnRelayed(func(r Relayed) { arrived <- r }))
	if err != nil {
		t.Fatal(err)
	}
	e.relay(ob)
	listener := func() (pid int) {
		err := e.db.QueryRow(`SELECT COALESCE(MAX(pid), 0) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	var first int
	testwait.For(t, 60*time.Second, "the relay to listen", func() bool { first = listener(); return first != 0 })
	if _, err := e.db.Exec(`SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, "the relay to listen again", func() bool { p := listener(); return p != 0 && p != first })
	info := e.enqueue(tide.NewTask("t", nil), tide.Queue("q"))
	select {
	case r := <-arrived:
		if r.ID != info.ID {
			t.Fatalf("relayed %s, want %s", r.ID, info.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not relayed after the listener reconnected")
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	for attempts, want := range map[int]time.Duration{0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		5: 1600 * time.Millisecond, 11: time.Minute, 1000: time.Minute} {
		if got := retryDelay(attempts); got != want {
			t.Errorf("retryDelay(%d) = %v, want %v", attempts, got, want)
		}
	}
}

// TestFailingRowDoesNotBlockOthers: rows of a queue that Redis refuses for
// a reason that may pass (a partition layout mismatch) are kept and retried
// later, while the rows behind them go through.
func TestFailingRowDoesNotBlockOthers(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithConcurrency(1))
		ctx := context.Background()
		// Redis records one partition for queue "bad"...
		if _, err := e.client.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("bad")); err != nil {
			t.Fatal(err)
		}
		// ...while the relay's broker insists on three.
		b := redisbroker.New(redistest.Client(t, e.redisAddr), redisbroker.WithPrefix(e.prefix), redisbroker.WithQueuePartitions("bad", 3))
		t.Cleanup(func() { _ = b.Close() })
		for range 3 {
			e.enqueue(tide.NewTask("t", nil), tide.Queue("bad"))
		}
		for range 5 {
			e.enqueue(tide.NewTask("t", nil), tide.Queue("good"))
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- e.ob.Relay(rctx, tide.NewClient(b)) }()
		testwait.For(t, 60*time.Second, "the good rows to arrive", func() bool { return e.count("good") == 5 })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := e.rows(); got != 3 {
			t.Fatalf("%d rows left, want the 3 of queue bad, kept for a later try", got)
		}
		if f, err := e.ob.Failed(ctx, 10); err != nil || len(f) != 0 {
			t.Fatalf("failed rows %+v, %v: a layout mismatch may pass, the rows must not be failed", f, err)
		}
	})
}

// TestReservedRefused: the outbox refuses tide's own task types, step
// headers and reserved IDs when a task is written, and a row written to the
// table by other means with one of them is marked failed by the relay, never
// stored in tide.
func TestReservedRefused(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		e.inTx(false, func(tx *sql.Tx) {
			if _, err := e.ob.Enqueue(ctx, tx, tide.NewTask(tide.FlowType, nil), tide.Queue("q")); !errors.Is(err, tide.ErrInvalidTask) {
				t.Errorf("Enqueue of a %s task: %v, want ErrInvalidTask", tide.FlowType, err)
			}
			if _, err := e.ob.Enqueue(ctx, tx, tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID("tide:n1{x}")); !errors.Is(err, tide.ErrInvalidTask) {
				t.Errorf("Enqueue with a reserved ID: %v, want ErrInvalidTask", err)
			}
		})
		tb := e.ob.Table()
		ph := func(n int) string { return d.ph(n) }
		forged := []string{
			`{"Queue":"q","ID":"f1","Type":"tide:flow","Payload":"e30=","NextProcessAt":"2020-01-01T00:00:00Z"}`,
			`{"Queue":"q","ID":"f2","Type":"tide:notify","NextProcessAt":"2020-01-01T00:00:00Z"}`,
			`{"Queue":"q","ID":"f3","Type":"t","Headers":{"tide-flow":"w:order-42","tide-step":"charge"},"NextProcessAt":"2020-01-01T00:00:00Z"}`,
			`{"Queue":"q","ID":"tide:n9{x}","Type":"t","NextProcessAt":"2020-01-01T00:00:00Z"}`,
		}
		for i, info := range forged {
			id := []byte(fmt.Sprint("f", i+1))
			if i == 3 {
				id = []byte("tide:n9{x}")
			}
			if _, err := e.db.Exec(`INSERT INTO `+tb+` (kind, queue, task_id, info) VALUES (`+ph(1)+`,`+ph(2)+`,`+ph(3)+`,`+ph(4)+`)`,
				1, "q", id, []byte(info)); err != nil {
				t.Fatal(err)
			}
		}
		e.relay(e.ob)
		e.waitEmpty()
		failed, err := e.ob.Failed(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(failed) != len(forged) {
			t.Fatalf("%d failed rows, want %d: %+v", len(failed), len(forged), failed)
		}
		if n := e.count("q"); n != 0 {
			t.Fatalf("tide holds %d tasks of the forged rows", n)
		}
	})
}

// TestReservedWordTables: tables named with reserved words ("order",
// "user") are migrated, written, relayed, inspected and cleaned up: every
// statement quotes the name.
func TestReservedWordTables(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d, WithTable("order"))
		ctx := context.Background()
		if err := e.ob.Migrate(ctx); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		info := e.enqueue(tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID("kept"))
		e.inTx(true, func(tx *sql.Tx) {
			if _, err := e.ob.Delete(ctx, tx, "q", info.ID); err != nil {
				t.Fatal(err)
			}
		})
		e.enqueue(tide.NewTask("t", nil), tide.Queue("q"), tide.TaskID("sent"))
		e.relay(e.ob)
		e.waitEmpty()
		if _, err := e.insp.GetTaskInfo(ctx, "q", "sent"); err != nil {
			t.Fatalf("the relayed task: %v", err)
		}
		if _, err := e.ob.Failed(ctx, 10); err != nil {
			t.Fatalf("Failed: %v", err)
		}
		if _, _, err := e.ob.Backlog(ctx); err != nil {
			t.Fatalf("Backlog: %v", err)
		}
		h, err := NewHistory(e.db, d, WithHistoryTable("user"), WithHistoryLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := h.Migrate(ctx); err != nil {
			t.Fatalf("history Migrate: %v", err)
		}
		h.Record(Attempt{Queue: "q", ID: "sent", Type: "t", State: StateDone, Attempt: 1, Started: time.Now(), Finished: time.Now()})
		if err := h.Flush(ctx); err != nil {
			t.Fatalf("history Flush: %v", err)
		}
		if _, err := h.Attempts(ctx, "q", "sent"); err != nil {
			t.Fatalf("history Attempts: %v", err)
		}
	})
}

// A grouped task keeps the ID its caller chose (no group tag) through the
// relay, and one without an ID gets one tagged with its group, which every
// queue takes.
func TestGroupedTaskIDs(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		e := newEnv(t, d)
		ctx := context.Background()
		chosen := e.enqueue(tide.NewTask("order:cancel", nil), tide.Queue("orders"), tide.Group("shop-7"), tide.TaskID("order-cancel:42"))
		drawn := e.enqueue(tide.NewTask("order:cancel", nil), tide.Queue("orders"), tide.Group("shop-7"))
		if chosen.ID != "order-cancel:42" || broker.HashTag(drawn.ID) != "shop-7" {
			t.Fatalf("IDs %q and %q", chosen.ID, drawn.ID)
		}
		e.relay(e.ob)
		e.waitEmpty()
		for _, id := range []string{chosen.ID, drawn.ID} {
			got, err := e.insp.GetTaskInfo(ctx, "orders", id)
			if err != nil || got.Group != "shop-7" {
				t.Fatalf("GetTaskInfo(%s) = %+v, %v", id, got, err)
			}
		}
	})
}
