package main

// The cost mode (-cost): what a task costs in CPU, with each system's client
// and server in processes of their own so that their CPU can be read from
// /proc, and the systems taking turns round after round.
//
// Rows:
//   - enq1, enq8: n single Enqueue calls from 1 and from 8 goroutines, set up
//     as a new user writes it (tide: redisbroker.New(redis.NewClient(&redis.
//     Options{Addr: addr})), tide.NewClient, Client.Enqueue(ctx,
//     tide.NewTask(...)); asynq: asynq.NewClient(asynq.RedisClientOpt{Addr:
//     addr}), EnqueueContext; BullMQ: new Queue(...), queue.add from 1 or 8
//     concurrent async loops). No warm-up: the first call's script load is
//     part of the run. Throughput is timed inside the client, from the first
//     call to the last reply.
//   - life: a task's whole life, enqueue + dequeue + settle, with a server
//     process (concurrency 50, no-op handler, defaults otherwise) running
//     while a client process enqueues n tasks from 8 goroutines with single
//     calls. Throughput is n over the time from the first enqueue until no
//     task is left pending or active in Redis.
//
// CPU per task is (client process + server process + redis-server) CPU over
// the run, divided by n: the children's utime+stime from /proc/<pid>/stat,
// read while they are still alive after their work (so their start is
// included), and redis-server's used_cpu_user+used_cpu_sys from INFO cpu
// before and after.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker/redisbroker"
)

const (
	sysBull = "bullmq"

	// bullmqVersion is the BullMQ release the cost mode installs.
	bullmqVersion = "6.7.0"
	// ioredisVersion is the Redis client BullMQ runs on (an optional peer
	// of BullMQ 6, which must be installed beside it).
	ioredisVersion = "5.11.1"
	bullQueue      = "bench" // runner.js's queue name

	// clockTicks is the unit of utime and stime in /proc/<pid>/stat
	// (sysconf(_SC_CLK_TCK), 100 on Linux).
	clockTicks = 100

	costConcurrency = 50
	costLifeWorkers = 8
)

//go:embed bullmq/runner.js
var bullRunner []byte

// costOpts are the cost mode's settings.
type costOpts struct {
	rounds    int
	n, lifeN  int
	systems   []string
	rows      []string
	bullDir   string
	profileTo string // directory for the Go children's CPU profiles
}

type costRow struct {
	key, label string
	g          int
	life       bool
}

func costRows(o costOpts) []costRow {
	all := []costRow{
		{key: "enq1", label: fmt.Sprintf("enqueue: %s × single Enqueue, 1 goroutine, defaults", kcount(o.n)), g: 1},
		{key: "enq8", label: fmt.Sprintf("enqueue: %s × single Enqueue, 8 goroutines, defaults", kcount(o.n)), g: 8},
		{key: "life", label: fmt.Sprintf("whole life: %s tasks enqueued (8 goroutines) + processed (concurrency %d, no-op handler), defaults", kcount(o.lifeN), costConcurrency), g: costLifeWorkers, life: true},
	}
	var out []costRow
	for _, r := range all {
		if len(o.rows) == 0 || has(o.rows, r.key) {
			out = append(out, r)
		}
	}
	return out
}

// costRun is one system's run of one row.
type costRun struct {
	n                     int
	secs                  float64 // the timed part
	client, server, redis float64 // CPU seconds
}

func (r costRun) rate() float64 { return float64(r.n) / r.secs }
func (r costRun) cpu() float64  { return r.client + r.server + r.redis }

// perTask is a CPU figure in µs per task.
func (r costRun) perTask(s float64) float64 { return s / float64(r.n) * 1e6 }

