package tide_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// flowWorkerEnv makes the test binary a worker process that SIGKILLs
// itself at one point of a workflow step's completion (see runFlowWorker).
const flowWorkerEnv = "TIDE_TEST_FLOW_WORKER"

// flowHandler logs each step's start and end in Redis, in order; kill, when
// not nil, is called after the start is logged.
func flowHandler(rdb *redis.Client, prefix string, kill func(step string)) tide.Handler {
	return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		step, _ := tide.GetStepName(ctx)
		if err := rdb.RPush(ctx, prefix+":test:log", "start:"+step).Err(); err != nil {
			return err
		}
		if kill != nil {
			kill(step)
		}
		if err := tide.WriteResult(ctx, []byte(step)); err != nil {
			return err
		}
		return rdb.RPush(ctx, prefix+":test:log", "end:"+step).Err()
	})
}

func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// runFlowWorker serves workflow steps and dies at the point its
// environment names: "handler" (step b's handler running; "last-attempt"
// when b has no retries left), "advance" (a's
// end about to be recorded), "ended" (a's end recorded, its dependents not
// enqueued), "enqueued" (b and c enqueued, not confirmed).
func runFlowWorker() {
	point := os.Getenv(flowWorkerEnv)
	addr, prefix := os.Getenv("TIDE_TEST_REDIS"), os.Getenv("TIDE_TEST_PREFIX")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	tide.SetFlowHookForTest(func(p, step string) {
		if p == point && (step == "a" || strings.Contains(step, "b")) {
			killSelf()
		}
	})
	var kill func(string)
	if point == "handler" || point == "last-attempt" {
		kill = func(step string) {
			if step == "b" {
				killSelf()
			}
		}
	}
	s := tide.NewServer(b, tide.Config{LeaseDuration: time.Second, Concurrency: 1, Logger: slog.New(slog.DiscardHandler)})
	if err := s.Start(flowHandler(rdb, prefix, kill)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	select {}
}

// A worker SIGKILLed at each point of a step's completion: the workflow
// still finishes, every step runs at least once, and no step starts before
// its dependencies ended.
func TestWorkflowSurvivesKilledWorker(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"handler", "last-attempt", "advance", "ended", "enqueued"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), flowWorkerEnv+"="+point, "TIDE_TEST_REDIS="+e.addr, "TIDE_TEST_PREFIX="+e.prefix)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			died := make(chan error, 1)
			go func() { died <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-died })
			var bOpts []tide.Option
			if point == "last-attempt" {
				bOpts = append(bOpts, tide.MaxRetry(0))
			}
			wf := tide.NewWorkflow("crash-"+point).
				Add("a", tide.NewTask("step", nil)).
				Add("b", tide.NewTask("step", nil, bOpts...), tide.After("a")).
				Add("c", tide.NewTask("step", nil), tide.After("a")).
				Add("d", tide.NewTask("step", nil), tide.After("b", "c"))
			if _, err := e.c.EnqueueWorkflow(ctx, wf); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-died:
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("worker ended without being killed at %q: %v", point, err)
				}
				died <- err // for the cleanup
			case <-time.After(60 * time.Second):
				t.Fatalf("the worker never reached %q", point)
			}
			e.server(tide.Config{LeaseDuration: time.Second}, flowHandler(e.rdb, e.prefix, nil))
			got := waitFlow(t, tide.NewInspector(e.b), "crash-"+point)
			if point == "last-attempt" {
				// b died on its last attempt: it fails (its lease expired
				// with no retries left) and d is cancelled; the workflow
				// still ends.
				states := stepStates(got)
				if got.State != tide.FlowFailed || states["b"] != "failed" || states["d"] != "cancelled" || states["c"] != "succeeded" {
					t.Fatalf("workflow after b's last attempt died: %+v", got)
				}
				if b := e.info("default", "crash-last-attempt/b"); b.State != tide.StateArchived || !strings.Contains(b.LastErr, "lease expired") {
					t.Fatalf("b = %v %q", b.State, b.LastErr)
				}
				return
			}
			if got.State != tide.FlowSucceeded || got.Succeeded != 4 {
				t.Fatalf("workflow after the crash: %+v", got)
			}
			log, err := e.rdb.LRange(ctx, e.prefix+":test:log", 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			checkOrder(t, log, map[string][]string{"b": {"a"}, "c": {"a"}, "d": {"b", "c"}})
			for _, s := range []string{"a", "b", "c", "d"} {
				if !slices.Contains(log, "end:"+s) {
					t.Errorf("step %s never completed: %v", s, log)
				}
			}
			if point == "handler" && strings.Count(strings.Join(log, " "), "start:b") != 2 {
				t.Errorf("b should have run twice (killed once): %v", log)
			}
			t.Logf("%s: %v", point, log)
		})
	}
}
