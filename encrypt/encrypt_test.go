package encrypt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/brokertest"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/encrypt"
	"github.com/tidequeue/tide/tidetype"
)

// TestConformanceMembroker runs the broker suite on a wrapped membroker: the
// wrapper changes nothing a caller of the contract can see.
func TestConformanceMembroker(t *testing.T) {
	key := newKey(t, 1)
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := wrap(t, membroker.New(), key)
		t.Cleanup(func() { _ = b.Close() })
		return b
	})
}

// TestStoredSealed checks what the wrapped broker stores: payloads and
// results sealed (a reader with the plain broker sees ciphertext, in every
// read path), plaintext through the wrapper, headers in plaintext.
func TestStoredSealed(t *testing.T) {
	ctx := context.Background()
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 7))
	secret := "card=4111-1111-1111-1111"
	result := "charged 42 EUR to 4111-1111-1111-1111"

	m := task("q", "", secret)
	m.Retention = time.Hour
	enqueue(t, b, m)
	if m.ID == "" {
		t.Fatal("Enqueue did not hand the task's ID back")
	}
	raw := get(t, inner, "q", m.ID)
	checkSealed(t, "stored payload", raw.Payload, []byte(secret), 7)
	if h := headerOf(raw.Payload); h.binding != 'I' {
		t.Errorf("a task without ID or unique key is bound with %q, want 'I' (its drawn ID)", h.binding)
	}
	if raw.Headers["traceparent"] != "00-trace-span-01" {
		t.Errorf("headers are not stored in plaintext: %v", raw.Headers)
	}
	if got := get(t, b, "q", m.ID); string(got.Payload) != secret {
		t.Errorf("GetTask through the wrapper: payload %q, want %q", got.Payload, secret)
	}
	all, err := inner.ListTasks(ctx, "q", tidetype.StatePending, 0, 10)
	if err != nil || len(all) != 1 {
		t.Fatalf("plain ListTasks: %v, %v", all, err)
	}
	checkSealed(t, "plain ListTasks payload", all[0].Payload, []byte(secret), 7)
	list, err := b.ListTasks(ctx, "q", tidetype.StatePending, 0, 10)
	if err != nil || len(list) != 1 || string(list[0].Payload) != secret {
		t.Fatalf("ListTasks through the wrapper: %v, %v", list, err)
	}

	ds := dequeue(t, b, "q", 1)
	if len(ds) != 1 || string(ds[0].Task.Payload) != secret {
		t.Fatalf("Dequeue through the wrapper: %+v", ds)
	}
	if err := b.SetResult(ctx, ds[0].Lease(), []byte(result)); err != nil {
		t.Fatal(err)
	}
	checkSealed(t, "stored result", get(t, inner, "q", m.ID).Result, []byte(result), 7)
	active, _ := inner.ListTasks(ctx, "q", tidetype.StateActive, 0, 10)
	checkSealed(t, "plain ListTasks result", active[0].Result, []byte(result), 7)

	delivered := ds[0].Task
	settle(t, b, broker.Settlement{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: delivered, At: time.Now()})
	if string(delivered.Payload) != secret {
		t.Errorf("Settle changed the caller's task: payload %q", delivered.Payload)
	}
	done := get(t, inner, "q", m.ID)
	if done.State != tidetype.StateCompleted {
		t.Fatalf("task is %v, want completed", done.State)
	}
	checkSealed(t, "completed payload", done.Payload, []byte(secret), 7)
	checkSealed(t, "completed result", done.Result, []byte(result), 7)
	got := get(t, b, "q", m.ID)
	if string(got.Payload) != secret || string(got.Result) != result || got.LastErr != "" {
		t.Errorf("completed task through the wrapper: payload %q result %q LastErr %q", got.Payload, got.Result, got.LastErr)
	}
}

// TestPlainReaderSeesCiphertext is a process without keys: its handlers would
// get the sealed bytes, never the plaintext.
func TestPlainReaderSeesCiphertext(t *testing.T) {
	inner := membroker.New()
	enqueue(t, wrap(t, inner, newKey(t, 1)), task("q", "t1", "top secret payload"))
	ds := dequeue(t, inner, "q", 1)
	if len(ds) != 1 {
		t.Fatalf("plain Dequeue returned %d tasks", len(ds))
	}
	checkSealed(t, "payload delivered by a plain broker", ds[0].Task.Payload, []byte("top secret payload"), 1)
}

