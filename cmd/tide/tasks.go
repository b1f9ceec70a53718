package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/encrypt"
	"github.com/tidequeue/tide/gateway"
	"github.com/tidequeue/tide/tidetype"
)

var stateNames = map[string]tide.TaskState{
	"pending": tide.StatePending, "active": tide.StateActive, "scheduled": tide.StateScheduled,
	"retry": tide.StateRetry, "archived": tide.StateArchived, "completed": tide.StateCompleted,
}

// parseState reads --state, accepting only the states in allowed.
func parseState(cmd *command, s string, allowed ...tide.TaskState) (tide.TaskState, error) {
	st, ok := stateNames[strings.ToLower(s)]
	if ok && slices.Contains(allowed, st) {
		return st, nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = a.String()
	}
	if s == "" {
		return 0, usagef(cmd, "--state is required (one of %s)", strings.Join(names, ", "))
	}
	return 0, usagef(cmd, "--state %q: must be one of %s", s, strings.Join(names, ", "))
}

var allStates = []tide.TaskState{tide.StatePending, tide.StateActive, tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateCompleted}

var cmdTasksLs = &command{
	name: "tasks ls", args: "<queue> [--state S] [--id S] [--type S] [--payload S] [--error S] [--page N] [--size N]", minArgs: 1, maxArgs: 1, redis: true, taskData: true,
	summary: "list the tasks of a queue in one state, or search them",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.StringVar(&o.state, "state", "pending", "`state` to list: pending, active, scheduled, retry, archived or completed")
		fs.IntVar(&o.page, "page", 1, "page `N` to show, from 1")
		fs.IntVar(&o.size, "size", 20, "`N` tasks per page, 1 to 1000")
		fs.StringVar(&o.filter.ID, "id", "", "only tasks whose ID contains `text`")
		fs.StringVar(&o.filter.Type, "type", "", "only tasks whose type contains `text`")
		fs.StringVar(&o.filter.Payload, "payload", "", "only tasks whose payload contains `text` (decrypted with --encryption-keys)")
		fs.StringVar(&o.filter.Err, "error", "", "only tasks whose last error contains `text`")
	},
	help: `
List the tasks of a queue in one state, a page at a time: pending oldest
first, scheduled and retry by due time, archived and completed by time,
active by lease expiry. Active tasks are listed with when they started, the
server running them (as of its last heartbeat) and when their lease runs
out. Payloads are not shown; use 'tide tasks show' (or --json, which
includes them with the attempts). Control characters in IDs, types and
errors are escaped (ESC as \x1b; see 'tide tasks show --help').

--id, --type, --payload and --error search instead: only tasks whose ID,
type, payload or last error contain the text (case matters) are listed;
several filters must all match. --page and --size then count matching
tasks. A search reads the whole state of the queue, in steps of a bounded
size: on a very large queue it takes a while.

` + encryptionHelp + `

Examples:
  tide tasks ls orders
  tide tasks ls orders --state retry
  tide tasks ls orders --state active           # started when, on which server
  tide tasks ls orders --state archived --page 2 --size 100
  tide tasks ls orders --state archived --error timeout --type order:
  tide tasks ls orders --payload '"customer_id":42'
  tide tasks ls orders --state scheduled --json | jq -r '.[].id'`,
	check: func(_ *app, o *cmdOpts, args []string) error {
		if _, err := parseState(o.cmd, o.state, allStates...); err != nil {
			return err
		}
		if o.page < 1 {
			return usagef(o.cmd, "--page %d: pages start at 1", o.page)
		}
		if o.size < 1 || o.size > tide.MaxPageSize {
			return usagef(o.cmd, "--size %d: must be between 1 and %d", o.size, tide.MaxPageSize)
		}
		return checkQueueArg(o.cmd, args[0])
	},
	run: runTasksLs,
}

// checkQueueArg reports an invalid queue name as a usage error.
func checkQueueArg(cmd *command, queue string) error {
	if err := tide.ValidateQueueName(queue); err != nil {
		return usagef(cmd, "%s", strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": "))
	}
	return nil
}

