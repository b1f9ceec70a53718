package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/encrypt"
	"github.com/tidequeue/tide/outbox"
)

// app is one run of the program.
type app struct {
	env            func(string) string
	stdout, stderr io.Writer
	globals        globals
	// jsonArg: the command line has --json; parsed: the flags were parsed
	// (globals.json is then the word). See jsonErrors.
	jsonArg, parsed bool

	rdb *redis.Client
	b   *redisbroker.Broker
	// tb is the broker of task data: b, wrapped by encrypt.Wrap when keys
	// are given. The inspector, client and webhook server use it.
	tb   broker.Broker
	keys []encrypt.Key
	in   *tide.Inspector
	c    *tide.Client

	// log is this run's logger (see logger); logLevel its level, from
	// TIDE_LOG_LEVEL.
	log      *slog.Logger
	logLevel slog.Level

	// hist reads the recorded task history (--history-dsn), on histDB;
	// nil without one. histSecret is the DSN's password, kept out of
	// messages.
	hist       *outbox.History
	histDB     *sql.DB
	histSecret string
}

// globals are the flags every command accepts.
type globals struct {
	redis      string
	prefix     string
	partitions int
	json       bool
}

func (g *globals) defaults(env func(string) string) {
	g.redis = env("TIDE_REDIS_ADDR")
	if g.redis == "" {
		g.redis = "127.0.0.1:6379"
	}
	g.prefix = env("TIDE_PREFIX")
	if g.prefix == "" {
		g.prefix = redisbroker.DefaultPrefix
	}
	g.partitions = 1
}

// register adds the global flags to fs with their current values as
// defaults, so that a flag given before the command is kept.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.redis, "redis", g.redis, "Redis `address`")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "key `prefix`")
	fs.IntVar(&g.partitions, "partitions", g.partitions, "partitions of new queues")
	fs.BoolVar(&g.json, "json", g.json, "print JSON")
}

func (g *globals) check() error {
	if g.redis == "" {
		return errors.New("--redis is empty")
	}
	if g.prefix == "" || strings.ContainsAny(g.prefix, "{}") {
		return fmt.Errorf("--prefix %q must be non-empty and free of '{' and '}'", g.prefix)
	}
	if g.partitions < 1 || g.partitions > 1024 {
		return fmt.Errorf("--partitions %d must be between 1 and 1024", g.partitions)
	}
	return nil
}

// redisOptions reads --redis: host:port, or a redis:// / rediss:// URL.
func redisOptions(addr string) (*redis.Options, string, error) {
	if strings.Contains(addr, "://") {
		opts, err := redis.ParseURL(addr)
		if err != nil {
			// The URL may hold a password: name the problem, not the URL.
			return nil, "", fmt.Errorf("--redis is not a valid redis:// URL: %v", scrubURLError(err))
		}
		return opts, opts.Addr, nil
	}
	if strings.Count(addr, ":") == 0 {
		addr += ":6379"
	}
	return &redis.Options{Addr: addr}, addr, nil
}

func scrubURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// connect opens Redis, checks that it answers and builds the broker,
// inspector and client. Queues whose partition count is recorded in Redis
// keep that count (the broker adopts it), so a wrong --partitions cannot
// hide tasks.
func (a *app) connect(ctx context.Context) error {
	opts, shown, err := redisOptions(a.globals.redis)
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	opts.MaxRetries = 1
	opts.DialTimeout = 3 * time.Second
	a.rdb = redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.rdb.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("tide: cannot reach Redis at %s: %v\n  Start Redis there, or point tide at yours with --redis host:port or TIDE_REDIS_ADDR", shown, err)
	}
	// Queues in use keep the partition count recorded in Redis.
	a.b = redisbroker.New(a.rdb, redisbroker.WithPrefix(a.globals.prefix), redisbroker.WithPartitions(a.globals.partitions))
	a.tb = a.b
	if len(a.keys) > 0 {
		wb, err := encrypt.Wrap(a.b, a.keys...)
		if err != nil {
			// ParseKeys already checked the keys; Wrap names a key by ID only.
			return &usageError{msg: strings.TrimPrefix(err.Error(), "encrypt: ")}
		}
		a.tb = wb
	}
	a.in = tide.NewInspector(a.tb)
	a.c = tide.NewClient(a.tb)
	return nil
}

func (a *app) close() {
	redisLogTarget.CompareAndSwap(a.log, nil)
	if a.c != nil {
		a.c.Close()
	}
	if a.b != nil {
		a.b.Close()
	}
	if a.rdb != nil {
		a.rdb.Close()
	}
	if a.hist != nil {
		_ = a.hist.Close()
	}
	if a.histDB != nil {
		_ = a.histDB.Close()
	}
}

// knownQueue returns a notFoundError when no task was ever enqueued to
// queue under the prefix.
func (a *app) knownQueue(ctx context.Context, queue string) error {
	if err := tide.ValidateQueueName(queue); err != nil {
		return &usageError{msg: strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": ")}
	}
	qs, err := a.in.Queues(ctx)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if q == queue {
			return nil
		}
	}
	msg := fmt.Sprintf("no queue %q under prefix %q", queue, a.globals.prefix)
	if len(qs) > 0 {
		msg += " (queues: " + strings.Join(qs, ", ") + ")"
	} else {
		msg += " (no queues at all: is --prefix right?)"
	}
	return &notFoundError{msg: msg}
}

// jsonErrors reports whether errors are printed as JSON: with --json, even
// when the command line could not be parsed as far as --json.
func (a *app) jsonErrors() bool {
	return a.globals.json || a.jsonArg && !a.parsed
}

// printJSON writes v as indented JSON (see writeJSON).
func (a *app) printJSON(v any) error { return writeJSON(a.stdout, v, "  ") }

// writeLineJSON writes v as one line of JSON (for --watch --json, and
// errors and notes on stderr; see writeJSON).
func writeLineJSON(w io.Writer, v any) error { return writeJSON(w, v, "") }

// writeJSON is the one way --json output is written (the JSON log lines
// pass through jsonSafeWriter): v as JSON, indented by indent, with
// jsonSafe's escapes, then a newline.
func writeJSON(w io.Writer, v any, indent string) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", indent)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonSafe(buf.Bytes()))
	return err
}

// jsonSafeWriter passes every Write through jsonSafe. slog's JSON handler
// writes each record whole in one Write, so no character is split between
// two.
type jsonSafeWriter struct{ w io.Writer }

func (s jsonSafeWriter) Write(p []byte) (int, error) {
	if _, err := s.w.Write(jsonSafe(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
