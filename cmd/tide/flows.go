package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/tidetype"
)

// flowListMax is the most workflows or batches one 'ls' lists
// (Inspector.Workflows and Batches take 1 to 1000).
const flowListMax = 1000

// failedIDsShown is how many failed task IDs 'batches show' prints; --json
// has them all.
const failedIDsShown = 20

// flowKept says how long workflows and batches are kept; flowKeptHelp is
// its paragraph in the help texts.
var (
	flowKept     = "Workflows and batches are kept for " + formatPer(tide.WorkflowRetention) + " after they end"
	flowKeptHelp = flowKept + "\n(tide.WorkflowRetention)."
)

// flowListFlags registers --offset and --limit.
func flowListFlags(what string) func(fs *flag.FlagSet, o *cmdOpts) {
	return func(fs *flag.FlagSet, o *cmdOpts) {
		fs.IntVar(&o.offset, "offset", 0, "skip the `N` newest "+what)
		fs.IntVar(&o.limit, "limit", 20, fmt.Sprintf("list at most `N` %s, 1 to %d", what, flowListMax))
	}
}

func checkFlowList(_ *app, o *cmdOpts, _ []string) error {
	if o.offset < 0 {
		return usagef(o.cmd, "--offset %d: must be 0 or more", o.offset)
	}
	if o.limit < 1 || o.limit > flowListMax {
		return usagef(o.cmd, "--limit %d: must be between 1 and %d", o.limit, flowListMax)
	}
	return nil
}

// checkFlowID reports an ID that cannot name a workflow or batch as a usage
// error, as the library would refuse it (1 to broker.MaxFlowIDLength bytes
// of letters, digits and . _ - :).
func checkFlowID(cmd *command, what, id string) error {
	if err := tide.ValidateWorkflowID(id); err != nil {
		msg := strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")
		return usagef(cmd, "%s", strings.Replace(msg, "workflow ID", what, 1))
	}
	return nil
}