func runTasksLs(ctx context.Context, a *app, o *cmdOpts, args []string) error {
	queue := args[0]
	st, _ := parseState(o.cmd, o.state, allStates...)
	if err := a.knownQueue(ctx, queue); err != nil {
		return err
	}
	var ts []*tide.TaskInfo
	var err error
	more := false
	searching := o.filter != (tide.TaskFilter{})
	if searching {
		ts, more, err = a.search(ctx, queue, st, o.filter, (o.page-1)*o.size, o.size)
		if err != nil {
			return fmt.Errorf("tide: search %s tasks of %s: %w", st, queue, err)
		}
	} else {
		ts, err = a.in.ListTasks(ctx, queue, st, o.page, o.size)
		if err != nil {
			return fmt.Errorf("tide: list %s tasks of %s: %w", st, queue, err)
		}
		more = len(ts) == o.size
	}
	if a.globals.json {
		out := make([]*taskJSON, len(ts))
		for i, t := range ts {
			out[i] = toTaskJSON(t)
		}
		return a.printJSON(out)
	}
	filters := filterArgs(o.filter)
	if len(ts) == 0 {
		match := ""
		if searching {
			match = " matching" + filters
		}
		if o.page > 1 {
			fmt.Fprintf(a.stdout, "No %s tasks%s in queue %s on page %d.\n", st, match, queue, o.page)
		} else {
			fmt.Fprintf(a.stdout, "No %s tasks%s in queue %s.\n", st, match, queue)
		}
		return nil
	}
	now := time.Now()
	if st == tide.StateActive {
		t := newTable(a.stdout, "ID", "TYPE", "RETRIED", "STARTED", "SERVER", "LEASE EXPIRES", "LAST ERROR")
		for _, ti := range ts {
			t.row(ti.ID, ti.Type, fmt.Sprintf("%d/%d", ti.Retried, ti.MaxRetry), when(ti.StartedAt, now), orDash(ti.Server),
				when(ti.LeaseExpiresAt, now), orDash(firstLine(ti.LastErr, 60)))
		}
		t.flush()
	} else {
		timeCol := map[tide.TaskState]string{
			tide.StatePending: "READY", tide.StateScheduled: "DUE", tide.StateRetry: "RETRY AT",
			tide.StateArchived: "FAILED", tide.StateCompleted: "COMPLETED",
		}[st]
		t := newTable(a.stdout, "ID", "TYPE", "RETRIED", timeCol, "LAST ERROR")
		for _, ti := range ts {
			at := ti.NextProcessAt
			switch st {
			case tide.StateArchived:
				at = ti.LastFailedAt
			case tide.StateCompleted:
				at = ti.CompletedAt
			}
			t.row(ti.ID, ti.Type, fmt.Sprintf("%d/%d", ti.Retried, ti.MaxRetry), when(at, now), orDash(firstLine(ti.LastErr, 60)))
		}
		t.flush()
	}
	if more {
		fmt.Fprintf(a.stdout, "\nPage %d (%d per page). Next: %s\n", o.page, o.size,
			escape(fmt.Sprintf("tide tasks ls %s --state %s%s --page %d --size %d", queue, st, filters, o.page+1, o.size)))
	}
	return nil
}

// search returns the tasks of queue in state that match f, skipping the
// first skip matches, at most n of them, and whether more match. It calls
// SearchTasks until it has enough or the state is read to its end: a call
// may return fewer tasks than asked with more to read.
func (a *app) search(ctx context.Context, queue string, st tide.TaskState, f tide.TaskFilter, skip, n int) (ts []*tide.TaskInfo, more bool, err error) {
	seen, offset := 0, 0
	for {
		limit := min(skip+n+1-seen, tide.MaxPageSize)
		page, next, err := a.in.SearchTasks(ctx, queue, st, f, offset, limit)
		if err != nil {
			return nil, false, err
		}
		for _, t := range page {
			if seen >= skip {
				ts = append(ts, t)
			}
			seen++
		}
		if len(ts) > n || next < 0 || next <= offset {
			break
		}
		offset = next
	}
	if len(ts) > n {
		return ts[:n], true, nil
	}
	return ts, false, nil
}

