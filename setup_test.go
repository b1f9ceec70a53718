package tide_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashWorkerEnv) != "" {
		runCrashWorker()
		return
	}
	if os.Getenv(flowWorkerEnv) != "" {
		runFlowWorker()
		return
	}
	if os.Getenv(groupWorkerEnv) != "" {
		runGroupWorker()
		return
	}
	if os.Getenv(durableWorkerEnv) != "" {
		runDurableWorker()
		return
	}
	goleak.VerifyTestMain(m,
		// go-redis keeps a connection-reaper goroutine per client until Close;
		// tests close theirs in t.Cleanup, after goleak's per-package check
		// could run, so the pool's helpers are ignored here.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// env is what most tests need: a Redis broker with its own key prefix on a
// Redis of its own (or TIDE_REDIS_ADDR), and a client.
type env struct {
	t      *testing.T
	addr   string
	prefix string
	rdb    *redis.Client
	b      *redisbroker.Broker
	c      *tide.Client
	opts   []redisbroker.Option
}

func setup(t *testing.T, opts ...redisbroker.Option) *env {
	t.Helper()
	addr := redistest.Addr(t)
	e := &env{t: t, addr: addr, prefix: redistest.Prefix(t), opts: opts}
	e.rdb = redistest.Client(t, addr)
	e.b = e.broker()
	e.c = tide.NewClient(e.b)
	return e
}

// broker returns another broker on the same Redis, prefix and options
// (another process's view).
func (e *env) broker() *redisbroker.Broker {
	rdb := redistest.Client(e.t, e.addr)
	return redisbroker.New(rdb, append([]redisbroker.Option{redisbroker.WithPrefix(e.prefix)}, e.opts...)...)
}

// server starts a server on the env's broker with cfg and h; it is shut down
// when the test ends.
func (e *env) server(cfg tide.Config, h tide.Handler) *tide.Server {
	e.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(e.t)
	}
	s := tide.NewServer(e.broker(), cfg)
	if err := s.Start(h); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.t.Cleanup(s.Shutdown)
	return s
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func (e *env) info(queue, id string) *tide.TaskInfo {
	e.t.Helper()
	in := tide.NewInspector(e.b)
	ti, err := in.GetTaskInfo(context.Background(), queue, id)
	if err != nil {
		e.t.Fatalf("GetTaskInfo(%s, %s): %v", queue, id, err)
	}
	return ti
}

// waitState waits until the task is in state st and returns its info.
func (e *env) waitState(queue, id string, st tide.TaskState) *tide.TaskInfo {
	e.t.Helper()
	var ti *tide.TaskInfo
	in := tide.NewInspector(e.b)
	testwait.For(e.t, 10*time.Second, "task "+id+" to be "+st.String(), func() bool {
		var err error
		ti, err = in.GetTaskInfo(context.Background(), queue, id)
		return err == nil && ti.State == st
	})
	return ti
}

// waitGone waits until the task no longer exists.
func (e *env) waitGone(queue, id string) {
	e.t.Helper()
	in := tide.NewInspector(e.b)
	testwait.For(e.t, 10*time.Second, "task "+id+" to be deleted", func() bool {
		_, err := in.GetTaskInfo(context.Background(), queue, id)
		return err == tide.ErrTaskNotFound
	})
}
