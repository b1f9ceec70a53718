package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
)

// limitsOpts are the flags of 'tide limits set'. Each remembers whether it
// was given, so that set changes only those.
type limitsOpts struct {
	concurrency      limitFlag
	rate             rateFlag
	groupConcurrency limitFlag
	groupRate        rateFlag
	ordered          setBoolFlag
	clear            bool
}

func (l *limitsOpts) any() bool {
	return l.concurrency.set || l.rate.set || l.groupConcurrency.set || l.groupRate.set || l.ordered.set
}

// apply changes the fields of cur that were given.
func (l *limitsOpts) apply(cur tide.QueueLimits) tide.QueueLimits {
	if l.concurrency.set {
		cur.Concurrency = l.concurrency.n
	}
	if l.rate.set {
		cur.Rate = l.rate.r
	}
	if l.groupConcurrency.set {
		cur.GroupConcurrency = l.groupConcurrency.n
	}
	if l.groupRate.set {
		cur.GroupRate = l.groupRate.r
	}
	if l.ordered.set {
		cur.Ordered = l.ordered.v
	}
	return cur
}

// limitFlag is a limit on running tasks: 0 to max, or "none" (0, no limit).
type limitFlag struct {
	n   int
	max int
	set bool
}

func (f *limitFlag) String() string { return "" }

