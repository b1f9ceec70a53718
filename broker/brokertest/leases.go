package brokertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

func testExtend(t *testing.T, b broker.Broker) {
	const lease = 300 * time.Millisecond
	enqueue(t, b, newMsg("q", "long"))
	start := time.Now()
	d := dequeueOne(t, b, "q", lease)
	extendOK(t, b, d, 30*time.Second)
	time.Sleep(time.Until(start.Add(lease + 200*time.Millisecond)))
	if r := maintain(t, b, "q"); r.Recovered != 0 {
		t.Fatalf("Maintain recovered %d tasks whose lease was extended", r.Recovered)
	}
	if st := get(t, b, "q", "long").State; st != tidetype.StateActive {
		t.Fatalf("extended task is %v, want active", st)
	}
	extendOK(t, b, d, 30*time.Second)
	settleOK(t, b, outcomeOf(d, broker.SettleDone))

	errs, err := b.Extend(t.Context(), []broker.LeaseRef{leaseOf(d), {Queue: "q", ID: "nope", Token: 1}}, time.Minute)
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	for i, e := range errs {
		if !errors.Is(e, broker.ErrLeaseLost) {
			t.Fatalf("Extend of a settled or missing task (element %d): %v, want ErrLeaseLost", i, e)
		}
	}
}

func testLeaseExpiry(t *testing.T, b broker.Broker) {
	m := newMsg("q", "lost")
	m.MaxRetry = 3
	enqueue(t, b, m)
	d := dequeueOne(t, b, "q", 100*time.Millisecond)
	awaitRecovered(t, b, "q", 1)
	got := get(t, b, "q", "lost")
	switch {
	case got.State != tidetype.StateRetry && got.State != tidetype.StatePending:
		t.Fatalf("recovered task is %v, want retry or pending", got.State)
	case got.Retried != 1:
		t.Fatalf("recovered task Retried = %d, want 1", got.Retried)
	case got.LastErr == "":
		t.Fatalf("recovered task has no LastErr")
	case got.LastFailedAt.IsZero():
		t.Fatalf("recovered task has no LastFailedAt")
	}
	d2 := redeliver(t, b, "q", time.Minute)
	if d2.Task.ID != "lost" || d2.Token <= d.Token {
		t.Fatalf("redelivered %q token %d, want lost with a token above %d", d2.Task.ID, d2.Token, d.Token)
	}
	if d2.Task.Retried != 1 {
		t.Fatalf("redelivered Retried = %d, want 1", d2.Task.Retried)
	}
	settleOK(t, b, outcomeOf(d2, broker.SettleDone))
}

func testStaleToken(t *testing.T, b broker.Broker) {
	m := newMsg("q", "fenced")
	m.MaxRetry = 5
	enqueue(t, b, m)
	old := dequeueOne(t, b, "q", 100*time.Millisecond)
	awaitRecovered(t, b, "q", 1)
	cur := redeliver(t, b, "q", time.Minute)
	if cur.Token <= old.Token {
		t.Fatalf("redelivery token %d not above %d", cur.Token, old.Token)
	}

	for _, o := range []broker.SettleKind{broker.SettleDone, broker.SettleRetry, broker.SettleArchive, broker.SettleRequeue, broker.SettleDefer} {
		s := outcomeOf(old, o)
		s.Err, s.RetryAt = "late", time.Now()
		if err := settle(t, b, s); !errors.Is(err, broker.ErrLeaseLost) {
			t.Fatalf("Settle(outcome %d) with a stale token: %v, want ErrLeaseLost", o, err)
		}
	}
	if errs, err := b.Extend(t.Context(), []broker.LeaseRef{leaseOf(old)}, time.Minute); err != nil || !errors.Is(errs[0], broker.ErrLeaseLost) {
		t.Fatalf("Extend with a stale token: %v %v, want ErrLeaseLost", errs, err)
	}
	if err := b.SetResult(t.Context(), leaseOf(old), []byte("stale")); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SetResult with a stale token: %v, want ErrLeaseLost", err)
	}
	wrong := leaseOf(cur)
	wrong.Token++
	if err := b.SetResult(t.Context(), wrong, []byte("future")); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("SetResult with a token from the future: %v, want ErrLeaseLost", err)
	}

	// The current delivery is undisturbed.
	got := get(t, b, "q", "fenced")
	if got.State != tidetype.StateActive || len(got.Result) != 0 || got.Retried != 1 {
		t.Fatalf("after stale calls: State %v Result %q Retried %d, want active, no result, 1", got.State, got.Result, got.Retried)
	}
	extendOK(t, b, cur, time.Minute)
	if err := b.SetResult(t.Context(), leaseOf(cur), []byte("ok")); err != nil {
		t.Fatalf("SetResult with the current token: %v", err)
	}
	settleOK(t, b, outcomeOf(cur, broker.SettleDone))
	if err := settle(t, b, outcomeOf(cur, broker.SettleDone)); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("second Settle of the same delivery: %v, want ErrLeaseLost", err)
	}
}

