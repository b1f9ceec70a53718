package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tidequeue/tide/gateway"
)

// A client limited to one queue cannot store tide's own tasks through the
// gateway, in any queue: no workflow follow-up, no notification, no step
// headers, no NotifyURL header set by hand, no reserved task ID.
func TestReservedRefused(t *testing.T) {
	e := setup(t, gateway.Config{AllowedQueues: []string{"public", "webhooks"}})
	for name, body := range map[string]string{
		"flow type":     `{"type":"tide:flow","queue":"public","payload":{"flow":"w:order-42","step":"charge","outcome":"completed"}}`,
		"notify type":   `{"type":"tide:notify","queue":"webhooks","payload":{"url":"http://127.0.0.1:6379/"}}`,
		"flow header":   `{"type":"t","queue":"public","headers":{"tide-flow":"w:order-42","tide-step":"charge"}}`,
		"notify header": `{"type":"tide:webhook","queue":"webhooks","payload":{"url":"https://hooks.example.com/"},"headers":{"Tide-Notify-Url":"http://127.0.0.1:6379/"}}`,
		"reserved ID":   `{"type":"t","queue":"public","task_id":"tide:n1{order-42/charge}"}`,
		"sealed mark":   `{"type":"t","queue":"public","headers":{"tide-sealed":"1"}}`,
	} {
		r := e.do("POST", "/v1/tasks", body)
		code, _, msg := r.errorBody(t)
		if r.status != http.StatusBadRequest || !strings.Contains(msg, "tide's own") {
			t.Errorf("%s: %d %s %s, want 400 naming tide's own", name, r.status, code, msg)
		}
	}
	for _, q := range []string{"public", "webhooks"} {
		if qi, err := e.in.QueueInfo(context.Background(), q); err != nil || qi.Size != 0 {
			t.Errorf("queue %s: %+v %v, want empty", q, qi, err)
		}
	}
}
