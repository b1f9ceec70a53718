package broker

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A task that someone follows carries headers that name who: its workflow
// or batch (FlowHeader and StepHeader) and the URL to notify of its outcome
// (NotifyHeader). However the task ends (a worker's settlement, lease
// recovery with no retries left, an operator's archive or delete, single or
// bulk, a cancellation), the broker records the end in the same atomic step
// by storing a follow-up: an internal task (Delivery.Internal) of type
// FlowType or NotifyType, pending at once in the task's partition, whose
// payload is the Ending. A server runs it: the flow records the step's end
// and releases what became ready, and the notification is posted. A task
// ends once per life: retries, requeues and deferrals are not ends, and a
// task that is already finished (archived, completed) ends no more when it
// is deleted or trimmed.
//
// A workflow step or batch task that has not finished is never deleted:
// Delete and an operator's bulk delete archive it ("deleted by an
// operator"), which is its end (failed). An archived one is not run again
// (Admin.RunTask gives ErrFlowStep): its end is recorded. A workflow
// follow-up itself cannot be deleted, cancelled or archived
// (ErrInternalTask).

// Headers that make a task followed. Callers cannot set them: the tide
// client refuses them (they are set by EnqueueWorkflow, EnqueueBatch and
// NotifyURL).
const (
	// FlowHeader names the flow a task is a step of: "w:<workflow ID>" or
	// "b:<batch ID>".
	FlowHeader = "tide-flow"
	// StepHeader names the step within the flow.
	StepHeader = "tide-step"
	// NotifyHeader is the URL to notify of the task's outcome.
	NotifyHeader = "tide-notify-url"
)

// Internal task types: follow-ups (see the comment at the top of this
// file). No enqueue of the tide client stores them.
const (
	// FlowType is the type of a follow-up of a workflow step or batch task
	// (which also carries its notification, if any).
	FlowType = "tide:flow"
	// NotifyType is the type of a follow-up that only notifies.
	NotifyType = "tide:notify"
)

// Retries of follow-ups: a flow follow-up retries while the store cannot
// be reached; a notification while its receiver does not answer 2xx.
const (
	FlowMaxRetry   = 50
	NotifyMaxRetry = 10
)

// ErrFlowStep is returned by Admin.RunTask (and counted as a failure by
// RunTasks) for an archived workflow step or batch task: its end is
// recorded with its flow, so running it again would reach nothing.
var ErrFlowStep = errors.New("tide: the task is a workflow step or batch task whose end its workflow has recorded; it cannot run again")

// ErrInternalTask is returned by Delete, Cancel and Admin.ArchiveTask for a
// workflow follow-up (FlowType): it is tide's own bookkeeping of a step's
// end, and it finishes by itself (an operator's bulk delete and archive
// pass over such tasks). A NotifyType follow-up may be deleted: that stops
// the notification.
var ErrInternalTask = errors.New("tide: the task is a workflow follow-up, tide's own bookkeeping of a step's end; it cannot be deleted, cancelled or archived (it finishes by itself)")

// Followed reports whether headers make a task followed: a step of a flow,
// or a task with a NotifyURL.
func Followed(headers map[string]string) bool {
	return headers[FlowHeader] != "" || headers[NotifyHeader] != ""
}

// Outcome is how a followed task ended.
type Outcome byte

// Outcomes of an Ending.
const (
	// OutcomeCompleted: the handler succeeded.
	OutcomeCompleted Outcome = 'c'
	// OutcomeArchived: the task failed for good (retries used up,
	// SkipRetry, cancelled, archived or deleted by an operator, lease
	// expired with no retries left).
	OutcomeArchived Outcome = 'a'
)

// Ending is the payload of a follow-up: how one followed task ended. Its
// encoding (Encode) is written by the brokers' scripts too, so it is plain
// text: "f1", then Flow, Step, Notify, TaskID, Type, the outcome letter, At
// in Unix ms and Retried, each on a line of its own, then Err (which may
// hold newlines) to the end. No other field may hold a newline: task IDs
// and types hold no control characters, nor do flow IDs, step names and
// URLs. The queue is not encoded: the follow-up is in the task's queue.
type Ending struct {
	Flow    string // FlowHeader's value, "" for a notification only
	Step    string // StepHeader's value
	Notify  string // NotifyHeader's value, "" for none
	Queue   string // the follow-up's queue (not encoded)
	TaskID  string
	Type    string // the ended task's type
	Outcome Outcome
	At      time.Time // when it ended
	Retried int
	Err     string // why it failed, for OutcomeArchived
}

// endingVersion starts every encoded Ending.
const endingVersion = "f1"

// Encode returns e as a follow-up's payload.
func (e Ending) Encode() []byte {
	var b strings.Builder
	for _, f := range []string{endingVersion, e.Flow, e.Step, e.Notify, e.TaskID, e.Type, string(e.Outcome),
		strconv.FormatInt(e.At.UnixMilli(), 10), strconv.Itoa(e.Retried)} {
		b.WriteString(f)
		b.WriteByte('\n')
	}
	b.WriteString(e.Err)
	return []byte(b.String())
}

// ParseEnding reads the payload of a follow-up in queue. Its error names
// what is wrong.
func ParseEnding(queue string, p []byte) (Ending, error) {
	parts := strings.SplitN(string(p), "\n", 10)
	if len(parts) != 10 || parts[0] != endingVersion {
		return Ending{}, fmt.Errorf("tide: follow-up payload: not a version %s ending (%d fields)", endingVersion, len(parts))
	}
	e := Ending{Flow: parts[1], Step: parts[2], Notify: parts[3], Queue: queue, TaskID: parts[4], Type: parts[5], Err: parts[9]}
	switch o := parts[6]; o {
	case string(OutcomeCompleted), string(OutcomeArchived):
		e.Outcome = Outcome(o[0])
	default:
		return Ending{}, fmt.Errorf("tide: follow-up payload: unknown outcome %q", o)
	}
	ms, err := strconv.ParseInt(parts[7], 10, 64)
	if err != nil || ms < 0 {
		return Ending{}, fmt.Errorf("tide: follow-up payload: bad end time %q", parts[7])
	}
	e.At = time.UnixMilli(ms)
	if e.Retried, err = strconv.Atoi(parts[8]); err != nil || e.Retried < 0 {
		return Ending{}, fmt.Errorf("tide: follow-up payload: bad retry count %q", parts[8])
	}
	if e.TaskID == "" || (e.Flow == "" && e.Notify == "") {
		return Ending{}, fmt.Errorf("tide: follow-up payload: no task, or neither a flow nor a URL")
	}
	return e, nil
}

// FollowupType is the type of the follow-up of a task with headers: FlowType
// for a step of a flow, NotifyType for a task that only notifies, "" for a
// task nobody follows; and its MaxRetry.
func FollowupType(headers map[string]string) (string, int) {
	switch {
	case headers[FlowHeader] != "":
		return FlowType, FlowMaxRetry
	case headers[NotifyHeader] != "":
		return NotifyType, NotifyMaxRetry
	}
	return "", 0
}
