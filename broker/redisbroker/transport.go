package redisbroker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
)

// call is one script invocation destined for one partition.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	queue  string // whose layout the script checks
	// argv, when not nil, is the whole EVALSHA command (its keys and
	// arguments boxed once, many of them for good: enqueueOneCall) and
	// stands for keys and args.
	argv []any

	// expiry names, for a call that sets its reply cache's expiry, the
	// partition (its key prefix) and the cache: once the call succeeds,
	// the partition's later calls on that cache need not set it again.
	expiry [2]string
	slots  bool // expiry names reply slots (replySlot), not a reply cache
	// solo: a lone call that may run on the broker's kept connection
	// (soloConn) rather than through the pool.
	solo bool

	// full builds, for a call of a plain script (dequeue_plain.lua,
	// settle_plain.lua), the general script's call with the same request:
	// run in its place when the plain one replies plainRefused. base is
	// then the partition's key prefix.
	full func() *call
	base string

	cmd *redis.Cmd
	err error // after run: nil, or classified (see classify)
	// unsure: a send of this call got no reply, so it may have run; a
	// send after it that the layout check refuses tells nothing about it.
	unsure bool
}

// plainRefused is the reply of a plain script that changed nothing because
// what it found needs its general script.
const plainRefused = "*"

// plainPause is how long a partition whose plain script refused a call is
// served by the general scripts alone before the plain ones are tried
// again: a partition given limits, groups or waiters keeps them for a
// while, and each refused call costs a round trip.
const plainPause = 10 * time.Second

// plainOK reports whether partition base may be tried with the plain
// scripts (no refusal in the last plainPause).
func (b *Broker) plainOK(base string) bool {
	v, ok := b.plainOff.Load(base)
	return !ok || time.Now().UnixNano() >= v.(int64)
}

// request returns the identity of a new state-changing request on partition
// p: a random ID, the reply cache it answers from when it runs again, and
// when that cache expires (ms, Redis clock). A partition's reply caches are
// hashes named by slice of an eighth of the replay window, by process and by
// fifty requests of that process (see req_pack in lib.lua), so the name
// is fixed when the request is made and a re-send finds the reply the first
// run stored. A slice's hashes expire one window after the slice ends: every
// reply is kept at least the window and at most an eighth longer, so the
// caches' memory stays level at about (requests per second) × window
// instead of swinging up to twice that as whole windows expire. edge
// reports whether the request is the first or the last of its hash, which
// then must set the expiry (setsExpiry).
func (b *Broker) request(p part) (rid, cache string, expireAt int64, edge bool) {
	w := b.window.Milliseconds()
	g := max(w/8, 1000)
	n := b.Now().UnixMilli() / g
	var raw [9]byte
	_, _ = rand.Read(raw[:])
	seq, ok := b.requests.Load(p.base)
	if !ok {
		seq, _ = b.requests.LoadOrStore(p.base, new(atomic.Uint64))
	}
	i := seq.(*atomic.Uint64).Add(1) - 1
	edge = i%repliesPerCache == 0 || i%repliesPerCache == repliesPerCache-1
	cache = p.k("rq:" + strconv.FormatInt(n, 10) + ":" + b.tag + "." + strconv.FormatUint(i/repliesPerCache, 36))
	return base64.RawURLEncoding.EncodeToString(raw[:]), cache, (n+1)*g + w, edge
}

// slotSeq counts this process's single enqueues on one partition
// (replySlot) and keeps the name of the reply slots key they last used.
type slotSeq struct {
	next atomic.Uint64
	last atomic.Pointer[slotKey]
}

// slotKey is a reply slots key's name and what it was made from, with
// what enqueueOneCall sends of it boxed once.
type slotKey struct {
	n    int64  // slice
	k    uint64 // the k-th fifty
	name string
	exp  int64 // when the key expires (ms)
	// boxed: the name, the expiry and the expiry negated
	boxed [3]any
}

