package middleware_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis keeps a connection-reaper goroutine per client until
		// Close, which tests do in t.Cleanup.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// env is a Redis broker with a key prefix of its own, and a client on it.
type env struct {
	t    *testing.T
	addr string
	b    *redisbroker.Broker
	c    *tide.Client
}

func setup(t *testing.T) *env {
	t.Helper()
	addr := redistest.Addr(t)
	b := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(redistest.Prefix(t)))
	return &env{t: t, addr: addr, b: b, c: tide.NewClient(b)}
}

// server starts a server on the env's broker; it is shut down when the test
// ends. Retries come 10ms after a failure unless cfg says otherwise.
func (e *env) server(cfg tide.Config, h tide.Handler) *tide.Server {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	if cfg.RetryDelayFunc == nil {
		cfg.RetryDelayFunc = tide.RetrySchedule(10 * time.Millisecond)
	}
	s := tide.NewServer(e.b, cfg)
	if err := s.Start(h); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.t.Cleanup(s.Shutdown)
	return s
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// failOnce returns a handler that fails its first call with "boom" and
// succeeds afterwards, counting calls.
func failOnce(calls *atomic.Int32) tide.HandlerFunc {
	return func(context.Context, *tide.Task) error {
		if calls.Add(1) == 1 {
			return errBoom
		}
		return nil
	}
}

type boomError struct{}

func (boomError) Error() string { return "boom" }

var errBoom error = boomError{}
