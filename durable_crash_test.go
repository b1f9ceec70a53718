package tide_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// durableWorkerEnv makes the test binary act as a worker process running a
// durable handler (see runDurableWorker), so that a test can SIGKILL it
// between steps.
const durableWorkerEnv = "TIDE_TEST_DURABLE_WORKER"

// durableSteps is how many steps the crash test's handler has.
const durableSteps = 4

// runDurableWorker serves a handler of durableSteps steps. Each step's fn
// counts its side effect in Redis (<prefix>:test:fx:<i>); after step
// TIDE_TEST_KILL_AT returns (its result stored) the handler records that
// it got there and hangs until the process is killed.
func runDurableWorker() {
	addr, prefix := os.Getenv("TIDE_TEST_REDIS"), os.Getenv("TIDE_TEST_PREFIX")
	killAt, _ := strconv.Atoi(os.Getenv("TIDE_TEST_KILL_AT"))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	s := tide.NewServer(b, tide.Config{LeaseDuration: 500 * time.Millisecond})
	err := s.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		for i := 1; i <= durableSteps; i++ {
			v, err := tide.Step(ctx, "s"+strconv.Itoa(i), func(ctx context.Context) (int, error) {
				return i, rdb.Incr(ctx, prefix+":test:fx:"+strconv.Itoa(i)).Err()
			})
			if err != nil {
				return err
			}
			if v != i {
				return fmt.Errorf("step %d replayed %d", i, v)
			}
			if i == killAt {
				rdb.Set(ctx, prefix+":test:reached", i, 0)
				select {} // hang until SIGKILL
			}
		}
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	select {}
}

// TestDurableStepsSurviveSIGKILL kills the worker with SIGKILL between
// every pair of steps; each next worker recovers the task and replays the
// stored steps. Every step's side effect happens exactly once: a stored
// step never runs again.
func TestDurableStepsSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	info, err := e.c.Enqueue(ctx, tide.NewTask("durable", nil), tide.Retention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	start := func(killAt int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), durableWorkerEnv+"=1", "TIDE_TEST_REDIS="+e.addr, "TIDE_TEST_PREFIX="+e.prefix,
			"TIDE_TEST_KILL_AT="+strconv.Itoa(killAt))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	for k := 1; k < durableSteps; k++ {
		cmd := start(k)
		testwait.For(t, 30*time.Second, fmt.Sprintf("the worker to store step %d", k), func() bool {
			n, _ := e.rdb.Get(ctx, e.prefix+":test:reached").Int()
			return n == k
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	start(0)
	done := e.waitState("default", info.ID, tide.StateCompleted)
	for i := 1; i <= durableSteps; i++ {
		n, _ := e.rdb.Get(ctx, e.prefix+":test:fx:"+strconv.Itoa(i)).Int()
		if n != 1 {
			t.Errorf("step %d's side effect happened %d times, want 1", i, n)
		}
	}
	if done.Retried != durableSteps-1 {
		t.Errorf("Retried = %d, want %d (one per killed worker)", done.Retried, durableSteps-1)
	}
	if len(done.Steps) != durableSteps {
		t.Errorf("Steps = %+v, want %d", done.Steps, durableSteps)
	}
}
