package tide_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

func TestPrepareThenEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := tide.NewClient(membroker.New())
	task := tide.NewTask("order:cancel", []byte(`{"order":42}`), tide.MaxRetry(7))
	task.Headers()["tenant"] = "acme"
	before := time.Now()
	info, err := tide.Prepare(task, tide.TaskID("order-cancel:42"), tide.ProcessIn(time.Hour),
		tide.Queue("orders"), tide.Timeout(time.Minute), tide.Retention(time.Hour), tide.IdempotencyKey("order-cancel:42"))
	if err != nil {
		t.Fatal(err)
	}
	// Through storage and back, as an outbox row would travel.
	raw, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	var back tide.TaskInfo
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	got, err := c.EnqueuePrepared(ctx, &back)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "order-cancel:42" || got.Queue != "orders" || got.State != tide.StateScheduled || got.MaxRetry != 7 ||
		got.Timeout != time.Minute || got.Retention != time.Hour || got.Headers["tenant"] != "acme" {
		t.Fatalf("stored %+v", got)
	}
	if due := got.NextProcessAt; due.Before(before.Add(time.Hour).Truncate(time.Millisecond)) || due.After(time.Now().Add(time.Hour)) {
		t.Fatalf("due %v: the delay must count from Prepare", due)
	}
	// Relayed again (a relay that crashed before marking the row): the
	// idempotency key answers with the same task.
	again, err := c.EnqueuePrepared(ctx, &back)
	if err != nil || again.ID != got.ID {
		t.Fatalf("second EnqueuePrepared: %+v, %v", again, err)
	}

	// A due time in the past is pending at once.
	old, err := tide.Prepare(tide.NewTask("t", nil))
	if err != nil {
		t.Fatal(err)
	}
	old.NextProcessAt = time.Now().Add(-time.Hour)
	if p, err := c.EnqueuePrepared(ctx, old); err != nil || p.State != tide.StatePending || p.ID == "" {
		t.Fatalf("past due: %+v, %v", p, err)
	}

	if _, err := tide.Prepare(tide.NewTask("t", nil), tide.WaitForReplicas(1, time.Second)); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("Prepare with WaitForReplicas: %v, want ErrInvalidTask", err)
	}
	for name, mutate := range map[string]func(*tide.TaskInfo){
		"bad queue":       func(i *tide.TaskInfo) { i.Queue = "a b" },
		"empty type":      func(i *tide.TaskInfo) { i.Type = "" },
		"control in ID":   func(i *tide.TaskInfo) { i.ID = "a\x1bb" },
		"negative retry":  func(i *tide.TaskInfo) { i.MaxRetry = -1 },
		"lone unique key": func(i *tide.TaskInfo) { i.UniqueKey = "k" },
		"no due time":     func(i *tide.TaskInfo) { i.NextProcessAt = time.Time{} },
		"huge payload":    func(i *tide.TaskInfo) { i.Payload = make([]byte, tide.MaxPayloadSize+1) },
	} {
		bad := back
		mutate(&bad)
		if _, err := c.EnqueuePrepared(ctx, &bad); !errors.Is(err, tide.ErrInvalidTask) {
			t.Errorf("%s: %v, want ErrInvalidTask", name, err)
		}
	}
	if _, err := c.EnqueuePrepared(ctx, nil); !errors.Is(err, tide.ErrInvalidTask) {
		t.Errorf("nil: %v, want ErrInvalidTask", err)
	}
}
