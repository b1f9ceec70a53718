package tide

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tidequeue/tide/broker"
)

// NotifyType is the type of the task that carries a NotifyURL notification;
// servers run it themselves, whatever their handler.
const NotifyType = "tide:notify"

// notifyHeader is the task header NotifyURL sets.
const notifyHeader = "tide-notify-url"

// Bounds of NotifyURL.
const (
	// MaxNotifyURL is the longest URL NotifyURL accepts, in bytes.
	MaxNotifyURL = 2048
	// NotifyMaxRetry is how often a notification that failed is retried.
	NotifyMaxRetry = 10
)

// NotifyURL makes the server POST the task's outcome to u when the task
// finishes: completed, or archived after failing. The notification is a
// task of its own (type NotifyType, in the task's queue) stored in the same
// atomic step as the outcome, so it is neither lost when a server dies nor
// sent for an outcome that did not stand; it is retried NotifyMaxRetry
// times with back-off until u answers 2xx (a 4xx other than 408 and 429
// ends it). The body is JSON: {"task_id", "queue", "type", "state"
// ("completed" or "archived"), "error", "finished_at", "retried"}. With
// Config.NotifySecret set, each POST carries Tide-Timestamp and
// Tide-Signature: "sha256=" and the hex HMAC-SHA256 of "<timestamp>.<body>"
// under the secret, for the receiver to check. u must be an absolute http or
// https URL of at most MaxNotifyURL bytes. Delivery is at least once:
// receivers dedupe on task_id.
func NotifyURL(u string) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if err := checkNotifyURL(u); err != nil {
			return err
		}
		o.notify = u
		return nil
	})
}

func checkNotifyURL(u string) error {
	if len(u) > MaxNotifyURL {
		return fmt.Errorf("NotifyURL: %d bytes, over the %d limit", len(u), MaxNotifyURL)
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("NotifyURL(%q): want an absolute http or https URL", u)
	}
	return nil
}

// notification is the body of a notification POST.
type notification struct {
	URL        string    `json:"-"`
	TaskID     string    `json:"task_id"`
	Queue      string    `json:"queue"`
	Type       string    `json:"type"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
	Retried    int       `json:"retried"`
}

// notifyPayload is what a notification task carries.
type notifyPayload struct {
	URL  string       `json:"url"`
	Body notification `json:"body"`
}

// followup returns the task to store with m's settlement set
// (broker.Settlement.Then): a workflow step's FlowType task (which also
// carries its notification), else the notification, or nil.
func followup(m *TaskInfo, set broker.Settlement) *TaskInfo {
	if m.Headers[flowHeader] != "" && m.Type != FlowType && m.Type != NotifyType {
		return flowFollowup(m, set)
	}
	n := notificationOf(m, set)
	if n == nil {
		return nil
	}
	payload, err := json.Marshal(n)
	if err != nil {
		return nil // cannot happen: plain strings and a time
	}
	return &TaskInfo{
		Type: NotifyType, Payload: payload, Queue: m.Queue, MaxRetry: NotifyMaxRetry,
		EnqueuedAt: set.At, NextProcessAt: set.At, State: StatePending,
	}
}

// notificationOf returns the notification of m's settlement set, or nil
// when m asked for none or the settlement is not final.
func notificationOf(m *TaskInfo, set broker.Settlement) *notifyPayload {
	u := m.Headers[notifyHeader]
	if u == "" || m.Type == NotifyType || (set.Kind != broker.SettleDone && set.Kind != broker.SettleArchive) {
		return nil
	}
	n := notification{TaskID: m.ID, Queue: m.Queue, Type: m.Type, State: StateCompleted.String(), FinishedAt: set.At.UTC(), Retried: m.Retried}
	if set.Kind == broker.SettleArchive {
		n.State, n.Error = StateArchived.String(), set.Err
	}
	return &notifyPayload{URL: u, Body: n}
}

// notifyClient sends notifications; each POST is bounded by its own timeout.
var notifyClient = &http.Client{Timeout: 10 * time.Second}

// deliverNotification runs a NotifyType task: one POST.
func (s *Server) deliverNotification(ctx context.Context, t *Task) error {
	var p notifyPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("tide: notification payload is not one tide wrote: %w", SkipRetry)
	}
	return s.post(ctx, p)
}

// post sends one notification.
func (s *Server) post(ctx context.Context, p notifyPayload) error {
	if checkNotifyURL(p.URL) != nil {
		return fmt.Errorf("tide: notification payload is not one tide wrote: %w", SkipRetry)
	}
	body, err := json.Marshal(p.Body)
	if err != nil {
		return fmt.Errorf("tide: notification: %v: %w", err, SkipRetry)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("tide: notification: %v: %w", err, SkipRetry)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tide-notify")
	req.Header.Set("Tide-Task-ID", p.Body.TaskID)
	if s.cfg.NotifySecret != "" {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(s.cfg.NotifySecret))
		mac.Write([]byte(ts + "."))
		mac.Write(body)
		req.Header.Set("Tide-Timestamp", ts)
		req.Header.Set("Tide-Signature", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	}
	resp, err := notifyClient.Do(req)
	if err != nil {
		return fmt.Errorf("tide: notification to %s: %w", req.URL.Redacted(), err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooManyRequests:
		return fmt.Errorf("tide: notification to %s refused with %s: %w", req.URL.Redacted(), resp.Status, SkipRetry)
	}
	return errors.New("tide: notification to " + req.URL.Redacted() + " answered " + resp.Status)
}
