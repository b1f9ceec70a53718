package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
)

// logLevelHelp documents TIDE_LOG_LEVEL, for the help of dash and serve.
const logLevelHelp = `Log lines go to stderr (as JSON with --json). TIDE_LOG_LEVEL sets the
level: debug, info (the default), warn or error. go-redis's own messages,
such as the dial errors it reports many times a second while Redis is down,
are logged at debug level only: by default a Redis outage shows as a line
when it starts and one when it ends (from /metrics when it is scraped, and
from serve's webhook sender), not as a line per failed connection.`

// setLogLevel reads TIDE_LOG_LEVEL.
func (a *app) setLogLevel(cmd *command) error {
	v := strings.TrimSpace(a.env("TIDE_LOG_LEVEL"))
	if v == "" {
		a.logLevel = slog.LevelInfo
		return nil
	}
	if err := a.logLevel.UnmarshalText([]byte(v)); err != nil {
		return usagef(cmd, "TIDE_LOG_LEVEL %q: use debug, info, warn or error", v)
	}
	return nil
}

// logger returns this run's logger: text on stderr, JSON with --json, at
// the level of TIDE_LOG_LEVEL. It also receives go-redis's messages at debug
// level while this run is the latest one (see redisLogger).
func (a *app) logger() *slog.Logger {
	if a.log == nil {
		opts := &slog.HandlerOptions{Level: a.logLevel}
		var h slog.Handler = slog.NewTextHandler(a.stderr, opts)
		if a.globals.json {
			h = slog.NewJSONHandler(jsonSafeWriter{a.stderr}, opts)
		}
		a.log = slog.New(h)
		redisLogTarget.Store(a.log)
	}
	return a.log
}

// redisLogTarget is the logger go-redis's messages go to: the logger of the
// latest run, nil when none is running.
var redisLogTarget atomic.Pointer[slog.Logger]

// redisLogger is the go-redis logger of the program (redis.SetLogger). By
// default go-redis prints to stderr, with no level, a line for every
// connection it fails to open: while Redis is down that is several lines a
// second, drowning the one line that says Redis is unreachable. redisLogger
// logs them on the CLI's logger at debug level (TIDE_LOG_LEVEL=debug shows
// them), escaped like all text.
type redisLogger struct{}

func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	l := redisLogTarget.Load()
	if l == nil || !l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	msg := strings.TrimPrefix(strings.TrimSpace(fmt.Sprintf(format, v...)), "redis: ")
	l.Log(ctx, slog.LevelDebug, "go-redis: "+msg)
}

// note and warn print a note or a warning on stderr: "tide: note: ...", or
// with --json one JSON object per line, {"note": "..."}, like errors.
func (a *app) note(format string, v ...any) { a.say("note", fmt.Sprintf(format, v...), nil) }

func (a *app) warn(format string, v ...any) { a.say("warning", fmt.Sprintf(format, v...), nil) }

// status prints a line about what a long-running command does ("dashboard
// listening on ..."): "tide: ..." as text, {"note": "...", extra...} with
// --json.
func (a *app) status(extra map[string]string, format string, v ...any) {
	a.say("", fmt.Sprintf(format, v...), extra)
}

func (a *app) say(kind, msg string, extra map[string]string) {
	if a.globals.json {
		obj := map[string]string{}
		for k, v := range extra {
			obj[k] = v
		}
		if kind == "" {
			kind = "note"
		}
		obj[kind] = msg
		_ = writeLineJSON(a.stderr, obj)
		return
	}
	if kind != "" {
		kind += ": "
	}
	fmt.Fprintln(a.stderr, "tide: "+kind+escapeLines(msg))
}
