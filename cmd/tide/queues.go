package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

var cmdQueues = &command{
	name: "queues ls", args: "", maxArgs: 0, redis: true,
	summary: "list queues with their sizes, today's counts and latency",
	help: `
List every queue with the number of tasks in each state, the attempts
processed and failed today (UTC), the latency (how long the oldest
pending task has been waiting) and the limits set with 'tide limits set'.

Examples:
  tide queues
  tide queues --json | jq '.[] | select(.retry > 0) | .queue'`,
	run: runQueues,
}

var cmdQueuesRepartition = &command{
	name: "queues repartition", args: "<queue> <partitions>", minArgs: 2, maxArgs: 2, redis: true,
	summary: "change a queue's partition count while it is in use",
	help: `
Change the number of partitions of a queue without stopping its servers or
its producers: new tasks go to the new partitions at once, every waiting
task is moved over, tasks running now finish where they are, and then the
old partitions are retired. Nothing is lost or run twice, even if this
command is interrupted: run it again with the same count to finish.

More partitions spread a hot queue over more Redis Cluster masters (use at
least as many as there are masters). Processes configured with
redisbroker.WithQueuePartitions for this queue must be given the new count.

Examples:
  tide queues repartition orders 12`,
	check: func(_ *app, o *cmdOpts, args []string) error {
		if err := checkQueueArg(o.cmd, args[0]); err != nil {
			return err
		}
		if n, err := strconv.Atoi(args[1]); err != nil || n < 1 || n > 1024 {
			return usagef(o.cmd, "partitions %q must be a number from 1 to 1024", args[1])
		}
		return nil
	},
	run: runRepartition,
}

func runRepartition(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	queue := args[0]
	n, _ := strconv.Atoi(args[1])
	if err := a.knownQueue(ctx, queue); err != nil {
		return err
	}
	last := time.Time{}
	err := a.in.Repartition(ctx, queue, n, func(moved, left int) {
		if a.globals.json || time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		fmt.Fprintf(a.stderr, "moved %s; %d left in the old partitions (running tasks finish there)\n", plural(moved, "task", "tasks"), left)
	})
	if err != nil {
		return fmt.Errorf("tide: repartition %s: %w", queue, err)
	}
	if a.globals.json {
		return a.printJSON(map[string]any{"queue": queue, "partitions": n})
	}
	fmt.Fprintf(a.stdout, "Queue %s now has %s.\n", queue, plural(n, "partition", "partitions"))
	return nil
}

var cmdQueuesRm = &command{
	name: "queues rm", args: "<queue>", minArgs: 1, maxArgs: 1, redis: true,
	summary: "remove an empty queue",
	help: `
Remove a queue that holds no task: it disappears from 'tide queues', and its
counters, pause flag and partition count (every partition) are deleted. A
later task enqueued to it creates it again. Its limits ('tide limits set',
or servers' QueueLimits) stay, with the partition count they are shared on
and the recent starts a rate counts, so that they hold when the queue comes
back; run 'tide limits set <queue> --clear' first to forget them too.

A queue that still holds tasks, in any state, is refused (exit 1) with what
it holds: delete them first ('tide tasks delete <queue> --all --state S';
running tasks finish, or cancel them with 'tide tasks cancel'). A queue that
never had a task is refused with exit 3, as 'tide pause' does.

Examples:
  tide queues rm orders-v1
  tide tasks delete orders-v1 --all --state archived && tide queues rm orders-v1`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
	run:   runQueuesRm,
}

func runQueuesRm(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	queue := args[0]
	if err := a.knownQueue(ctx, queue); err != nil {
		return err
	}
	err := a.in.DeleteQueue(ctx, queue)
	if errors.Is(err, tide.ErrQueueNotEmpty) {
		return fmt.Errorf("tide: cannot remove queue %s: %s\n  %s", queue, strings.TrimPrefix(err.Error(), "tide: "), a.emptyQueueHint(ctx, queue))
	}
	if err != nil {
		return fmt.Errorf("tide: remove queue %s: %w", queue, err)
	}
	if a.globals.json {
		return a.printJSON(map[string]any{"queue": queue, "removed": true})
	}
	fmt.Fprintf(a.stdout, "Queue %s removed.\n", queue)
	return nil
}

