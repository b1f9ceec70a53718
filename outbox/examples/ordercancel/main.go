// Command ordercancel is the PostgreSQL edition of the root module's
// examples/ordercancel: the same shop (an order not paid within a time limit
// is cancelled and its stock released), but orders and stock live in
// PostgreSQL, and the cancel timer is written through the outbox in the
// transaction that creates the order. An order is never left without its
// timer, and a rolled-back order never gets one. Paying removes the timer
// in the payment's transaction (outbox.Delete). It lives in the outbox
// module so that the root module does not depend on a database driver.
//
//	go run ./outbox/examples/ordercancel -dsn postgres://user@localhost/shop
//
// runs a scripted demo and exits: three orders are created, one is paid,
// one more is created in a transaction that rolls back, and once the time
// limit has passed the two unpaid orders are cancelled and their stock is
// back. Tasks are kept in the Redis at TIDE_REDIS_ADDR, or in memory when it
// is not set. The demo creates its tables (ordercancel_orders,
// ordercancel_stock and the outbox's tide_outbox) if needed and empties the
// first two.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/outbox"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// CancelOrder is the task that cancels an order left unpaid.
type CancelOrder struct {
	OrderID int `json:"order_id"`
}

// TaskType implements tide.TaskArgs.
func (CancelOrder) TaskType() string { return "order:cancel" }

func cancelTaskID(orderID int) string { return "order-cancel:" + strconv.Itoa(orderID) }

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ordercancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "PostgreSQL URL, e.g. postgres://user@localhost/shop (required)")
	cancelAfter := fs.Duration("cancel-after", 2*time.Second, "how long an order may stay unpaid")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dsn == "" || *cancelAfter <= 0 {
		fmt.Fprintln(stderr, "ordercancel: -dsn is required and -cancel-after must be positive")
		fs.Usage()
		return 2
	}
	if err := demo(ctx, *dsn, getenv("TIDE_REDIS_ADDR"), *cancelAfter, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "ordercancel:", err)
		return 1
	}
	return 0
}

// Shop keeps orders and stock in PostgreSQL.
type Shop struct {
	db          *sql.DB
	ob          *outbox.Outbox
	cancelAfter time.Duration
}

func (s *Shop) setup(ctx context.Context) error {
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ordercancel_stock (item TEXT PRIMARY KEY, qty INT NOT NULL CHECK (qty >= 0))`,
		`CREATE TABLE IF NOT EXISTS ordercancel_orders (id SERIAL PRIMARY KEY, item TEXT NOT NULL, qty INT NOT NULL, status TEXT NOT NULL)`,
		`TRUNCATE ordercancel_orders, ordercancel_stock`,
		`INSERT INTO ordercancel_stock VALUES ('widget', 10), ('gadget', 5)`,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return s.ob.Migrate(ctx)
}

// Create reserves stock, inserts the order and writes its cancel timer, in
// one transaction. With rollback set, it rolls the transaction back at the
// end instead of committing (the demo's failed checkout).
func (s *Shop) Create(ctx context.Context, item string, qty int, rollback bool) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `UPDATE ordercancel_stock SET qty = qty - $1 WHERE item = $2 AND qty >= $1`, qty, item)
	if err != nil {
		return 0, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return 0, fmt.Errorf("%d x %s: out of stock", qty, item)
	}
	var id int
	if err := tx.QueryRowContext(ctx, `INSERT INTO ordercancel_orders (item, qty, status) VALUES ($1, $2, 'awaiting_payment') RETURNING id`,
		item, qty).Scan(&id); err != nil {
		return 0, err
	}
	task, err := tide.NewTaskFrom(CancelOrder{OrderID: id})
	if err != nil {
		return 0, err
	}
	if _, err := s.ob.Enqueue(ctx, tx, task, tide.TaskID(cancelTaskID(id)), tide.ProcessIn(s.cancelAfter)); err != nil {
		return 0, err
	}
	if rollback {
		return id, tx.Rollback()
	}
	return id, tx.Commit()
}

// Pay marks an order paid and stops its timer, in one transaction.
func (s *Shop) Pay(ctx context.Context, id int) (timerRemoved bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `UPDATE ordercancel_orders SET status = 'paid' WHERE id = $1 AND status = 'awaiting_payment'`, id)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, fmt.Errorf("order %d cannot be paid", id)
	}
	removed, err := s.ob.Delete(ctx, tx, tide.DefaultQueue, cancelTaskID(id))
	if err != nil {
		return false, err
	}
	return removed, tx.Commit()
}

// HandleCancel cancels an unpaid order and releases its stock; a paid or
// already cancelled order is left alone, so a redelivered task is harmless.
func (s *Shop) HandleCancel(ctx context.Context, a CancelOrder) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var item string
	var qty int
	err = tx.QueryRowContext(ctx, `UPDATE ordercancel_orders SET status = 'cancelled' WHERE id = $1 AND status = 'awaiting_payment' RETURNING item, qty`,
		a.OrderID).Scan(&item, &qty)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ordercancel_stock SET qty = qty + $1 WHERE item = $2`, qty, item); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *Shop) statuses(ctx context.Context) (map[int]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, status FROM ordercancel_orders ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var id int
		var st string
		if err := rows.Scan(&id, &st); err != nil {
			return nil, err
		}
		out[id] = st
	}
	return out, rows.Err()
}