// replySlot is request for a single Enqueue that enqueue_one.lua stores:
// the request is named by a reply slots key (a string, one byte a request,
// named like a reply cache but "rs:" for "rq:") and its slot in it, handed
// out once each by this process, rather than by a random ID. The key
// expires as a reply cache does; edge reports the first and last slot of
// the key.
func (b *Broker) replySlot(p part) (key *slotKey, slot int, edge bool) {
	w := b.window.Milliseconds()
	g := max(w/8, 1000)
	n := b.Now().UnixMilli() / g
	v, ok := b.slots.Load(p.base)
	if !ok {
		v, _ = b.slots.LoadOrStore(p.base, new(slotSeq))
	}
	seq := v.(*slotSeq)
	i := seq.next.Add(1) - 1
	k := i / repliesPerCache
	slot = int(i % repliesPerCache)
	edge = slot == 0 || slot == repliesPerCache-1
	if key = seq.last.Load(); key == nil || key.n != n || key.k != k {
		name := p.k("rs:" + strconv.FormatInt(n, 10) + ":" + b.tag + "." + strconv.FormatUint(k, 36))
		exp := (n+1)*g + w
		key = &slotKey{n: n, k: k, name: name, exp: exp, boxed: [3]any{name, exp, -exp}}
		seq.last.Store(key)
	}
	return key, slot, edge
}

// repliesPerCache is how many requests of a process share one reply cache
// hash: few enough that Redis keeps the hash as a compact list under its
// default hash-max-listpack-entries (128), which a request scans to claim
// its entry (a hundred made that scan a seventh of a single Enqueue's cost
// in Redis), and enough that the hash's own overhead is spread thin (about
// 20 bytes a request at fifty, as at a hundred).
const repliesPerCache = 50

// run sends the calls in one pipeline (go-redis splits it per node on a
// cluster) and classifies each call's error. A call whose outcome is unknown
// (sent, no reply) is sent again unchanged, with its request ID, until it
// answers, ctx ends or half the replay window has passed since the first
// send: the scripts answer a repeated request from their reply cache, so
// sending again is safe and settles what happened.
func (b *Broker) run(ctx context.Context, calls []*call) {
	b.runOnce(ctx, calls)
	var again []*call
	for _, c := range calls {
		if c.full == nil || c.err != nil {
			continue
		}
		if v, ok := c.cmd.Val().(string); ok && v == plainRefused {
			b.plainOff.Store(c.base, time.Now().Add(plainPause).UnixNano())
			f := c.full()
			c.script, c.keys, c.args, c.expiry, c.full = f.script, f.keys, f.args, f.expiry, nil
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		b.runOnce(ctx, again)
	}
}

// wroteCache reports whether a call that was to set its reply cache's
// expiry surely wrote the cache, and so set it: not when it replied
// plainRefused or an empty list (a lease that found nothing stores no
// reply), which leave the cache as it was, maybe not there yet. Later calls
// on the cache skip the expiry only once one did write it, or the cache
// they create would never expire.
func wroteCache(cmd *redis.Cmd) bool {
	switch v := cmd.Val().(type) {
	case string:
		return v != plainRefused
	case []any:
		return len(v) > 0
	}
	return true
}

// runOnce is run without the plain scripts' fallback.
func (b *Broker) runOnce(ctx context.Context, calls []*call) {
	start := time.Now()
	pending := calls
	wait := 20 * time.Millisecond
	for {
		b.send(ctx, pending)
		var again []*call
		for _, c := range pending {
			c.err = classify(c.cmd.Err())
			if lerr, ok := b.layoutRefused(c.queue, c.cmd.Err()); ok {
				c.err = lerr
				if c.unsure {
					// The check runs before the reply cache: the send
					// that got no reply may have run under the old
					// layout. Not sent again: the layout stays new.
					c.err = fmt.Errorf("%w: %w: queue %q: a call sent again after no reply met a new layout, so whether its first send was applied is not known",
						broker.ErrUnavailable, broker.ErrOutcomeUnknown, c.queue)
					continue
				}
			}
			if c.err == nil && c.expiry[0] != "" && wroteCache(c.cmd) {
				if c.slots {
					b.slotExpiry.Store(c.expiry[0], c.expiry[1])
				} else {
					b.cacheExpiry.Store(c.expiry[0], c.expiry[1])
				}
			}
			if errors.Is(c.err, broker.ErrOutcomeUnknown) {
				c.unsure = true
				again = append(again, c)
			}
		}
		if len(again) == 0 || time.Since(start)+wait > b.window/2 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, time.Second)
		pending = again
	}
}