// emptyQueueHint says how to empty queue: the commands that delete the
// tasks of each state that holds some.
func (a *app) emptyQueueHint(ctx context.Context, queue string) string {
	qi, err := a.in.QueueInfo(ctx, queue)
	if err != nil || qi.Size == 0 {
		return "Delete its tasks first ('tide tasks delete " + queue + " --all --state S'), or let a repartition finish ('tide queues repartition'), then try again."
	}
	var cmds, held []string
	for _, s := range []struct {
		st tide.TaskState
		n  int
	}{{tide.StatePending, qi.Pending}, {tide.StateActive, qi.Active}, {tide.StateScheduled, qi.Scheduled},
		{tide.StateRetry, qi.Retry}, {tide.StateArchived, qi.Archived}, {tide.StateCompleted, qi.Completed}} {
		if s.n == 0 {
			continue
		}
		held = append(held, fmt.Sprintf("%d %s", s.n, s.st))
		if s.st != tide.StateActive {
			cmds = append(cmds, fmt.Sprintf("tide tasks delete %s --all --state %s", queue, s.st))
		}
	}
	hint := "It holds " + strings.Join(held, ", ") + "."
	if len(cmds) > 0 {
		hint += " Delete its tasks first:\n    " + strings.Join(cmds, "\n    ")
	}
	if qi.Active > 0 {
		hint += "\n  Running tasks cannot be deleted: let them finish, or cancel them ('tide tasks ls " + queue + " --state active', 'tide tasks cancel')."
	}
	return hint
}

// queueJSON is a queue in --json output.
type queueJSON struct {
	Queue          string           `json:"queue"`
	Paused         bool             `json:"paused"`
	PausedUntil    *time.Time       `json:"paused_until,omitempty"`
	Size           int              `json:"size"`
	Pending        int              `json:"pending"`
	Active         int              `json:"active"`
	Scheduled      int              `json:"scheduled"`
	Retry          int              `json:"retry"`
	Archived       int              `json:"archived"`
	Completed      int              `json:"completed"`
	ProcessedToday int              `json:"processed_today"`
	FailedToday    int              `json:"failed_today"`
	LatencySeconds float64          `json:"latency_seconds"`
	Limits         tide.QueueLimits `json:"limits"`
}

func toQueueJSON(q *tide.QueueInfo, l tide.QueueLimits) queueJSON {
	j := queueJSON{q.Queue, q.Paused, nil, q.Size, q.Pending, q.Active, q.Scheduled, q.Retry, q.Archived, q.Completed,
		q.Processed, q.Failed, q.Latency.Seconds(), l}
	if !q.PausedUntil.IsZero() {
		u := q.PausedUntil.UTC()
		j.PausedUntil = &u
	}
	return j
}

// pausedCell is the PAUSED column: no, yes, or for a timed pause how long
// it has left.
func pausedCell(q *tide.QueueInfo) string {
	if q.Paused && !q.PausedUntil.IsZero() {
		return "for " + short(max(time.Until(q.PausedUntil), 0))
	}
	return yesNo(q.Paused)
}

// queueInfos returns the info of every queue.
func (a *app) queueInfos(ctx context.Context) ([]*tide.QueueInfo, error) {
	qs, err := a.in.Queues(ctx)
	if err != nil {
		return nil, fmt.Errorf("tide: list queues: %w", err)
	}
	out := make([]*tide.QueueInfo, 0, len(qs))
	for _, q := range qs {
		qi, err := a.in.QueueInfo(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("tide: queue %s: %w", q, err)
		}
		out = append(out, qi)
	}
	return out, nil
}

func runQueues(ctx context.Context, a *app, _ *cmdOpts, _ []string) error {
	infos, err := a.queueInfos(ctx)
	if err != nil {
		return err
	}
	limits, err := a.queueLimits(ctx, infos)
	if err != nil {
		return err
	}
	if a.globals.json {
		out := make([]queueJSON, len(infos))
		for i, q := range infos {
			out[i] = toQueueJSON(q, limits[q.Queue])
		}
		return a.printJSON(out)
	}
	if len(infos) == 0 {
		fmt.Fprintf(a.stdout, "No queues under prefix %q yet (is --prefix right?).\n", a.globals.prefix)
		return nil
	}
	t := newTable(a.stdout, "QUEUE", "PAUSED", "PENDING", "ACTIVE", "SCHEDULED", "RETRY", "ARCHIVED", "COMPLETED", "PROCESSED TODAY", "FAILED TODAY", "LATENCY", "LIMITS")
	for _, q := range infos {
		t.row(q.Queue, pausedCell(q), strconv.Itoa(q.Pending), strconv.Itoa(q.Active), strconv.Itoa(q.Scheduled),
			strconv.Itoa(q.Retry), strconv.Itoa(q.Archived), strconv.Itoa(q.Completed),
			strconv.Itoa(q.Processed), strconv.Itoa(q.Failed), latency(q.Latency), compactLimits(limits[q.Queue]))
	}
	t.flush()
	return nil
}