// filterArgs writes the filters back as flags (" --type 'a b'"), for
// messages and the next-page hint.
func filterArgs(f tide.TaskFilter) string {
	var b strings.Builder
	for _, x := range []struct{ flag, v string }{{"id", f.ID}, {"type", f.Type}, {"payload", f.Payload}, {"error", f.Err}} {
		if x.v != "" {
			b.WriteString(" --" + x.flag + " " + shellQuote(x.v))
		}
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@%+=,", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// taskJSON is a task in --json output: the gateway's form of a task, with
// the attempts, where an active task runs, and whether the payload and the
// result are encrypted (and so shown as stored: their base64 is the
// ciphertext).
type taskJSON struct {
	*gateway.Task
	PayloadEncrypted bool          `json:"payload_encrypted,omitempty"`
	ResultEncrypted  bool          `json:"result_encrypted,omitempty"`
	StartedAt        *time.Time    `json:"started_at,omitempty"`
	Server           string        `json:"server,omitempty"`
	LeaseExpiresAt   *time.Time    `json:"lease_expires_at,omitempty"`
	Attempts         []attemptJSON `json:"attempts"`
	// History is the recorded history (--history-dsn), absent without
	// one; HistoryError says why it could not be read.
	History      *[]attemptJSON `json:"history,omitempty"`
	HistoryError string         `json:"history_error,omitempty"`
}

// attemptJSON is one attempt of a task.
type attemptJSON struct {
	Started *time.Time `json:"started,omitempty"` // absent when unknown (the lease expired)
	Ended   *time.Time `json:"ended,omitempty"`
	Server  string     `json:"server,omitempty"`
	Outcome string     `json:"outcome"`
	Error   string     `json:"error,omitempty"`
}

func toTaskJSON(ti *tide.TaskInfo) *taskJSON {
	t := &taskJSON{Task: gateway.TaskFromInfo(ti), PayloadEncrypted: encrypt.IsSealed(ti.Payload), ResultEncrypted: encrypt.IsSealed(ti.Result),
		StartedAt: utcPtr(ti.StartedAt), Server: ti.Server, LeaseExpiresAt: utcPtr(ti.LeaseExpiresAt), Attempts: []attemptJSON{}}
	for _, at := range ti.Attempts {
		t.Attempts = append(t.Attempts, attemptJSON{utcPtr(at.Started), utcPtr(at.Ended), at.Server, at.Outcome, at.Err})
	}
	return t
}

func utcPtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

var cmdTasksShow = &command{
	name: "tasks show", args: "<queue> <id> [--history-dsn DSN] [--history-table T]", minArgs: 2, maxArgs: 2, redis: true, taskData: true,
	summary: "show one task: state, payload, attempts, last error, result, recorded history",
	flags:   historyFlags,
	help: `
Show everything about one task: its state, when it is due, retries, the last
error (with a stack trace for panics), headers, payload and result, and its
latest attempts (at most 10 are kept: when each started and ended, on which
server, the outcome and the first line of its error). For a running task it
shows when it started, for how long it has run, the server running it and
when its lease runs out, instead of when it was due. A payload is shown as
JSON or text when it is, else as base64; long ones are cut (--json shows
all).

` + historyHelp + `

A task Redis no longer holds but whose recorded history has attempts is
shown by its history alone (exit 0; with --json, {"id", "queue",
"stored": false, "history"}); --json has the history as "history". When
the history cannot be read, the task is shown with a note and tide exits
with 1.

` + encryptionHelp + `

` + escapeHelp + `

Exits with 3 when there is no such task (in Redis nor in the history).

Examples:
  tide tasks show orders order-cancel:42
  tide tasks show orders order-cancel:42 --json | jq .payload
  tide tasks show orders order-cancel:42 --json | jq '.attempts[].error'
  TIDE_HISTORY_DSN='postgres://tide:secret@db:5432/app' tide tasks show orders order-cancel:42
  TIDE_ENCRYPTION_KEYS=$(cat /run/secrets/tide-keys) tide tasks show orders order-cancel:42`,
	check: func(a *app, o *cmdOpts, args []string) error {
		if err := checkQueueArg(o.cmd, args[0]); err != nil {
			return err
		}
		return a.openHistory(o)
	},
	run: runTasksShow,
}

func runTasksShow(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	queue, id := args[0], args[1]
	ti, err := a.in.GetTaskInfo(ctx, queue, id)
	var (
		hist    []tide.Attempt
		histErr error
	)
	if a.hist != nil && (err == nil || errors.Is(err, tide.ErrTaskNotFound)) {
		hist, histErr = a.taskHistory(ctx, queue, id)
	}
	if err != nil {
		if len(hist) > 0 {
			return showGone(a, queue, id, hist)
		}
		err = taskErr("show", queue, id, err)
		if histErr != nil {
			var nf *notFoundError
			if errors.As(err, &nf) {
				nf.msg += "; its recorded history could not be read: " + firstLine(histErr.Error(), historyErrRunes)
			}
		}
		return err
	}
	if ti.State == tide.StateActive {
		a.running(ctx, ti)
	}
	if a.globals.json {
		tj := toTaskJSON(ti)
		if a.hist != nil {
			h := historyJSON(hist)
			tj.History = &h
			if histErr != nil {
				tj.HistoryError = histErr.Error()
			}
		}
		if err := a.printJSON(tj); err != nil {
			return err
		}
		return historyFailed(histErr)
	}
	now := time.Now()
	t := newTable(a.stdout)
	// Keys are as wide as the widest, "Next process at:", whichever are
	// shown, so that the lines printed after the table line up.
	kv := func(k, v string) { t.row(fmt.Sprintf("%-16s", k+":"), v) }
	kv("ID", ti.ID)
	kv("Queue", ti.Queue)
	kv("Type", ti.Type)
	kv("State", ti.State.String())
	if ti.State == tide.StateActive {
		if ti.StartedAt.IsZero() {
			kv("Started at", "- (not reported yet by a server heartbeat)")
			kv("Running for", "-")
		} else {
			kv("Started at", stamp(ti.StartedAt, now))
			kv("Running for", short(now.Sub(ti.StartedAt)))
		}
		kv("Server", orDash(ti.Server))
		kv("Lease expires", stamp(ti.LeaseExpiresAt, now))
	} else {
		kv("Next process at", stamp(ti.NextProcessAt, now))
	}
	kv("Retried", fmt.Sprintf("%d of %d", ti.Retried, ti.MaxRetry))
	kv("Last failed at", stamp(ti.LastFailedAt, now))
	kv("Completed at", stamp(ti.CompletedAt, now))
	kv("Timeout", durOrDash(ti.Timeout))
	kv("Deadline", stamp(ti.Deadline, now))
	kv("Retention", durOrDash(ti.Retention))
	if len(ti.Headers) == 0 {
		kv("Headers", "-")
	}
	for i, k := range slices.Sorted(maps.Keys(ti.Headers)) {
		label := ""
		if i == 0 {
			label = "Headers:"
		}
		t.row(label, k+": "+ti.Headers[k])
	}
	kv("Payload", a.showValue("payload", ti.Payload, ti.LastErr))
	if len(ti.Result) > 0 || len(a.keys) > 0 && undecrypted("result", ti.Result, ti.LastErr) {
		kv("Result", a.showValue("result", ti.Result, ti.LastErr))
	}
	t.flush()
	if ti.LastErr != "" {
		fmt.Fprintln(a.stdout, "Last error:")
		for line := range strings.SplitSeq(strings.TrimRight(escapeLines(ti.LastErr), "\n"), "\n") {
			fmt.Fprintln(a.stdout, "  "+line)
		}
	} else {
		fmt.Fprintln(a.stdout, "Last error:       -")
	}
	printAttempts(a, ti.Attempts, now)
	if a.hist != nil {
		printHistory(a, hist, histErr, now)
	}
	return historyFailed(histErr)
}

// historyFailed is the error of 'tasks show' when the task was shown but
// its recorded history could not be read.
func historyFailed(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("tide: cannot read the recorded history: %s", firstLine(err.Error(), historyErrRunes))
}

// showGone shows a task that Redis no longer holds by its recorded
// history.
func showGone(a *app, queue, id string, hist []tide.Attempt) error {
	if a.globals.json {
		return a.printJSON(goneJSON{ID: id, Queue: queue, History: historyJSON(hist)})
	}
	t := newTable(a.stdout)
	kv := func(k, v string) { t.row(fmt.Sprintf("%-16s", k+":"), v) }
	kv("ID", id)
	kv("Queue", queue)
	kv("State", "- (no longer stored in Redis: finished and deleted, or expired)")
	t.flush()
	printHistory(a, hist, nil, time.Now())
	return nil
}

// attemptErrRunes bounds an attempt's error in 'tasks show': its first
// line, cut to this many characters (--json has it whole).
const attemptErrRunes = 100

// printAttempts prints a task's attempt history, oldest first.
func printAttempts(a *app, as []tide.Attempt, now time.Time) {
	if len(as) == 0 {
		fmt.Fprintln(a.stdout, "Attempts:         - (none recorded: a task's first attempt that succeeds is not kept, unless the task is kept as completed)")
		return
	}
	fmt.Fprintf(a.stdout, "Attempts (%d, oldest first; the latest %d are kept):\n", len(as), tidetype.MaxAttempts)
	printAttemptTable(a, as, now)
}

// printAttemptTable prints attempts as an indented table, one a line;
// errors are cut to their first line.
func printAttemptTable(a *app, as []tide.Attempt, now time.Time) {
	var b strings.Builder
	t := newTable(&b, "STARTED", "TOOK", "SERVER", "OUTCOME", "ERROR")
	for _, at := range as {
		took := "-"
		if !at.Started.IsZero() && !at.Ended.IsZero() {
			took = short(at.Ended.Sub(at.Started))
		}
		t.row(stamp(at.Started, now), took, orDash(at.Server), orDash(at.Outcome), orDash(firstLine(at.Err, attemptErrRunes)))
	}
	t.flush()
	for line := range strings.SplitSeq(strings.TrimRight(b.String(), "\n"), "\n") {
		fmt.Fprintln(a.stdout, "  "+line)
	}
}

// running fills in where an active task runs: when it started and on which
// server (from the servers' heartbeats) and when its lease expires, which
// GetTaskInfo leaves out. It searches the queue's active tasks, a set as
// small as the servers' concurrency. Left as they are when it fails.
func (a *app) running(ctx context.Context, ti *tide.TaskInfo) {
	f := tide.TaskFilter{ID: ti.ID}
	for offset := 0; ; {
		ts, next, err := a.in.SearchTasks(ctx, ti.Queue, tide.StateActive, f, offset, tide.MaxPageSize)
		if err != nil {
			return
		}
		for _, t := range ts {
			if t.ID == ti.ID {
				ti.StartedAt, ti.Server, ti.LeaseExpiresAt = t.StartedAt, t.Server, t.LeaseExpiresAt
				return
			}
		}
		if next < 0 || next <= offset {
			return
		}
		offset = next
	}
}

func durOrDash(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}

// showBytes renders a payload or result for people.
func showBytes(b []byte) string {
	const limit = 2048
	if len(b) == 0 {
		return "(empty)"
	}
	var s, kind string
	switch {
	case json.Valid(b):
		s, kind = string(b), "JSON"
	case utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' }):
		s, kind = strconv.Quote(string(b)), "text"
	default:
		s, kind = base64.StdEncoding.EncodeToString(b), "base64"
	}
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut-- // do not split a character
		}
		s = s[:cut] + "…"
	}
	return fmt.Sprintf("%s  (%s, %s)", s, kind, plural(len(b), "byte", "bytes"))
}

