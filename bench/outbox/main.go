// Command outbox-bench measures the outbox relay: throughput (rows moved
// into Redis per second, with a backlog already committed) and
// commit-to-pending latency (from a transaction's commit returning to the
// relay having stored the task, pending, in Redis), for PostgreSQL and
// MySQL/MariaDB. It prints one table per measure.
//
//	go run . -pg 'postgres://...' -mysql 'root@tcp(...)/db' -redis 127.0.0.1:6379
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/outbox"
)

func main() {
	pgDSN := flag.String("pg", "", "PostgreSQL URL (skipped when empty)")
	myDSN := flag.String("mysql", "", "MySQL/MariaDB DSN for github.com/go-sql-driver/mysql (skipped when empty)")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	rows := flag.Int("rows", 20000, "rows in the throughput backlog")
	relays := flag.String("relays", "1,4", "relay counts to measure throughput with")
	latTasks := flag.Int("latency-tasks", 2000, "single-task transactions in the latency run")
	latRate := flag.Int("latency-rate", 500, "commits per second in the latency run")
	verbose := flag.Bool("v", false, "log the relays' warnings to stderr")
	flag.Parse()
	if *verbose {
		logOut = os.Stderr
	}

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fatal("redis: %v", err)
	}
	relayCounts := splitInts(*relays)
	type dbCase struct {
		name string
		d    outbox.Dialect
		drv  string
		dsn  string
	}
	var cases []dbCase
	if *pgDSN != "" {
		cases = append(cases, dbCase{"postgres", outbox.Postgres, "pgx", *pgDSN})
	}
	if *myDSN != "" {
		cases = append(cases, dbCase{"mysql", outbox.MySQL, "mysql", *myDSN})
	}
	if len(cases) == 0 {
		fatal("give -pg and/or -mysql")
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "database\trelays\trows\tseconds\trows/s\t")
	type lat struct {
		name     string
		n        int
		p50, p99 time.Duration
		max      time.Duration
	}
	var lats []lat
	run := 0
	for _, c := range cases {
		db, err := sql.Open(c.drv, c.dsn)
		if err != nil {
			fatal("%s: %v", c.name, err)
		}
		db.SetMaxOpenConns(64)
		db.SetMaxIdleConns(64)
		for _, r := range relayCounts {
			run++
			secs := throughput(ctx, db, c.d, rdb, fmt.Sprintf("bench_%d_%d", os.Getpid(), run), *rows, r)
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t\n", c.name, r, *rows, secs, float64(*rows)/secs)
		}
		run++
		ds := latency(ctx, db, c.d, rdb, fmt.Sprintf("bench_%d_%d", os.Getpid(), run), *latTasks, *latRate)
		lats = append(lats, lat{c.name, len(ds), pct(ds, 50), pct(ds, 99), ds[len(ds)-1]})
		db.Close()
	}
	tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "database\ttasks\tcommits/s\tp50\tp99\tmax\t\n")
	for _, l := range lats {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%v\t%v\t\n", l.name, l.n, *latRate, l.p50.Round(10*time.Microsecond), l.p99.Round(10*time.Microsecond), l.max.Round(10*time.Microsecond))
	}
	tw.Flush()
}

var logOut io.Writer = io.Discard

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// throughput commits rows tasks (1000 per transaction) with no relay
// running, then starts relays and returns the seconds until all arrived.
func throughput(ctx context.Context, db *sql.DB, d outbox.Dialect, rdb *redis.Client, table string, rows, relays int) float64 {
	var got atomic.Int64
	all := make(chan struct{})
	ob, err := outbox.New(db, d, outbox.WithTable(table), outbox.WithLogger(quietLogger()), outbox.WithBatchSize(500), outbox.WithConcurrency(64),
		outbox.OnRelayed(func(outbox.Relayed) {
			if got.Add(1) == int64(rows) {
				close(all)
			}
		}))
	if err != nil {
		fatal("%v", err)
	}
	if err := ob.Migrate(ctx); err != nil {
		fatal("migrate: %v", err)
	}
	for i := 0; i < rows; i += 1000 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			fatal("%v", err)
		}
		for j := i; j < min(i+1000, rows); j++ {
			if _, err := ob.Enqueue(ctx, tx, tide.NewTask("bench", []byte(`{"n":1}`)), tide.Queue("bench")); err != nil {
				fatal("enqueue: %v", err)
			}
		}
		if err := tx.Commit(); err != nil {
			fatal("%v", err)
		}
	}
	b := redisbroker.New(rdb, redisbroker.WithPrefix("outbox-bench:"+table))
	defer b.Close()
	client := tide.NewClient(b)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	for range relays {
		wg.Add(1)
		go func() { defer wg.Done(); _ = ob.Relay(rctx, client) }()
	}
	<-all
	secs := time.Since(start).Seconds()
	cancel()
	wg.Wait()
	return secs
}

// latency commits single-task transactions at rate per second with one
// relay running, and returns the sorted commit-to-pending durations.
func latency(ctx context.Context, db *sql.DB, d outbox.Dialect, rdb *redis.Client, table string, n, rate int) []time.Duration {
	var mu sync.Mutex
	committed := map[string]time.Time{}
	arrived := map[string]time.Time{}
	all := make(chan struct{})
	ob, err := outbox.New(db, d, outbox.WithTable(table), outbox.WithLogger(quietLogger()),
		outbox.OnRelayed(func(r outbox.Relayed) {
			mu.Lock()
			arrived[r.ID] = r.At
			if len(arrived) == n {
				close(all)
			}
			mu.Unlock()
		}))
	if err != nil {
		fatal("%v", err)
	}
	if err := ob.Migrate(ctx); err != nil {
		fatal("migrate: %v", err)
	}
	b := redisbroker.New(rdb, redisbroker.WithPrefix("outbox-bench:"+table))
	defer b.Close()
	client := tide.NewClient(b)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = ob.Relay(rctx, client) }()
	time.Sleep(200 * time.Millisecond) // let the relay start listening
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for range n {
		<-tick.C
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			fatal("%v", err)
		}
		info, err := ob.Enqueue(ctx, tx, tide.NewTask("bench", []byte(`{"n":1}`)), tide.Queue("bench"))
		if err != nil {
			fatal("enqueue: %v", err)
		}
		if err := tx.Commit(); err != nil {
			fatal("%v", err)
		}
		mu.Lock()
		committed[info.ID] = time.Now()
		mu.Unlock()
	}
	tick.Stop()
	<-all
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	ds := make([]time.Duration, 0, n)
	for id, c := range committed {
		ds = append(ds, max(arrived[id].Sub(c), 0))
	}
	slices.Sort(ds)
	return ds
}

func pct(ds []time.Duration, p int) time.Duration {
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

func splitInts(s string) []int {
	var out []int
	n, in := 0, false
	for _, c := range s + "," {
		switch {
		case c >= '0' && c <= '9':
			n, in = n*10+int(c-'0'), true
		case c == ',' && in:
			out = append(out, n)
			n, in = 0, false
		}
	}
	return out
}

func fatal(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "outbox-bench: "+f+"\n", a...)
	os.Exit(1)
}