// send runs the calls; those whose script Redis has not cached yet are sent
// again with EVAL.
func (b *Broker) send(ctx context.Context, calls []*call) {
	if len(calls) == 1 {
		c := calls[0]
		var x scripter = b.rdb
		var conn *redis.Conn
		if c.solo {
			if conn = b.solo.take(b.rdb); conn != nil {
				x = conn
			}
		}
		c.cmd = c.evalSha(ctx, x)
		if noScript(c.cmd.Err()) {
			c.cmd = c.eval(ctx, x)
		}
		if conn != nil {
			b.solo.give(c.cmd.Err())
		}
		return
	}
	pipe := b.rdb.Pipeline()
	for _, c := range calls {
		c.cmd = c.evalSha(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var retry []*call
	for _, c := range calls {
		if noScript(c.cmd.Err()) {
			retry = append(retry, c)
		}
	}
	if len(retry) == 0 {
		return
	}
	pipe = b.rdb.Pipeline()
	for _, c := range retry {
		c.cmd = c.eval(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx)
}

// noScript reports Redis's reply to an EVALSHA of a script it has not
// cached.
func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || strings.HasPrefix(err.Error(), "NOSCRIPT"))
}

// scripter is where a call's script is run or queued: a client or a
// pipeline.
type scripter interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
}

// evalSha runs or queues c's script by its SHA on x.
func (c *call) evalSha(ctx context.Context, x scripter) *redis.Cmd {
	if c.argv == nil {
		return c.script.EvalSha(ctx, x, c.keys, c.args...)
	}
	cmd := redis.NewCmd(ctx, c.argv...)
	cmd.SetFirstKeyPos(3) // a cluster client routes by the first key
	_ = x.Process(ctx, cmd)
	return cmd
}

// eval runs or queues c's script with its body (EVAL), for Redis to cache.
func (c *call) eval(ctx context.Context, x scripter) *redis.Cmd {
	if c.argv == nil {
		return c.script.Eval(ctx, x, c.keys, c.args...)
	}
	n := c.argv[2].(int)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = c.argv[3+i].(string)
	}
	return c.script.Eval(ctx, x, keys, c.argv[3+n:]...)
}

// classify turns a go-redis error into the broker's vocabulary, so that no
// Redis type or error string needs to be understood past the broker:
// ErrUnavailable when Redis could not be reached or refused to run the
// command for now (the command did not run), ErrUnavailable and
// ErrOutcomeUnknown when the command was sent but no reply came (it may have
// run). Other errors (replies of Redis itself, such as a script error) keep
// their message. redis.Nil and nil are returned as they are.
func classify(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if errors.Is(err, broker.ErrUnavailable) || errors.Is(err, broker.ErrLayout) {
		return err
	}
	switch transportKind(err) {
	case notRun:
		return fmt.Errorf("%w: %v", broker.ErrUnavailable, err)
	case maybeRun:
		if ce := ctxErr(err); ce != nil {
			return fmt.Errorf("%w: %w: %w", broker.ErrUnavailable, broker.ErrOutcomeUnknown, ce)
		}
		return fmt.Errorf("%w: %w: %v", broker.ErrUnavailable, broker.ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("tide: redisbroker: %v", err)
}

// isTransport reports whether err says Redis could not be reached or
// answered, as opposed to a reply of Redis itself.
func isTransport(err error) bool { return transportKind(err) != notTransport }

type kind int

const (
	notTransport kind = iota
	notRun            // the command surely did not run
	maybeRun          // the command may have run
)

func transportKind(err error) kind {
	if err == nil {
		return notTransport
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return maybeRun
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return notRun
	}
	if errors.Is(err, redis.ErrClosed) {
		return notRun
	}
	s := err.Error()
	// Replies that mean "not now": the command was not executed.
	for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MOVED ", "ASK ", "LOADING", "MASTERDOWN", "READONLY", "NOSCRIPT", "BUSY", "OOM ", "NOREPLICAS"} {
		if strings.HasPrefix(s, p) {
			return notRun
		}
	}
	for _, f := range []string{"connection pool timeout", "connection refused", "no such host", "network is unreachable", "client is closed"} {
		if strings.Contains(s, f) {
			return notRun
		}
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return maybeRun
	}
	for _, f := range []string{"connection reset", "broken pipe", "i/o timeout", "EOF"} {
		if strings.Contains(s, f) {
			return maybeRun
		}
	}
	return notTransport
}

func ctxErr(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return context.DeadlineExceeded
	}
	return nil
}

// callErr wraps a call's classified error with what was being done.
func callErr(op string, err error) error {
	return fmt.Errorf("tide: redisbroker: %s: %w", op, err)
}
