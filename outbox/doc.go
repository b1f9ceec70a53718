// Package outbox is tide's transactional outbox for PostgreSQL and
// MySQL/MariaDB, and an optional SQL sink for task history.
//
// # The outbox
//
// A program that changes its database and enqueues a task about the change
// ("order 42 created: cancel it in 15 minutes unless paid") wants both or
// neither. Enqueue writes the task into an outbox table inside the
// program's own transaction; Relay, running in any number of processes,
// moves committed rows into tide:
//
//	ob, err := outbox.New(db, outbox.Postgres)
//	err = ob.Migrate(ctx)                      // once, at start-up
//
//	tx, err := db.BeginTx(ctx, nil)
//	// ... INSERT INTO orders ...
//	info, err := ob.Enqueue(ctx, tx, task, tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute))
//	err = tx.Commit()
//
//	go ob.Relay(ctx, client)                   // until ctx ends
//
// The guarantees:
//
//   - A task reaches tide if and only if its transaction commits, and it is
//     stored once: the relay deletes a row only after Redis took its task,
//     and every row carries an idempotency key (tide.IdempotencyKey), so a
//     row sent again after a crash is recognised rather than stored twice.
//     Rows must therefore be relayed within the broker's idempotency window
//     (redisbroker.WithIdempotencyWindow, 24 hours by default); a row older
//     than that could be stored twice if it was sent before.
//   - Options are resolved at Enqueue, as tide.Prepare does: ProcessIn counts
//     from Enqueue, not from the relay, and queue, ID, retries, timeout,
//     deadline, retention, uniqueness and headers travel with the row.
//   - Relays claim rows with SELECT ... FOR UPDATE SKIP LOCKED and hold them
//     for WithClaimTimeout; several relays share the work and each row is
//     moved by one of them. A relay killed at any point loses nothing: its
//     rows are claimed again when the claim runs out.
//   - Rows of one task (same queue and ID) are relayed in order.
//
// Delete cancels a task in a transaction: it removes the task's row if no
// relay has touched it yet, and otherwise records a cancel that the relay
// carries out with Client.Cancel after the commit (see Delete for exactly
// what its result means).
//
// On PostgreSQL, Enqueue and Delete send a notification that wakes the
// relays at commit (LISTEN/NOTIFY, with a fallback poll every
// DefaultPollInterval); on MySQL the relays poll every
// DefaultMySQLPollInterval. The database/sql drivers are the caller's
// choice of github.com/jackc/pgx/v5/stdlib ("pgx") and
// github.com/go-sql-driver/mysql; import the one you use.
//
// Rows that tide refuses for good (an ID held by another task, an invalid
// task) or that cannot be read back are kept, marked failed, logged with
// their row number and listed by Failed; Retry and Discard deal with them.
// Backlog reports how many rows wait.
//
// # Task history
//
// History is independent of the outbox: its Middleware records every
// finished attempt of a task (queue, ID, type, outcome, attempt number,
// error, start and end, server) into a table, in batches written by a
// background goroutine, and Attempts reads a task's attempts back.
// Attempts older than WithRetention are deleted.
//
//	hist, err := outbox.NewHistory(db, outbox.MySQL)
//	err = hist.Migrate(ctx)
//	defer hist.Close()
//	mux.Use(hist.Middleware())
package outbox
