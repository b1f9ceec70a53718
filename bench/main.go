// Command bench runs the same workloads against tide and github.com/hibiken/asynq
// on the same Redis, in the same run, and prints one table of figures.
//
//	cd bench && go run .            # full run (several minutes)
//	cd bench && go run . -quick     # smoke run with small counts
//	cd bench && go run . -only process,pickup -json out.json
//	cd bench && go run . -only floor,enqueue    # enqueue figures, the floor and the goals
//	cd bench && go run . -only soak -soak 5m     # Redis memory while processing
//	cd bench && go run . -only groups,fairness,blocked # what groups cost, what they are for, blocked groups
//	cd bench && go run . -only chain,fanout,wait # workflows, batches and EnqueueAndWait
//
// See README.md for what each figure means.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	if kind := os.Getenv(envChild); kind != "" {
		os.Exit(childMain(kind))
	}
	if len(os.Args) > 1 && (os.Args[1] == "-role" || strings.HasPrefix(os.Args[1], "-role=")) {
		os.Exit(costChild(os.Args[1:]))
	}
	os.Exit(run())
}

func run() int {
	redisAddr := flag.String("redis", "", "use the Redis at host:port instead of starting a private redis-server (its data is FLUSHALLed between runs)")
	force := flag.Bool("force-flush", false, "with -redis: allow FLUSHALL of a database that is not empty")
	quick := flag.Bool("quick", false, "smoke run: small counts and short caps")
	only := flag.String("only", "", "comma-separated workloads to run (default all): "+strings.Join(workloadNames(), ","))
	systems := flag.String("systems", sysTide+","+sysAsynq, "comma-separated systems to run")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the bench process (clients and servers of both systems) to this file")
	crashCap := flag.Duration("crash-cap", 0, "give up waiting for a crashed task after this long (default 120s, 15s with -quick)")
	soak := flag.Duration("soak", 0, "how long the soak workload runs (default 30s, 15s with -quick)")
	rounds := flag.Int("rounds", 1, "run the selected workloads this many times in turn (floor, tide, asynq, then floor, asynq, tide, ...) and report each figure's median; the ratios are the medians of each round's ratio, so that a machine whose speed drifts compares figures measured minutes apart less often")
	cost := flag.Bool("cost", false, "run the cost mode instead of the workloads: single Enqueue from 1 and 8 goroutines and a task's whole life, each system's client and server in processes of their own, CPU per task, -rounds rounds (default 5) in turn")
	costN := flag.Int("cost-n", 40000, "cost mode: tasks of the enqueue rows")
	costLifeN := flag.Int("cost-life-n", 100000, "cost mode: tasks of the whole-life row")
	costRowsFlag := flag.String("cost-rows", "", "cost mode: rows to run (default all): enq1,enq8,life")
	costSystems := flag.String("cost-systems", sysTide+","+sysAsynq+","+sysBull, "cost mode: systems (BullMQ needs node and npm; it is installed into -bullmq-dir)")
	bullDir := flag.String("bullmq-dir", ".bullmq", "cost mode: where the bullmq npm package is installed (once) and its runner written")
	costProfile := flag.String("cost-profile", "", "cost mode: write CPU profiles of the Go children into this directory")
	flag.Parse()

	sz := fullSizes()
	if *quick {
		sz = quickSizes()
	}
	if *crashCap > 0 {
		sz.crashCap = *crashCap
	}
	if *soak > 0 {
		sz.soakDur = *soak
		sz.soakEvery = min(max(*soak/60, time.Second), 5*time.Second)
	}

	if *rounds < 1 {
		fmt.Fprintf(os.Stderr, "bench: -rounds %d: want at least 1\n", *rounds)
		return 2
	}
	sel, err := selectWorkloads(workloads(sz), *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	kinds := splitList(*systems)
	for _, k := range kinds {
		if k != sysTide && k != sysAsynq {
			fmt.Fprintf(os.Stderr, "bench: unknown system %q (want %s, %s)\n", k, sysTide, sysAsynq)
			return 2
		}
	}

	addr := *redisAddr
	own := addr == ""
	if own {
		rs, err := startRedis()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer rs.stop()
		addr = rs.addr
		// Stop redis-server on Ctrl-C too.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() { <-sig; rs.stop(); os.Exit(130) }()
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: redis %s: %v\n", addr, err)
		return 1
	}
	if !own && !*force {
		if n, err := admin.DBSize(ctx).Result(); err != nil || n > 0 {
			fmt.Fprintf(os.Stderr, "bench: redis %s holds %d keys; the bench FLUSHALLs it between runs. Pass -force-flush to allow that, or omit -redis to use a private redis-server.\n", addr, n)
			return 2
		}
	}
	redisVersion, _ := infoField(ctx, admin, "server", "redis_version")

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	if *cost {
		co := costOpts{rounds: 5, n: *costN, lifeN: *costLifeN, systems: splitList(*costSystems),
			rows: splitList(*costRowsFlag), bullDir: *bullDir, profileTo: *costProfile}
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "rounds" {
				co.rounds = *rounds
			}
		})
		if *quick {
			co.n, co.lifeN = min(co.n, 5000), min(co.lifeN, 10000)
		}
		if co.profileTo != "" {
			if err := os.MkdirAll(co.profileTo, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				return 1
			}
		}
		return runCost(ctx, addr, admin, co)
	}

	e := &env{addr: addr, admin: admin, sz: sz}
	var perRound []figures
	failed := map[string]map[string]string{sysTide: {}, sysAsynq: {}, sysFloor: {}}
	started := time.Now()
	for round := range *rounds {
		out := figures{sysTide: {}, sysAsynq: {}, sysFloor: {}}
		perRound = append(perRound, out)
		if *rounds > 1 {
			fmt.Fprintf(os.Stderr, "round %d of %d\n", round+1, *rounds)
		}
		for _, w := range sel {
			runKinds := kinds
			if w.once {
				runKinds = []string{sysFloor}
			}
			if w.systems != nil {
				runKinds = nil
				for _, k := range kinds {
					if has(w.systems, k) {
						runKinds = append(runKinds, k)
					}
				}
			}
			if round%2 == 1 {
				// Every other round the other system goes first: the first
				// one after the floor measured slower here, whichever it was.
				runKinds = slices.Clone(runKinds)
				slices.Reverse(runKinds)
			}
			for _, k := range runKinds {
				fmt.Fprintf(os.Stderr, "[%6.1fs] %-8s %-6s ...", time.Since(started).Seconds(), w.name, k)
				t0 := time.Now()
				res, err := runOne(ctx, e, w, k)
				if err != nil {
					fmt.Fprintf(os.Stderr, " FAILED (%v): %v\n", time.Since(t0).Round(time.Millisecond), err)
					for _, f := range w.figs {
						if f.only == "" || f.only == k {
							failed[k][f.key] = err.Error()
						}
					}
					continue
				}
				fmt.Fprintf(os.Stderr, " done (%v)\n", time.Since(t0).Round(time.Millisecond))
				for _, f := range w.figs {
					if f.only != "" && f.only != k {
						continue
					}
					v, ok := res[f.key]
					if !ok {
						failed[k][f.key] = "workload returned no value"
						continue
					}
					out[k][f.key] = v
				}
			}
		}
	}
	out := medians(perRound)

	// The table.
	fmt.Println("tide vs asynq: side-by-side benchmark")
	fmt.Printf("date: %s   go: %s   GOMAXPROCS: %d (NumCPU %d)   %s/%s\n", time.Now().Format(time.RFC3339), runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	where := "private redis-server started by the bench (--save \"\" --appendonly no)"
	if !own {
		where = "external Redis at " + addr
	}
	fmt.Printf("redis: %s, %s   asynq: %s   go-redis: %s\n", redisVersion, where, depVersion("github.com/hibiken/asynq"), depVersion("github.com/redis/go-redis/v9"))
	fmt.Printf("command: %s\n", commandLine())
	if *rounds > 1 {
		fmt.Printf("rounds: %d; each figure is the median of its rounds\n", *rounds)
	}
	fmt.Println("ratio: > 1 means tide is better (throughput: tide ÷ asynq; latency, lateness, memory, commands: asynq ÷ tide)")
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\ttide\tasynq\tratio")
	fmt.Fprintln(tw, "------\t----\t-----\t-----")
	anyFail := false
	for _, w := range sel {
		for _, f := range w.figs {
			tv, tok := out[sysTide][f.key]
			av, aok := out[sysAsynq][f.key]
			ts, as := cell(f, tv, tok, failed[sysTide][f.key], has(kinds, sysTide)), cell(f, av, aok, failed[sysAsynq][f.key], has(kinds, sysAsynq))
			if w.once {
				fv, fok := out[sysFloor][f.key]
				ts = cell(f, fv, fok, failed[sysFloor][f.key], true)
				as = ts
			}
			if w.systems != nil && !has(w.systems, sysTide) {
				ts = w.absent
			}
			if w.systems != nil && !has(w.systems, sysAsynq) {
				as = w.absent
			}
			if f.only != "" && f.only != sysTide {
				ts = f.absent
			}
			if f.only != "" && f.only != sysAsynq {
				as = f.absent
			}
			if ts == "FAILED" || as == "FAILED" {
				anyFail = true
			}
			r := "—"
			if f.ratio && tok && aok {
				r = ratio(f, tv, av)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.label, ts, as, r)
		}
	}
	tw.Flush()
	printGoals(out, perRound)
	if len(e.notes) > 0 {
		fmt.Println()
		fmt.Println("notes:")
		for _, n := range e.notes {
			fmt.Println("  " + n)
		}
	}
	if anyFail {
		fmt.Println()
		fmt.Println("FAILURES:")
		for _, k := range append([]string{sysFloor}, kinds...) {
			seen := map[string]bool{}
			for _, w := range sel {
				for _, f := range w.figs {
					if msg := failed[k][f.key]; msg != "" && !seen[w.name] {
						seen[w.name] = true
						fmt.Printf("  %s/%s: %s\n", w.name, k, msg)
					}
				}
			}
		}
	}
	fmt.Printf("\ntotal time: %v\n", time.Since(started).Round(time.Second))

	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, sel, out, failed, redisVersion, own); err != nil {
			fmt.Fprintln(os.Stderr, "bench: write json:", err)
			return 1
		}
	}
	if anyFail {
		return 1
	}
	return 0
}

