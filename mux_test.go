package tide_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tidequeue/tide"
)

func TestServeMuxRouting(t *testing.T) {
	t.Parallel()
	mux := tide.NewServeMux()
	var got string
	h := func(name string) tide.HandlerFunc {
		return func(context.Context, *tide.Task) error { got = name; return nil }
	}
	mux.Handle("order:cancel", h("exact"))
	mux.Handle("order:", h("order prefix"))
	mux.Handle("order:refund:", h("refund prefix"))
	mux.HandleFunc("email", h("email"))
	for typ, want := range map[string]string{
		"order:cancel":         "exact",
		"order:ship":           "order prefix",
		"order:refund:partial": "refund prefix",
		"email":                "email",
	} {
		got = ""
		if err := mux.ProcessTask(context.Background(), tide.NewTask(typ, nil)); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if got != want {
			t.Errorf("%s routed to %q, want %q", typ, got, want)
		}
	}
	if _, pat := mux.Handler(tide.NewTask("order:refund:x", nil)); pat != "order:refund:" {
		t.Errorf("pattern = %q", pat)
	}
	err := mux.ProcessTask(context.Background(), tide.NewTask("emailx", nil))
	if !errors.Is(err, tide.ErrHandlerNotFound) || !strings.Contains(err.Error(), "emailx") {
		t.Errorf("unknown type: %v", err)
	}
}

func TestServeMuxPanics(t *testing.T) {
	t.Parallel()
	ok := tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil })
	for name, f := range map[string]func(m *tide.ServeMux){
		"empty pattern":   func(m *tide.ServeMux) { m.Handle("", ok) },
		"nil handler":     func(m *tide.ServeMux) { m.Handle("a", nil) },
		"nil func":        func(m *tide.ServeMux) { m.HandleFunc("a", nil) },
		"nil HandlerFunc": func(m *tide.ServeMux) { m.Handle("a", tide.HandlerFunc(nil)) },
		"duplicate":       func(m *tide.ServeMux) { m.Handle("a", ok); m.Handle("a", ok) },
		"nil middleware":  func(m *tide.ServeMux) { m.Use(nil) },
		"handle after serving": func(m *tide.ServeMux) {
			m.Handle("a", ok)
			_ = m.ProcessTask(context.Background(), tide.NewTask("a", nil))
			m.Handle("b", ok)
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("did not panic")
				}
			}()
			f(tide.NewServeMux())
		})
	}
}

func TestMiddlewareOrderAndBuiltOnce(t *testing.T) {
	t.Parallel()
	mux := tide.NewServeMux()
	var trail []string
	built := 0
	mw := func(name string) tide.MiddlewareFunc {
		return func(next tide.Handler) tide.Handler {
			built++
			return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
				trail = append(trail, name)
				return next.ProcessTask(ctx, t)
			})
		}
	}
	mux.Use(mw("outer"), mw("inner"))
	mux.HandleFunc("t", func(context.Context, *tide.Task) error { trail = append(trail, "handler"); return nil })
	for range 3 {
		if err := mux.ProcessTask(context.Background(), tide.NewTask("t", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if built != 2 {
		t.Fatalf("middleware constructed %d times, want 2 (once each)", built)
	}
	if got := strings.Join(trail[:3], ","); got != "outer,inner,handler" {
		t.Fatalf("order = %s", got)
	}
}

type cancelArgs struct {
	OrderID int    `json:"order_id"`
	Reason  string `json:"reason"`
}

func (cancelArgs) TaskType() string { return "order:cancel" }

func TestHandleArgs(t *testing.T) {
	t.Parallel()
	mux := tide.NewServeMux()
	var got cancelArgs
	tide.HandleArgs(mux, func(_ context.Context, a cancelArgs) error { got = a; return nil })
	task, err := tide.NewTaskFrom(cancelArgs{OrderID: 42, Reason: "unpaid"})
	if err != nil {
		t.Fatal(err)
	}
	if task.Type() != "order:cancel" {
		t.Fatalf("type = %q", task.Type())
	}
	if err := mux.ProcessTask(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	if got != (cancelArgs{42, "unpaid"}) {
		t.Fatalf("args = %+v", got)
	}
	err = mux.ProcessTask(context.Background(), tide.NewTask("order:cancel", []byte(`{"order_id":"forty-two"}`)))
	if !errors.Is(err, tide.SkipRetry) || !strings.Contains(err.Error(), "order_id") || !strings.Contains(err.Error(), "order:cancel") {
		t.Fatalf("bad payload error = %v, want SkipRetry naming the type and field", err)
	}
	err = mux.ProcessTask(context.Background(), tide.NewTask("order:cancel", []byte(`{not json`)))
	if !errors.Is(err, tide.SkipRetry) {
		t.Fatalf("syntax error = %v", err)
	}
}

func TestRetryDelays(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 30; n++ {
		d := tide.DefaultRetryDelay(n, nil, nil)
		if d <= 0 || d > 12*60*60*1e9 {
			t.Fatalf("DefaultRetryDelay(%d) = %v", n, d)
		}
	}
	want := []string{"15s", "3m0s", "10m0s", "30m0s", "1h0m0s", "2h0m0s", "6h0m0s", "15h0m0s", "15h0m0s"}
	for i, w := range want {
		if got := tide.NotificationRetryDelay(i+1, nil, nil).String(); got != w {
			t.Errorf("NotificationRetryDelay(%d) = %s, want %s", i+1, got, w)
		}
	}
}