func runCost(ctx context.Context, addr string, admin *redis.Client, o costOpts) int {
	for _, s := range o.systems {
		if s != sysTide && s != sysAsynq && s != sysBull {
			fmt.Fprintf(os.Stderr, "bench: -cost: unknown system %q (want tide, asynq, bullmq)\n", s)
			return 2
		}
	}
	rows := costRows(o)
	if len(rows) == 0 {
		fmt.Fprintln(os.Stderr, "bench: -cost-rows: no row selected (enq1, enq8, life)")
		return 2
	}
	var notes []string
	if has(o.systems, sysBull) {
		if err := ensureBullMQ(o.bullDir); err != nil {
			fmt.Fprintf(os.Stderr, "bench: BullMQ left out: %v\n", err)
			notes = append(notes, "BullMQ left out: "+err.Error())
			o.systems = slices.DeleteFunc(slices.Clone(o.systems), func(s string) bool { return s == sysBull })
		}
	}
	cr := &costRunner{addr: addr, admin: admin, o: o}
	// runs[row][system] holds one costRun per round.
	runs := map[string]map[string][]costRun{}
	for _, r := range rows {
		runs[r.key] = map[string][]costRun{}
	}
	failed := false
	started := time.Now()
	for round := range o.rounds {
		// The systems take turns to go first.
		order := slices.Clone(o.systems)
		k := round % len(order)
		order = append(order[k:], order[:k]...)
		for _, row := range rows {
			for _, sys := range order {
				fmt.Fprintf(os.Stderr, "[%6.1fs] round %d/%d %-5s %-7s ...", time.Since(started).Seconds(), round+1, o.rounds, row.key, sys)
				res, err := cr.run(ctx, row, sys, round)
				if err != nil {
					fmt.Fprintf(os.Stderr, " FAILED: %v\n", err)
					notes = append(notes, fmt.Sprintf("round %d %s/%s FAILED: %v", round+1, row.key, sys, err))
					failed = true
					continue
				}
				fmt.Fprintf(os.Stderr, " %s, %.1f µs/task (client %.1f, server %.1f, redis %.1f)\n",
					format("tasks/s", res.rate()), res.perTask(res.cpu()), res.perTask(res.client), res.perTask(res.server), res.perTask(res.redis))
				runs[row.key][sys] = append(runs[row.key][sys], res)
			}
		}
	}
	printCost(o, rows, runs, notes)
	fmt.Printf("\ntotal time: %v\n", time.Since(started).Round(time.Second))
	if failed {
		return 1
	}
	return 0
}

// printCost prints each row's medians and ranges, and the ratios of tide to
// each other system, taken round by round.
func printCost(o costOpts, rows []costRow, runs map[string]map[string][]costRun, notes []string) {
	fmt.Println("cost per task: interleaved rounds, each system's client and server in processes of their own")
	fmt.Printf("date: %s   rounds: %d   systems: %s   asynq: %s   BullMQ: %s   go-redis: %s\n",
		time.Now().UTC().Format(time.RFC3339), o.rounds, strings.Join(o.systems, ", "),
		depVersion("github.com/hibiken/asynq"), bullmqVersion, depVersion("github.com/redis/go-redis/v9"))
	fmt.Printf("command: %s\n", commandLine())
	fmt.Println("figures: median [min–max] over the rounds; CPU in µs per task = client + server + redis-server processes")
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	for _, row := range rows {
		fmt.Printf("%-5s %s\n", row.key+":", row.label)
	}
	fmt.Println()
	fmt.Fprintf(tw, "row\tfigure\t%s\n", strings.Join(o.systems, "\t"))
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t\t%s\n", row.key, strings.Repeat("\t", len(o.systems)-1))
		type fig struct {
			name string
			f    func(costRun) float64
			fmt  func(float64) string
		}
		us := func(v float64) string { return fmt.Sprintf("%.1f", v) }
		figs := []fig{
			{"tasks/s", costRun.rate, func(v float64) string { return thousands(int64(math.Round(v))) }},
			{"CPU µs/task, total", func(r costRun) float64 { return r.perTask(r.cpu()) }, us},
			{"  client process", func(r costRun) float64 { return r.perTask(r.client) }, us},
		}
		if row.life {
			figs = append(figs, fig{"  server process", func(r costRun) float64 { return r.perTask(r.server) }, us})
		}
		figs = append(figs, fig{"  redis-server", func(r costRun) float64 { return r.perTask(r.redis) }, us})
		for _, f := range figs {
			cells := make([]string, len(o.systems))
			for i, s := range o.systems {
				var xs []float64
				for _, r := range runs[row.key][s] {
					xs = append(xs, f.f(r))
				}
				cells[i] = spanCell(xs, f.fmt)
			}
			fmt.Fprintf(tw, "\t%s\t%s\n", f.name, strings.Join(cells, "\t"))
		}
	}
	tw.Flush()

	if !has(o.systems, sysTide) {
		return
	}
	fmt.Println()
	fmt.Println("ratios, round by round (throughput: tide ÷ other, > 1 tide faster; CPU per task: tide ÷ other, < 1 tide cheaper):")
	for _, row := range rows {
		for _, other := range o.systems {
			if other == sysTide {
				continue
			}
			t, a := runs[row.key][sysTide], runs[row.key][other]
			var thr, cpu []float64
			for i := range min(len(t), len(a)) {
				thr = append(thr, t[i].rate()/a[i].rate())
				cpu = append(cpu, t[i].cpu()/a[i].cpu())
			}
			if len(thr) == 0 {
				continue
			}
			fmt.Printf("  %-5s vs %-7s throughput %s  CPU/task %s\n", row.key, other, ratioSpan(thr), ratioSpan(cpu))
		}
	}
	if len(notes) > 0 {
		fmt.Println()
		fmt.Println("notes:")
		for _, n := range notes {
			fmt.Println("  " + n)
		}
	}
}