func latency(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return short(d)
}

var cmdPause = &command{
	name: "pause", args: "<queue> [--for <duration>] [--force]", minArgs: 1, maxArgs: 1, redis: true,
	summary: "stop servers from taking tasks of a queue",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.BoolVar(&o.force, "force", false, "pause a queue that has no tasks yet (before its first use)")
		fs.Var(&o.pauseFor, "for", "pause only for this long (e.g. 10m, 2h); the queue then resumes by itself")
	},
	help: `
Pause a queue: servers stop taking its tasks (running ones finish) until
'tide unpause', or with --for until that time has passed (servers pick the
queue up again within a few seconds of the end; 'tide queues' shows the time
left). Tasks can still be enqueued, and scheduled tasks still become
pending.

A queue that never had a task is refused (exit 3, with the list of queues):
the name is most likely a typo, and the pause would silently stop that
queue when it is first used. --force pauses it anyway, e.g. to hold a new
queue's tasks until its servers are ready; the queue is then listed by
'tide queues'.

Examples:
  tide pause emails
  tide unpause emails
  tide pause payments --for 15m   # the payment provider is down for maintenance
  tide pause reports-v2 --force   # before its first task`,
	run: func(ctx context.Context, a *app, o *cmdOpts, args []string) error {
		return a.pause(ctx, args[0], true, o.force, time.Duration(o.pauseFor))
	},
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
}

var cmdUnpause = &command{
	name: "unpause", args: "<queue> [--force]", minArgs: 1, maxArgs: 1, redis: true,
	summary: "resume a paused queue",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.BoolVar(&o.force, "force", false, "unpause a queue that never had a task")
	},
	help: `
Resume a queue paused with 'tide pause'. A queue that never had a task (nor
a pause) is refused with exit 3, as 'tide pause' does; --force skips the
check.

Example:
  tide unpause emails`,
	run: func(ctx context.Context, a *app, o *cmdOpts, args []string) error {
		return a.pause(ctx, args[0], false, o.force, 0)
	},
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
}

// pause pauses or unpauses queue; a pause with d > 0 lasts d. A queue no task was ever enqueued to is
// refused without force: a typo would leave a pause that stops the queue
// when it is first used. (Pausing records the queue, so a queue paused with
// force is known to unpause.)
func (a *app) pause(ctx context.Context, queue string, pause, force bool, d time.Duration) error {
	verb := "paused"
	if !pause {
		verb = "unpaused"
	}
	if err := a.knownQueue(ctx, queue); err != nil {
		var nf *notFoundError
		switch {
		case !errors.As(err, &nf):
			return err
		case force:
			a.note("%s; %s anyway (--force)", err.Error(), verb)
		case pause:
			return &notFoundError{msg: fmt.Sprintf("%v\n  Check the name; to pause a queue before its first task, add --force.", err)}
		default:
			return &notFoundError{msg: fmt.Sprintf("%v\n  Check the name (--force unpauses it anyway).", err)}
		}
	}
	var err error
	switch {
	case pause && d > 0:
		err = a.in.PauseQueueFor(ctx, queue, d)
	case pause:
		err = a.in.PauseQueue(ctx, queue)
	default:
		err = a.in.UnpauseQueue(ctx, queue)
	}
	if err != nil {
		return fmt.Errorf("tide: %s %s: %w", strings.TrimSuffix(verb, "d"), queue, err)
	}
	if pause && d > 0 {
		if a.globals.json {
			return a.printJSON(map[string]any{"queue": queue, "paused": true, "paused_for_seconds": d.Seconds()})
		}
		fmt.Fprintf(a.stdout, "Queue %s paused for %v; it resumes by itself.\n", queue, d)
		return nil
	}
	if a.globals.json {
		return a.printJSON(map[string]any{"queue": queue, "paused": pause})
	}
	fmt.Fprintf(a.stdout, "Queue %s %s.\n", queue, verb)
	return nil
}

var cmdServers = &command{
	name: "servers", args: "", maxArgs: 0, redis: true,
	summary: "list live servers and the tasks they are running",
	help: `
List the tide servers alive now (as of their last heartbeat, at most a few
seconds old): where they run, their queues and the tasks they are running.

Examples:
  tide servers
  tide servers --json`,
	run: runServers,
}

