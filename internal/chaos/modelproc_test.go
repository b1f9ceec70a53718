package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// The model tests' worker processes (TestFlowModel, TestLimitModel) are the
// test binary re-executed like TestChaos's workers, with envModel set to the
// model's name: they serve the model's queues, talking to Redis through
// envAddr (a fault proxy), and log what their handlers do straight to Redis
// (envDirect), beside the proxy, so that the log itself suffers no fault.
const (
	envModel  = "TIDE_MODEL"        // "fm": runModelWorker; "lm": runLimitWorker
	envDirect = "TIDE_MODEL_DIRECT" // Redis's own address, for the log
)

// modelBuild makes a model process's server configuration and handler, for
// the server named id ("<worker>.<incarnation>"), given its broker and the
// model's log.
type modelBuild func(b broker.Broker, rec recorder, id string, logger *slog.Logger) (tide.Config, tide.Handler)

// runModelProcess is a model's worker process: a server built by build, on
// a broker with opts through the proxy, whose handlers log into the model's
// log ns (see newRedisRecorder). Once the server has started it logs
// "U <id>"; it serves until SIGTERM, then shuts down gracefully and checks,
// like runWorker, that none of the goroutines it started is left.
func runModelProcess(ns string, opts []redisbroker.Option, build modelBuild) int {
	baseline := goleak.IgnoreCurrent()
	name, addr, direct, prefix, dir := os.Getenv(workerEnv), os.Getenv(envAddr), os.Getenv(envDirect), os.Getenv(envPrefix), os.Getenv(envDir)
	inc, _ := strconv.Atoi(os.Getenv(envIncarnat))
	lf, err := os.OpenFile(logFile(dir, name, inc), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	defer lf.Close()
	sig, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := os.WriteFile(readyFile(dir, name, inc), nil, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	logRDB := redis.NewClient(&redis.Options{Addr: direct})
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: workerReadTimeout})
	b := redisbroker.New(rdb, append([]redisbroker.Option{redisbroker.WithPrefix(prefix)}, opts...)...)
	rec := newRedisRecorder(logRDB, prefix, ns)
	id := fmt.Sprintf("%s.%d", name, inc)
	cfg, h := build(b, rec, id, slog.New(slog.NewJSONHandler(lf, nil)))
	srv := tide.NewServer(b, cfg)
	if err := srv.Start(h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, _, err = rec.add(c, "U "+id, "")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		srv.Shutdown()
		return exitSetup
	}
	<-sig.Done()
	srv.Shutdown()
	stop()
	_ = b.Close()
	_ = rdb.Close()
	_ = logRDB.Close()
	leak := goleak.Find(baseline)
	report := "clean"
	if leak != nil {
		report = fmt.Sprintf("goroutines left after Shutdown (%d running):\n%v", runtime.NumGoroutine(), leak)
	}
	_ = os.WriteFile(exitFile(dir, name, inc), []byte(report), 0o644)
	if leak != nil {
		return exitLeak
	}
	return exitClean
}
