package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/encrypt"
)

// defaultWaitTimeout is how long 'tasks wait' waits without --timeout.
const defaultWaitTimeout = 30 * time.Second

var cmdTasksWait = &command{
	name: "tasks wait", args: "<queue> <id> [--timeout 30s]", minArgs: 2, maxArgs: 2, redis: true, taskData: true,
	summary: "wait until a task is completed or archived",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		o.timeout = durationFlag(defaultWaitTimeout)
		fs.Var(&o.timeout, "timeout", "give up after this long, e.g. `2m`")
	},
	help: `
Wait until a task is completed or archived (failed for good), then print how
it ended: when, the size of its result for a completed task, the last error
for an archived one. It does not poll: the server that ends the task wakes
the wait (Client.Wait). With --json it prints the task as 'tide tasks show
--json' does.

A task that succeeds is deleted unless it has a Retention (tide.Retention):
it is then reported as completed without its result, and one that ended so
before the wait began cannot be found (exit 3). Give tasks you wait for a
Retention.

Exit codes:
  0  the task completed
  4  the task failed: it was archived
  5  --timeout passed first (the task goes on; the error says its state)
  3  there is no such task, or it was deleted or cancelled while waited for
  1  the wait failed (Redis unreachable, interrupted with Ctrl-C, ...)

` + encryptionHelp + `

Examples:
  tide tasks wait images resize:42
  tide tasks wait images resize:42 --timeout 5m && echo done
  tide tasks wait images resize:42 --json | jq -r .result`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkQueueArg(o.cmd, args[0]) },
	run:   runTasksWait,
}

func runTasksWait(ctx context.Context, a *app, o *cmdOpts, args []string) error {
	queue, id := args[0], args[1]
	limit := time.Duration(o.timeout)
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	ti, err := a.c.Wait(wctx, queue, id)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("tide: interrupted while waiting for task %q in queue %q", id, queue)
		case errors.Is(err, tide.ErrTaskNotFound):
			return &notFoundError{msg: fmt.Sprintf("tide: no task %q in queue %q to wait for: there is none, it was deleted or cancelled, or it succeeded without a Retention before the wait began", id, queue)}
		case wctx.Err() != nil && !errors.Is(err, tide.ErrInvalidTask):
			// The deadline passed, whatever the wait was doing then (a
			// round trip to Redis may fail with a timeout of its own).
			msg := fmt.Sprintf("tide: task %q in queue %q did not finish within %v", id, queue, limit)
			if cur, err := a.in.GetTaskInfo(ctx, queue, id); err == nil {
				msg += " (it is " + cur.State.String() + ")"
			}
			return &codedError{code: exitTimeout, msg: msg}
		}
		return taskErr("wait for", queue, id, err)
	}
	var failed error
	if ti.State == tide.StateArchived {
		failed = &codedError{code: exitArchived, msg: fmt.Sprintf("tide: task %q in queue %q failed: it was archived", id, queue)}
	}
	if a.globals.json {
		if err := a.printJSON(toTaskJSON(ti)); err != nil {
			return err
		}
		return failed
	}
	printWaited(a, ti, time.Now())
	return failed
}

// printWaited prints how a task that was waited for ended.
func printWaited(a *app, ti *tide.TaskInfo, now time.Time) {
	t := newTable(a.stdout)
	kv := func(k, v string) { t.row(fmt.Sprintf("%-13s", k+":"), v) }
	kv("ID", ti.ID)
	kv("Queue", ti.Queue)
	if ti.Type != "" {
		kv("Type", ti.Type)
	}
	kv("State", ti.State.String())
	switch ti.State {
	case tide.StateCompleted:
		kv("Completed at", stamp(ti.CompletedAt, now))
		switch {
		case ti.Type == "":
			// Wait reports a task deleted when it succeeded by its ID,
			// queue, state and time only.
			kv("Result", "- (the task was not kept once it succeeded: give it a Retention to read its result)")
		case len(ti.Result) == 0:
			kv("Result", "none")
		case encrypt.IsSealed(ti.Result):
			kv("Result", plural(len(ti.Result), "byte", "bytes")+", encrypted ('tide tasks show' with --encryption-keys shows it)")
		default:
			kv("Result", plural(len(ti.Result), "byte", "bytes")+" ('tide tasks show' or --json shows it)")
		}
		t.flush()
	default:
		kv("Failed at", stamp(ti.LastFailedAt, now))
		kv("Retried", fmt.Sprintf("%d of %d", ti.Retried, ti.MaxRetry))
		t.flush()
		if ti.LastErr == "" {
			fmt.Fprintln(a.stdout, "Last error:    -")
			return
		}
		fmt.Fprintln(a.stdout, "Last error:")
		for line := range strings.SplitSeq(strings.TrimRight(escapeLines(ti.LastErr), "\n"), "\n") {
			fmt.Fprintln(a.stdout, "  "+line)
		}
	}
}
