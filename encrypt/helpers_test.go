package encrypt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/encrypt"
	"github.com/tidequeue/tide/tidetype"
)

// newKey returns a key with a fresh random secret.
func newKey(t testing.TB, id byte) encrypt.Key {
	t.Helper()
	s := make([]byte, encrypt.SecretSize)
	if _, err := rand.Read(s); err != nil {
		t.Fatal(err)
	}
	return encrypt.Key{ID: id, Secret: s}
}

// keyText is k as ParseKeys reads it.
func keyText(k encrypt.Key) string {
	return fmt.Sprintf("%d:%s", k.ID, base64.StdEncoding.EncodeToString(k.Secret))
}

func wrap(t testing.TB, b broker.Broker, keys ...encrypt.Key) broker.Broker {
	t.Helper()
	w, err := encrypt.Wrap(b, keys...)
	if err != nil {
		t.Fatalf("Wrap: %v", err)
	}
	return w
}

// task returns a pending task of queue with id (empty: the broker draws
// one) and payload.
func task(queue, id, payload string) *tidetype.TaskInfo {
	now := time.Now()
	return &tidetype.TaskInfo{
		ID: id, Queue: queue, Type: "test:task", Payload: []byte(payload),
		Headers: map[string]string{"traceparent": "00-trace-span-01"},
		State:   tidetype.StatePending, MaxRetry: 3,
		NextProcessAt: now, EnqueuedAt: now,
	}
}

func enqueue(t testing.TB, b broker.Broker, ts ...*tidetype.TaskInfo) {
	t.Helper()
	errs, err := b.Enqueue(context.Background(), ts, broker.EnqueueOptions{})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Enqueue %s/%s: %v", ts[i].Queue, ts[i].ID, e)
		}
	}
}

func get(t testing.TB, b broker.Broker, queue, id string) *tidetype.TaskInfo {
	t.Helper()
	ti, err := b.GetTask(context.Background(), queue, id)
	if err != nil {
		t.Fatalf("GetTask(%s, %s): %v", queue, id, err)
	}
	return ti
}

func dequeue(t testing.TB, b broker.Broker, queue string, n int) []*broker.Delivery {
	t.Helper()
	ds, err := b.Dequeue(context.Background(), []string{queue}, n, time.Minute)
	if err != nil {
		t.Fatalf("Dequeue: %v", err)
	}
	return ds
}

func settle(t testing.TB, b broker.Broker, s broker.Settlement) {
	t.Helper()
	errs, err := b.Settle(context.Background(), []broker.Settlement{s})
	if err != nil || errs[0] != nil {
		t.Fatalf("Settle: %v %v", err, errs)
	}
}

// header describes a stored value: whether it is sealed, and with which key
// and binding.
type header struct {
	sealed  bool
	keyID   byte
	binding byte
}

func headerOf(v []byte) header {
	if len(v) < encrypt.Overhead || v[0] != 0xFF || v[1] != 'T' || v[2] != 'E' {
		return header{}
	}
	return header{sealed: true, keyID: v[4], binding: v[5]}
}

// checkSealed fails unless raw is a sealed value with key keyID that does
// not contain plain.
func checkSealed(t testing.TB, what string, raw, plain []byte, keyID byte) {
	t.Helper()
	h := headerOf(raw)
	if !h.sealed {
		t.Fatalf("%s is stored unsealed: %q", what, raw)
	}
	if h.keyID != keyID {
		t.Fatalf("%s is sealed with key %d, want %d", what, h.keyID, keyID)
	}
	if len(plain) >= 4 && bytes.Contains(raw, plain) {
		t.Fatalf("%s holds its plaintext %q", what, plain)
	}
	if len(raw) != len(plain)+encrypt.Overhead {
		t.Fatalf("%s is %d bytes for a plaintext of %d, want %d more", what, len(raw), len(plain), encrypt.Overhead)
	}
}

// checkUndecryptable fails unless ti (read through a wrapped broker) has a
// nil value and LastErr starting with the reason.
func checkUndecryptable(t testing.TB, ti *tidetype.TaskInfo, field, reason string) {
	t.Helper()
	v := ti.Payload
	if field == "result" {
		v = ti.Result
	}
	if v != nil {
		t.Errorf("%s of an undecryptable task = %q, want nil", field, v)
	}
	want := "encrypt: cannot decrypt " + field + ": " + reason
	if !strings.HasPrefix(ti.LastErr, want) {
		t.Errorf("LastErr = %q, want it to start with %q", ti.LastErr, want)
	}
}