type serverJSON struct {
	ID          string           `json:"id"`
	Host        string           `json:"host"`
	PID         int              `json:"pid"`
	Concurrency int              `json:"concurrency"`
	Queues      map[string]int   `json:"queues"`
	Strict      bool             `json:"strict_priority"`
	StartedAt   time.Time        `json:"started_at"`
	Active      []activeTaskJSON `json:"active"`
}

type activeTaskJSON struct {
	Queue     string    `json:"queue"`
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	StartedAt time.Time `json:"started_at"`
}

func runServers(ctx context.Context, a *app, _ *cmdOpts, _ []string) error {
	ss, err := a.in.Servers(ctx)
	if err != nil {
		return fmt.Errorf("tide: list servers: %w", err)
	}
	if a.globals.json {
		out := make([]serverJSON, len(ss))
		for i, s := range ss {
			out[i] = serverJSON{s.ID, s.Host, s.PID, s.Concurrency, s.Queues, s.StrictPriority, s.StartedAt.UTC(), []activeTaskJSON{}}
			for _, t := range s.Active {
				out[i].Active = append(out[i].Active, activeTaskJSON{t.Queue, t.ID, t.Type, t.StartedAt.UTC()})
			}
		}
		return a.printJSON(out)
	}
	if len(ss) == 0 {
		fmt.Fprintln(a.stdout, "No live servers.")
		return nil
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "HOST", "PID", "QUEUES", "BUSY", "STARTED")
	for _, s := range ss {
		var qs []string
		for _, q := range slices.Sorted(maps.Keys(s.Queues)) {
			qs = append(qs, fmt.Sprintf("%s=%d", q, s.Queues[q]))
		}
		queues := strings.Join(qs, ",")
		if s.StrictPriority {
			queues += " (strict)"
		}
		t.row(s.ID, s.Host, strconv.Itoa(s.PID), queues, fmt.Sprintf("%d/%d", len(s.Active), s.Concurrency), when(s.StartedAt, now))
	}
	t.flush()
	var active int
	for _, s := range ss {
		active += len(s.Active)
	}
	if active > 0 {
		fmt.Fprintln(a.stdout)
		t = newTable(a.stdout, "SERVER", "QUEUE", "TASK ID", "TYPE", "RUNNING FOR")
		for _, s := range ss {
			for _, x := range s.Active {
				t.row(s.ID, x.Queue, x.ID, x.Type, short(now.Sub(x.StartedAt)))
			}
		}
		t.flush()
	}
	return nil
}

var cmdStats = &command{
	name: "stats", args: "[--watch] [--interval 2s] [--count N]", maxArgs: 0, redis: true,
	summary: "processed and failed counts per queue, optionally refreshing",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		o.interval = durationFlag(2 * time.Second)
		fs.BoolVar(&o.watch, "watch", false, "refresh every --interval until interrupted (Ctrl-C)")
		fs.Var(&o.interval, "interval", "time between refreshes with --watch, e.g. `1s`")
		fs.IntVar(&o.count, "count", 0, "with --watch, stop after `N` refreshes (0: until interrupted)")
	},
	help: `
Show, per queue, the attempts processed and failed today (UTC), the error
rate, and the pending, active and retry sizes. With --watch the numbers are
refreshed every --interval with the processing rate since the last refresh;
with --json each refresh is one JSON object on its own line.

Examples:
  tide stats
  tide stats --watch --interval 5s
  tide stats --watch --json --count 12 > stats.ndjson`,
	check: func(_ *app, o *cmdOpts, _ []string) error {
		if !o.watch && o.count != 0 {
			return usagef(o.cmd, "--count needs --watch")
		}
		if o.count < 0 {
			return usagef(o.cmd, "--count %d is negative", o.count)
		}
		return nil
	},
	run: runStats,
}

type statsJSON struct {
	Time   time.Time        `json:"time"`
	Queues []queueStatsJSON `json:"queues"`
}

type queueStatsJSON struct {
	Queue          string   `json:"queue"`
	ProcessedToday int      `json:"processed_today"`
	FailedToday    int      `json:"failed_today"`
	PerSecond      *float64 `json:"processed_per_second,omitempty"`
	Pending        int      `json:"pending"`
	Active         int      `json:"active"`
	Retry          int      `json:"retry"`
	Archived       int      `json:"archived"`
	LatencySeconds float64  `json:"latency_seconds"`
}