// TestEmptyValues: nil and empty payloads and results are stored as they are
// (nothing to hide) and come back equal.
func TestEmptyValues(t *testing.T) {
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	a, e := task("q", "nil", ""), task("q", "empty", "")
	a.Payload, e.Payload = nil, []byte{}
	enqueue(t, b, a, e)
	for _, id := range []string{"nil", "empty"} {
		if raw := get(t, inner, "q", id); len(raw.Payload) != 0 {
			t.Errorf("%s: stored payload %q, want empty", id, raw.Payload)
		}
		if got := get(t, b, "q", id); len(got.Payload) != 0 || got.LastErr != "" {
			t.Errorf("%s: payload %q LastErr %q", id, got.Payload, got.LastErr)
		}
	}
	d := dequeue(t, b, "q", 1)[0]
	if err := b.SetResult(context.Background(), d.Lease(), nil); err != nil {
		t.Fatal(err)
	}
	if raw := get(t, inner, "q", d.Task.ID); len(raw.Result) != 0 {
		t.Errorf("empty result stored as %q", raw.Result)
	}
}

// TestLegacyPlaintext: tasks written before encryption was turned on are
// read as they are, including binary payloads that start with 0xFF.
func TestLegacyPlaintext(t *testing.T) {
	inner := membroker.New()
	payloads := map[string][]byte{
		"json":    []byte(`{"order":42}`),
		"binary":  {0xFF, 0x00, 'x', 0xFE},
		"ff-t":    {0xFF, 'T', 'x'},
		"one-ff":  {0xFF},
		"two-ff":  {0xFF, 'T'},
		"looks-e": []byte("TE\x01\x01I"),
	}
	for id, p := range payloads {
		m := task("q", id, "")
		m.Payload = p
		enqueue(t, inner, m)
	}
	b := wrap(t, inner, newKey(t, 1))
	for id, p := range payloads {
		if got := get(t, b, "q", id); !bytes.Equal(got.Payload, p) || got.LastErr != "" {
			t.Errorf("%s: GetTask payload %q LastErr %q, want %q", id, got.Payload, got.LastErr, p)
		}
	}
	ds := dequeue(t, b, "q", 10)
	if len(ds) != len(payloads) {
		t.Fatalf("Dequeue returned %d of %d plaintext tasks", len(ds), len(payloads))
	}
	for _, d := range ds {
		if !bytes.Equal(d.Task.Payload, payloads[d.Task.ID]) {
			t.Errorf("%s: delivered payload %q", d.Task.ID, d.Task.Payload)
		}
	}
}

// TestKeyRotation follows the documented rotation: tasks sealed with key 1
// stay readable once key 2 encrypts; new tasks use key 2; a process that
// dropped key 1 too early archives key-1 tasks with a clear error instead of
// running them, and they run once the key is back.
func TestKeyRotation(t *testing.T) {
	ctx := context.Background()
	inner := membroker.New()
	k1, k2 := newKey(t, 1), newKey(t, 2)

	enqueue(t, wrap(t, inner, k1), task("q", "old", "sealed with key 1"))
	// Step 1: key 2 can decrypt; key 1 still encrypts.
	enqueue(t, wrap(t, inner, k1, k2), task("q", "mid", "still key 1"))
	// Step 2: key 2 encrypts.
	rotated := wrap(t, inner, k2, k1)
	enqueue(t, rotated, task("q", "new", "sealed with key 2"))

	for id, want := range map[string]byte{"old": 1, "mid": 1, "new": 2} {
		if h := headerOf(get(t, inner, "q", id).Payload); h.keyID != want {
			t.Errorf("%s sealed with key %d, want %d", id, h.keyID, want)
		}
	}
	if got := get(t, rotated, "q", "old"); string(got.Payload) != "sealed with key 1" {
		t.Errorf("old task after rotation: %q (LastErr %q)", got.Payload, got.LastErr)
	}

	// Too early: a process with key 2 only.
	only2 := wrap(t, inner, k2)
	checkUndecryptable(t, get(t, only2, "q", "old"), "payload", "unknown key 1 (this process has keys 2)")
	ds := dequeue(t, only2, "q", 3)
	if len(ds) != 1 || ds[0].Task.ID != "new" || string(ds[0].Task.Payload) != "sealed with key 2" {
		t.Fatalf("Dequeue with key 2 only: %d deliveries %v, want only the new task", len(ds), ds)
	}
	for id, plain := range map[string]string{"old": "sealed with key 1", "mid": "still key 1"} {
		raw := get(t, inner, "q", id)
		if raw.State != tidetype.StateArchived {
			t.Fatalf("%s is %v, want archived", id, raw.State)
		}
		if want := "encrypt: cannot decrypt payload: unknown key 1 (this process has keys 2)"; raw.LastErr != want {
			t.Errorf("%s LastErr = %q, want %q", id, raw.LastErr, want)
		}
		checkSealed(t, id+" archived payload", raw.Payload, []byte(plain), 1)
	}

	// Key 1 back: the archived task reads and runs again.
	if got := get(t, rotated, "q", "old"); string(got.Payload) != "sealed with key 1" {
		t.Errorf("archived task with key 1 back: payload %q", got.Payload)
	}
	if err := rotated.RunTask(ctx, "q", "old"); err != nil {
		t.Fatal(err)
	}
	ds = dequeue(t, rotated, "q", 1)
	if len(ds) != 1 || string(ds[0].Task.Payload) != "sealed with key 1" {
		t.Fatalf("re-run archived task: %v", ds)
	}
}

