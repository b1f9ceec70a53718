package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetest"
)

func TestDemoInMemory(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"-cancel-after", "300ms"}, func(string) string { return "" }, &out, &errs); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, want := range []string{"order 1: cancelled", "order 2: paid", "order 3: cancelled", "done",
		"durable order 1: cancelled", "durable order 2: paid", "durable order 3: cancelled", "durable done"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDemoOnRedis(t *testing.T) {
	addr := redistest.Start(t).Addr
	var out, errs bytes.Buffer
	env := func(k string) string {
		if k == "TIDE_REDIS_ADDR" {
			return addr
		}
		return ""
	}
	if code := run(context.Background(), []string{"-cancel-after", "300ms"}, env, &out, &errs); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "Redis at "+addr) || !strings.Contains(out.String(), "done") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestBadFlagsAndUnreachableRedis(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"-cancel-after", "-1s"}, func(string) string { return "" }, &out, &errs); code != 2 {
		t.Fatalf("negative -cancel-after: exit %d", code)
	}
	env := func(string) string { return "127.0.0.1:1" }
	errs.Reset()
	if code := run(context.Background(), nil, env, &out, &errs); code != 1 || !strings.Contains(errs.String(), "cannot reach Redis") {
		t.Fatalf("unreachable Redis: exit %d, %s", code, errs.String())
	}
}

// TestCancelAfterFifteenMinutes runs the shop's handler on a fake clock:
// no waiting, and the paid order is left alone.
func TestCancelAfterFifteenMinutes(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var shop *Shop
	mux := tide.NewServeMux()
	tide.HandleArgs(mux, func(ctx context.Context, a CancelOrder) error { return shop.HandleCancel(ctx, a) })
	h := tidetest.New(t, mux)
	shop = NewShop(h.Client, 15*time.Minute, map[string]int{"widget": 5}, log)
	ctx := context.Background()
	unpaid, err := shop.Create(ctx, "widget", 2)
	if err != nil {
		t.Fatal(err)
	}
	paid, err := shop.Create(ctx, "widget", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shop.Pay(ctx, paid.ID); err != nil {
		t.Fatal(err)
	}
	tidetest.AssertEnqueued(t, h, CancelOrder{OrderID: unpaid.ID})
	h.Advance(14 * time.Minute)
	if o, _ := shop.Get(unpaid.ID); o.Status != StatusAwaitingPayment {
		t.Fatalf("cancelled early: %s", o.Status)
	}
	h.Advance(time.Minute)
	if o, _ := shop.Get(unpaid.ID); o.Status != StatusCancelled {
		t.Fatalf("after 15 minutes: %s", o.Status)
	}
	if o, _ := shop.Get(paid.ID); o.Status != StatusPaid {
		t.Fatalf("paid order: %s", o.Status)
	}
	if s := shop.Stock()["widget"]; s != 2 {
		t.Fatalf("stock = %d, want 2 (the paid order's 3 gone)", s)
	}
	// Paying a cancelled order is refused; the handler is idempotent.
	if _, err := shop.Pay(ctx, unpaid.ID); err == nil {
		t.Fatal("paid a cancelled order")
	}
	if err := shop.HandleCancel(ctx, CancelOrder{OrderID: unpaid.ID}); err != nil || shop.Stock()["widget"] != 2 {
		t.Fatalf("second cancel: %v, stock %d", err, shop.Stock()["widget"])
	}
}

func TestHTTPBadInput(t *testing.T) {
	h := tidetest.New(t, tide.HandlerFunc(func(context.Context, *tide.Task) error { return nil }))
	shop := NewShop(h.Client, time.Minute, map[string]int{"widget": 1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(shop.Routes())
	defer srv.Close()
	for _, tc := range []struct {
		method, path, body string
		code               int
	}{
		{"POST", "/orders", `{"item":"widget","qty":0}`, 400},
		{"POST", "/orders", `{"item":"widget","qty":1,"extra":1}`, 400},
		{"POST", "/orders", `not json`, 400},
		{"POST", "/orders", `{"item":"widget","qty":2}`, 409},
		{"POST", "/orders/abc/pay", ``, 400},
		{"POST", "/orders/99/pay", ``, 404},
		{"GET", "/orders/99", ``, 404},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s %s: %d, want %d", tc.method, tc.path, tc.body, resp.StatusCode, tc.code)
		}
	}
}