func (f *limitFlag) Set(v string) error {
	if v == "none" {
		f.n, f.set = 0, true
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > f.max {
		return fmt.Errorf("want a number of tasks from 1 to %d, or 0 or none for no limit", f.max)
	}
	f.n, f.set = n, true
	return nil
}

// rateFlag is a rate, N/DUR ("100/1s", "5/1m", "10/500ms", "100/s"), or
// "none" for no limit.
type rateFlag struct {
	r   tide.Rate
	max int
	set bool
}

func (f *rateFlag) String() string { return "" }

func (f *rateFlag) Set(v string) error {
	r, err := parseRate(v, f.max)
	if err != nil {
		return err
	}
	f.r, f.set = r, true
	return nil
}

// parseRate reads N/DUR, or "none" (or "0") for the zero Rate.
func parseRate(v string, maxN int) (tide.Rate, error) {
	if v == "none" || v == "0" {
		return tide.Rate{}, nil
	}
	ns, ds, ok := strings.Cut(v, "/")
	if !ok {
		return tide.Rate{}, errors.New("want N/DURATION, e.g. 100/1s, 5/1m or 10/500ms (none for no limit)")
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 || n > maxN {
		return tide.Rate{}, fmt.Errorf("the number of starts %q must be 1 to %d (as in 100/1s)", ns, maxN)
	}
	dur := ds
	if ds != "" && ds[0] >= 'a' && ds[0] <= 'z' {
		dur = "1" + ds // "100/s" is "100/1s"
	}
	d, err := time.ParseDuration(dur)
	if err != nil {
		return tide.Rate{}, fmt.Errorf("the period %q is not a duration (use e.g. 500ms, 1s, 1m, 1h)", ds)
	}
	if d < time.Millisecond || d > broker.MaxRatePer || d%time.Millisecond != 0 {
		return tide.Rate{}, fmt.Errorf("the period %v must be whole milliseconds from 1ms to %s", d, formatPer(broker.MaxRatePer))
	}
	return tide.Rate{Limit: n, Per: d}, nil
}

// setBoolFlag is a boolean flag that remembers whether it was given.
type setBoolFlag struct{ v, set bool }

func (f *setBoolFlag) String() string   { return "" }
func (f *setBoolFlag) IsBoolFlag() bool { return true }

func (f *setBoolFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New("want true or false")
	}
	f.v, f.set = b, true
	return nil
}

// formatPer shows a period without its zero units: 1s, 1m, 1h30m, 500ms.
func formatPer(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatRate shows a rate as set takes it (100/1s), or "none".
func formatRate(r tide.Rate) string {
	if r.Limit == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%s", r.Limit, formatPer(r.Per))
}

func formatLimit(n int) string {
	if n == 0 {
		return "none"
	}
	return strconv.Itoa(n)
}

// compactLimits is a queue's limits on one line, in the words of 'tide
// limits set' ("concurrency=10 rate=100/1s ordered"), or "-" for none.
func compactLimits(l tide.QueueLimits) string {
	var f []string
	if l.Concurrency > 0 {
		f = append(f, "concurrency="+strconv.Itoa(l.Concurrency))
	}
	if l.Rate.Limit > 0 {
		f = append(f, "rate="+formatRate(l.Rate))
	}
	if l.GroupConcurrency > 0 {
		f = append(f, "group-concurrency="+strconv.Itoa(l.GroupConcurrency))
	}
	if l.GroupRate.Limit > 0 {
		f = append(f, "group-rate="+formatRate(l.GroupRate))
	}
	if l.Ordered {
		f = append(f, "ordered")
	}
	if len(f) == 0 {
		return "-"
	}
	return strings.Join(f, " ")
}

// queueLimitsJSON is the output of 'tide limits get --json' and set.
type queueLimitsJSON struct {
	Queue  string
	Limits tide.QueueLimits
}

// MarshalJSON writes {"queue":...} followed by the limits' own fields
// (tide.QueueLimits.MarshalJSON).
func (q queueLimitsJSON) MarshalJSON() ([]byte, error) {
	lb, err := json.Marshal(q.Limits)
	if err != nil {
		return nil, err
	}
	qb, err := json.Marshal(q.Queue)
	if err != nil {
		return nil, err
	}
	out := append([]byte(`{"queue":`), qb...)
	if len(lb) > 2 {
		out = append(out, ',')
	}
	return append(out, lb[1:]...), nil
}

// queueLimits returns the limits of every queue of infos, by name.
func (a *app) queueLimits(ctx context.Context, infos []*tide.QueueInfo) (map[string]tide.QueueLimits, error) {
	out := make(map[string]tide.QueueLimits, len(infos))
	for _, q := range infos {
		l, err := a.in.QueueLimits(ctx, q.Queue)
		if err != nil {
			return nil, fmt.Errorf("tide: limits of queue %s: %w", q.Queue, err)
		}
		out[q.Queue] = l
	}
	return out, nil
}

const limitsHelpCommon = `
Limits hold for all servers together and change without a restart: every
server obeys new limits within a second. Concurrency and the rate are the
queue's whatever its partition count: their slots follow the backlog between
the partitions. The group limits apply to each group
(tide.Group) on its own; --ordered runs each group's tasks one at a time, in
enqueue order. A server started with Config.QueueLimits for the queue writes
its own limits again when it starts.`

var cmdLimitsGet = &command{
	name: "limits get", args: "<queue>", minArgs: 1, maxArgs: 1, redis: true,
	summary: "show a queue's limits",
	help: `
Show the flow-control limits of a queue: concurrency (tasks running at once,
over all servers), rate (task starts per period), group concurrency, group
rate and whether groups are ordered. "none" is no limit.
` + limitsHelpCommon + `

Examples:
  tide limits get orders
  tide limits orders              # the same
  tide limits get orders --json`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
	run:   runLimitsGet,
}

var cmdLimitsSet = &command{
	name: "limits set", args: "<queue> [--concurrency N] [--rate N/DUR] [--group-concurrency N] [--group-rate N/DUR] [--ordered[=false]] | --clear", minArgs: 1, maxArgs: 1, redis: true,
	summary: "change a queue's limits",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		o.lim.concurrency.max = broker.MaxQueueConcurrency
		o.lim.groupConcurrency.max = broker.MaxQueueConcurrency
		o.lim.rate.max = broker.MaxQueueRate
		o.lim.groupRate.max = broker.MaxGroupRate
		fs.Var(&o.lim.concurrency, "concurrency", "most tasks of the queue running at once over all servers (`N`; 0 or none: no limit)")
		fs.Var(&o.lim.rate, "rate", "most task starts per period, `N/DUR` as in 100/1s, 5/1m, 10/500ms (none: no limit)")
		fs.Var(&o.lim.groupConcurrency, "group-concurrency", "most tasks of one group running at once (`N`; 0 or none: no limit)")
		fs.Var(&o.lim.groupRate, "group-rate", "most task starts of one group per period, `N/DUR` (none: no limit)")
		fs.Var(&o.lim.ordered, "ordered", "run each group's tasks one at a time, in enqueue order (--ordered=false: no)")
		fs.BoolVar(&o.lim.clear, "clear", false, "remove every limit of the queue")
		fs.BoolVar(&o.force, "force", false, "set limits of a queue that has no tasks yet (before its first use)")
	},
	help: `
Change the flow-control limits of a queue. Only the limits given change; the
others keep their values. --clear removes every limit.
` + limitsHelpCommon + `

A queue that never had a task is refused (exit 3), as 'tide pause' does:
the name is most likely a typo. --force sets its limits anyway.

Examples:
  tide limits set orders --concurrency 10 --rate 100/1s
  tide limits set orders --rate none               # remove only the rate
  tide limits set emails --group-concurrency 2 --group-rate 5/1m
  tide limits set ledger --ordered                 # each group in sequence
  tide limits set orders --clear`,
	check: func(_ *app, o *cmdOpts, args []string) error {
		if err := checkQueueArg(o.cmd, args[0]); err != nil {
			return err
		}
		switch {
		case o.lim.clear && o.lim.any():
			return usagef(o.cmd, "--clear removes every limit: give it without other limits")
		case !o.lim.clear && !o.lim.any():
			return usagef(o.cmd, "give the limits to change (--concurrency, --rate, --group-concurrency, --group-rate, --ordered) or --clear")
		}
		return nil
	},
	run: runLimitsSet,
}

func runLimitsGet(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	queue := args[0]
	l, err := a.in.QueueLimits(ctx, queue)
	if err != nil {
		return fmt.Errorf("tide: limits of %s: %w", queue, err)
	}
	if l == (tide.QueueLimits{}) {
		// No limits: say so only for a queue that exists (a typo would
		// otherwise read as "no limits").
		if err := a.knownQueue(ctx, queue); err != nil {
			return err
		}
	}
	return a.printLimits(queue, l, "")
}

func runLimitsSet(ctx context.Context, a *app, o *cmdOpts, args []string) error {
	queue := args[0]
	if err := a.knownQueue(ctx, queue); err != nil {
		var nf *notFoundError
		switch {
		case !errors.As(err, &nf):
			return err
		case !o.force:
			return &notFoundError{msg: fmt.Sprintf("%v\n  Check the name; to set the limits of a queue before its first task, add --force.", err)}
		}
		a.note("%s; setting its limits anyway (--force)", err.Error())
	}
	var l tide.QueueLimits
	if !o.lim.clear {
		cur, err := a.in.QueueLimits(ctx, queue)
		if err != nil {
			return fmt.Errorf("tide: limits of %s: %w", queue, err)
		}
		l = o.lim.apply(cur)
	}
	if err := a.in.SetQueueLimits(ctx, queue, l); err != nil {
		if errors.Is(err, tide.ErrInvalidTask) {
			return fmt.Errorf("tide: limits of %s refused: %s", queue, limitsFieldNames.Replace(strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")))
		}
		return fmt.Errorf("tide: set limits of %s: %w", queue, err)
	}
	head := "Limits of queue " + queue + " set:"
	if o.lim.clear {
		head = "Limits of queue " + queue + " removed:"
	}
	return a.printLimits(queue, l, head)
}

// limitsFieldNames names the fields of QueueLimits in the library's errors
// by the flags that set them.
var limitsFieldNames = strings.NewReplacer(
	"QueueLimits.GroupConcurrency", "--group-concurrency",
	"QueueLimits.GroupRate.Limit", "--group-rate limit",
	"QueueLimits.GroupRate.Per", "--group-rate period",
	"QueueLimits.Concurrency", "--concurrency",
	"QueueLimits.Rate.Limit", "--rate limit",
	"QueueLimits.Rate.Per", "--rate period",
)

// printLimits prints l, under head (or "Limits of queue Q:").
func (a *app) printLimits(queue string, l tide.QueueLimits, head string) error {
	if a.globals.json {
		return a.printJSON(queueLimitsJSON{queue, l})
	}
	if head == "" {
		head = "Limits of queue " + queue + ":"
	}
	fmt.Fprintln(a.stdout, head)
	t := newTable(a.stdout)
	t.row("  concurrency", formatLimit(l.Concurrency))
	t.row("  rate", formatRate(l.Rate))
	t.row("  group concurrency", formatLimit(l.GroupConcurrency))
	t.row("  group rate", formatRate(l.GroupRate))
	t.row("  ordered", yesNo(l.Ordered))
	t.flush()
	return nil
}

var cmdGroups = &command{
	name: "groups", args: "<queue> [--top N]", minArgs: 1, maxArgs: 1, redis: true,
	summary: "list the groups of a queue with the largest backlogs",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		o.count = 20
		fs.IntVar(&o.count, "top", 20, "show the `N` groups with the most tasks waiting (1 to 1000)")
	},
	help: `
List the groups (tide.Group: tenants, customers...) of a queue that have
tasks waiting or running, or that are throttled, the largest backlogs first:
the tasks waiting (pending), running (active), and for a group held back by
a throttle (tide.ThrottleGroup) or the queue's group rate, how long it is
held back.

Group names are text from Redis: they are printed escaped (see 'tide tasks
show --help'); --json output is exact (and escaped as JSON).

Examples:
  tide groups emails
  tide groups emails --top 100
  tide groups emails --json | jq '.[] | select(.running > 0) | .group'`,
	check: func(_ *app, o *cmdOpts, args []string) error {
		if err := checkQueueArg(o.cmd, args[0]); err != nil {
			return err
		}
		if o.count < 1 || o.count > broker.MaxGroupsListed {
			return usagef(o.cmd, "--top %d: must be between 1 and %d", o.count, broker.MaxGroupsListed)
		}
		return nil
	},
	run: runGroups,
}

type groupJSON struct {
	Queue          string     `json:"queue"`
	Group          string     `json:"group"`
	Waiting        int        `json:"waiting"`
	Running        int        `json:"running"`
	ThrottledUntil *time.Time `json:"throttled_until"`
}

func runGroups(ctx context.Context, a *app, o *cmdOpts, args []string) error {
	queue := args[0]
	if err := a.knownQueue(ctx, queue); err != nil {
		return err
	}
	gs, err := a.in.Groups(ctx, queue, o.count)
	if err != nil {
		return fmt.Errorf("tide: groups of %s: %w", queue, err)
	}
	now := time.Now()
	if a.globals.json {
		out := make([]groupJSON, len(gs))
		for i, g := range gs {
			out[i] = groupJSON{queue, g.Group, g.Waiting, g.Running, nil}
			if g.ThrottledUntil.After(now) {
				u := g.ThrottledUntil.UTC()
				out[i].ThrottledUntil = &u
			}
		}
		return a.printJSON(out)
	}
	if len(gs) == 0 {
		fmt.Fprintf(a.stdout, "No groups in queue %s: no grouped task is waiting, running or throttled.\n", queue)
		return nil
	}
	t := newTable(a.stdout, "GROUP", "WAITING", "RUNNING", "THROTTLED FOR")
	for _, g := range gs {
		th := "-"
		if g.ThrottledUntil.After(now) {
			th = short(g.ThrottledUntil.Sub(now))
		}
		t.row(g.Group, strconv.Itoa(g.Waiting), strconv.Itoa(g.Running), th)
	}
	t.flush()
	if len(gs) == o.count {
		fmt.Fprintf(a.stdout, "(the top %d groups; --top shows more)\n", o.count)
	}
	return nil
}
