package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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
	// WaitingFor and Steps: a durable handler's park and records.
	WaitingFor string        `json:"waiting_for,omitempty"`
	Steps      []durStepJSON `json:"steps,omitempty"`
	// History is the recorded history (--history-dsn), absent without
	// one; HistoryError says why it could not be read.
	History      *[]attemptJSON `json:"history,omitempty"`
	HistoryError string         `json:"history_error,omitempty"`
}

// durStepJSON is one record of a durable handler (tide.Step, Sleep,
// WaitSignal, a signal received).
type durStepJSON struct {
	Name       string     `json:"name"`
	State      string     `json:"state"`
	Size       int        `json:"size"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Error      string     `json:"error,omitempty"`
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
	t.WaitingFor = ti.WaitingFor
	for _, s := range ti.Steps {
		t.Steps = append(t.Steps, durStepJSON{s.Name, s.State.String(), s.ResultSize, utcPtr(s.StartedAt), utcPtr(s.FinishedAt), s.Err})
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
	if ti.Group != "" {
		kv("Group", ti.Group)
	}
	if p := ti.Progress; !p.At.IsZero() {
		kv("Progress", strings.TrimSpace(fmt.Sprintf("%d%%  %s", p.Percent, p.Note))+"  (reported "+stamp(p.At, now)+")")
	}
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
	if ti.WaitingFor != "" {
		kv("Waiting for", escape(ti.WaitingFor)+" (a durable handler, parked until then or its signal)")
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
	printSteps(a, ti.Steps, now)
	if a.hist != nil {
		printHistory(a, hist, histErr, now)
	}
	return historyFailed(histErr)
}

// printSteps lists a durable handler's records (none: nothing printed).
func printSteps(a *app, steps []tide.StepInfo, now time.Time) {
	if len(steps) == 0 {
		return
	}
	fmt.Fprintln(a.stdout, "Durable steps:")
	t := newTable(a.stdout)
	for _, s := range steps {
		t.row("  "+escape(s.Name), s.State.String(), fmt.Sprintf("%d B", s.ResultSize), stamp(s.FinishedAt, now), orDash(escape(s.Err)))
	}
	t.flush()
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
