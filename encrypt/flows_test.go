package encrypt_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/encrypt"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// A workflow step that waits on another is kept sealed in the workflow. A
// server without its key (after a rotation, or a deployment that lacks it)
// releases it: the step's task is stored with its sealed payload and
// archived with the reason (the step's end: it failed), never run with an
// empty payload, and its payload stays readable with the key.
func TestStepReleasedWithoutItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	raw := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix))
	t.Cleanup(func() { _ = raw.Close() })
	owner := wrap(t, redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix)), newKey(t, 2))
	t.Cleanup(func() { _ = owner.Close() })
	other := wrap(t, redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix)), newKey(t, 9))
	t.Cleanup(func() { _ = other.Close() })

	const secret = "card 4111 1111 1111 1111"
	var mu sync.Mutex
	seen := map[string][]string{} // step name -> payloads its handler got
	handler := tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		step, _ := tide.GetStepName(ctx)
		mu.Lock()
		seen[step] = append(seen[step], string(task.Payload()))
		mu.Unlock()
		return nil
	})
	wf := tide.NewWorkflow("wf-rotated").
		Add("a", tide.NewTask("a", nil)).
		Add("b", tide.NewTask("b", []byte(secret)), tide.After("a"))
	if _, err := tide.NewClient(owner).EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	// Only the server without key 2 runs: it runs a (no payload) and
	// releases b, whose kept payload it cannot open.
	srv := tide.NewServer(other, tide.Config{Concurrency: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.Start(handler); err != nil {
		t.Fatal(err)
	}
	in := tide.NewInspector(raw)
	var b *tide.TaskInfo
	testwait.Until(t, 10*time.Second, func() error {
		var err error
		b, err = in.GetTaskInfo(ctx, "default", "wf-rotated/b")
		if err == nil && b.State == tide.StateArchived {
			return nil
		}
		return fmt.Errorf("step b was not archived: %+v %v", b, err)
	})
	if !encrypt.IsSealed(b.Payload) || !strings.Contains(b.LastErr, "unknown key 2") {
		t.Fatalf("step b stored with payload %q, LastErr %q; want it sealed and archived for its key", b.Payload, b.LastErr)
	}
	if _, ok := b.Headers[broker.SealedHeader]; ok {
		t.Fatalf("the mark %s was stored with the task", broker.SealedHeader)
	}
	mu.Lock()
	if got := seen["b"]; len(got) != 0 {
		t.Fatalf("step b ran without its key, with payloads %q", got)
	}
	mu.Unlock()

	// Its end is recorded: the workflow failed at b, whose payload stays
	// readable where the key is, and b does not run again. The end is a
	// follow-up task the server runs, so the server runs until it is seen.
	testwait.Until(t, 10*time.Second, func() error {
		wi, err := tide.NewInspector(owner).GetWorkflow(ctx, "wf-rotated")
		if err == nil && wi.State == tide.FlowFailed {
			if st := wi.Steps[1]; st.Name != "b" || st.State != tide.StepFailed || !strings.Contains(st.Err, "unknown key 2") {
				t.Fatalf("step b: %+v", st)
			}
			return nil
		}
		return fmt.Errorf("workflow did not fail at b: %+v %v", wi, err)
	})
	srv.Shutdown()
	mu.Lock()
	if got := seen["b"]; len(got) != 0 {
		t.Fatalf("step b ran without its key, with payloads %q", got)
	}
	mu.Unlock()
	if got, err := tide.NewInspector(owner).GetTaskInfo(ctx, "default", "wf-rotated/b"); err != nil || string(got.Payload) != secret {
		t.Fatalf("step b read with its key: %+v, %v; want its payload", got, err)
	}
	if err := tide.NewInspector(owner).RunTask(ctx, "default", "wf-rotated/b"); !errors.Is(err, broker.ErrFlowStep) {
		t.Fatalf("RunTask of the archived step: %v, want ErrFlowStep", err)
	}
}

// The digest a workflow is stored with is keyed: enqueuing the same
// workflow again with the same key resumes it, while the same steps
// under another key do not match (an unkeyed digest would, which is what
// lets a reader of the store confirm a guessed payload).
func TestWorkflowDigestIsKeyed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	one := wrap(t, redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix)), newKey(t, 1))
	t.Cleanup(func() { _ = one.Close() })
	two := wrap(t, redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix)), newKey(t, 1))
	t.Cleanup(func() { _ = two.Close() })
	build := func() *tide.Workflow {
		return tide.NewWorkflow("wf-digest").
			Add("a", tide.NewTask("a", []byte("salary 1234"))).
			Add("b", tide.NewTask("b", []byte("salary 5678")), tide.After("a"))
	}
	if _, err := tide.NewClient(one).EnqueueWorkflow(ctx, build()); err != nil {
		t.Fatal(err)
	}
	if _, err := tide.NewClient(one).EnqueueWorkflow(ctx, build()); err != nil {
		t.Fatalf("the same workflow again with the same key: %v", err)
	}
	if _, err := tide.NewClient(two).EnqueueWorkflow(ctx, build()); !errors.Is(err, tide.ErrWorkflowExists) {
		t.Fatalf("the same workflow under another key: %v, want ErrWorkflowExists", err)
	}
}
