package tide

import (
	"encoding/json"
	"fmt"
	"net/url"
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
// ("completed" or "archived"), "error", "finished_at", "retried"}; the
// Tide-Task-ID header repeats task_id. u must be an absolute http or https
// URL of at most MaxNotifyURL bytes. Delivery is at least once: receivers
// dedupe on task_id.
//
// With Config.NotifySecret set, each POST carries the header
// "Tide-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">"
// under the secret, the format of webhook tasks: receivers check it with
// webhook.Verify.
//
// The server sends notifications as guardedly as webhook tasks, since u
// comes from whoever enqueued the task (through the gateway, another
// system): it never connects to a loopback, private, link-local or other
// non-public address, checked on the address dialled after DNS resolution,
// unless Config.NotifyAllowPrivate is set; with Config.NotifyAllowedHosts
// it calls only those hosts; it uses no proxy from the environment; it
// follows only 307 and 308 redirects (at most 5, to allowed hosts, each
// signed again), never 301, 302 or 303, and a redirect that is not
// followed is a failure, retried, never a delivery. A refused address or
// host archives the notification at once, with the reason in its error.
// Errors never hold u's query or credentials.
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