// taskErr words an error about one task.
func taskErr(op, queue, id string, err error) error {
	switch {
	case errors.Is(err, tide.ErrTaskNotFound):
		return &notFoundError{msg: fmt.Sprintf("tide: no task %q in queue %q (it may have finished; 'tide tasks ls %s --state completed' lists retained ones)", id, queue, queue)}
	case errors.Is(err, tide.ErrTaskActive):
		return fmt.Errorf("tide: cannot %s task %q: it is running; cancel it first with 'tide tasks cancel %s %s'", op, id, queue, id)
	case errors.Is(err, tide.ErrInvalidTask):
		return &usageError{msg: strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")}
	}
	return fmt.Errorf("tide: %s task %q in queue %q: %s", op, id, queue, strings.TrimPrefix(err.Error(), "tide: "))
}

// bulkCommand builds "tasks delete|run|archive".
func bulkCommand(verb, summary, help string, allowed []tide.TaskState,
	one func(in *tide.Inspector, ctx context.Context, queue, id string) error,
	all func(in *tide.Inspector, ctx context.Context, queue string, st tide.TaskState) (int, error)) *command {
	var names []string
	for _, s := range allowed {
		names = append(names, s.String())
	}
	past := map[string]string{"delete": "deleted", "run": "made pending", "archive": "archived"}[verb]
	return &command{
		name: "tasks " + verb, args: "<queue> <id> | <queue> --all --state S", minArgs: 1, maxArgs: 2, redis: true,
		summary: summary,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			fs.BoolVar(&o.all, "all", false, "every task of the queue in --state instead of one")
			fs.StringVar(&o.state, "state", "", "with --all, the `state`: "+strings.Join(names, ", "))
		},
		help: help,
		check: func(_ *app, o *cmdOpts, args []string) error {
			if !o.all {
				if len(args) != 2 {
					return usagef(o.cmd, "give a task ID, or --all --state S for every task in a state")
				}
				if o.state != "" {
					return usagef(o.cmd, "--state only goes with --all")
				}
				return checkQueueArg(o.cmd, args[0])
			}
			if len(args) != 1 {
				return usagef(o.cmd, "give either a task ID or --all, not both")
			}
			if _, err := parseState(o.cmd, o.state, allowed...); err != nil {
				return err
			}
			return checkQueueArg(o.cmd, args[0])
		},
		run: func(ctx context.Context, a *app, o *cmdOpts, args []string) error {
			queue := args[0]
			if !o.all {
				if err := one(a.in, ctx, queue, args[1]); err != nil {
					return taskErr(verb, queue, args[1], err)
				}
				if a.globals.json {
					return a.printJSON(map[string]any{"queue": queue, "id": args[1], "count": 1})
				}
				fmt.Fprintf(a.stdout, "Task %s in queue %s %s.\n", escape(args[1]), queue, past)
				return nil
			}
			st, _ := parseState(o.cmd, o.state, allowed...)
			if err := a.knownQueue(ctx, queue); err != nil {
				return err
			}
			n, err := all(a.in, ctx, queue, st)
			if err != nil {
				return fmt.Errorf("tide: %s %s tasks of %s (%s done before the error): %w", verb, st, queue, plural(n, "task", "tasks"), err)
			}
			if a.globals.json {
				return a.printJSON(map[string]any{"queue": queue, "state": st.String(), "count": n})
			}
			if verb == "run" {
				fmt.Fprintf(a.stdout, "Made %s (%s) in queue %s pending.\n", plural(n, "task", "tasks"), st, queue)
			} else {
				fmt.Fprintf(a.stdout, "%s %s (%s) in queue %s.\n", upperFirst(past), plural(n, "task", "tasks"), st, queue)
			}
			return nil
		},
	}
}