func runStats(ctx context.Context, a *app, o *cmdOpts, _ []string) error {
	clear := o.watch && !a.globals.json && isTerminal(a.stdout)
	prev := map[string]int{}
	var prevAt time.Time
	for i := 1; ; i++ {
		infos, err := a.queueInfos(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted mid-refresh
			}
			return err
		}
		now := time.Now()
		snap := statsJSON{Time: now.UTC(), Queues: []queueStatsJSON{}}
		for _, q := range infos {
			s := queueStatsJSON{Queue: q.Queue, ProcessedToday: q.Processed, FailedToday: q.Failed,
				Pending: q.Pending, Active: q.Active, Retry: q.Retry, Archived: q.Archived, LatencySeconds: q.Latency.Seconds()}
			if p, ok := prev[q.Queue]; ok && now.After(prevAt) {
				rate := max(float64(q.Processed-p), 0) / now.Sub(prevAt).Seconds()
				s.PerSecond = &rate
			}
			prev[q.Queue] = q.Processed
			snap.Queues = append(snap.Queues, s)
		}
		prevAt = now
		if a.globals.json {
			if err := writeLineJSON(a.stdout, snap); err != nil {
				return err
			}
		} else {
			if clear {
				fmt.Fprint(a.stdout, "\x1b[H\x1b[2J")
			}
			printStats(a, snap, o.watch)
		}
		if !o.watch || o.count > 0 && i >= o.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Duration(o.interval)):
		}
	}
}

func printStats(a *app, s statsJSON, watch bool) {
	if watch {
		fmt.Fprintf(a.stdout, "%s (counts are for today, UTC; Ctrl-C to stop)\n", s.Time.Format("2006-01-02 15:04:05 MST"))
	}
	if len(s.Queues) == 0 {
		fmt.Fprintf(a.stdout, "No queues under prefix %q yet.\n", a.globals.prefix)
		return
	}
	t := newTable(a.stdout, "QUEUE", "PROCESSED", "FAILED", "ERROR RATE", "PER SECOND", "PENDING", "ACTIVE", "RETRY", "LATENCY")
	for _, q := range s.Queues {
		errRate := "-"
		if q.ProcessedToday > 0 {
			errRate = fmt.Sprintf("%.1f%%", 100*float64(q.FailedToday)/float64(q.ProcessedToday))
		}
		rate := "-"
		if q.PerSecond != nil {
			rate = fmt.Sprintf("%.1f", *q.PerSecond)
		}
		t.row(q.Queue, strconv.Itoa(q.ProcessedToday), strconv.Itoa(q.FailedToday), errRate, rate,
			strconv.Itoa(q.Pending), strconv.Itoa(q.Active), strconv.Itoa(q.Retry), latency(time.Duration(q.LatencySeconds*float64(time.Second))))
	}
	t.flush()
	if watch {
		fmt.Fprintln(a.stdout)
	}
}

var cmdCronLs = &command{
	name: "cron ls", args: "", maxArgs: 0, redis: true,
	summary: "list the periodic tasks of live schedulers",
	help: `
List the periodic tasks registered by running tide Schedulers: the cron
spec, the task type and queue, and when each runs next and ran last.

Examples:
  tide cron ls
  tide cron ls --json`,
	run: runCronLs,
}

type cronJSON struct {
	SchedulerID string     `json:"scheduler_id"`
	ID          string     `json:"id"`
	Spec        string     `json:"spec"`
	Type        string     `json:"type"`
	Queue       string     `json:"queue"`
	Next        time.Time  `json:"next"`
	Prev        *time.Time `json:"prev,omitempty"`
}

func runCronLs(ctx context.Context, a *app, _ *cmdOpts, _ []string) error {
	es, err := a.in.SchedulerEntries(ctx)
	if err != nil {
		return fmt.Errorf("tide: list scheduler entries: %w", err)
	}
	if a.globals.json {
		out := make([]cronJSON, len(es))
		for i, e := range es {
			out[i] = cronJSON{e.SchedulerID, e.ID, e.Spec, e.Type, e.Queue, e.Next.UTC(), nil}
			if !e.Prev.IsZero() {
				p := e.Prev.UTC()
				out[i].Prev = &p
			}
		}
		return a.printJSON(out)
	}
	if len(es) == 0 {
		fmt.Fprintln(a.stdout, "No periodic tasks (no live scheduler has registered any).")
		return nil
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "SPEC", "TYPE", "QUEUE", "NEXT", "PREVIOUS", "SCHEDULER")
	for _, e := range es {
		t.row(e.ID, e.Spec, e.Type, e.Queue, when(e.Next, now), when(e.Prev, now), e.SchedulerID)
	}
	t.flush()
	return nil
}

// isTerminal reports whether w is a terminal (to clear the screen between
// refreshes).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
