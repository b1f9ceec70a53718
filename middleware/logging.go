package middleware

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"
	"unicode/utf8"

	"github.com/tidequeue/tide"
)

// MaxLoggedPayload is how many bytes of a payload Logging writes when
// WithPayload is given; longer payloads are cut there and marked with the
// attribute payload_truncated=true.
const MaxLoggedPayload = 4096

// LoggingOption configures Logging. A LoggingOption is immutable and safe to
// share.
type LoggingOption interface {
	apply(*loggingConfig)
}

type loggingOptionFunc func(*loggingConfig)

func (f loggingOptionFunc) apply(c *loggingConfig) { f(c) }

type loggingConfig struct {
	payload        bool
	okLevel, errLv slog.Level
}

// WithPayload makes Logging add the payload to each line (attribute
// "payload": a string when the payload is valid UTF-8, raw bytes otherwise,
// at most MaxLoggedPayload bytes). Payloads often hold personal data, so they
// are not logged by default.
func WithPayload() LoggingOption {
	return loggingOptionFunc(func(c *loggingConfig) { c.payload = true })
}

// WithLevels sets the level of the lines for successful attempts (default
// slog.LevelInfo) and for failed ones (default slog.LevelWarn).
func WithLevels(ok, failed slog.Level) LoggingOption {
	return loggingOptionFunc(func(c *loggingConfig) { c.okLevel, c.errLv = ok, failed })
}

// Logging returns middleware that writes one line to logger for every
// attempt of a task, with the message "tide: task attempt" and the
// attributes:
//
//	type      the task type
//	queue     the queue                         (only under a tide.Server)
//	id        the task ID                       (only under a tide.Server)
//	attempt   the retry count plus one          (only under a tide.Server)
//	duration  how long the attempt took
//	outcome   "ok" or "error"
//	err       the error's text                  (only for "error")
//	payload   the payload                       (only WithPayload)
//
// Successful attempts are logged at slog.LevelInfo and failed ones at
// slog.LevelWarn unless WithLevels says otherwise. A panic that passes
// through is logged as an error (the *tide.PanicError text, with its stack)
// and re-raised; register Recover after Logging to have it returned as an
// error instead. The line is logged with the handler's context, so a
// slog.Handler that reads trace IDs from the context sees the span of a
// Tracing middleware registered before Logging. A nil logger means
// slog.Default(). The returned middleware is safe for concurrent use.
func Logging(logger *slog.Logger, opts ...LoggingOption) tide.MiddlewareFunc {
	cfg := loggingConfig{okLevel: slog.LevelInfo, errLv: slog.LevelWarn}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	return func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) (err error) {
			l := logger
			if l == nil {
				l = slog.Default()
			}
			start := time.Now()
			defer func() {
				r := recover()
				logErr := err
				if r != nil {
					logErr = &tide.PanicError{Value: r, Stack: debug.Stack()}
				}
				cfg.log(ctx, l, t, time.Since(start), logErr)
				if r != nil {
					panic(r)
				}
			}()
			return next.ProcessTask(ctx, t)
		})
	}
}

func (c *loggingConfig) log(ctx context.Context, l *slog.Logger, t *tide.Task, d time.Duration, err error) {
	level := c.okLevel
	if err != nil {
		level = c.errLv
	}
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs, slog.String("type", t.Type()))
	if q, ok := tide.GetQueueName(ctx); ok {
		attrs = append(attrs, slog.String("queue", q))
	}
	if id, ok := tide.GetTaskID(ctx); ok {
		attrs = append(attrs, slog.String("id", id))
	}
	if n, ok := tide.GetRetryCount(ctx); ok {
		attrs = append(attrs, slog.Int("attempt", n+1))
	}
	attrs = append(attrs, slog.Duration("duration", d))
	if err == nil {
		attrs = append(attrs, slog.String("outcome", "ok"))
	} else {
		attrs = append(attrs, slog.String("outcome", "error"), slog.String("err", err.Error()))
	}
	if c.payload {
		p := t.Payload()
		if len(p) > MaxLoggedPayload {
			p = p[:MaxLoggedPayload]
			// Do not let the cut split a UTF-8 sequence of a text payload.
			for i := 1; i < utf8.UTFMax && !utf8.Valid(p); i++ {
				if utf8.Valid(p[:len(p)-i]) {
					p = p[:len(p)-i]
				}
			}
			attrs = append(attrs, slog.Bool("payload_truncated", true))
		}
		if utf8.Valid(p) {
			attrs = append(attrs, slog.String("payload", string(p)))
		} else {
			attrs = append(attrs, slog.Any("payload", p))
		}
	}
	l.LogAttrs(ctx, level, "tide: task attempt", attrs...)
}
