package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

const (
	sysTide  = "tide"
	sysAsynq = "asynq"
	sysFloor = "floor" // the redis-benchmark rows: not a system, run once

	taskType     = "bench"
	defaultQueue = "default"
)

// system is one task queue under test, seen through the few operations the
// workloads need. Each workload builds its own system (with its own go-redis
// client) and closes it at the end.
type system interface {
	name() string
	// enqueue stores one task in queue, due at at (zero: now).
	enqueue(ctx context.Context, queue string, payload []byte, at time.Time) error
	// enqueueBatch stores the tasks in one client call. ok is false when the
	// system has no batch call.
	enqueueBatch(ctx context.Context, queue string, payloads [][]byte, at time.Time) (ok bool, err error)
	// startServer starts a server that calls h with every task's payload.
	startServer(cfg serverConfig, h func(ctx context.Context, payload []byte) error) (server, error)
	// stored returns how many tasks Redis holds for the system, in any state.
	stored(ctx context.Context) (int, error)
	close()
}

type serverConfig struct {
	concurrency int
	queues      []string      // nil: the default queue
	lease       time.Duration // tide only; 0: tide's default
	// taskCheck is asynq's TaskCheckInterval (how long its processor sleeps
	// after finding every queue empty); asynq only; 0: asynq's default (1s).
	taskCheck time.Duration
}

// server is a running server; stop shuts it down, giving up after limit.
type server interface {
	stop(limit time.Duration) error
}

func newSystem(kind, addr string) (system, error) {
	rdb := newRDB(addr)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		rdb.Close()
		return nil, err
	}
	switch kind {
	case sysTide:
		b := redisbroker.New(rdb)
		return &tideSystem{rdb: rdb, b: b, c: tide.NewClient(b)}, nil
	case sysAsynq:
		return &asynqSystem{rdb: rdb, c: asynq.NewClientFromRedisClient(rdb)}, nil
	}
	rdb.Close()
	return nil, fmt.Errorf("unknown system %q", kind)
}

// stopWithin runs shutdown, giving up (and leaking it) after limit so that a
// hung shutdown cannot hang the bench.
func stopWithin(name string, limit time.Duration, shutdown func()) error {
	done := make(chan struct{})
	go func() { shutdown(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(limit):
		return fmt.Errorf("%s server did not shut down within %v", name, limit)
	}
}

// ---- tide ----

type tideSystem struct {
	rdb *redis.Client
	b   *redisbroker.Broker
	c   *tide.Client
}

func (s *tideSystem) name() string { return sysTide }

func tideOpts(queue string, at time.Time) []tide.Option {
	var opts []tide.Option
	if queue != defaultQueue {
		opts = append(opts, tide.Queue(queue))
	}
	if !at.IsZero() {
		opts = append(opts, tide.ProcessAt(at))
	}
	return opts
}

func (s *tideSystem) enqueue(ctx context.Context, queue string, payload []byte, at time.Time) error {
	_, err := s.c.Enqueue(ctx, tide.NewTask(taskType, payload), tideOpts(queue, at)...)
	return err
}

func (s *tideSystem) enqueueBatch(ctx context.Context, queue string, payloads [][]byte, at time.Time) (bool, error) {
	ts := make([]*tide.Task, len(payloads))
	for i, p := range payloads {
		ts[i] = tide.NewTask(taskType, p)
	}
	infos, err := s.c.EnqueueMany(ctx, ts, tideOpts(queue, at)...)
	if err != nil {
		return true, err
	}
	if len(infos) != len(ts) {
		return true, fmt.Errorf("EnqueueMany returned %d infos for %d tasks", len(infos), len(ts))
	}
	for i, in := range infos {
		if in == nil {
			return true, fmt.Errorf("EnqueueMany: task %d not stored", i)
		}
	}
	return true, nil
}

type tideServer struct{ srv *tide.Server }

func (t tideServer) stop(limit time.Duration) error {
	return stopWithin(sysTide, limit, t.srv.Shutdown)
}

func (s *tideSystem) startServer(cfg serverConfig, h func(ctx context.Context, payload []byte) error) (server, error) {
	tc := tide.Config{
		Concurrency:   cfg.concurrency,
		LeaseDuration: cfg.lease,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if len(cfg.queues) > 0 {
		tc.Queues = map[string]int{}
		for _, q := range cfg.queues {
			tc.Queues[q] = 1
		}
	}
	srv := tide.NewServer(s.b, tc)
	err := srv.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		return h(ctx, t.Payload())
	}))
	if err != nil {
		return nil, err
	}
	return tideServer{srv}, nil
}