// TestTamperedAndMoved: a value changed in one bit, or copied to another
// task, another queue or another field, does not decrypt; readers see a nil
// value and a clear LastErr, Dequeue archives the task; nothing panics.
func TestTamperedAndMoved(t *testing.T) {
	ctx := context.Background()
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	src := task("q", "src", "transfer 5 EUR to alice")
	enqueue(t, b, src)
	sealedPayload := get(t, inner, "q", "src").Payload

	plant := func(queue, id string, payload []byte) {
		t.Helper()
		m := task(queue, id, "")
		m.Payload = payload
		enqueue(t, inner, m) // a writer with plain access to the store
	}
	flipped := bytes.Clone(sealedPayload)
	flipped[len(flipped)/2] ^= 0x01
	plant("q", "tampered", flipped) // same queue, other ID: fails on the ID alone, so also:
	if err := inner.Delete(ctx, "q", "src"); err != nil {
		t.Fatal(err)
	}
	plant("q", "src", flipped) // the very task, one bit changed
	plant("q", "moved", sealedPayload)
	plant("other", "src", sealedPayload)
	truncated := sealedPayload[:len(sealedPayload)-1]
	plant("q", "truncated", truncated)
	header := bytes.Clone(sealedPayload)
	header[4] = 1 // same key, binding changed to the unique key
	header[5] = 'U'
	plant("q", "rebound", header)

	auth := "authentication failed with key 1"
	cases := map[[2]string]string{
		{"q", "src"}:       auth,
		{"q", "tampered"}:  auth,
		{"q", "moved"}:     auth,
		{"other", "src"}:   auth,
		{"q", "truncated"}: auth,
		{"q", "rebound"}:   auth,
	}
	for ref, reason := range cases {
		checkUndecryptable(t, get(t, b, ref[0], ref[1]), "payload", reason)
	}

	// A payload moved into the result of its own task fails too.
	m := task("r", "res", "payload")
	enqueue(t, b, m)
	d := dequeue(t, inner, "r", 1)[0]
	if err := inner.SetResult(ctx, d.Lease(), d.Task.Payload); err != nil {
		t.Fatal(err)
	}
	got := get(t, b, "r", "res")
	checkUndecryptable(t, got, "result", auth)
	if string(got.Payload) != "payload" {
		t.Errorf("payload of the task with a bad result = %q", got.Payload)
	}

	// Dequeue archives every one of them and hands out none.
	for _, q := range []string{"q", "other"} {
		if ds := dequeue(t, b, q, 10); len(ds) != 0 {
			t.Fatalf("Dequeue(%s) handed out %d undecryptable tasks", q, len(ds))
		}
	}
	for ref, reason := range cases {
		raw := get(t, inner, ref[0], ref[1])
		if raw.State != tidetype.StateArchived || !strings.HasPrefix(raw.LastErr, "encrypt: cannot decrypt payload: "+reason) {
			t.Errorf("%s/%s: %v with LastErr %q, want archived with the reason", ref[0], ref[1], raw.State, raw.LastErr)
		}
	}
	// Read again, the archived task names the reason once.
	if got := get(t, b, "q", "moved"); strings.Count(got.LastErr, "cannot decrypt") != 1 {
		t.Errorf("LastErr repeats the reason: %q", got.LastErr)
	}
}

