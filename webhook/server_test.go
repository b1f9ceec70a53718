package webhook_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/webhook"
)

// These tests run webhook tasks through a real tide.Server on Redis.

var secret = []byte("server-test-secret-0123456789")

type env struct {
	t  *testing.T
	b  *redisbroker.Broker
	c  *tide.Client
	in *tide.Inspector
}

func setup(t *testing.T, allowed ...string) *env {
	t.Helper()
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	b := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix))
	h, err := webhook.Handler(webhook.Config{Secret: secret, AllowedHosts: allowed, AllowPrivateNetworks: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mux := tide.NewServeMux()
	mux.Handle(webhook.TaskType, h)
	srv := tide.NewServer(redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix)), tide.Config{
		Queues:          map[string]int{webhook.DefaultQueue: 1},
		RetryDelayFunc:  tide.RetrySchedule(50 * time.Millisecond),
		ShutdownTimeout: time.Second,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return &env{t: t, b: b, c: tide.NewClient(b), in: tide.NewInspector(b)}
}

func TestFailedDeliveryIsRetried(t *testing.T) {
	type delivery struct {
		id, attempt string
		verified    bool
	}
	var mu sync.Mutex
	var got []delivery
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, delivery{r.Header.Get(webhook.DeliveryHeader), r.Header.Get(webhook.AttemptHeader),
			webhook.Verify(secret, r.Header.Get(webhook.SignatureHeader), body, time.Minute) == nil})
		n := len(got)
		mu.Unlock()
		if n == 1 {
			http.Error(w, "database is down", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	u, _ := url.Parse(recv.URL)
	e := setup(t, u.Hostname())

	tk, err := webhook.NewTask(webhook.Payload{URL: recv.URL + "/hook", Body: []byte(`{"order":42}`)}, tide.TaskID("hook-42"), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.c.Enqueue(context.Background(), tk)
	if err != nil {
		t.Fatal(err)
	}
	if info.Queue != webhook.DefaultQueue {
		t.Fatalf("queue = %q, want %q", info.Queue, webhook.DefaultQueue)
	}
	testwait.For(t, 10*time.Second, "the task to complete", func() bool {
		ti, err := e.in.GetTaskInfo(context.Background(), webhook.DefaultQueue, "hook-42")
		return err == nil && ti.State == tide.StateCompleted
	})
	ti, _ := e.in.GetTaskInfo(context.Background(), webhook.DefaultQueue, "hook-42")
	if ti.Retried != 1 || !strings.Contains(ti.LastErr, "status 500") || !strings.Contains(ti.LastErr, "database is down") {
		t.Errorf("retried %d, last error %q", ti.Retried, ti.LastErr)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []delivery{{"hook-42", "1", true}, {"hook-42", "2", true}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("deliveries = %+v, want %+v", got, want)
	}
}

func TestDisallowedHostIsArchived(t *testing.T) {
	e := setup(t, "hooks.example.com")
	tk, err := webhook.NewTask(webhook.Payload{URL: "https://evil.example.net/steal", Body: []byte("x")}, tide.TaskID("evil"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	var ti *tide.TaskInfo
	testwait.For(t, 10*time.Second, "the task to be archived", func() bool {
		ti, err = e.in.GetTaskInfo(context.Background(), webhook.DefaultQueue, "evil")
		return err == nil && ti.State == tide.StateArchived
	})
	if ti.Retried != 0 || !strings.Contains(ti.LastErr, `host "evil.example.net" is not in AllowedHosts`) {
		t.Errorf("retried %d, last error %q", ti.Retried, ti.LastErr)
	}
}

func TestRedirectIsRetriedNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var methods []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		methods = append(methods, r.Method+" "+r.URL.Path)
		n := len(methods)
		mu.Unlock()
		if n == 1 {
			http.Redirect(w, r, "/moved", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	u, _ := url.Parse(recv.URL)
	e := setup(t, u.Hostname())

	tk, err := webhook.NewTask(webhook.Payload{URL: recv.URL + "/hook", Body: []byte(`{"order":42}`)}, tide.TaskID("hook-302"), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Enqueue(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	var ti *tide.TaskInfo
	testwait.For(t, 10*time.Second, "the task to complete", func() bool {
		ti, err = e.in.GetTaskInfo(context.Background(), webhook.DefaultQueue, "hook-302")
		return err == nil && ti.State == tide.StateCompleted
	})
	if want := `status 302 Found to "` + recv.URL + `/moved", not followed`; ti.Retried != 1 || !strings.Contains(ti.LastErr, want) {
		t.Errorf("retried %d, last error %q; want 1 and an error containing %q", ti.Retried, ti.LastErr, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(methods) != 2 || methods[0] != "POST /hook" || methods[1] != "POST /hook" {
		t.Errorf("receiver got %q, want the POST twice (never a GET of the redirect)", methods)
	}
}
