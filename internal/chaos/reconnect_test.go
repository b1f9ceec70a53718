package chaos

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestReconnect checks what a server does when Redis goes away and comes
// back: it logs one clear line each way, backs off instead of hammering the
// network, keeps the outcome of a task that finished during the outage and
// writes it once Redis is back (its lease outlasts the outage), and resumes
// by itself.
func TestReconnect(t *testing.T) {
	const (
		lease  = 10 * time.Second
		outage = 3 * time.Second
		prefix = "reconnect"
		// A loop that retried without back-off would make thousands of
		// broker calls in 3 s; the engine's back-offs allow about ten.
		maxFailedCalls = 100
		// Connection attempts are more: go-redis retries a failed command
		// three times (its own 8-512 ms back-off) and its pub/sub
		// connection redials every 100 ms; 40-90 are typical.
		maxAttempts = 300
	)
	ctx := context.Background()
	rs := redistest.Start(t)
	px, err := faultproxy.New(rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })

	// The server goes through the proxy; the test's client and inspector
	// talk to Redis directly, so they see the state while the server is cut
	// off and add nothing to the proxy's counts.
	var logs testlog.Buffer
	srdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { _ = srdb.Close() })
	srv := tide.NewServer(redisbroker.New(srdb, redisbroker.WithPrefix(prefix)), tide.Config{
		Concurrency:   2,
		LeaseDuration: lease,
		Logger:        slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	drdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = drdb.Close() })
	db := redisbroker.New(drdb, redisbroker.WithPrefix(prefix))
	client, insp := tide.NewClient(db), tide.NewInspector(db)

	started := make(chan string, 1)
	release := make(chan struct{})
	quick := make(chan string, 1)
	mux := tide.NewServeMux()
	mux.HandleFunc("block", func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		started <- id
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	mux.HandleFunc("quick", func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		quick <- id
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	blocked, err := client.Enqueue(ctx, tide.NewTask("block", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-started:
		if id != blocked.ID {
			t.Fatalf("started %s, want %s", id, blocked.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the task never started")
	}

	refused0 := px.Refused()
	cutAt := time.Now()
	px.Cut(outage)
	time.Sleep(300 * time.Millisecond)
	close(release) // the outcome is now in the server's hands, Redis out of reach
	time.Sleep(outage / 2)
	if ti, err := insp.GetTaskInfo(ctx, "default", blocked.ID); err != nil || ti.State != tide.StateActive {
		t.Fatalf("during the outage the finished task should still be active (outcome not written yet): %+v, %v", ti, err)
	}
	// Another producer still reaches Redis: its task's wake-up event is
	// lost to the cut-off server, which must find the task anyway.
	during, err := client.Enqueue(ctx, tide.NewTask("quick", nil))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, outage+30*time.Second, "the cut to end", func() bool { return !px.Down() })
	restoredAt := time.Now()
	refusedDuring := px.Refused() - refused0

	// (c) The kept outcome is written: completed, not retried.
	var ti *tide.TaskInfo
	testwait.For(t, 30*time.Second, "the outcome kept during the outage to be written", func() bool {
		ti, err = insp.GetTaskInfo(ctx, "default", blocked.ID)
		return err == nil && ti.State == tide.StateCompleted
	})
	writtenAfter := time.Since(restoredAt)
	if ti.Retried != 0 || ti.LastErr != "" {
		t.Errorf("the task was retried (retried %d, last error %q); its outcome should have been written after the outage", ti.Retried, ti.LastErr)
	}

	// (d) Work that arrived during the outage, and new work, is processed.
	select {
	case id := <-quick:
		if id != during.ID {
			t.Fatalf("processed %s, want %s", id, during.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a task enqueued (by another client) during the outage was not processed after it")
	}
	missedAfter := time.Since(restoredAt)
	fresh, err := client.Enqueue(ctx, tide.NewTask("quick", nil))
	if err != nil {
		t.Fatal(err)
	}
	freshAt := time.Now()
	select {
	case id := <-quick:
		if id != fresh.ID {
			t.Fatalf("processed %s, want %s", id, fresh.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a task enqueued after the outage was not processed")
	}
	freshLatency := time.Since(freshAt)

	// (a) One line when Redis went away, one when it came back, in order.
	var down, up []logLine
	for _, l := range logLines(t, logs.String()) {
		switch {
		case strings.HasPrefix(l.Msg, "tide: broker unreachable"):
			down = append(down, l)
		case strings.HasPrefix(l.Msg, "tide: broker reachable again"):
			up = append(up, l)
		case strings.Contains(l.Msg, "lease"):
			t.Errorf("unexpected log line: %s", l.raw)
		}
	}
	if len(down) == 0 || len(up) == 0 {
		t.Fatalf("want an 'unreachable' and a 'reachable again' line, got %d and %d:\n%s", len(down), len(up), logs.String())
	}
	if down[0].Level != "ERROR" || down[0].Time.Before(cutAt) || up[0].Time.Before(down[0].Time) {
		t.Errorf("'unreachable' line: %s\n'reachable again' line: %s", down[0].raw, up[0].raw)
	}
	if up[0].Time.Before(restoredAt.Add(-50 * time.Millisecond)) {
		t.Errorf("'reachable again' logged before the outage ended (%v): %s", restoredAt, up[0].raw)
	}
	if len(down) != 1 || len(up) != 1 {
		t.Errorf("want exactly one 'unreachable' and one 'reachable again' line, got %d and %d:\n%s", len(down), len(up), logs.String())
	}

	// (b) No busy loop: few failed calls and connection attempts.
	attempts := refusedDuring
	if attempts > maxAttempts {
		t.Errorf("%d connection attempts during a %v outage: the server does not back off", attempts, outage)
	}
	if up[0].FailedCalls > maxFailedCalls {
		t.Errorf("%d failed broker calls during a %v outage: the server does not back off", up[0].FailedCalls, outage)
	}
	t.Logf("outage %v: %d failed broker calls, %d connection attempts refused; kept outcome written %v after the return; task enqueued during the outage processed %v after it, a new one in %v",
		outage, up[0].FailedCalls, attempts, writtenAfter.Round(time.Millisecond), missedAfter.Round(time.Millisecond), freshLatency.Round(time.Millisecond))
}

type logLine struct {
	Time        time.Time `json:"time"`
	Level       string    `json:"level"`
	Msg         string    `json:"msg"`
	FailedCalls int       `json:"failed_calls"`
	raw         string
}

// logLines parses JSON log output, one record a line.
func logLines(t *testing.T, text string) []logLine {
	var out []logLine
	for _, raw := range strings.Split(text, "\n") {
		if raw == "" {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Errorf("log line is not JSON: %q: %v", raw, err)
			continue
		}
		l.raw = raw
		out = append(out, l)
	}
	return out
}