// spanCell is "median [min–max]", or the one value of a single round.
func spanCell(xs []float64, f func(float64) string) string {
	if len(xs) == 0 {
		return "-"
	}
	if len(xs) == 1 {
		return f(xs[0])
	}
	return fmt.Sprintf("%s [%s–%s]", f(median(xs)), f(slices.Min(xs)), f(slices.Max(xs)))
}

// ratioSpan is "median [min–max] (each round's)".
func ratioSpan(xs []float64) string {
	each := make([]string, len(xs))
	for i, x := range xs {
		each[i] = fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2f× [%.2f–%.2f] (%s)", median(xs), slices.Min(xs), slices.Max(xs), strings.Join(each, " "))
}

type costRunner struct {
	addr  string
	admin *redis.Client
	o     costOpts
}

// run runs one row for one system on a flushed Redis.
func (cr *costRunner) run(ctx context.Context, row costRow, sys string, round int) (costRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := cr.admin.FlushAll(ctx).Err(); err != nil {
		return costRun{}, err
	}
	defer cr.admin.FlushAll(context.Background())
	n := cr.o.n
	if row.life {
		n = cr.o.lifeN
	}
	r0, err := redisCPU(ctx, cr.admin)
	if err != nil {
		return costRun{}, err
	}
	var srv *child
	if row.life {
		if srv, err = cr.start(sys, "worker", n, costConcurrency, fmt.Sprintf("%s-server-%d", row.key, round)); err != nil {
			return costRun{}, err
		}
		defer srv.stop()
		if _, err := srv.expect("ready", time.Minute); err != nil {
			return costRun{}, fmt.Errorf("server: %w", err)
		}
	}
	cl, err := cr.start(sys, "enq", n, row.g, fmt.Sprintf("%s-client-%d", row.key, round))
	if err != nil {
		return costRun{}, err
	}
	defer cl.stop()
	f, err := cl.expect("start", time.Minute)
	if err != nil {
		return costRun{}, fmt.Errorf("client: %w", err)
	}
	t0, _ := strconv.ParseInt(f[1], 10, 64)
	f, err = cl.expect("end", 10*time.Minute)
	if err != nil {
		return costRun{}, fmt.Errorf("client: %w", err)
	}
	t1, _ := strconv.ParseInt(f[1], 10, 64)
	if row.life {
		f, err := srv.expect("done", 5*time.Minute)
		if err != nil {
			return costRun{}, fmt.Errorf("server: %w", err)
		}
		if f[3] != "0" {
			return costRun{}, fmt.Errorf("server: %s tasks ran twice or could not be read", f[3])
		}
		// Done when nothing is left pending or active: the last task has
		// been settled, not just handled.
		deadline := time.Now().Add(time.Minute)
		for {
			left, err := cr.unsettled(ctx, sys)
			if err != nil {
				return costRun{}, err
			}
			if left == 0 {
				t1 = time.Now().UnixNano()
				break
			}
			if time.Now().After(deadline) {
				return costRun{}, fmt.Errorf("every handler ran, but %d tasks are still pending or active a minute later", left)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	res := costRun{n: n, secs: float64(t1-t0) / 1e9}
	if res.client, err = cl.cpu(); err != nil {
		return costRun{}, err
	}
	if srv != nil {
		if res.server, err = srv.cpu(); err != nil {
			return costRun{}, err
		}
	}
	r1, err := redisCPU(ctx, cr.admin)
	if err != nil {
		return costRun{}, err
	}
	res.redis = r1 - r0
	if !row.life {
		got, err := cr.pending(ctx, sys)
		if err != nil {
			return costRun{}, err
		}
		if got != n {
			return costRun{}, fmt.Errorf("the queue holds %d tasks in Redis, want %d", got, n)
		}
	}
	if err := cl.stop(); err != nil {
		return costRun{}, fmt.Errorf("client: %w", err)
	}
	if srv != nil {
		if err := srv.stop(); err != nil {
			return costRun{}, fmt.Errorf("server: %w", err)
		}
	}
	return res, nil
}

// pending counts the tasks a system holds waiting in the default queue.
func (cr *costRunner) pending(ctx context.Context, sys string) (int, error) {
	switch sys {
	case sysTide:
		return sumHLen(ctx, cr.admin, redisbroker.DefaultPrefix+":{*}:t")
	case sysAsynq:
		n, err := cr.admin.LLen(ctx, "asynq:{default}:pending").Result()
		return int(n), err
	default:
		n, err := cr.admin.LLen(ctx, "bull:"+bullQueue+":wait").Result()
		return int(n), err
	}
}

// unsettled counts the tasks a system holds pending or active. tide deletes
// a processed task by default (no Retention), asynq too (Retention 0);
// BullMQ keeps completed jobs by default, so its count reads its wait and
// active lists.
func (cr *costRunner) unsettled(ctx context.Context, sys string) (int, error) {
	var keys []string
	switch sys {
	case sysTide:
		return sumHLen(ctx, cr.admin, redisbroker.DefaultPrefix+":{*}:t")
	case sysAsynq:
		keys = []string{"asynq:{default}:pending", "asynq:{default}:active"}
	default:
		keys = []string{"bull:" + bullQueue + ":wait", "bull:" + bullQueue + ":active"}
	}
	total := 0
	for _, k := range keys {
		n, err := cr.admin.LLen(ctx, k).Result()
		if err != nil {
			return 0, err
		}
		total += int(n)
	}
	return total, nil
}

// start starts a child process of sys in role ("enq" or "worker").
func (cr *costRunner) start(sys, role string, n, g int, name string) (*child, error) {
	var cmd *exec.Cmd
	if sys == sysBull {
		cmd = exec.Command("node", filepath.Join(cr.o.bullDir, "runner.js"), role, cr.addr, strconv.Itoa(n), strconv.Itoa(g))
	} else {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		args := []string{"-role", role, "-sys", sys, "-redis", cr.addr, "-n", strconv.Itoa(n), "-g", strconv.Itoa(g)}
		if cr.o.profileTo != "" {
			args = append(args, "-cpuprofile", filepath.Join(cr.o.profileTo, sys+"-"+name+".pprof"))
		}
		cmd = exec.Command(exe, args...)
	}
	return startChild(cmd)
}

// redisCPU is redis-server's CPU time so far, in seconds.
func redisCPU(ctx context.Context, admin *redis.Client) (float64, error) {
	s, err := admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	total, found := 0.0, 0
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
			}
			total += f
			found++
		}
	}
	if found != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	return total, nil
}
