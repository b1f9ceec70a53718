package tide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/internal/outbound"
)

// notifyTimeout bounds each notification POST, its redirects and reading
// the response included.
const notifyTimeout = 10 * time.Second

// notifySender returns the guarded sender of c's notifications (see
// NotifyURL), or an error wrapping ErrInvalidConfig for an invalid
// NotifyAllowedHosts entry.
func (c Config) notifySender() (*outbound.Sender, error) {
	hosts, err := outbound.ParseHosts("NotifyAllowedHosts", c.NotifyAllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	out, err := outbound.New(outbound.Config{
		Secret: []byte(c.NotifySecret), Hosts: hosts, AllowPrivate: c.NotifyAllowPrivate, Timeout: notifyTimeout,
		Settings: outbound.Settings{Hosts: "Config.NotifyAllowedHosts", Private: "Config.NotifyAllowPrivate"},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return out, nil
}

// deliverNotification runs a NotifyType task of queue: one POST.
func (s *Server) deliverNotification(ctx context.Context, queue string, t *Task) error {
	e, err := broker.ParseEnding(queue, t.Payload())
	if err != nil || e.Notify == "" {
		return fmt.Errorf("tide: notification payload is not one tide wrote (%v): %w", err, SkipRetry)
	}
	return s.post(ctx, e)
}

// post sends one notification through the server's guarded sender. A 2xx
// answer delivers it; a refused request (address, host, or a redirect's
// target) and a 4xx other than 408 and 429 archive it (SkipRetry); anything
// else, a 3xx that was not followed included, is retried.
func (s *Server) post(ctx context.Context, e broker.Ending) error {
	if checkNotifyURL(e.Notify) != nil {
		return fmt.Errorf("tide: notification payload is not one tide wrote: %w", SkipRetry)
	}
	u, _ := url.Parse(e.Notify) // checked
	where := "tide: notification to " + outbound.Redact(u)
	body, err := json.Marshal(notificationOf(e))
	if err != nil {
		return fmt.Errorf("%s: %v: %w", where, err, SkipRetry)
	}
	h := make(http.Header, 3)
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "tide-notify")
	h.Set("Tide-Task-ID", e.TaskID)
	resp, err := s.notify.Send(ctx, outbound.Request{Method: http.MethodPost, URL: u, Header: h, Body: body})
	if err != nil {
		var oe *outbound.Error
		if !errors.As(err, &oe) {
			return fmt.Errorf("%s: %w", where, err) // not reached: Send returns an *outbound.Error
		}
		if oe.Permanent {
			return fmt.Errorf("%s%s: %s: %w", where, oe.After(), oe.Msg, SkipRetry)
		}
		return fmt.Errorf("%s%s: %w", where, oe.After(), oe)
	}
	c := resp.StatusCode
	if c >= 200 && c < 300 {
		return nil
	}
	msg := fmt.Sprintf("%s: status %d %s", where, c, http.StatusText(c))
	if resp.Redirects > 0 {
		msg += " after " + outbound.Plural(resp.Redirects, "redirect")
	}
	permanent := false
	switch {
	case c >= 300 && c < 400:
		if resp.Location == "" {
			msg += " without a Location header"
		} else {
			msg += fmt.Sprintf(" to %q", resp.Location)
		}
		if resp.NotFollowed != "" {
			msg += ", not followed: " + resp.NotFollowed
		}
		permanent = resp.Refused
	case c >= 400 && c < 500 && c != http.StatusRequestTimeout && c != http.StatusTooManyRequests:
		permanent = true
	}
	if sn := outbound.Snippet(resp.Body); sn != "" {
		msg += fmt.Sprintf(": %q", sn)
	}
	if permanent {
		return fmt.Errorf("%s (not retried): %w", msg, SkipRetry)
	}
	return errors.New(msg)
}
