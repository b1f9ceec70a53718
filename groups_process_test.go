package tide_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/testwait"
)

// groupWorkerEnv makes the test binary act as a server process (see
// runGroupWorker) for the tests that run several of them.
const groupWorkerEnv = "TIDE_TEST_GROUP_WORKER"

// stamp appends "<kind>|<group>|<id>|<pid>|<Redis time in µs>" to the
// interval log: one clock for every process.
var stamp = redis.NewScript(`
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. t[1] .. string.format('%06d', tonumber(t[2])))
`)

// runGroupWorker serves the queue TIDE_TEST_QUEUE; each handler logs its
// start and end in Redis and runs for the milliseconds its payload names.
func runGroupWorker() {
	addr, prefix, queue := os.Getenv("TIDE_TEST_REDIS"), os.Getenv("TIDE_TEST_PREFIX"), os.Getenv("TIDE_TEST_QUEUE")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	s := tide.NewServer(b, tide.Config{Concurrency: 8, Queues: map[string]int{queue: 1}, LeaseDuration: time.Second})
	log := prefix + ":test:iv"
	pid := strconv.Itoa(os.Getpid())
	err := s.Start(tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		g, _ := tide.GetGroup(ctx)
		ms, _ := strconv.Atoi(string(t.Payload()))
		stamp.Run(ctx, rdb, []string{log}, "S|"+g+"|"+id+"|"+pid)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		stamp.Run(context.WithoutCancel(ctx), rdb, []string{log}, "E|"+g+"|"+id+"|"+pid)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	select {}
}

// interval is one handler run as the log shows it.
type interval struct {
	group, id string
	from, to  int64 // µs, Redis time
}

// readIntervals pairs the log's starts and ends; a start without an end
// (its process was killed) ends at killedAt.
func readIntervals(t *testing.T, rdb *redis.Client, key string, killedAt int64) []interval {
	t.Helper()
	lines, err := rdb.LRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	open := map[string][]int{} // id|pid -> indexes of unended runs
	var out []interval
	for _, l := range lines {
		f := strings.Split(l, "|")
		if len(f) != 5 {
			t.Fatalf("bad log line %q", l)
		}
		at, _ := strconv.ParseInt(f[4], 10, 64)
		k := f[2] + "|" + f[3]
		if f[0] == "S" {
			open[k] = append(open[k], len(out))
			out = append(out, interval{group: f[1], id: f[2], from: at, to: -1})
			continue
		}
		if len(open[k]) == 0 {
			t.Fatalf("end without a start: %q", l)
		}
		out[open[k][0]].to = at
		open[k] = open[k][1:]
	}
	for i := range out {
		if out[i].to < 0 {
			out[i].to = killedAt
		}
	}
	return out
}

// peak returns the most intervals that overlap at one instant, of those
// keep selects.
func peak(iv []interval, keep func(interval) bool) int {
	type ev struct {
		at    int64
		delta int
	}
	var evs []ev
	for _, x := range iv {
		if keep(x) {
			evs = append(evs, ev{x.from, 1}, ev{x.to, -1})
		}
	}
	// Ends before starts at the same instant: a slot given back and taken.
	slices.SortFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	for _, e := range evs {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// Three server processes of concurrency 8 share a queue of two partitions
// with GroupConcurrency 2 and Concurrency 6 (two groups: without the group
// limit each would run 3 at once); one process is SIGKILLed
// while it holds slots. Measured by the handlers on Redis' clock, no group
// ever runs more than 2 tasks at once and the queue never more than 6;
// every task runs (the killed process's tasks again after their leases
// expire).
func TestGroupLimitsAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := setup(t, redisbroker.WithPartitions(2))
	ctx := context.Background()
	const q, groups, per, gc, qc = "gl", 2, 40, 2, 6
	if err := tide.NewInspector(e.b).SetQueueLimits(ctx, q, tide.QueueLimits{Concurrency: qc, GroupConcurrency: gc}); err != nil {
		t.Fatal(err)
	}
	for i := range groups * per {
		g := fmt.Sprint("tenant-", i%groups)
		if _, err := e.c.Enqueue(ctx, tide.NewTask("work", []byte("30")), tide.Queue(q), tide.Group(g)); err != nil {
			t.Fatal(err)
		}
	}
	procs := make([]*exec.Cmd, 3)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), groupWorkerEnv+"=1", "TIDE_TEST_REDIS="+e.addr, "TIDE_TEST_PREFIX="+e.prefix, "TIDE_TEST_QUEUE="+q)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	log := e.prefix + ":test:iv"
	victim := strconv.Itoa(procs[0].Process.Pid)
	testwait.For(t, 20*time.Second, "the first process to run a task", func() bool {
		lines, _ := e.rdb.LRange(ctx, log, 0, -1).Result()
		open := 0
		for _, l := range lines {
			if strings.HasSuffix(strings.Join(strings.Split(l, "|")[3:4], ""), victim) {
				if strings.HasPrefix(l, "S|") {
					open++
				} else {
					open--
				}
			}
		}
		return open > 0
	})
	if err := procs[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = procs[0].Wait()
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killedAt := now.UnixMicro()
	in := tide.NewInspector(e.b)
	testwait.For(t, 60*time.Second, "every task to finish", func() bool {
		qi, err := in.QueueInfo(ctx, q)
		return err == nil && qi.Size == 0
	})
	iv := readIntervals(t, e.rdb, log, killedAt)
	var cut int
	for _, x := range iv {
		if x.to == killedAt {
			cut++
		}
	}
	if cut == 0 {
		t.Fatal("the killed process was running nothing")
	}
	t.Logf("SIGKILL cut %d runs short; %d runs in all", cut, len(iv))
	ran := map[string]bool{}
	for _, x := range iv {
		ran[x.id] = true
	}
	if len(ran) != groups*per {
		t.Fatalf("%d distinct tasks ran, want %d", len(ran), groups*per)
	}
	if p := peak(iv, func(interval) bool { return true }); p > qc {
		t.Fatalf("%d tasks of the queue ran at once under Concurrency %d", p, qc)
	}
	for g := range groups {
		name := fmt.Sprint("tenant-", g)
		p := peak(iv, func(x interval) bool { return x.group == name })
		if p > gc {
			t.Fatalf("group %s ran %d tasks at once under GroupConcurrency %d", name, p, gc)
		}
		if p < gc {
			t.Logf("group %s peaked at %d (limit %d)", name, p, gc)
		}
	}
}
