package tide

import (
	"fmt"
	"net/url"
	"time"

	"github.com/tidequeue/tide/broker"
)

// NotifyType is the type of the task that carries a NotifyURL notification:
// the broker stores it when the task ends, and servers run it themselves,
// whatever their handler. No enqueue accepts it.
const NotifyType = broker.NotifyType

// notifyHeader is the task header NotifyURL sets.
const notifyHeader = broker.NotifyHeader

// Bounds of NotifyURL.
const (
	// MaxNotifyURL is the longest URL NotifyURL accepts, in bytes.
	MaxNotifyURL = 2048
	// NotifyMaxRetry is how often a notification that failed is retried.
	NotifyMaxRetry = broker.NotifyMaxRetry
)

// NotifyURL makes the server POST the task's outcome to u when the task
// finishes: completed, or archived (after failing, by a worker whose lease
// ran out with no retries left, or by an operator; a task deleted before it
// ran notifies nobody). The notification is a task of its own (type
// NotifyType, in the task's queue) that the broker stores in the same
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
	TaskID     string    `json:"task_id"`
	Queue      string    `json:"queue"`
	Type       string    `json:"type"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
	Retried    int       `json:"retried"`
}

// notificationOf is the body of the notification of ending e.
func notificationOf(e broker.Ending) notification {
	n := notification{TaskID: e.TaskID, Queue: e.Queue, Type: e.Type, State: StateCompleted.String(), FinishedAt: e.At.UTC(), Retried: e.Retried}
	if e.Outcome == broker.OutcomeArchived {
		n.State, n.Error = StateArchived.String(), e.Err
	}
	return n
}
