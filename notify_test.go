package tide_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/webhook"
)

type received struct {
	body map[string]any
	sig  error // webhook.Verify of its Tide-Signature
}

// notifyReceiver records the notifications it gets; the first `fail` POSTs
// are answered 503.
func notifyReceiver(t *testing.T, secret string, fail int32) (*httptest.Server, func() []received) {
	var mu sync.Mutex
	var got []received
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= fail {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		b, _ := io.ReadAll(r.Body)
		rec := received{sig: webhook.Verify([]byte(secret), r.Header.Get(webhook.SignatureHeader), b, time.Minute)}
		_ = json.Unmarshal(b, &rec.body)
		mu.Lock()
		got = append(got, rec)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv, func() []received {
		mu.Lock()
		defer mu.Unlock()
		return append([]received(nil), got...)
	}
}

// A task with NotifyURL has its outcome POSTed, signed as webhooks are (so
// webhook.Verify accepts it), once it finishes: completed, or archived with
// its error; a receiver that fails first gets the notification again.
func TestNotifyURL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const secret = "s3cret-for-signing"
	srv, got := notifyReceiver(t, secret, 1)
	e.server(tide.Config{
		NotifySecret:       secret,
		NotifyAllowPrivate: true, // the receiver listens on 127.0.0.1
		RetryDelayFunc:     func(int, error, *tide.Task) time.Duration { return 20 * time.Millisecond },
	}, tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
		if string(task.Payload()) == "bad" {
			return errors.New("card declined")
		}
		return nil
	}))
	ok, err := e.c.Enqueue(ctx, tide.NewTask("charge", []byte("good")), tide.NotifyURL(srv.URL+"/hook"))
	if err != nil {
		t.Fatal(err)
	}
	bad, err := e.c.Enqueue(ctx, tide.NewTask("charge", []byte("bad")), tide.NotifyURL(srv.URL+"/hook"), tide.MaxRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "both notifications", func() bool { return len(got()) == 2 })
	byID := map[string]received{}
	for _, r := range got() {
		if r.sig != nil {
			t.Fatalf("notification %v: webhook.Verify: %v", r.body, r.sig)
		}
		id, _ := r.body["task_id"].(string)
		byID[id] = r
	}
	if s := byID[ok.ID].body["state"]; s != "completed" {
		t.Fatalf("notification of the good task: %v", byID[ok.ID].body)
	}
	if r := byID[bad.ID].body; r["state"] != "archived" || !strings.Contains(r["error"].(string), "card declined") {
		t.Fatalf("notification of the bad task: %v", r)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(got()); n != 2 {
		t.Fatalf("%d notifications, want 2 (one per task)", n)
	}
	if _, err := e.c.Enqueue(ctx, tide.NewTask("charge", nil), tide.NotifyURL("ftp://x")); !errors.Is(err, tide.ErrInvalidTask) {
		t.Fatalf("NotifyURL(ftp): %v, want ErrInvalidTask", err)
	}
}
