package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// The worker process: TestChaos re-executes the test binary with these
// variables set, and TestMain then runs runWorker instead of the tests.
const (
	workerEnv   = "TIDE_CHAOS_WORKER" // worker name, e.g. "w1"
	envAddr     = "TIDE_CHAOS_ADDR"   // Redis address (the proxy)
	envPrefix   = "TIDE_CHAOS_PREFIX" // key prefix
	envDir      = "TIDE_CHAOS_DIR"    // where the worker writes its files
	envIncarnat = "TIDE_CHAOS_INCARNATION"
	envLeak     = "TIDE_CHAOS_LEAK" // set: leak a goroutine (tests the check)
)

// The workers' configuration, which the test's bounds are computed from.
const (
	workerConcurrency = 10
	workerLease       = 2 * time.Second
	workerShutdown    = 5 * time.Second
	// workerReadTimeout is the workers' (and the producer's) go-redis read
	// timeout: shorter than the lease, so that a reply delayed past it makes
	// go-redis send the command again without the stall outlasting a lease.
	workerReadTimeout = time.Second
	chaosPartitions   = 4
	chaosTaskType     = "chaos:task"
)

// Exit codes of a worker process.
const (
	exitClean = 0
	exitSetup = 2
	exitLeak  = 3
)

// File names in the run directory. An incarnation is one process of a
// worker: a restarted worker gets the next number.
func execFile(dir, name string, inc int) string {
	return filepath.Join(dir, fmt.Sprintf("exec-%s-%02d.log", name, inc))
}
func logFile(dir, name string, inc int) string {
	return filepath.Join(dir, fmt.Sprintf("log-%s-%02d.json", name, inc))
}
func stderrFile(dir, name string, inc int) string {
	return filepath.Join(dir, fmt.Sprintf("stderr-%s-%02d.txt", name, inc))
}

// readyFile is written by a model process once it handles SIGTERM.
func readyFile(dir, name string, inc int) string {
	return filepath.Join(dir, fmt.Sprintf("ready-%s-%02d", name, inc))
}
func exitFile(dir, name string, inc int) string {
	return filepath.Join(dir, fmt.Sprintf("exit-%s-%02d.txt", name, inc))
}

// runWorker serves chaos tasks until SIGTERM, then shuts down gracefully and
// checks that none of the goroutines it started is left. Each execution is
// recorded in the process's own file (Redis may be down, the process may be
// killed at any instruction): one line per attempt, written with a single
// write(2) on an O_APPEND file, so a SIGKILL leaves whole lines only.
//
//	S <task ID> <retry count> <unix ns>   the attempt succeeded (written just
//	                                      before the handler returns nil)
//	F <task ID> <retry count> <unix ns>   a planned failure
//
// A task's payload is the number of attempts that must fail before one
// succeeds (compared with GetRetryCount, so recovered attempts count too).
func runWorker() int {
	baseline := goleak.IgnoreCurrent()
	if os.Getenv(envLeak) != "" {
		block := make(chan struct{})
		go func() { <-block }() // never closed
	}
	name, addr, prefix, dir := os.Getenv(workerEnv), os.Getenv(envAddr), os.Getenv(envPrefix), os.Getenv(envDir)
	inc, _ := strconv.Atoi(os.Getenv(envIncarnat))
	rec, err := os.OpenFile(execFile(dir, name, inc), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	defer rec.Close()
	lf, err := os.OpenFile(logFile(dir, name, inc), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	defer lf.Close()
	record := func(kind byte, id string, n int) error {
		_, err := fmt.Fprintf(rec, "%c %s %d %d\n", kind, id, n, time.Now().UnixNano())
		return err
	}

	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: workerReadTimeout})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(chaosPartitions))
	srv := tide.NewServer(b, tide.Config{
		Concurrency:     workerConcurrency,
		LeaseDuration:   workerLease,
		ShutdownTimeout: workerShutdown,
		RetryDelayFunc:  tide.RetrySchedule(100*time.Millisecond, 200*time.Millisecond, 400*time.Millisecond),
		Logger:          slog.New(slog.NewJSONHandler(lf, nil)),
		ServerID:        fmt.Sprintf("%s.%d", name, inc),
	})
	h := tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		n, _ := tide.GetRetryCount(ctx)
		failN, err := strconv.Atoi(string(t.Payload()))
		if err != nil {
			return fmt.Errorf("bad payload %q: %w", t.Payload(), tide.SkipRetry)
		}
		timer := time.NewTimer(time.Duration(rand.IntN(51)) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-ctx.Done(): // lease lost or shutdown: no success to record
			return context.Cause(ctx)
		case <-timer.C:
		}
		if n < failN {
			if err := record('F', id, n); err != nil {
				return err
			}
			return fmt.Errorf("planned failure %d of %d", n+1, failN)
		}
		return record('S', id, n)
	})
	if err := srv.Run(h); err != nil { // returns after SIGTERM and Shutdown
		fmt.Fprintln(os.Stderr, err)
		return exitSetup
	}
	_ = b.Close()
	_ = rdb.Close()

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

// TestWorkerLeakCheck checks the check TestChaos relies on: a worker process
// shuts down cleanly on SIGTERM and exits 0, and one that leaves a goroutine
// behind is reported.
func TestWorkerLeakCheck(t *testing.T) {
	dir := t.TempDir()
	rs := redistest.StartIn(t, dir)
	f := newFleet(t, dir, rs.Addr, "leakcheck")
	f.start("clean")
	f.start("leaky", envLeak+"=1")
	for _, name := range []string{"clean", "leaky"} {
		testwait.For(t, 60*time.Second, name+" to start", func() bool {
			b, _ := os.ReadFile(logFile(dir, name, 1))
			return strings.Contains(string(b), "tide: server started")
		})
	}
	errs := f.terminate(workerShutdown + 30*time.Second)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "worker leaky.1 leaked goroutines") {
		t.Fatalf("want one error, for the leaky worker; got %v", errs)
	}
	t.Logf("reported: %.200s", errs[0])
}