// flowErr words an error reading or changing a workflow or batch.
func flowErr(a *app, op, kind, id string, err error) error {
	switch {
	case errors.Is(err, tide.ErrWorkflowNotFound):
		list := "workflows"
		if kind == "batch" {
			list = "batches"
		}
		return &notFoundError{msg: fmt.Sprintf("tide: no %s %q under prefix %q (%s are kept for %s after they end; 'tide %s' lists them)",
			kind, id, a.globals.prefix, list, formatPer(tide.WorkflowRetention), list)}
	case errors.Is(err, tide.ErrInvalidTask):
		return &usageError{msg: strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")}
	}
	return fmt.Errorf("tide: %s %s %q: %s", op, kind, id, strings.TrimPrefix(err.Error(), "tide: "))
}

// isBatch reports whether id names a batch (GetBatch reads its counts only).
func (a *app) isBatch(ctx context.Context, id string) (*tide.BatchInfo, bool, error) {
	b, err := a.in.GetBatch(ctx, id)
	switch {
	case err == nil:
		return b, true, nil
	case errors.Is(err, tide.ErrWorkflowNotFound):
		return nil, false, nil
	}
	return nil, false, err
}

// otherKind is the not-found error for an ID that names a flow of the
// other kind: a batch given to 'workflows', or a workflow to 'batches'.
func otherKind(id, want, is, cmd string) error {
	return &notFoundError{msg: fmt.Sprintf("tide: no %s %q: it is a %s (see 'tide %s %s')", want, id, is, cmd, id)}
}

// stepJSON is a workflow step in --json output.
type stepJSON struct {
	Name         string   `json:"name"`
	State        string   `json:"state"`
	TaskState    string   `json:"task_state,omitempty"` // of an enqueued step's task, when known
	Queue        string   `json:"queue"`
	TaskID       string   `json:"task_id"`
	After        []string `json:"after"`
	RunOnFailure bool     `json:"run_on_failure"`
	Error        string   `json:"error,omitempty"`
}

// workflowJSON is a workflow in --json output; 'workflows ls' leaves out
// the steps and failed task IDs.
type workflowJSON struct {
	ID         string      `json:"id"`
	State      string      `json:"state"`
	Total      int         `json:"total"`
	Done       int         `json:"done"`
	Succeeded  int         `json:"succeeded"`
	Failed     int         `json:"failed"`
	Cancelled  int         `json:"cancelled"`
	CreatedAt  time.Time   `json:"created_at"`
	FinishedAt *time.Time  `json:"finished_at,omitempty"`
	FailedIDs  *[]string   `json:"failed_ids,omitempty"`
	Steps      *[]stepJSON `json:"steps,omitempty"`
}

func toWorkflowJSON(w *tide.WorkflowInfo, full bool) workflowJSON {
	j := workflowJSON{ID: w.ID, State: w.State.String(), Total: w.Total, Done: w.Succeeded + w.Failed + w.Canceled,
		Succeeded: w.Succeeded, Failed: w.Failed, Cancelled: w.Canceled, CreatedAt: w.CreatedAt.UTC(), FinishedAt: utcPtr(w.FinishedAt)}
	if full {
		ids := append([]string{}, w.FailedIDs...)
		steps := make([]stepJSON, len(w.Steps))
		for i, s := range w.Steps {
			steps[i] = stepJSON{Name: s.Name, State: s.State.String(), Queue: s.Queue, TaskID: s.TaskID,
				After: append([]string{}, s.After...), RunOnFailure: s.RunOnFailure, Error: s.Err}
			if s.State == tide.StepEnqueued && s.TaskState.Valid() {
				steps[i].TaskState = s.TaskState.String()
			}
		}
		j.FailedIDs, j.Steps = &ids, &steps
	}
	return j
}

// batchJSON is a batch in --json output; 'batches ls' leaves out the
// failed task IDs.
type batchJSON struct {
	ID              string     `json:"id"`
	State           string     `json:"state"`
	Total           int        `json:"total"`
	Succeeded       int        `json:"succeeded"`
	Failed          int        `json:"failed"`
	Pending         int        `json:"pending"`
	ProgressPercent int        `json:"progress_percent"`
	CallbackID      string     `json:"callback_id,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
	FailedIDs       *[]string  `json:"failed_ids,omitempty"`
}

func toBatchJSON(b *tide.BatchInfo, full bool) batchJSON {
	j := batchJSON{ID: b.ID, State: b.State.String(), Total: b.Total, Succeeded: b.Succeeded, Failed: b.Failed,
		Pending: batchPending(b), ProgressPercent: batchPercent(b), CallbackID: b.CallbackID,
		CreatedAt: b.CreatedAt.UTC(), FinishedAt: utcPtr(b.FinishedAt)}
	if full {
		ids := append([]string{}, b.FailedIDs...)
		j.FailedIDs = &ids
	}
	return j
}

// batchPending is the number of the batch's tasks that have not finished.
func batchPending(b *tide.BatchInfo) int { return max(b.Total-b.Succeeded-b.Failed, 0) }

// batchPercent is the share of the batch's tasks that have finished,
// rounded down (100 only when all have).
func batchPercent(b *tide.BatchInfo) int {
	if b.Total <= 0 {
		return 0
	}
	return min((b.Succeeded+b.Failed)*100/b.Total, 100)
}

// listHint prints which part of the list was shown and how to see the
// next, after a table.
func listHint(a *app, what, cmd string, offset, n, total, limit int) {
	if n == 0 || offset+n >= total {
		return
	}
	fmt.Fprintf(a.stdout, "\n%s %d to %d of %d. Next: tide %s --offset %d --limit %d\n",
		upperFirst(what), offset+1, offset+n, total, cmd, offset+n, limit)
}

// noneListed prints why a list is empty.
func noneListed(a *app, what, one string, offset, total int) {
	if total > 0 {
		fmt.Fprintf(a.stdout, "No %s from offset %d: there are %s.\n", what, offset, plural(total, one, what))
		return
	}
	fmt.Fprintf(a.stdout, "No %s under prefix %q. %s.\n", what, a.globals.prefix, flowKept)
}

var cmdWorkflowsLs = &command{
	name: "workflows ls", args: "[--offset N] [--limit N]", maxArgs: 0, redis: true,
	summary: "list workflows, newest first, with their progress",
	flags:   flowListFlags("workflows"),
	help: `
List workflows (tide.NewWorkflow, Client.EnqueueWorkflow), newest first: their
state (running, succeeded, failed or cancelled), how many of their steps are
done, how many succeeded, failed or were cancelled, when each was created
and when it finished. --json lists them without their steps.

` + flowKeptHelp + `

Examples:
  tide workflows
  tide workflows ls --offset 20 --limit 20
  tide workflows --json | jq -r '.[] | select(.state == "failed") | .id'`,
	check: checkFlowList,
	run:   runWorkflowsLs,
}

func runWorkflowsLs(ctx context.Context, a *app, o *cmdOpts, _ []string) error {
	ws, total, err := a.in.Workflows(ctx, o.offset, o.limit)
	if err != nil {
		return fmt.Errorf("tide: list workflows: %w", err)
	}
	if a.globals.json {
		out := make([]workflowJSON, len(ws))
		for i, w := range ws {
			out[i] = toWorkflowJSON(w, false)
		}
		return a.printJSON(out)
	}
	if len(ws) == 0 {
		noneListed(a, "workflows", "workflow", o.offset, total)
		return nil
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "STATE", "STEPS DONE", "SUCCEEDED", "FAILED", "CANCELLED", "CREATED", "FINISHED")
	for _, w := range ws {
		t.row(w.ID, w.State.String(), fmt.Sprintf("%d/%d", w.Succeeded+w.Failed+w.Canceled, w.Total),
			strconv.Itoa(w.Succeeded), strconv.Itoa(w.Failed), strconv.Itoa(w.Canceled), when(w.CreatedAt, now), when(w.FinishedAt, now))
	}
	t.flush()
	listHint(a, "workflows", "workflows ls", o.offset, len(ws), total, o.limit)
	return nil
}

// stepErrRunes bounds a step's error in 'workflows show': its first line,
// cut to this many characters (--json has it whole).
const stepErrRunes = 100

var cmdWorkflowsShow = &command{
	name: "workflows show", args: "<id>", minArgs: 1, maxArgs: 1, redis: true,
	summary: "show one workflow and its steps",
	help: `
Show a workflow: its state, how many steps are done, when it was created and
finished, and each step: its name, its state (waiting for the steps it runs
after, enqueued, succeeded, failed or cancelled; for an enqueued step the
state of its task in parentheses, as in "enqueued (active)"), its queue and
task ID ('tide tasks show <queue> <task ID>' shows the task), the steps it
runs after ("even if they fail" for a step with tide.RunDependents) and why
it failed or was cancelled (the first line; --json has it all).

` + escapeHelp + `

Exits with 3 when there is no such workflow (or the ID is a batch's).
` + flowKeptHelp + `

Examples:
  tide workflows show fulfil-order-42
  tide workflows show fulfil-order-42 --json | jq '.steps[] | select(.state == "failed")'`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkFlowID(o.cmd, "workflow ID", args[0]) },
	run:   runWorkflowsShow,
}

func runWorkflowsShow(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	id := args[0]
	// A batch's steps are its tasks, up to 100,000 of them: find out
	// cheaply that the ID is a batch's before reading steps.
	if _, ok, err := a.isBatch(ctx, id); err != nil {
		return flowErr(a, "show", "workflow", id, err)
	} else if ok {
		return otherKind(id, "workflow", "batch", "batches show")
	}
	w, err := a.in.GetWorkflow(ctx, id)
	if err != nil {
		return flowErr(a, "show", "workflow", id, err)
	}
	if a.globals.json {
		return a.printJSON(toWorkflowJSON(w, true))
	}
	now := time.Now()
	t := newTable(a.stdout)
	kv := func(k, v string) { t.row(fmt.Sprintf("%-10s", k+":"), v) }
	kv("ID", w.ID)
	kv("State", w.State.String())
	kv("Steps", fmt.Sprintf("%d of %d done: %d succeeded, %d failed, %d cancelled",
		w.Succeeded+w.Failed+w.Canceled, w.Total, w.Succeeded, w.Failed, w.Canceled))
	kv("Created", stamp(w.CreatedAt, now))
	kv("Finished", stamp(w.FinishedAt, now))
	t.flush()
	fmt.Fprintln(a.stdout)
	t = newTable(a.stdout, "STEP", "STATE", "QUEUE", "TASK ID", "AFTER", "ERROR")
	for _, s := range w.Steps {
		t.row(s.Name, stepState(s), s.Queue, s.TaskID, stepAfter(s), orDash(firstLine(s.Err, stepErrRunes)))
	}
	t.flush()
	return nil
}

// stepState words a step's state, with its task's for an enqueued step:
// "enqueued (active)".
func stepState(s tidetype.StepInfo) string {
	if s.State == tide.StepEnqueued && s.TaskState.Valid() {
		return s.State.String() + " (" + s.TaskState.String() + ")"
	}
	return s.State.String()
}

// stepAfter is the AFTER column: the steps a step runs after.
func stepAfter(s tidetype.StepInfo) string {
	if len(s.After) == 0 {
		return "-"
	}
	after := strings.Join(s.After, ",")
	if s.RunOnFailure {
		after += " (even if they fail)"
	}
	return after
}

// flowCancel builds 'workflows cancel' and 'batches cancel'.
func flowCancel(group, kind, other, help string) *command {
	return &command{
		name: group + " cancel", args: "<id>", minArgs: 1, maxArgs: 1, redis: true,
		summary: "cancel a " + kind + ": stop its running tasks, start no more",
		help:    help,
		check:   func(_ *app, o *cmdOpts, args []string) error { return checkFlowID(o.cmd, kind+" ID", args[0]) },
		run: func(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
			id := args[0]
			_, batch, err := a.isBatch(ctx, id)
			if err != nil {
				return flowErr(a, "cancel", kind, id, err)
			}
			switch {
			case kind == "workflow" && batch:
				return otherKind(id, kind, other, "batches cancel")
			case kind == "batch" && !batch:
				if _, err := a.in.GetWorkflow(ctx, id); err == nil {
					return otherKind(id, kind, other, "workflows cancel")
				}
				return flowErr(a, "cancel", kind, id, tide.ErrWorkflowNotFound)
			}
			if err := a.c.CancelWorkflow(ctx, id); err != nil {
				return flowErr(a, "cancel", kind, id, err)
			}
			// A flow that ended before the cancellation is left as it was.
			var state tide.FlowState
			if kind == "batch" {
				b, err := a.in.GetBatch(ctx, id)
				if err != nil {
					return flowErr(a, "cancel", kind, id, err)
				}
				state = b.State
			} else {
				w, err := a.in.GetWorkflow(ctx, id)
				if err != nil {
					return flowErr(a, "cancel", kind, id, err)
				}
				state = w.State
			}
			if state != tide.FlowCanceled {
				return fmt.Errorf("tide: %s %q had already ended (%s): nothing to cancel", kind, id, state)
			}
			if a.globals.json {
				return a.printJSON(map[string]any{"id": id, "kind": kind, "state": state.String()})
			}
			fmt.Fprintf(a.stdout, "%s %s cancelled: nothing more of it starts, and its enqueued tasks are cancelled (running ones are asked to stop).\n",
				upperFirst(kind), escape(id))
			return nil
		},
	}
}

var cmdWorkflowsCancel = flowCancel("workflows", "workflow", "batch", `
Cancel a workflow: steps that have not started never will, and the tasks of
enqueued steps are cancelled (deleted while they wait; a running handler's
context is cancelled, and the task is archived when it returns an error).
Steps that have finished keep their outcome. The workflow's state becomes
cancelled; cancelling it again does nothing. A workflow that had already
succeeded or failed is left as it is (exit 1).

Exits with 3 when there is no such workflow (or the ID is a batch's).

Example:
  tide workflows cancel fulfil-order-42`)

var cmdBatchesCancel = flowCancel("batches", "batch", "workflow", `
Cancel a batch: its tasks that wait are deleted and those running are asked
to stop (their handler's context is cancelled); its callback
(tide.OnBatchDone) does not run. The batch's state becomes cancelled;
cancelling it again does nothing. A batch that had already ended is left as
it is (exit 1).

Exits with 3 when there is no such batch (or the ID is a workflow's).

Example:
  tide batches cancel b01J0Q3ZP6W5X8K2N4M7R9T1V3`)

var cmdBatchesLs = &command{
	name: "batches ls", args: "[--offset N] [--limit N]", maxArgs: 0, redis: true,
	summary: "list batches, newest first, with their progress",
	flags:   flowListFlags("batches"),
	help: `
List batches (Client.EnqueueBatch), newest first: their state (running,
succeeded, failed or cancelled), their tasks (total, succeeded, failed,
pending: not finished yet), the share finished, the task ID of the
callback (tide.OnBatchDone), and when each was created and finished.
--json lists them without their failed task IDs.

` + flowKeptHelp + `

Examples:
  tide batches
  tide batches ls --offset 20 --limit 20
  tide batches --json | jq -r '.[] | select(.failed > 0) | .id'`,
	check: checkFlowList,
	run:   runBatchesLs,
}

func runBatchesLs(ctx context.Context, a *app, o *cmdOpts, _ []string) error {
	bs, total, err := a.in.Batches(ctx, o.offset, o.limit)
	if err != nil {
		return fmt.Errorf("tide: list batches: %w", err)
	}
	if a.globals.json {
		out := make([]batchJSON, len(bs))
		for i, b := range bs {
			out[i] = toBatchJSON(b, false)
		}
		return a.printJSON(out)
	}
	if len(bs) == 0 {
		noneListed(a, "batches", "batch", o.offset, total)
		return nil
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "STATE", "TOTAL", "SUCCEEDED", "FAILED", "PENDING", "PROGRESS", "CALLBACK", "CREATED", "FINISHED")
	for _, b := range bs {
		t.row(b.ID, b.State.String(), strconv.Itoa(b.Total), strconv.Itoa(b.Succeeded), strconv.Itoa(b.Failed),
			strconv.Itoa(batchPending(b)), strconv.Itoa(batchPercent(b))+"%", orDash(b.CallbackID), when(b.CreatedAt, now), when(b.FinishedAt, now))
	}
	t.flush()
	listHint(a, "batches", "batches ls", o.offset, len(bs), total, o.limit)
	return nil
}

var cmdBatchesShow = &command{
	name: "batches show", args: "<id>", minArgs: 1, maxArgs: 1, redis: true,
	summary: "show one batch: counts, progress, callback, failed tasks",
	help: `
Show a batch: its state, its tasks (total, succeeded, failed, pending: not
finished yet) and the share finished, the task ID of its callback
(tide.OnBatchDone; 'tide tasks show <queue> <callback ID>' shows it), when
it was created and finished, and the IDs of the tasks that failed (the
first ` + strconv.Itoa(failedIDsShown) + `; --json has them all). Cancelled tasks count as failed.

` + escapeHelp + `

Exits with 3 when there is no such batch (or the ID is a workflow's).
` + flowKeptHelp + `

Examples:
  tide batches show b01J0Q3ZP6W5X8K2N4M7R9T1V3
  tide batches show b01J0Q3ZP6W5X8K2N4M7R9T1V3 --json | jq -r '.failed_ids[]'`,
	check: func(_ *app, o *cmdOpts, args []string) error { return checkFlowID(o.cmd, "batch ID", args[0]) },
	run:   runBatchesShow,
}

func runBatchesShow(ctx context.Context, a *app, _ *cmdOpts, args []string) error {
	id := args[0]
	b, ok, err := a.isBatch(ctx, id)
	if err != nil {
		return flowErr(a, "show", "batch", id, err)
	}
	if !ok {
		if _, err := a.in.GetWorkflow(ctx, id); err == nil {
			return otherKind(id, "batch", "workflow", "workflows show")
		}
		return flowErr(a, "show", "batch", id, tide.ErrWorkflowNotFound)
	}
	if a.globals.json {
		return a.printJSON(toBatchJSON(b, true))
	}
	now := time.Now()
	t := newTable(a.stdout)
	kv := func(k, v string) { t.row(fmt.Sprintf("%-11s", k+":"), v) }
	kv("ID", b.ID)
	kv("State", b.State.String())
	kv("Progress", fmt.Sprintf("%d%% (%d of %s finished)", batchPercent(b), b.Succeeded+b.Failed, plural(b.Total, "task", "tasks")))
	kv("Total", strconv.Itoa(b.Total))
	kv("Succeeded", strconv.Itoa(b.Succeeded))
	kv("Failed", strconv.Itoa(b.Failed))
	kv("Pending", strconv.Itoa(batchPending(b)))
	kv("Callback", orDash(b.CallbackID))
	kv("Created", stamp(b.CreatedAt, now))
	kv("Finished", stamp(b.FinishedAt, now))
	if len(b.FailedIDs) == 0 {
		kv("Failed IDs", "-")
	}
	for i, fid := range b.FailedIDs[:min(len(b.FailedIDs), failedIDsShown)] {
		label := ""
		if i == 0 {
			label = fmt.Sprintf("%-11s", "Failed IDs:")
		}
		t.row(label, fid)
	}
	if n := len(b.FailedIDs) - failedIDsShown; n > 0 {
		t.row("", fmt.Sprintf("and %d more (--json lists them all)", n))
	}
	t.flush()
	return nil
}
