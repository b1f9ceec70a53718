package tide_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
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
)

type received struct {
	body map[string]any
	sig  bool // the signature checked out
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
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(r.Header.Get("Tide-Timestamp") + "."))
		mac.Write(b)
		rec := received{sig: r.Header.Get("Tide-Signature") == "sha256="+hex.EncodeToString(mac.Sum(nil))}
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

// A task with NotifyURL has its outcome POSTed, signed, once it finishes:
// completed, or archived with its error; a receiver that fails first gets
// the notification again.
func TestNotifyURL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const secret = "s3cret-for-signing"
	srv, got := notifyReceiver(t, secret, 1)
	e.server(tide.Config{
		NotifySecret:   secret,
		RetryDelayFunc: func(int, error, *tide.Task) time.Duration { return 20 * time.Millisecond },
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
	eventually(t, 20*time.Second, "both notifications", func() bool { return len(got()) == 2 })
	byID := map[string]received{}
	for _, r := range got() {
		if !r.sig {
			t.Fatalf("notification %v: bad signature", r.body)
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
