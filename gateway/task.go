package gateway

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"time"

	"github.com/tidequeue/tide"
)

// Task is the JSON form of a task that the gateway returns (and that the
// tide CLI prints with --json). Times are RFC 3339 in UTC and left out when
// unset; durations are Go duration strings ("30s").
type Task struct {
	ID    string `json:"id"`
	Queue string `json:"queue"`
	Type  string `json:"type"`
	// State is pending, active, scheduled, retry, archived or completed.
	State string `json:"state"`
	// Payload is the payload when it is valid JSON; PayloadBase64 is always
	// the payload's bytes in standard base64 (empty for an empty payload).
	// Both are left out of the response to an enqueue.
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	MaxRetry      int               `json:"max_retry"`
	Retried       int               `json:"retried"`
	LastError     string            `json:"last_error,omitempty"`
	// NextProcessAt is when a scheduled or retry task is due, or when a
	// pending task became ready.
	NextProcessAt *time.Time `json:"next_process_at,omitempty"`
	LastFailedAt  *time.Time `json:"last_failed_at,omitempty"`
	CompletedAt   *time.Time `json:"completed_at,omitempty"`
	Timeout       string     `json:"timeout,omitempty"`
	Deadline      *time.Time `json:"deadline,omitempty"`
	Retention     string     `json:"retention,omitempty"`
	// Result is what the handler wrote with tide.WriteResult when it is
	// valid JSON; ResultBase64 is always its bytes, when there is a result.
	Result       json.RawMessage `json:"result,omitempty"`
	ResultBase64 string          `json:"result_base64,omitempty"`
	// Progress is what the running task last reported
	// (tide.ReportProgress), when it reported anything.
	Progress *Progress `json:"progress,omitempty"`
	// Group is the task's group (tide.Group), when it has one.
	Group string `json:"group,omitempty"`
}

// Progress is the JSON form of a task's progress.
type Progress struct {
	Percent int       `json:"percent"`
	Note    string    `json:"note,omitempty"`
	At      time.Time `json:"at"`
}

// TaskFromInfo returns the JSON form of ti, payload and result included.
func TaskFromInfo(ti *tide.TaskInfo) *Task {
	t := &Task{
		ID: ti.ID, Queue: ti.Queue, Type: ti.Type, State: ti.State.String(),
		Headers: maps.Clone(ti.Headers), MaxRetry: ti.MaxRetry, Retried: ti.Retried, LastError: ti.LastErr,
		NextProcessAt: timePtr(ti.NextProcessAt), LastFailedAt: timePtr(ti.LastFailedAt),
		CompletedAt: timePtr(ti.CompletedAt), Deadline: timePtr(ti.Deadline), Group: ti.Group,
	}
	if !ti.Progress.At.IsZero() {
		t.Progress = &Progress{Percent: ti.Progress.Percent, Note: ti.Progress.Note, At: ti.Progress.At.UTC()}
	}
	if ti.Timeout > 0 {
		t.Timeout = ti.Timeout.String()
	}
	if ti.Retention > 0 {
		t.Retention = ti.Retention.String()
	}
	b64 := base64.StdEncoding.EncodeToString(ti.Payload)
	t.PayloadBase64 = &b64
	if len(ti.Payload) > 0 && json.Valid(ti.Payload) {
		t.Payload = json.RawMessage(ti.Payload)
	}
	if len(ti.Result) > 0 {
		t.ResultBase64 = base64.StdEncoding.EncodeToString(ti.Result)
		if json.Valid(ti.Result) {
			t.Result = json.RawMessage(ti.Result)
		}
	}
	return t
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