var cmdTasksDelete = bulkCommand("delete", "delete one task, or every task in a state",
	`
Delete a task that is not running, or with --all every task of the queue in
one state. A running task cannot be deleted: cancel it ('tide tasks cancel').

Examples:
  tide tasks delete orders order-cancel:42
  tide tasks delete orders --all --state archived`,
	[]tide.TaskState{tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateCompleted},
	(*tide.Inspector).DeleteTask, (*tide.Inspector).DeleteAllTasks)

var cmdTasksRun = bulkCommand("run", "make a scheduled, retry or archived task pending now",
	`
Make a scheduled, retry or archived task pending now (run it as soon as a
worker is free), or with --all every task of the queue in one of those
states. Use it to retry archived tasks after fixing what made them fail.

Examples:
  tide tasks run orders order-cancel:42
  tide tasks run webhooks --all --state archived`,
	[]tide.TaskState{tide.StateScheduled, tide.StateRetry, tide.StateArchived},
	(*tide.Inspector).RunTask, (*tide.Inspector).RunAllTasks)

var cmdTasksArchive = bulkCommand("archive", "archive a pending, scheduled or retry task",
	`
Archive a pending, scheduled or retry task so that it is not run (it is kept
for inspection and can be run later with 'tide tasks run'), or with --all
every task of the queue in one of those states.

Examples:
  tide tasks archive orders order-cancel:42
  tide tasks archive emails --all --state retry`,
	[]tide.TaskState{tide.StatePending, tide.StateScheduled, tide.StateRetry},
	(*tide.Inspector).ArchiveTask, (*tide.Inspector).ArchiveAllTasks)

var cmdTasksCancel = &command{
	name: "tasks cancel", args: "<queue> <id>", minArgs: 2, maxArgs: 2, redis: true,
	summary: "cancel a running task",
	help: `
Ask the server running an active task to cancel it: its handler's context is
cancelled, and if the handler then returns an error the task is archived.
Tasks that are not running are deleted or archived instead.

Example:
  tide tasks cancel orders order-cancel:42`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
	run: func(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
		queue, id := args[0], args[1]
		ti, err := a.in.GetTaskInfo(ctx, queue, id)
		if err != nil {
			return taskErr("cancel", queue, id, err)
		}
		if ti.State != tide.StateActive {
			return fmt.Errorf("tide: task %q is %s, not running; only running tasks can be cancelled ('tide tasks delete' or 'tide tasks archive' it instead)", id, ti.State)
		}
		if err := a.in.CancelProcessing(ctx, queue, id); err != nil {
			return taskErr("cancel", queue, id, err)
		}
		if a.globals.json {
			return a.printJSON(map[string]any{"queue": queue, "id": id, "cancel_requested": true})
		}
		fmt.Fprintf(a.stdout, "Cancellation of task %s in queue %s requested.\n", escape(id), queue)
		return nil
	},
}