// stored counts the records in every partition's task hash
// (<prefix>:{<queue>:<p>}:t, see the redisbroker package documentation):
// every task, in any state, has exactly one.
func (s *tideSystem) stored(ctx context.Context) (int, error) {
	return sumHLen(ctx, s.rdb, redisbroker.DefaultPrefix+":{*}:t")
}

func sumHLen(ctx context.Context, rdb *redis.Client, pattern string) (int, error) {
	total := 0
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n, err := rdb.HLen(ctx, iter.Val()).Result()
		if err != nil {
			return 0, err
		}
		total += int(n)
	}
	return total, iter.Err()
}

func (s *tideSystem) close() {
	_ = s.c.Close()
	_ = s.b.Close()
	_ = s.rdb.Close()
}

// ---- asynq ----

type asynqSystem struct {
	rdb *redis.Client
	c   *asynq.Client
}

func (s *asynqSystem) name() string { return sysAsynq }

func asynqOpts(queue string, at time.Time) []asynq.Option {
	var opts []asynq.Option
	if queue != defaultQueue {
		opts = append(opts, asynq.Queue(queue))
	}
	if !at.IsZero() {
		opts = append(opts, asynq.ProcessAt(at))
	}
	return opts
}

func (s *asynqSystem) enqueue(ctx context.Context, queue string, payload []byte, at time.Time) error {
	_, err := s.c.EnqueueContext(ctx, asynq.NewTask(taskType, payload), asynqOpts(queue, at)...)
	return err
}

// enqueueBatch: asynq has no batch enqueue.
func (s *asynqSystem) enqueueBatch(context.Context, string, [][]byte, time.Time) (bool, error) {
	return false, nil
}

type asynqServer struct{ srv *asynq.Server }

func (a asynqServer) stop(limit time.Duration) error {
	return stopWithin(sysAsynq, limit, a.srv.Shutdown)
}

func (s *asynqSystem) startServer(cfg serverConfig, h func(ctx context.Context, payload []byte) error) (server, error) {
	ac := asynq.Config{
		Concurrency:       cfg.concurrency,
		TaskCheckInterval: cfg.taskCheck,
		Logger:            nopLogger{},
		LogLevel:          asynq.FatalLevel,
	}
	if len(cfg.queues) > 0 {
		ac.Queues = map[string]int{}
		for _, q := range cfg.queues {
			ac.Queues[q] = 1
		}
	}
	srv := asynq.NewServerFromRedisClient(s.rdb, ac)
	err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		return h(ctx, t.Payload())
	}))
	if err != nil {
		return nil, err
	}
	return asynqServer{srv}, nil
}

// stored sums the sizes of all of asynq's queues (pending, active,
// scheduled, retry, archived, completed, aggregating).
func (s *asynqSystem) stored(context.Context) (int, error) {
	in := asynq.NewInspectorFromRedisClient(s.rdb)
	qs, err := in.Queues()
	if err != nil {
		return 0, err
	}
	total := 0
	for _, q := range qs {
		info, err := in.GetQueueInfo(q)
		if err != nil {
			if strings.Contains(err.Error(), "does not exist") || errors.Is(err, asynq.ErrQueueNotFound) {
				continue
			}
			return 0, err
		}
		total += info.Size
	}
	return total, nil
}

func (s *asynqSystem) close() {
	_ = s.c.Close()
	_ = s.rdb.Close()
}

type nopLogger struct{}

func (nopLogger) Debug(...any) {}
func (nopLogger) Info(...any)  {}
func (nopLogger) Warn(...any)  {}
func (nopLogger) Error(...any) {}
func (nopLogger) Fatal(...any) {}