// TestUndecryptableKeepsLastErr: a task's own last error stays visible after
// the decryption error.
func TestUndecryptableKeepsLastErr(t *testing.T) {
	inner := membroker.New()
	enqueue(t, wrap(t, inner, newKey(t, 5)), task("q", "x", "payload"))
	d := dequeue(t, inner, "q", 1)[0]
	settle(t, inner, broker.Settlement{Lease: d.Lease(), Kind: broker.SettleRetry, Task: d.Task, Err: "handler said no", RetryAt: time.Now().Add(time.Hour), At: time.Now()})
	got := get(t, wrap(t, inner, newKey(t, 6)), "q", "x")
	want := "encrypt: cannot decrypt payload: unknown key 5 (this process has keys 6)\nlast error: handler said no"
	if got.LastErr != want || got.Payload != nil {
		t.Errorf("LastErr = %q, payload %q; want %q and nil", got.LastErr, got.Payload, want)
	}
}

// TestDequeueReplacesArchived: tasks that do not decrypt do not make Dequeue
// come back empty while good tasks wait behind them.
func TestDequeueReplacesArchived(t *testing.T) {
	inner := membroker.New()
	foreign := wrap(t, inner, newKey(t, 9))
	b := wrap(t, inner, newKey(t, 1))
	for i := range 6 {
		enqueue(t, foreign, task("q", fmt.Sprint("bad", i), "key 9"))
	}
	for i := range 3 {
		enqueue(t, b, task("q", fmt.Sprint("good", i), "key 1"))
	}
	ds := dequeue(t, b, "q", 2)
	if len(ds) != 2 {
		t.Fatalf("Dequeue(2) returned %d deliveries, want 2 good ones behind the bad", len(ds))
	}
	for _, d := range ds {
		if !strings.HasPrefix(d.Task.ID, "good") || string(d.Task.Payload) != "key 1" {
			t.Errorf("delivered %s %q", d.Task.ID, d.Task.Payload)
		}
	}
	info, err := inner.QueueInfo(context.Background(), "q")
	if err != nil || info.Archived != 6 || info.Pending != 1 {
		t.Fatalf("queue after Dequeue: %+v %v; want 6 archived, 1 pending", info, err)
	}
}

// TestUniqueBinding: a unique task without an ID gets its ID from the
// broker; its payload is bound to the queue and unique key and opens; it
// does not open in a task with another unique key.
func TestUniqueBinding(t *testing.T) {
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	m := task("q", "", "unique payload")
	m.UniqueKey, m.UniqueTTL = "lock-a", time.Hour
	m.Retention = time.Hour
	enqueue(t, b, m)
	if m.ID == "" {
		t.Fatal("no ID handed back")
	}
	raw := get(t, inner, "q", m.ID)
	if h := headerOf(raw.Payload); h.binding != 'U' {
		t.Fatalf("binding %q, want 'U'", h.binding)
	}
	if got := get(t, b, "q", m.ID); string(got.Payload) != "unique payload" {
		t.Fatalf("payload %q LastErr %q", got.Payload, got.LastErr)
	}
	moved := task("q", "other", "")
	moved.Payload, moved.UniqueKey, moved.UniqueTTL = raw.Payload, "lock-b", time.Hour
	enqueue(t, inner, moved)
	checkUndecryptable(t, get(t, b, "q", "other"), "payload", "authentication failed")

	// Delivered, then kept with Retention: sealed again, bound to the ID.
	d := dequeue(t, b, "q", 1)[0]
	if d.Task.ID != m.ID || string(d.Task.Payload) != "unique payload" {
		t.Fatalf("delivered %s %q", d.Task.ID, d.Task.Payload)
	}
	settle(t, b, broker.Settlement{Lease: d.Lease(), Kind: broker.SettleDone, Task: d.Task, At: time.Now()})
	if got := get(t, b, "q", m.ID); got.State != tidetype.StateCompleted || string(got.Payload) != "unique payload" {
		t.Errorf("after settling: payload %q LastErr %q", got.Payload, got.LastErr)
	}
}