// runOne runs one workload against one system on a flushed Redis, inside the
// workload's time box.
func runOne(ctx context.Context, e *env, w workload, kind string) (res results, err error) {
	ctx, cancel := context.WithTimeout(ctx, w.limit)
	defer cancel()
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
		_ = e.admin.FlushAll(context.Background()).Err()
	}()
	type outcome struct {
		res results
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- outcome{err: fmt.Errorf("panic: %v\n%s", r, debug.Stack())}
			}
		}()
		r, err := w.run(ctx, e, kind)
		done <- outcome{r, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-time.After(w.limit + 30*time.Second):
		return nil, fmt.Errorf("workload did not finish within its %v time box (abandoned)", w.limit)
	}
}

func cell(f figure, v val, ok bool, fail string, ran bool) string {
	switch {
	case !ran:
		return "(not run)"
	case fail != "":
		return "FAILED"
	case !ok:
		return "(not run)"
	}
	s := format(f.unit, v.v)
	if v.atLeast {
		s = "> " + s
	}
	return s
}

func format(unit string, v float64) string {
	switch unit {
	case "tasks/s":
		return thousands(int64(math.Round(v))) + "/s"
	case "dur": // milliseconds
		switch a := math.Abs(v); {
		case a >= 10000:
			return fmt.Sprintf("%.1f s", v/1000)
		case a >= 1000:
			return fmt.Sprintf("%.2f s", v/1000)
		case a >= 100:
			return fmt.Sprintf("%.0f ms", v)
		case a >= 10:
			return fmt.Sprintf("%.1f ms", v)
		default:
			return fmt.Sprintf("%.2f ms", v)
		}
	case "bytes":
		return fmt.Sprintf("%.0f B", v)
	case "rate":
		return fmt.Sprintf("%.1f/s", v)
	case "count":
		return fmt.Sprintf("%.0f", v)
	case "mb":
		return fmt.Sprintf("%.2f MB", v)
	case "kbmin":
		return fmt.Sprintf("%+.1f KB/min", v)
	}
	return fmt.Sprint(v)
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// ratio orients the comparison so that > 1 means tide is better.
func ratio(f figure, t, a val) string {
	num, den := t, a
	if f.lower {
		num, den = a, t
	}
	if num.v <= 0 || den.v <= 0 {
		return "n/a"
	}
	r := num.v / den.v
	s := fmt.Sprintf("%.2f×", r)
	if r >= 100 {
		s = fmt.Sprintf("%.0f×", r)
	}
	switch {
	case num.atLeast && den.atLeast:
		return "?"
	case num.atLeast:
		return "> " + s
	case den.atLeast:
		return "< " + s
	}
	return s
}

// goal is a ratio the project sets itself a target for.
type goal struct {
	what       string
	num, den   [2]string // system, figure key
	target     float64
	targetText string
}

var goals = []goal{
	{"tide Enqueue, 1 goroutine ÷ floor, 1 client", [2]string{sysTide, "enq1"}, [2]string{sysFloor, floorKey(1)}, 0.9, "≥ 0.9 (within 10% of one round trip)"},
	{"tide Enqueue, 8 goroutines ÷ asynq Enqueue, 8 goroutines", [2]string{sysTide, "enq8"}, [2]string{sysAsynq, "enq8"}, 2, "≥ 2"},
	{"tide Enqueue, 8 goroutines ÷ floor, 8 clients", [2]string{sysTide, "enq8"}, [2]string{sysFloor, floorKey(8)}, 0, ""},
	{"tide Enqueue, 1 goroutine ÷ EVALSHA floor, 1 client", [2]string{sysTide, "enq1"}, [2]string{sysFloor, floorShaKey(1)}, 0, ""},
	{"tide Enqueue, 8 goroutines ÷ EVALSHA floor, 8 clients", [2]string{sysTide, "enq8"}, [2]string{sysFloor, floorShaKey(8)}, 0, ""},
	{"tide, 8 tasks outstanding (ceiling of 8 callers) ÷ asynq Enqueue, 8 goroutines", [2]string{sysTide, "enqOut8"}, [2]string{sysAsynq, "enq8"}, 0, ""},
	{"tide Enqueue, 8 goroutines ÷ tide, 8 tasks outstanding", [2]string{sysTide, "enq8"}, [2]string{sysTide, "enqOut8"}, 0, ""},
	{"asynq Enqueue, 1 goroutine ÷ floor, 1 client", [2]string{sysAsynq, "enq1"}, [2]string{sysFloor, floorKey(1)}, 0, ""},
	{"asynq Enqueue, 8 goroutines ÷ floor, 8 clients", [2]string{sysAsynq, "enq8"}, [2]string{sysFloor, floorKey(8)}, 0, ""},
	{"asynq Enqueue, 1 goroutine ÷ EVALSHA floor, 1 client", [2]string{sysAsynq, "enq1"}, [2]string{sysFloor, floorShaKey(1)}, 0, ""},
	{"asynq Enqueue, 8 goroutines ÷ EVALSHA floor, 8 clients", [2]string{sysAsynq, "enq8"}, [2]string{sysFloor, floorShaKey(8)}, 0, ""},
	{"tide drain, groups with GroupConcurrency 1 ÷ no groups", [2]string{sysTide, "grpProc"}, [2]string{sysTide, "grpPlain"}, 0.6, "≥ 0.60"},
	{"tide drain under a queue Concurrency, groups ÷ no groups", [2]string{sysTide, "grpConcGrouped"}, [2]string{sysTide, "grpConcPlain"}, 0.9, "≥ 0.90"},
	{"tide wait of the few, p99: FIFO ÷ own group", [2]string{sysTide, "fairF99"}, [2]string{sysTide, "fairG99"}, 0, ""},
	{"wait of the few, p99: asynq FIFO ÷ tide own group", [2]string{sysAsynq, "fairF99"}, [2]string{sysTide, "fairG99"}, 0, ""},
	{"chain: tide workflow per step ÷ tide hand-rolled chain per task (per-step overhead)", [2]string{sysTide, "chainWf"}, [2]string{sysTide, "chainPlain"}, 0, ""},
	{"chain: tide workflow per step ÷ asynq hand-rolled chain per task (TaskCheckInterval 1ms)", [2]string{sysTide, "chainWf"}, [2]string{sysAsynq, "chainPlain"}, 0, ""},
	{"fanout: tide workflow fan-out steps/s ÷ plain tasks/s (root start → last fan-out step start)", [2]string{sysTide, "fanWfStep"}, [2]string{sysTide, "fanPlainRate"}, 0, ""},
	{"fanout: tide workflow, n ÷ (EnqueueWorkflow → join starts) ÷ plain, n ÷ (EnqueueMany → last start)", [2]string{sysTide, "fanWfRate"}, [2]string{sysTide, "fanPlainRate"}, 0, ""},
	{"fanout: tide EnqueueBatch + OnBatchDone, n ÷ (call → callback starts) ÷ plain, the same", [2]string{sysTide, "fanBatchRate"}, [2]string{sysTide, "fanPlainRate"}, 0, ""},
	{"wait: tide EnqueueAndWait p50, 1 goroutine ÷ floor p50, 1 client (tide's run)", [2]string{sysTide, "wait1p50"}, [2]string{sysTide, "waitFl1p50"}, 0, ""},
	{"wait: tide EnqueueAndWait p99, 1 goroutine ÷ floor p99, 1 client (tide's run)", [2]string{sysTide, "wait1p99"}, [2]string{sysTide, "waitFl1p99"}, 0, ""},
	{"wait: tide EnqueueAndWait p50, 16 goroutines ÷ floor p50, 16 clients (tide's run)", [2]string{sysTide, "wait16p50"}, [2]string{sysTide, "waitFl16p50"}, 0, ""},
	{"wait: tide EnqueueAndWait p99, 16 goroutines ÷ floor p99, 16 clients (tide's run)", [2]string{sysTide, "wait16p99"}, [2]string{sysTide, "waitFl16p99"}, 0, ""},
	{"wait: asynq enqueue+poll p50, 1 goroutine ÷ floor p50, 1 client (asynq's run)", [2]string{sysAsynq, "wait1p50"}, [2]string{sysAsynq, "waitFl1p50"}, 0, ""},
	{"wait: asynq enqueue+poll p50, 16 goroutines ÷ floor p50, 16 clients (asynq's run)", [2]string{sysAsynq, "wait16p50"}, [2]string{sysAsynq, "waitFl16p50"}, 0, ""},
}

// figures holds one run's figures: system -> figure key -> value.
type figures map[string]map[string]val

// medians returns each figure's median over the rounds that measured it (a
// figure is "at least" when any round's was).
func medians(rounds []figures) figures {
	if len(rounds) == 1 {
		return rounds[0]
	}
	out := figures{}
	for _, r := range rounds {
		for k, m := range r {
			if out[k] == nil {
				out[k] = map[string]val{}
			}
			for key := range m {
				if _, done := out[k][key]; done {
					continue
				}
				var xs []float64
				atLeast := false
				for _, r2 := range rounds {
					if v, ok := r2[k][key]; ok {
						xs = append(xs, v.v)
						atLeast = atLeast || v.atLeast
					}
				}
				out[k][key] = val{v: median(xs), atLeast: atLeast}
			}
		}
	}
	return out
}

// roundRatios returns goal g's ratio in each round that measured both its
// figures.
func roundRatios(rounds []figures, g goal) []float64 {
	var rs []float64
	for _, r := range rounds {
		n, nok := r[g.num[0]][g.num[1]]
		d, dok := r[g.den[0]][g.den[1]]
		if nok && dok && d.v > 0 {
			rs = append(rs, n.v/d.v)
		}
	}
	return rs
}

// printGoals prints the ratios against the physical floor and the goals set
// for them, for those whose figures this run measured.
func printGoals(out figures, perRound []figures) {
	var lines []string
	width := 58
	for _, g := range goals {
		_, nok := out[g.num[0]][g.num[1]]
		_, dok := out[g.den[0]][g.den[1]]
		if nok && dok {
			width = max(width, len([]rune(g.what)))
		}
	}
	for _, g := range goals {
		n, nok := out[g.num[0]][g.num[1]]
		d, dok := out[g.den[0]][g.den[1]]
		if !nok || !dok || d.v <= 0 {
			continue
		}
		r := n.v / d.v
		each := roundRatios(perRound, g)
		if len(each) > 1 {
			r = median(each)
		}
		line := fmt.Sprintf("  %s%s %6.2f", g.what, strings.Repeat(" ", width-len([]rune(g.what))), r)
		if g.target > 0 {
			verdict := "MET"
			if r < g.target {
				verdict = "MISSED"
			}
			line += fmt.Sprintf("   goal %s: %s", g.targetText, verdict)
		}
		if len(each) > 1 {
			parts := make([]string, len(each))
			for i, x := range each {
				parts[i] = fmt.Sprintf("%.2f", x)
			}
			line += "   rounds: " + strings.Join(parts, " ")
		}
		lines = append(lines, line)
	}
	if len(lines) > 0 {
		fmt.Println()
		fmt.Println("ratios (same run):")
		for _, l := range lines {
			fmt.Println(l)
		}
	}
}

func workloadNames() []string {
	var names []string
	for _, w := range workloads(fullSizes()) {
		names = append(names, w.name)
	}
	return names
}

func selectWorkloads(all []workload, only string) ([]workload, error) {
	if only == "" {
		return all, nil
	}
	byName := map[string]workload{}
	for _, w := range all {
		byName[w.name] = w
	}
	var out []workload
	for _, n := range splitList(only) {
		w, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("unknown workload %q (have %s)", n, strings.Join(workloadNames(), ", "))
		}
		out = append(out, w)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func depVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version + " (replaced)"
			}
			return d.Version
		}
	}
	return "?"
}

