package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

var stateNames = map[string]tide.TaskState{
	"pending": tide.StatePending, "active": tide.StateActive, "scheduled": tide.StateScheduled,
	"retry": tide.StateRetry, "archived": tide.StateArchived, "completed": tide.StateCompleted, "waiting": tide.StateWaiting,
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

var allStates = []tide.TaskState{tide.StatePending, tide.StateActive, tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateCompleted, tide.StateWaiting}

var cmdTasksLs = &command{
	name: "tasks ls", args: "<queue> [--state S] [--id S] [--type S] [--payload S] [--error S] [--page N] [--size N]", minArgs: 1, maxArgs: 1, redis: true, taskData: true,
	summary: "list the tasks of a queue in one state, or search them",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.StringVar(&o.state, "state", "pending", "`state` to list: pending, active, scheduled, retry, waiting, archived or completed")
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

Waiting tasks (parked by a durable handler in Sleep or WaitSignal) are
listed with what each waits for and until when. They lie with the retry
tasks and 'tide queues' counts them as retry; --state retry and --state
waiting each list their own, a search through the two (so, like a search,
a page past the first reads the pages before it).

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
  tide tasks ls orders --state waiting          # parked durable handlers: what for, until when
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
	// Retry and waiting tasks lie together; a search keeps one state.
	if searching || st == tide.StateRetry || st == tide.StateWaiting {
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
	if st == tide.StateWaiting {
		t := newTable(a.stdout, "ID", "TYPE", "WAITING FOR", "UNTIL", "RETRIED")
		for _, ti := range ts {
			t.row(ti.ID, ti.Type, orDash(ti.WaitingFor), when(ti.NextProcessAt, now), fmt.Sprintf("%d/%d", ti.Retried, ti.MaxRetry))
		}
		t.flush()
	} else if st == tide.StateActive {
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
	[]tide.TaskState{tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateCompleted, tide.StateWaiting},
	(*tide.Inspector).DeleteTask, (*tide.Inspector).DeleteAllTasks)

var cmdTasksRun = bulkCommand("run", "make a scheduled, retry or archived task pending now",
	`
Make a scheduled, retry or archived task pending now (run it as soon as a
worker is free), or with --all every task of the queue in one of those
states. Use it to retry archived tasks after fixing what made them fail.

Examples:
  tide tasks run orders order-cancel:42
  tide tasks run webhooks --all --state archived`,
	[]tide.TaskState{tide.StateScheduled, tide.StateRetry, tide.StateArchived, tide.StateWaiting},
	(*tide.Inspector).RunTask, (*tide.Inspector).RunAllTasks)

var cmdTasksArchive = bulkCommand("archive", "archive a pending, scheduled or retry task",
	`
Archive a pending, scheduled or retry task so that it is not run (it is kept
for inspection and can be run later with 'tide tasks run'), or with --all
every task of the queue in one of those states.

Examples:
  tide tasks archive orders order-cancel:42
  tide tasks archive emails --all --state retry`,
	[]tide.TaskState{tide.StatePending, tide.StateScheduled, tide.StateRetry, tide.StateWaiting},
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