func testRecoveryExhausted(t *testing.T, b broker.Broker) {
	for _, maxRetry := range []int{0, 1} {
		t.Run(fmt.Sprint("MaxRetry", maxRetry), func(t *testing.T) {
			t.Parallel()
			q := fmt.Sprint("exhaust-", maxRetry)
			key := "exhaust-key"
			m := newMsg(q, uniqueID(t, b, q, "x", key))
			m.MaxRetry = maxRetry
			m.UniqueKey, m.UniqueTTL = key, time.Hour
			enqueue(t, b, m)
			for i := 0; i < maxRetry; i++ {
				dequeueOne(t, b, q, 50*time.Millisecond)
				awaitRecovered(t, b, q, 1)
				if got := get(t, b, q, m.ID); got.Retried != i+1 {
					t.Fatalf("after recovery %d Retried = %d", i+1, got.Retried)
				}
				awaitState(t, b, q, m.ID, tidetype.StatePending)
			}
			dequeueOne(t, b, q, 50*time.Millisecond)
			awaitRecovered(t, b, q, 1)
			got := get(t, b, q, m.ID)
			if got.State != tidetype.StateArchived || got.LastErr == "" || got.Retried != maxRetry {
				t.Fatalf("after retries were exhausted: State %v LastErr %q Retried %d, want archived, an error, %d",
					got.State, got.LastErr, got.Retried, maxRetry)
			}
			// Archiving released the unique lock.
			other := newMsg(q, uniqueID(t, b, q, "y", key))
			other.UniqueKey, other.UniqueTTL = key, time.Hour
			enqueue(t, b, other)
		})
	}
}

// testDefer: a deferred task waits in retry until RetryAt with Retried
// unchanged, its last error and a "deferred" attempt, counts as neither
// processed nor failed, and is delivered again when due. Done afterwards
// leaves no history behind.
func testDefer(t *testing.T, b broker.Broker) {
	m := newMsg("q", "d")
	m.MaxRetry = 0
	enqueue(t, b, m)
	d := dequeueOne(t, b, "q", time.Minute)
	at := time.Now()
	retryAt := msTrunc(at.Add(time.Second))
	s := outcomeOf(d, broker.SettleDefer)
	s.RetryAt, s.Err, s.At, s.Started, s.Server = retryAt, "busy: retry after 1s", at, at, "srv-1"
	settleOK(t, b, s)

	got := get(t, b, "q", "d")
	switch {
	case got.State != tidetype.StateRetry:
		t.Fatalf("State = %v, want retry", got.State)
	case got.Retried != 0:
		t.Fatalf("Retried = %d, want 0: a deferral uses no retry", got.Retried)
	case got.LastErr != "busy: retry after 1s":
		t.Fatalf("LastErr = %q", got.LastErr)
	case !sameTime(got.NextProcessAt, retryAt):
		t.Fatalf("ProcessAt = %v, want RetryAt %v", got.NextProcessAt, retryAt)
	}
	if _, err := b.Queues(t.Context()); !errors.Is(err, broker.ErrNotSupported) {
		a := b
		if len(got.Attempts) != 1 || got.Attempts[0].Outcome != "deferred" || got.Attempts[0].Server != "srv-1" {
			t.Fatalf("attempts %+v, want one deferred on srv-1", got.Attempts)
		}
		qi, err := a.QueueInfo(t.Context(), "q")
		if err != nil {
			t.Fatal(err)
		}
		if qi.Processed != 0 || qi.Failed != 0 {
			t.Fatalf("a deferral counted: processed %d, failed %d", qi.Processed, qi.Failed)
		}
	}
	dequeueNoneBefore(t, b, "q", retryAt)
	awaitState(t, b, "q", "d", tidetype.StatePending)
	d2 := dequeueOne(t, b, "q", time.Minute)
	if d2.Task.Retried != 0 {
		t.Fatalf("redelivered with Retried %d, want 0", d2.Task.Retried)
	}
	settleOK(t, b, outcomeOf(d2, broker.SettleDone))
	if _, err := b.GetTask(t.Context(), "q", "d"); !errors.Is(err, broker.ErrTaskNotFound) {
		t.Fatalf("GetTask after done: %v, want ErrTaskNotFound", err)
	}
}

// testActiveLease: GetTask of a leased task says when its lease expires,
// and an extension moves it.
func testActiveLease(t *testing.T, b broker.Broker) {
	enqueue(t, b, newMsg("q", "a"))
	before := time.Now()
	d := dequeueOne(t, b, "q", time.Minute)
	got := get(t, b, "q", "a")
	if got.State != tidetype.StateActive || got.LeaseExpiresAt.Before(before.Add(time.Minute-time.Second)) || got.LeaseExpiresAt.After(time.Now().Add(time.Minute+time.Second)) {
		t.Fatalf("active task: state %v, lease expires %v; want about a minute from %v", got.State, got.LeaseExpiresAt, before)
	}
	extendOK(t, b, d, time.Hour)
	if got := get(t, b, "q", "a"); got.LeaseExpiresAt.Before(before.Add(time.Hour - time.Second)) {
		t.Fatalf("after extending by an hour the lease expires %v", got.LeaseExpiresAt)
	}
	settleOK(t, b, outcomeOf(d, broker.SettleRetry))
	if got := get(t, b, "q", "a"); !got.LeaseExpiresAt.IsZero() {
		t.Fatalf("a task in retry shows a lease expiry %v", got.LeaseExpiresAt)
	}
}