// TestIDCallerChosen: a caller's ID is kept and the payload bound to it.
func TestIDCallerChosen(t *testing.T) {
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	m := task("q", "order-cancel:42", "x")
	enqueue(t, b, m)
	if m.ID != "order-cancel:42" {
		t.Fatalf("ID changed to %q", m.ID)
	}
	if h := headerOf(get(t, inner, "q", m.ID).Payload); h.binding != 'I' {
		t.Errorf("binding %q, want 'I'", h.binding)
	}
	errs, err := b.Enqueue(context.Background(), []*tidetype.TaskInfo{task("q", "order-cancel:42", "y")}, broker.EnqueueOptions{})
	if err != nil || !errors.Is(errs[0], broker.ErrTaskIDConflict) {
		t.Fatalf("second task with the ID: %v %v, want ErrTaskIDConflict", errs, err)
	}
}

// collider is a broker on which the first ID of every Enqueue call is
// already taken by another task (a collision of a drawn ID), or, with same,
// on which the first Enqueue runs twice (a request the transport sent again
// and that lost its reply cache).
type collider struct {
	*membroker.Broker
	same    bool
	mu      sync.Mutex
	calls   int
	foreign []string
}

func (c *collider) Enqueue(ctx context.Context, ts []*tidetype.TaskInfo, o broker.EnqueueOptions) ([]error, error) {
	c.mu.Lock()
	c.calls++
	first := c.calls == 1
	c.mu.Unlock()
	if first && !c.same {
		for _, t := range ts {
			other := *t
			other.Payload = []byte("another task")
			if _, err := c.Broker.Enqueue(ctx, []*tidetype.TaskInfo{&other}, o); err != nil {
				return nil, err
			}
			c.foreign = append(c.foreign, t.ID)
		}
	}
	if first && c.same {
		if _, err := c.Broker.Enqueue(ctx, ts, o); err != nil {
			return nil, err
		}
	}
	return c.Broker.Enqueue(ctx, ts, o)
}

// TestDrawnIDCollision: a drawn ID that meets another task is drawn again;
// one that meets this very task (a repeated request) is not stored twice.
func TestDrawnIDCollision(t *testing.T) {
	t.Run("Other", func(t *testing.T) {
		c := &collider{Broker: membroker.New()}
		b := wrap(t, c, newKey(t, 1))
		m := task("q", "", "mine")
		enqueue(t, b, m)
		if len(c.foreign) != 1 || m.ID == c.foreign[0] || m.ID == "" {
			t.Fatalf("ID %q, colliding IDs %v: want a new ID", m.ID, c.foreign)
		}
		if got := get(t, b, "q", m.ID); string(got.Payload) != "mine" {
			t.Errorf("redrawn task: %q %q", got.Payload, got.LastErr)
		}
		if got := get(t, c, "q", c.foreign[0]); string(got.Payload) != "another task" {
			t.Errorf("the other task was changed: %q", got.Payload)
		}
		if c.calls != 2 {
			t.Errorf("%d Enqueue calls, want 2", c.calls)
		}
	})
	t.Run("Same", func(t *testing.T) {
		c := &collider{Broker: membroker.New(), same: true}
		b := wrap(t, c, newKey(t, 1))
		m := task("q", "", "mine")
		enqueue(t, b, m)
		info, _ := c.QueueInfo(context.Background(), "q")
		if info.Pending != 1 {
			t.Fatalf("%d tasks stored, want 1", info.Pending)
		}
		if got := get(t, b, "q", m.ID); string(got.Payload) != "mine" {
			t.Errorf("task: %q %q", got.Payload, got.LastErr)
		}
	})
	t.Run("CallerID", func(t *testing.T) {
		// A caller's ID is never redrawn: the conflict is reported.
		c := &collider{Broker: membroker.New()}
		b := wrap(t, c, newKey(t, 1))
		errs, err := b.Enqueue(context.Background(), []*tidetype.TaskInfo{task("q", "mine", "x")}, broker.EnqueueOptions{})
		if err != nil || !errors.Is(errs[0], broker.ErrTaskIDConflict) {
			t.Fatalf("%v %v, want ErrTaskIDConflict", errs, err)
		}
	})
}

