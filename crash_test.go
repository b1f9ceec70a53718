package tide_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// crashWorkerEnv makes the test binary act as a worker process (see
// runCrashWorker), so the crash test can SIGKILL a real process mid-task.
const crashWorkerEnv = "TIDE_TEST_CRASH_WORKER"

// runCrashWorker serves tasks whose handler announces itself in Redis and
// then blocks until the process is killed.
func runCrashWorker() {
	addr, prefix := os.Getenv("TIDE_TEST_REDIS"), os.Getenv("TIDE_TEST_PREFIX")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	s := tide.NewServer(b, tide.Config{LeaseDuration: time.Second})
	err := s.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		rdb.Set(ctx, prefix+":test:started", id, 0)
		select {} // hang until SIGKILL
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	select {}
}

// TestCrashedWorkerTaskIsRecovered kills a worker process with SIGKILL in the
// middle of a task; a second server runs the task once the lease has run out.
func TestCrashedWorkerTaskIsRecovered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	info, err := e.c.Enqueue(ctx, tide.NewTask("crashy", []byte("payload")), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"=1", "TIDE_TEST_REDIS="+e.addr, "TIDE_TEST_PREFIX="+e.prefix)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testwait.For(t, 20*time.Second, "the worker process to start the task", func() bool {
		id, _ := e.rdb.Get(ctx, e.prefix+":test:started").Result()
		return id == info.ID
	})
	if st := e.info("default", info.ID); st.State != tide.StateActive {
		t.Fatalf("state while the worker runs it = %v, want active", st.State)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()

	got := make(chan string, 1)
	e.server(tide.Config{LeaseDuration: time.Second}, tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
		got <- string(task.Payload())
		return nil
	}))
	select {
	case p := <-got:
		if p != "payload" {
			t.Fatalf("payload = %q", p)
		}
		t.Logf("task restarted %v after SIGKILL (lease 1s)", time.Since(killed).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("task of the killed worker was never processed again")
	}
	done := e.waitState("default", info.ID, tide.StateCompleted)
	if done.Retried != 1 {
		t.Fatalf("retried = %d, want 1 (the crashed attempt counts)", done.Retried)
	}
}