func (s *Shop) stock(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT item, qty FROM ordercancel_stock ORDER BY item`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var item string
		var qty int
		if err := rows.Scan(&item, &qty); err != nil {
			return nil, err
		}
		out[item] = qty
	}
	return out, rows.Err()
}

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
		return nil, "", nil, fmt.Errorf("cannot reach Redis at %s: %v", addr, err)
	}
	b := redisbroker.New(rdb, redisbroker.WithPrefix("tide-example-ordercancel-sql"))
	return b, "Redis at " + addr, func() { _ = b.Close(); _ = rdb.Close() }, nil
}

func demo(ctx context.Context, dsn, redisAddr string, cancelAfter time.Duration, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ob, err := outbox.New(db, outbox.Postgres, outbox.WithLogger(log))
	if err != nil {
		return err
	}
	shop := &Shop{db: db, ob: ob, cancelAfter: cancelAfter}
	if err := shop.setup(ctx); err != nil {
		return fmt.Errorf("set up the tables: %w", err)
	}
	b, where, closeBroker, err := openBroker(redisAddr)
	if err != nil {
		return err
	}
	defer closeBroker()
	client := tide.NewClient(b)

	mux := tide.NewServeMux()
	tide.HandleArgs(mux, shop.HandleCancel)
	srv := tide.NewServer(b, tide.Config{Logger: log})
	if err := srv.Start(mux); err != nil {
		return err
	}
	defer srv.Shutdown()
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- ob.Relay(rctx, client) }()
	defer func() { stopRelay(); <-relayDone }()

	fmt.Fprintf(stdout, "orders in PostgreSQL, tasks %s; unpaid orders are cancelled after %v\n", where, cancelAfter)
	var ids []int
	for _, o := range []struct {
		item string
		qty  int
	}{{"widget", 3}, {"gadget", 2}, {"widget", 1}} {
		id, err := shop.Create(ctx, o.item, o.qty, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created order %d: %d x %s, cancel timer in the same transaction\n", id, o.qty, o.item)
		ids = append(ids, id)
	}
	rolled, err := shop.Create(ctx, "gadget", 3, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "order %d rolled back: neither the order nor its timer exists\n", rolled)
	removed, err := shop.Pay(ctx, ids[1])
	if err != nil {
		return err
	}
	how := "it had reached tide and is cancelled there"
	if removed {
		how = "its timer was removed before it reached tide"
	}
	fmt.Fprintf(stdout, "paid order %d: %s\n", ids[1], how)

	fmt.Fprintf(stdout, "waiting %v for the unpaid orders to time out...\n", cancelAfter)
	deadline := time.Now().Add(cancelAfter + 30*time.Second)
	for {
		st, err := shop.statuses(ctx)
		if err != nil {
			return err
		}
		if st[ids[0]] == "cancelled" && st[ids[2]] == "cancelled" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the unpaid orders were not cancelled in time: %v", st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	st, err := shop.statuses(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		fmt.Fprintf(stdout, "order %d: %s\n", id, st[id])
	}
	if _, ok := st[rolled]; ok || st[ids[1]] != "paid" {
		return fmt.Errorf("unexpected orders: %v", st)
	}
	stock, err := shop.stock(ctx)
	if err != nil {
		return err
	}
	out, _ := json.Marshal(stock)
	fmt.Fprintf(stdout, "stock after: %s (only the paid order's 2 gadgets are gone)\n", out)
	if stock["widget"] != 10 || stock["gadget"] != 3 {
		return fmt.Errorf("stock not restored as expected: %v", stock)
	}
	fmt.Fprintln(stdout, "done")
	return nil
}
