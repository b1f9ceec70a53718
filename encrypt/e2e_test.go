package encrypt_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestEndToEnd runs tide's Client, Server and Inspector, unchanged, on a
// wrapped membroker: the handler sees the plaintext payload, WriteResult's
// result is stored sealed and read back in plaintext, and a task sealed with
// a key the server lacks is archived with a clear error without reaching the
// handler.
func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	inner := membroker.New()
	b := wrap(t, inner, newKey(t, 2), newKey(t, 1))
	const payload, result = `{"ssn":"078-05-1120"}`, `{"verified":"078-05-1120"}`

	var mu sync.Mutex
	seen := map[string]string{}
	mux := tide.NewServeMux()
	mux.HandleFunc("kyc:verify", func(ctx context.Context, t *tide.Task) error {
		mu.Lock()
		seen[string(t.Payload())] = t.Headers()["traceparent"]
		mu.Unlock()
		return tide.WriteResult(ctx, []byte(result))
	})
	srv := tide.NewServer(b, tide.Config{
		Concurrency: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ShutdownTimeout: time.Second,
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	c := tide.NewClient(b)
	task := tide.NewTask("kyc:verify", []byte(payload), tide.Retention(time.Hour))
	task.Headers()["traceparent"] = "00-e2e-01"
	info, err := c.Enqueue(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID == "" || string(info.Payload) != payload {
		t.Fatalf("Enqueue returned ID %q payload %q", info.ID, info.Payload)
	}
	// Sealed with a key only a foreign process has (key 9).
	foreign := wrap(t, inner, newKey(t, 9))
	lost, err := tide.NewClient(foreign).Enqueue(ctx, tide.NewTask("kyc:verify", []byte("for another deployment")))
	if err != nil {
		t.Fatal(err)
	}

	in := tide.NewInspector(b)
	testwait.Until(t, 10*time.Second, func() error {
		got, err := in.GetTaskInfo(ctx, "default", info.ID)
		if err != nil {
			t.Fatal(err)
		}
		other, err := in.GetTaskInfo(ctx, "default", lost.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != tide.StateCompleted || other.State != tide.StateArchived {
			return fmt.Errorf("task %v and foreign task %v; want completed and archived", got.State, other.State)
		}
		if string(got.Payload) != payload || string(got.Result) != result || got.LastErr != "" {
			t.Errorf("Inspector: payload %q result %q LastErr %q", got.Payload, got.Result, got.LastErr)
		}
		if other.Payload != nil || !strings.HasPrefix(other.LastErr, "encrypt: cannot decrypt payload: unknown key 9 (this process has keys 2, 1)") {
			t.Errorf("foreign task: payload %q LastErr %q", other.Payload, other.LastErr)
		}
		return nil
	})
	mu.Lock()
	if len(seen) != 1 || seen[payload] != "00-e2e-01" {
		t.Errorf("the handler saw %v, want only the plaintext payload with its header", seen)
	}
	mu.Unlock()

	raw := get(t, inner, "default", info.ID)
	checkSealed(t, "stored payload", raw.Payload, []byte(payload), 2)
	checkSealed(t, "stored result", raw.Result, []byte(result), 2)

	list, err := in.ListTasks(ctx, "default", tide.StateCompleted, 1, 10)
	if err != nil || len(list) != 1 || string(list[0].Payload) != payload || string(list[0].Result) != result {
		t.Fatalf("Inspector.ListTasks: %v, %v", list, err)
	}
}