// commandLine is how the bench was invoked ("go run ." for a binary that go
// run built in its temp dir).
func commandLine() string {
	name := filepath.Base(os.Args[0])
	if strings.Contains(os.Args[0], "go-build") {
		name = "go run ."
	}
	return strings.TrimSpace(name + " " + strings.Join(os.Args[1:], " "))
}

func writeJSON(path string, sel []workload, out map[string]map[string]val, failed map[string]map[string]string, redisVersion string, own bool) error {
	type row struct {
		Workload   string   `json:"workload"`
		Key        string   `json:"key"`
		Figure     string   `json:"figure"`
		Unit       string   `json:"unit"`
		LowerBest  bool     `json:"lower_is_better"`
		Tide       *float64 `json:"tide,omitempty"`
		TideCapped bool     `json:"tide_capped,omitempty"`
		TideError  string   `json:"tide_error,omitempty"`
		Asynq      *float64 `json:"asynq,omitempty"`
		AsynqCap   bool     `json:"asynq_capped,omitempty"`
		AsynqError string   `json:"asynq_error,omitempty"`
	}
	doc := struct {
		Date         string `json:"date"`
		GoVersion    string `json:"go_version"`
		GOMAXPROCS   int    `json:"gomaxprocs"`
		RedisVersion string `json:"redis_version"`
		PrivateRedis bool   `json:"private_redis"`
		Command      string `json:"command"`
		Note         string `json:"note"`
		Rows         []row  `json:"rows"`
	}{
		Date: time.Now().Format(time.RFC3339), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		RedisVersion: redisVersion, PrivateRedis: own, Command: commandLine(),
		Note: "units: tasks/s; dur in milliseconds; bytes per task; rate in commands per second; count; mb (10^6 bytes); kbmin (10^3 bytes per minute); floor rows are one redis-benchmark figure, given in both columns",
	}
	for _, w := range sel {
		for _, f := range w.figs {
			r := row{Workload: w.name, Key: f.key, Figure: f.label, Unit: f.unit, LowerBest: f.lower,
				TideError: failed[sysTide][f.key], AsynqError: failed[sysAsynq][f.key]}
			if v, ok := out[sysTide][f.key]; ok {
				r.Tide, r.TideCapped = &v.v, v.atLeast
			}
			if v, ok := out[sysFloor][f.key]; ok {
				r.Tide, r.Asynq = &v.v, &v.v
			}
			if v, ok := out[sysAsynq][f.key]; ok {
				r.Asynq, r.AsynqCap = &v.v, v.atLeast
			}
			doc.Rows = append(doc.Rows, r)
		}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
