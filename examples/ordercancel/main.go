// Command ordercancel is the everyday use of tide: an order that is not paid
// within a time limit is cancelled and its stock released.
//
// With no arguments it runs a scripted demo in process (no Redis needed):
// three orders are created, one is paid, and once the time limit has passed
// the other two are cancelled and the stock is back; then the same again
// with the durable version (durable.go): one handler per order that
// reserves the stock, waits for the "paid" signal and cancels otherwise.
// With -serve it runs the
// HTTP service until interrupted. With TIDE_REDIS_ADDR set it keeps its
// tasks in that Redis instead of in memory.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ordercancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serve := fs.Bool("serve", false, "run the HTTP service until interrupted instead of the scripted demo")
	addr := fs.String("addr", "127.0.0.1:8080", "listen address with -serve")
	cancelAfter := fs.Duration("cancel-after", 0, "how long an order may stay unpaid (default 15m with -serve, 2s for the demo)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ordercancel [-serve] [-addr host:port] [-cancel-after 15m]")
		fmt.Fprintln(stderr, "With no flags: a scripted demo that exits when done. TIDE_REDIS_ADDR=host:port uses Redis.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cancelAfter < 0 {
		fmt.Fprintln(stderr, "ordercancel: -cancel-after must not be negative")
		return 2
	}
	if *cancelAfter == 0 {
		*cancelAfter = 2 * time.Second
		if *serve {
			*cancelAfter = 15 * time.Minute
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	b, where, closeBroker, err := openBroker(getenv("TIDE_REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	defer closeBroker()

	shop := NewShop(tide.NewClient(b), *cancelAfter, map[string]int{"widget": 10, "gadget": 5}, log)
	dshop := NewDurableShop(tide.NewClient(b), *cancelAfter, map[string]int{"widget": 10, "gadget": 5})
	mux := tide.NewServeMux()
	tide.HandleArgs(mux, shop.HandleCancel)
	tide.HandleArgs(mux, dshop.HandleOrder)
	srv := tide.NewServer(b, tide.Config{Logger: log})
	if err := srv.Start(mux); err != nil {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	defer srv.Shutdown()

	if *serve {
		return serveHTTP(ctx, shop, *addr, where, *cancelAfter, stdout, stderr)
	}
	if code := demo(ctx, shop, where, *cancelAfter, stdout, stderr); code != 0 {
		return code
	}
	if err := durableDemo(ctx, dshop, stdout); err != nil {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	fmt.Fprintln(stdout, "durable done")
	return 0
}

// openBroker returns a Redis broker when addr is set, else a membroker.
func openBroker(addr string) (broker.Broker, string, func(), error) {
	if addr == "" {
		b := membroker.New()
		return b, "in memory (set TIDE_REDIS_ADDR to use Redis)", func() { _ = b.Close() }, nil
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, "", nil, fmt.Errorf("cannot reach Redis at %s: %v (start it, or unset TIDE_REDIS_ADDR to run in memory)", addr, err)
	}
	b := redisbroker.New(rdb, redisbroker.WithPrefix("tide-example-ordercancel"))
	return b, "Redis at " + addr, func() { _ = b.Close(); _ = rdb.Close() }, nil
}

func serveHTTP(ctx context.Context, shop *Shop, addr, where string, cancelAfter time.Duration, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hs := &http.Server{Addr: addr, Handler: shop.Routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	fmt.Fprintf(stdout, "order service on http://%s, tasks %s, unpaid orders cancelled after %v\n", addr, where, cancelAfter)
	fmt.Fprintf(stdout, "  curl -XPOST %s/orders -d '{\"item\":\"widget\",\"qty\":2}'\n  curl -XPOST %s/orders/1/pay\n  curl %s/stock\n", addr, addr, addr)
	if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	return 0
}

// demo drives the service over real HTTP: three orders, one paid, wait.
func demo(ctx context.Context, shop *Shop, where string, cancelAfter time.Duration, stdout, stderr io.Writer) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	hs := &http.Server{Handler: shop.Routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(l) }()
	defer hs.Close()
	base := "http://" + l.Addr().String()
	api := &apiClient{base: base}

	fmt.Fprintf(stdout, "tasks %s; unpaid orders are cancelled after %v\n", where, cancelAfter)
	fmt.Fprintf(stdout, "stock before: %v\n", api.stock())
	var ids []int
	for _, o := range []struct {
		item string
		qty  int
	}{{"widget", 3}, {"gadget", 2}, {"widget", 1}} {
		var got Order
		api.post("/orders", map[string]any{"item": o.item, "qty": o.qty}, &got)
		fmt.Fprintf(stdout, "created order %d: %d x %s, %s\n", got.ID, got.Qty, got.Item, got.Status)
		ids = append(ids, got.ID)
	}
	fmt.Fprintf(stdout, "stock reserved: %v\n", api.stock())
	var paid Order
	api.post(fmt.Sprintf("/orders/%d/pay", ids[1]), nil, &paid)
	fmt.Fprintf(stdout, "paid order %d\n", paid.ID)
	if api.err != nil {
		fmt.Fprintln(stderr, "ordercancel:", api.err)
		return 1
	}

	fmt.Fprintf(stdout, "waiting %v for the unpaid orders to time out...\n", cancelAfter)
	deadline := time.Now().Add(cancelAfter + 30*time.Second)
	for {
		cancelled := 0
		for _, id := range ids {
			var o Order
			api.get(fmt.Sprintf("/orders/%d", id), &o)
			if o.Status == StatusCancelled {
				cancelled++
			}
		}
		if api.err != nil {
			fmt.Fprintln(stderr, "ordercancel:", api.err)
			return 1
		}
		if cancelled == 2 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stderr, "ordercancel: only %d of 2 unpaid orders were cancelled in time\n", cancelled)
			return 1
		}
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, id := range ids {
		var o Order
		api.get(fmt.Sprintf("/orders/%d", id), &o)
		fmt.Fprintf(stdout, "order %d: %s\n", o.ID, o.Status)
	}
	stock := api.stock()
	fmt.Fprintf(stdout, "stock after: %v (only the paid order's 2 gadgets are gone)\n", stock)
	if stock["widget"] != 10 || stock["gadget"] != 3 {
		fmt.Fprintln(stderr, "ordercancel: stock not restored as expected")
		return 1
	}
	fmt.Fprintln(stdout, "done")
	return 0
}

// apiClient is a tiny JSON client that remembers its first error.
type apiClient struct {
	base string
	err  error
}

func (c *apiClient) post(path string, body any, out any) {
	var buf bytes.Buffer
	if body != nil {
		_ = json.NewEncoder(&buf).Encode(body)
	}
	c.do(http.MethodPost, path, &buf, out)
}

func (c *apiClient) get(path string, out any) { c.do(http.MethodGet, path, nil, out) }

func (c *apiClient) stock() map[string]int {
	var s map[string]int
	c.get("/stock", &s)
	return s
}

func (c *apiClient) do(method, path string, body io.Reader, out any) {
	if c.err != nil {
		return
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.err = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.err = err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		c.err = fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
		return
	}
	c.err = json.NewDecoder(resp.Body).Decode(out)
}
