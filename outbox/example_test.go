package outbox_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/outbox"
)

// An order and the timer that cancels it unless paid are written in one
// transaction; a relay moves the timer into tide after the commit. Paying
// deletes the timer in the payment's transaction.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	client := tide.NewClient(redisbroker.New(rdb))

	ob, err := outbox.New(db, outbox.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := ob.Relay(ctx, client); err != nil {
			log.Print(err)
		}
	}()

	// Create order 42 and its cancel timer, atomically.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (42, 'new')`); err != nil {
		log.Fatal(err)
	}
	task := tide.NewTask("order:cancel", []byte(`{"order":42}`))
	if _, err := ob.Enqueue(ctx, tx, task, tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute)); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// Order 42 is paid: stop its timer in the same transaction.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = 42`); err != nil {
		log.Fatal(err)
	}
	removed, err := ob.Delete(ctx, tx, "default", "order-cancel:42")
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	log.Printf("timer removed before it reached Redis: %v (otherwise it is cancelled there)", removed)
}

// Every finished attempt goes into a table that the dashboard or CLI can
// read back.
func ExampleHistory() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost/shop")
	if err != nil {
		log.Fatal(err)
	}
	hist, err := outbox.NewHistory(db, outbox.Postgres, outbox.WithRetention(30*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	if err := hist.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer hist.Close()
	mux := tide.NewServeMux()
	mux.Use(hist.Middleware())
	// ... mux.HandleFunc(...), server.Start(mux) ...

	attempts, err := hist.Attempts(ctx, "default", "order-cancel:42")
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range attempts {
		log.Printf("attempt %d on %s: %s %s", a.Attempt, a.Server, a.State, a.Error)
	}
}