// TestEnqueueBatch: a mixed batch keeps per-task errors in place and hands
// back every ID.
func TestEnqueueBatch(t *testing.T) {
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	enqueue(t, b, task("q", "taken", "x"))
	ts := []*tidetype.TaskInfo{task("q", "", "a"), task("q", "taken", "b"), task("q", "", ""), task("q", "c", "c")}
	errs, err := b.Enqueue(context.Background(), ts, broker.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], broker.ErrTaskIDConflict) || errs[2] != nil || errs[3] != nil {
		t.Fatalf("errors %v", errs)
	}
	for i, m := range ts {
		if m.ID == "" {
			t.Errorf("task %d got no ID", i)
		}
		if string(m.Payload) != []string{"a", "b", "", "c"}[i] {
			t.Errorf("task %d: the caller's payload changed to %q", i, m.Payload)
		}
	}
	// A nil task is the broker's to refuse, as without the wrapper.
	errs, err = b.Enqueue(context.Background(), []*tidetype.TaskInfo{nil}, broker.EnqueueOptions{})
	if err == nil && (len(errs) != 1 || !errors.Is(errs[0], broker.ErrInvalidTask)) {
		t.Errorf("a nil task: %v, %v; want ErrInvalidTask", errs, err)
	}
}

// TestWrapErrors: bad keys are refused with messages that name the key by ID
// and never show a secret.
func TestWrapErrors(t *testing.T) {
	good := newKey(t, 1)
	short := encrypt.Key{ID: 2, Secret: []byte("0123456789abcdef")}
	cases := []struct {
		name string
		b    broker.Broker
		keys []encrypt.Key
		want string
	}{
		{"NilBroker", nil, []encrypt.Key{good}, "nil broker"},
		{"NoKeys", membroker.New(), nil, "no keys"},
		{"IDZero", membroker.New(), []encrypt.Key{{ID: 0, Secret: good.Secret}}, "ID 0"},
		{"Short", membroker.New(), []encrypt.Key{good, short}, "key 2: the secret is 16 bytes, want 32"},
		{"Duplicate", membroker.New(), []encrypt.Key{good, good}, "key ID 1 is given twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := encrypt.Wrap(c.b, c.keys...)
			if err == nil || w != nil {
				t.Fatalf("Wrap = %v, %v; want an error", w, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if strings.Contains(err.Error(), "0123456789") || strings.Contains(err.Error(), string(good.Secret)) {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}
}

// TestWrapCopiesKeys: changing the caller's secret after Wrap changes
// nothing.
func TestWrapCopiesKeys(t *testing.T) {
	inner := membroker.New()
	k := newKey(t, 1)
	b := wrap(t, inner, k)
	enqueue(t, b, task("q", "x", "payload"))
	clear(k.Secret)
	if got := get(t, b, "q", "x"); string(got.Payload) != "payload" {
		t.Fatalf("after zeroing the caller's secret: %q %q", got.Payload, got.LastErr)
	}
}

func TestParseKeys(t *testing.T) {
	k1, k2 := newKey(t, 1), newKey(t, 200)
	keys, err := encrypt.ParseKeys(" " + keyText(k2) + " , " + keyText(k1) + " ")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != 200 || !bytes.Equal(keys[0].Secret, k2.Secret) || keys[1].ID != 1 || !bytes.Equal(keys[1].Secret, k1.Secret) {
		t.Fatalf("ParseKeys = %v", keys)
	}
	// Every base64 flavour.
	for _, s := range []string{
		"3:+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/8=",
		"3:+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/8",
		"3:-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_8=",
		"3:-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_-_8",
	} {
		keys, err := encrypt.ParseKeys(s)
		if err != nil || len(keys) != 1 || keys[0].ID != 3 || len(keys[0].Secret) != 32 {
			t.Errorf("ParseKeys(%q) = %v, %v", s, keys, err)
		}
	}
	// The parsed keys work.
	if _, err := encrypt.Wrap(membroker.New(), keys...); err != nil {
		t.Fatal(err)
	}

	secret := "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlYw" // 31 bytes
	bad := []struct{ in, want string }{
		{"", "no keys"},
		{"   ", "no keys"},
		{keyText(k1) + ",", "entry 2 of 2 is empty"},
		{secret, "entry 1 of 1 has no ':'"},
		{"0:" + secret, "entry 1 of 1: the key ID is not a number from 1 to 255"},
		{"256:" + secret, "the key ID is not a number from 1 to 255"},
		{secret + ":1", "the key ID is not a number"},
		{"x:" + secret, "the key ID is not a number"},
		{keyText(k1) + "," + keyText(newKey(t, 1)), "entry 2 of 2 (key 1): key ID 1 is already used by entry 1"},
		{"4:" + secret + "!!", "entry 1 of 1 (key 4): the secret is not valid base64"},
		{"4:" + secret, "entry 1 of 1 (key 4): the secret is 31 bytes, want 32"},
		{"4:", "the secret is 0 bytes"},
	}
	for _, c := range bad {
		_, err := encrypt.ParseKeys(c.in)
		if err == nil {
			t.Errorf("ParseKeys(%q) accepted", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseKeys(%q) = %q, want it to say %q", c.in, err, c.want)
		}
		for _, part := range []string{secret, keyText(k1)[2:], "c2VjcmV0"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("ParseKeys(%q) error %q shows the input", c.in, err)
			}
		}
	}
}

// TestKeyRedacted: printing a Key never shows its secret.
func TestKeyRedacted(t *testing.T) {
	k := encrypt.Key{ID: 9, Secret: []byte("SECRETSECRETSECRETSECRETSECRET!!")}
	var outs []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
		outs = append(outs, fmt.Sprintf(f, k), fmt.Sprintf(f, []encrypt.Key{k}), fmt.Sprintf(f, &k))
	}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("keys", "key", k)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("keys", "key", k)
	outs = append(outs, logged.String(), k.String())
	for _, o := range outs {
		if strings.Contains(strings.ToUpper(o), "SECRET!") || strings.Contains(strings.ToLower(o), "534543524554") {
			t.Errorf("printed key shows its secret: %s", o)
		}
	}
	if !strings.Contains(k.String(), "ID: 9") || !strings.Contains(logged.String(), "id=9") {
		t.Errorf("printed key does not show its ID: %s / %s", k, logged.String())
	}
}

// TestSettlePassesErrors: per-settlement errors and settlements without a
// task pass through; the caller's slice is not changed.
func TestSettlePassesErrors(t *testing.T) {
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 1))
	enqueue(t, b, task("q", "a", "payload a"))
	d := dequeue(t, b, "q", 1)[0]
	ss := []broker.Settlement{
		{Lease: broker.LeaseRef{Queue: "q", ID: "nope", Token: 1}, Kind: broker.SettleDone, Task: task("q", "nope", "x"), At: time.Now()},
		{Lease: d.Lease(), Kind: broker.SettleRetry, Task: d.Task, Err: "e", RetryAt: time.Now(), At: time.Now()},
		{Lease: broker.LeaseRef{Queue: "q", ID: "gone", Token: 1}, Kind: broker.SettleDone, At: time.Now()},
	}
	before := slices.Clone(ss)
	errs, err := b.Settle(context.Background(), ss)
	if err != nil || len(errs) != 3 || !errors.Is(errs[0], broker.ErrLeaseLost) || errs[1] != nil || !errors.Is(errs[2], broker.ErrLeaseLost) {
		t.Fatalf("Settle = %v, %v", errs, err)
	}
	for i := range ss {
		if ss[i].Task != before[i].Task {
			t.Errorf("settlement %d: the caller's task pointer was replaced", i)
		}
	}
	if string(d.Task.Payload) != "payload a" {
		t.Errorf("the delivered task was changed: %q", d.Task.Payload)
	}
}

// TestClosed: the wrapper reports the wrapped broker's ErrClosed.
func TestClosed(t *testing.T) {
	b := wrap(t, membroker.New(), newKey(t, 1))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Enqueue(context.Background(), []*tidetype.TaskInfo{task("q", "", "x")}, broker.EnqueueOptions{}); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("Enqueue after Close: %v", err)
	}
	if _, err := b.GetTask(context.Background(), "q", "x"); !errors.Is(err, broker.ErrClosed) {
		t.Errorf("GetTask after Close: %v", err)
	}
}
