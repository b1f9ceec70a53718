package middleware_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testlog"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/middleware"
)

// lines decodes JSON log lines.
func lines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("bad log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func jsonLogger(w *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestLoggingAcrossRedis(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var buf testlog.Buffer
	var calls atomic.Int32
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(jsonLogger(&buf)))
	mux.Handle("user:notify", failOnce(&calls))
	e.server(tide.Config{Queues: map[string]int{"mail": 1}}, mux)

	info, err := e.c.Enqueue(context.Background(), tide.NewTask("user:notify", []byte(`{"ssn":"123-45-6789"}`)), tide.Queue("mail"))
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "two log lines", func() bool { return strings.Count(buf.String(), "\n") >= 2 })
	ls := lines(t, buf.String())
	if len(ls) != 2 {
		t.Fatalf("%d log lines, want 2:\n%s", len(ls), buf.String())
	}
	for i, l := range ls {
		want := map[string]any{
			"msg": "tide: task attempt", "type": "user:notify", "queue": "mail",
			"id": info.ID, "attempt": float64(i + 1),
		}
		for k, v := range want {
			if l[k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, l[k], v)
			}
		}
		if d, ok := l["duration"].(float64); !ok || d < 0 {
			t.Errorf("line %d: duration = %v, want a non-negative number", i, l["duration"])
		}
		if _, ok := l["payload"]; ok || strings.Contains(buf.String(), "6789") {
			t.Errorf("line %d logs the payload without WithPayload", i)
		}
	}
	if l := ls[0]; l["level"] != "WARN" || l["outcome"] != "error" || l["err"] != "boom" {
		t.Errorf("first attempt: %v, want level WARN, outcome error, err boom", l)
	}
	if l := ls[1]; l["level"] != "INFO" || l["outcome"] != "ok" || l["err"] != nil {
		t.Errorf("second attempt: %v, want level INFO, outcome ok, no err", l)
	}
}

func TestLoggingOutsideServer(t *testing.T) {
	t.Parallel()
	var buf testlog.Buffer
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(jsonLogger(&buf)))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
	if err := mux.ProcessTask(context.Background(), tide.NewTask("t", []byte("secret"))); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, buf.String())
	if len(ls) != 1 {
		t.Fatalf("%d lines, want 1", len(ls))
	}
	for _, k := range []string{"queue", "id", "attempt", "payload", "err"} {
		if v, ok := ls[0][k]; ok {
			t.Errorf("%s = %v logged outside a server", k, v)
		}
	}
	if ls[0]["outcome"] != "ok" || ls[0]["type"] != "t" {
		t.Errorf("line %v", ls[0])
	}
}

func TestLoggingPayload(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", middleware.MaxLoggedPayload) // 2 bytes a rune
	binary := []byte{0xff, 0x00, 0xfe}
	for _, c := range []struct {
		name      string
		payload   []byte
		want      string
		truncated bool
	}{
		{"text", []byte(`{"to":"a@b"}`), `{"to":"a@b"}`, false},
		{"binary", binary, base64.StdEncoding.EncodeToString(binary), false},
		{"long", []byte(long), long[:middleware.MaxLoggedPayload], true},
		{"long-odd", []byte("x" + long), "x" + long[:middleware.MaxLoggedPayload-2], true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var buf testlog.Buffer
			mux := tide.NewServeMux()
			mux.Use(middleware.Logging(jsonLogger(&buf), middleware.WithPayload()))
			mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
			_ = mux.ProcessTask(context.Background(), tide.NewTask("t", c.payload))
			l := lines(t, buf.String())[0]
			if l["payload"] != c.want {
				t.Errorf("payload = %.40q..., want %.40q...", l["payload"], c.want)
			}
			if tr, _ := l["payload_truncated"].(bool); tr != c.truncated {
				t.Errorf("payload_truncated = %v, want %v", l["payload_truncated"], c.truncated)
			}
		})
	}
}

func TestLoggingLevels(t *testing.T) {
	t.Parallel()
	var buf testlog.Buffer
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(jsonLogger(&buf), middleware.WithLevels(slog.LevelDebug, slog.LevelError)))
	mux.HandleFunc("ok", func(context.Context, *tide.Task) error { return nil })
	mux.HandleFunc("bad", func(context.Context, *tide.Task) error { return errors.New("no") })
	_ = mux.ProcessTask(context.Background(), tide.NewTask("ok", nil))
	_ = mux.ProcessTask(context.Background(), tide.NewTask("bad", nil))
	ls := lines(t, buf.String())
	if len(ls) != 2 || ls[0]["level"] != "DEBUG" || ls[1]["level"] != "ERROR" {
		t.Errorf("lines %v, want DEBUG then ERROR", ls)
	}

	// A disabled level writes nothing.
	var quiet testlog.Buffer
	mux = tide.NewServeMux()
	mux.Use(middleware.Logging(slog.New(slog.NewJSONHandler(&quiet, nil)), middleware.WithLevels(slog.LevelDebug, slog.LevelWarn)))
	mux.HandleFunc("ok", func(context.Context, *tide.Task) error { return nil })
	_ = mux.ProcessTask(context.Background(), tide.NewTask("ok", nil))
	if quiet.String() != "" {
		t.Errorf("logged at a disabled level: %s", quiet.String())
	}
}

func TestLoggingPanic(t *testing.T) {
	t.Parallel()
	var buf testlog.Buffer
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(jsonLogger(&buf)))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { panic("kaboom") })
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want the panic re-raised", r)
			}
		}()
		_ = mux.ProcessTask(context.Background(), tide.NewTask("t", nil))
	}()
	l := lines(t, buf.String())[0]
	if e, _ := l["err"].(string); l["outcome"] != "error" || !strings.HasPrefix(e, "tide: handler panic: kaboom\n") {
		t.Errorf("line %v, want outcome error with the panic", l)
	}
}

// Not parallel: it replaces the default logger.
func TestLoggingNilLoggerUsesDefault(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	defer slog.SetDefault(old)
	mux := tide.NewServeMux()
	mux.Use(middleware.Logging(nil))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { return nil })
	_ = mux.ProcessTask(context.Background(), tide.NewTask("t", nil))
	if !strings.Contains(buf.String(), `"msg":"tide: task attempt"`) {
		t.Errorf("default logger got %q", buf.String())
	}
}
