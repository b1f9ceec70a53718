package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// waitLimit bounds every wait of these tests for something that should
// happen; it is never reached when the code works.
const waitLimit = 10 * time.Second

// env is a redis-server, a proxy in front of it and a client that talks to
// Redis directly, bypassing the proxy.
type env struct {
	srv    *redistest.Server
	p      *Proxy
	direct *redis.Client
}

func setup(t *testing.T, redisArgs ...string) *env {
	t.Helper()
	srv := redistest.Start(t, redisArgs...)
	p, err := New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &env{srv: srv, p: p, direct: redistest.Client(t, srv.Addr)}
}

// client returns a go-redis client of the proxy configured by opt.
func (e *env) client(t *testing.T, opt redis.Options) *redis.Client {
	t.Helper()
	opt.Addr = e.p.Addr()
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// value reads key directly from Redis; a missing key is 0.
func (e *env) value(t *testing.T, key string) int64 {
	t.Helper()
	v, err := e.direct.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

// await waits for ch to be closed or fails the test.
func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestDelayedReplyRunsCommandTwice reproduces the double execution: the
// reply to INCR is held past the client's read timeout, go-redis re-sends
// the command on a new connection, and Redis runs it twice.
func TestDelayedReplyRunsCommandTwice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{ReadTimeout: 200 * time.Millisecond, MaxRetries: 1})

	e.p.DelayReplies(Commands("incr"), 500*time.Millisecond, 1)
	v, err := rdb.Incr(ctx, "k").Result()
	t.Logf("client saw %d, %v", v, err)
	if got := e.value(t, "k"); got != 2 {
		t.Fatalf("k = %d in Redis, want 2: the timed-out INCR should have been re-sent and run twice", got)
	}
	if n := e.p.Seen("INCR"); n != 2 {
		t.Fatalf("Seen(INCR) = %d, want 2", n)
	}
}

// TestDelayedEvalShaRetriedByDefault is the same with a script run through
// EVALSHA and go-redis's default MaxRetries (3): two delayed replies, three
// executions, on three connections (the count is across connections).
func TestDelayedEvalShaRetriedByDefault(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	script := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	if err := script.Load(ctx, e.direct).Err(); err != nil {
		t.Fatal(err)
	}
	rdb := e.client(t, redis.Options{ReadTimeout: 200 * time.Millisecond})

	e.p.DelayReplies(Commands("EVALSHA", "EVAL"), 500*time.Millisecond, 2)
	v, err := script.Run(ctx, rdb, []string{"k"}).Int64()
	t.Logf("client saw %d, %v", v, err)
	if got := e.value(t, "k"); got != 3 {
		t.Fatalf("k = %d in Redis, want 3: the script should have run once per attempt", got)
	}
	if n := e.p.Seen("evalsha"); n != 3 {
		t.Fatalf("Seen(EVALSHA) = %d, want 3", n)
	}
	if err != nil || v != 3 {
		t.Fatalf("client got %d, %v; want 3 from the third attempt", v, err)
	}
}

// TestDroppedReplyAfterExecution: the reply to INCR is swallowed and the
// connection reset; without retries the client gets an error although the
// increment happened.
func TestDroppedReplyAfterExecution(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{MaxRetries: -1}) // go-redis: -1 = no retries

	e.p.DropReplies(Commands("INCR"), 1)
	if err := rdb.Incr(ctx, "k").Err(); err == nil {
		t.Fatal("INCR succeeded although its reply was dropped")
	} else {
		t.Logf("client saw %v", err)
	}
	if got := e.value(t, "k"); got != 1 {
		t.Fatalf("k = %d in Redis, want 1: the command runs before its reply is dropped", got)
	}
	if d := e.p.Dropped(); d != 1 {
		t.Fatalf("Dropped() = %d, want 1", d)
	}
	// The fault is used up: the next INCR goes through on a new connection.
	if v, err := rdb.Incr(ctx, "k").Result(); err != nil || v != 2 {
		t.Fatalf("second INCR = %d, %v; want 2", v, err)
	}
}

// TestDelayedReplyInPipeline delays the reply to the third of five
// pipelined INCRs.
func TestDelayedReplyInPipeline(t *testing.T) {
	t.Parallel()
	keys := []string{"p1", "p2", "p3", "p4", "p5"}
	pipeline := func(ctx context.Context, rdb *redis.Client) ([]*redis.IntCmd, error) {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.Incr(ctx, k)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}

	t.Run("long timeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		rdb := e.client(t, redis.Options{ReadTimeout: waitLimit})
		if err := rdb.Ping(ctx).Err(); err != nil { // connect before timing
			t.Fatal(err)
		}
		const delay = time.Second
		e.p.DelayReplies(Commands("INCR").WithFirstArg("p3"), delay, 1)

		done := make(chan struct{})
		var cmds []*redis.IntCmd
		var err error
		start := time.Now()
		go func() {
			defer close(done)
			cmds, err = pipeline(ctx, rdb)
		}()
		// Every command runs while the third reply is held, and the client
		// is still waiting for it.
		testwait.For(t, waitLimit, "the fifth INCR to run", func() bool { return e.value(t, "p5") == 1 })
		if closed(done) {
			t.Fatal("the pipeline returned before its delayed reply was released")
		}
		await(t, "the pipeline", done)
		if elapsed := time.Since(start); elapsed < delay {
			t.Fatalf("the pipeline returned after %v, before the %v delay", elapsed, delay)
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range cmds {
			if c.Val() != 1 {
				t.Errorf("INCR %s returned %d, want 1", keys[i], c.Val())
			}
			if v := e.value(t, keys[i]); v != 1 {
				t.Errorf("%s = %d in Redis, want 1", keys[i], v)
			}
		}
		if n := e.p.Seen("INCR"); n != 5 {
			t.Fatalf("Seen(INCR) = %d, want 5", n)
		}
	})

	t.Run("short timeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ctx := context.Background()
		rdb := e.client(t, redis.Options{ReadTimeout: 200 * time.Millisecond})
		e.p.DelayReplies(Commands("INCR").WithFirstArg("p3"), 500*time.Millisecond, 1)

		_, err := pipeline(ctx, rdb)
		t.Logf("pipeline: %v", err)
		seen := e.p.Seen("INCR")
		if seen <= 5 {
			t.Fatalf("Seen(INCR) = %d: go-redis did not re-send the pipeline", seen)
		}
		if seen%5 != 0 {
			t.Fatalf("Seen(INCR) = %d, not whole pipelines", seen)
		}
		for _, k := range keys {
			if v := e.value(t, k); v != seen/5 {
				t.Errorf("%s = %d in Redis, want %d: every INCR runs once per attempt", k, v, seen/5)
			}
		}
	})
}

// TestPauseResume: a command sent while the proxy is paused does not reach
// Redis until Resume, and a connection opened meanwhile is accepted but not
// served.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{ReadTimeout: waitLimit})
	if err := rdb.Ping(ctx).Err(); err != nil { // an open connection in the pool
		t.Fatal(err)
	}
	fresh := e.client(t, redis.Options{ReadTimeout: waitLimit})

	e.p.Pause()
	incrDone, pingDone := make(chan struct{}), make(chan struct{})
	var incr int64
	var incrErr, pingErr error
	go func() {
		defer close(incrDone)
		incr, incrErr = rdb.Incr(ctx, "k").Result()
	}()
	go func() {
		defer close(pingDone)
		pingErr = fresh.Ping(ctx).Err()
	}()
	testwait.For(t, waitLimit, "the fresh connection to be accepted", func() bool { return e.p.Accepted() == 2 })
	time.Sleep(200 * time.Millisecond) // time for the INCR to reach Redis if it could
	if n := e.p.Seen("INCR"); n != 0 {
		t.Fatalf("Seen(INCR) = %d during Pause", n)
	}
	if v := e.value(t, "k"); v != 0 {
		t.Fatalf("k = %d in Redis during Pause", v)
	}
	if closed(incrDone) || closed(pingDone) {
		t.Fatalf("a command completed during Pause: INCR %v, PING %v", incrErr, pingErr)
	}

	e.p.Resume()
	await(t, "INCR", incrDone)
	await(t, "PING", pingDone)
	if incrErr != nil || incr != 1 || pingErr != nil {
		t.Fatalf("after Resume: INCR = %d, %v; PING %v", incr, incrErr, pingErr)
	}
	if v, n := e.value(t, "k"), e.p.Seen("INCR"); v != 1 || n != 1 {
		t.Fatalf("after Resume: k = %d, Seen(INCR) = %d; want 1, 1", v, n)
	}
}

// TestDelayedRequest: a held command, and those after it on its connection,
// reach Redis only after the delay, while those before it are forwarded.
func TestDelayedRequest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{ReadTimeout: waitLimit})
	e.p.DelayRequests(Commands("INCR"), time.Second, 1)

	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		pipe := rdb.Pipeline()
		pipe.Set(ctx, "a", 1, 0)
		pipe.Incr(ctx, "b")
		pipe.Set(ctx, "c", 1, 0)
		_, err = pipe.Exec(ctx)
	}()
	testwait.For(t, waitLimit, "the SET before the INCR", func() bool { return e.value(t, "a") == 1 })
	if b, c := e.value(t, "b"), e.value(t, "c"); b != 0 || c != 0 {
		t.Fatalf("b = %d, c = %d while the INCR is held; want 0, 0", b, c)
	}
	if n := e.p.Seen("INCR"); n != 0 {
		t.Fatalf("Seen(INCR) = %d while it is held", n)
	}
	if closed(done) {
		t.Fatal("the pipeline returned while a command was held")
	}
	await(t, "the pipeline", done)
	if err != nil {
		t.Fatal(err)
	}
	if b, c := e.value(t, "b"), e.value(t, "c"); b != 1 || c != 1 {
		t.Fatalf("b = %d, c = %d; want 1, 1", b, c)
	}
	if s, i := e.p.Seen("SET"), e.p.Seen("INCR"); s != 2 || i != 1 {
		t.Fatalf("Seen(SET) = %d, Seen(INCR) = %d; want 2, 1", s, i)
	}
}

// TestSeenCountsPipelineAndMulti: Seen counts each command of a pipeline
// and of a MULTI block, inline commands too.
func TestSeenCountsPipelineAndMulti(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{})
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, "a")
		p.Incr(ctx, "b")
		p.Get(ctx, "a")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, e.p.Addr())
	send(t, c, "ping\r\nPING\r\n")
	if got := readN(t, c, 14); got != "+PONG\r\n+PONG\r\n" {
		t.Fatalf("inline PINGs: %q", got)
	}
	for name, want := range map[string]int64{"MULTI": 1, "incr": 2, "Get": 1, "EXEC": 1, "PING": 2} {
		if n := e.p.Seen(name); n != want {
			t.Errorf("Seen(%s) = %d, want %d", name, n, want)
		}
	}
}

// TestCut: open connections are reset, new ones refused while the cut
// lasts, and served again after it.
func TestCut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	rdb := e.client(t, redis.Options{})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	open := dial(t, e.p.Addr())
	send(t, open, "PING\r\n")
	if got := readN(t, open, 7); got != "+PONG\r\n" {
		t.Fatalf("PING: %q", got)
	}

	e.p.Cut(2 * time.Second)
	if !e.p.Down() {
		t.Fatal("Down() = false right after Cut")
	}
	t.Logf("open connection: %v", expectEnd(t, open))
	t.Logf("connection during the cut: %v", expectRefused(t, e.p.Addr()))
	if n := e.p.Refused(); n < 1 {
		t.Fatalf("Refused() = %d after a refused connection", n)
	}
	noRetry := e.client(t, redis.Options{MaxRetries: -1})
	if err := noRetry.Ping(ctx).Err(); err == nil {
		t.Fatal("a client got a reply during the cut")
	}

	testwait.For(t, waitLimit, "the cut to end", func() bool { return !e.p.Down() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the cut: %v", err)
	}
	if err := noRetry.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the cut: %v", err)
	}
}

// TestDialFailed: when the target is down, connections are reset and
// counted.
func TestDialFailed(t *testing.T) {
	t.Parallel()
	target := net.JoinHostPort("127.0.0.1", fmt.Sprint(redistest.FreePort(t)))
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	t.Logf("connection: %v", expectRefused(t, p.Addr()))
	if n, a := p.DialFailed(), p.Accepted(); n != 1 || a != 0 {
		t.Fatalf("DialFailed() = %d, Accepted() = %d; want 1, 0", n, a)
	}
}

// TestGarbageIsForwarded: bytes that are not RESP reach Redis as they are
// (Redis answers them), and the proxy keeps serving.
func TestGarbageIsForwarded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// Redis rejects a malformed array header and closes the connection.
	// Every paired reply would be held for an hour: this one is not paired,
	// as the proxy cannot tell which command it answers.
	e.p.DelayReplies(Commands(), time.Hour, 0)
	c := dial(t, e.p.Addr())
	send(t, c, "*abc\r\nPING\r\n")
	if got, _ := readAll(c); !strings.HasPrefix(string(got), "-ERR Protocol error") {
		t.Fatalf("reply to a bad header: %q", got)
	}

	// Binary junk parses as an inline command Redis does not know. (Not
	// with a NUL byte: Redis looks for the end of an inline line with
	// strchr, so it would wait for more.)
	e.p.Clear()
	c = dial(t, e.p.Addr())
	send(t, c, "\x01\xff\xfe junk\r\nECHO ok\r\n")
	want := "-ERR unknown command '\x01\xff\xfe', with args beginning with: 'junk' \r\n$2\r\nok\r\n"
	if got := readN(t, c, len(want)); got != want {
		t.Fatalf("replies to junk: %q", got)
	}

	// Random bytes on a few connections.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		c := dial(t, e.p.Addr())
		junk := make([]byte, 1+rng.IntN(4096))
		for i := range junk {
			junk[i] = byte(rng.UintN(256))
		}
		_, _ = c.Write(junk)
		_ = c.Close()
	}

	// A malformed command after a good one: the good one's reply is still
	// paired and delayed, then the rest goes through raw.
	e.p.DelayReplies(Commands("ECHO"), 300*time.Millisecond, 1)
	c = dial(t, e.p.Addr())
	send(t, c, bulkCmd("ECHO", "first")+"*2\r\n$4\r\nECHO\r\nX\r\n")
	got, _ := readAll(c)
	if !strings.HasPrefix(string(got), "$5\r\nfirst\r\n-ERR Protocol error") {
		t.Fatalf("replies: %q", got)
	}

	e.p.Clear()
	rdb := e.client(t, redis.Options{})
	if v, err := rdb.Echo(ctx, "still here").Result(); err != nil || v != "still here" {
		t.Fatalf("ECHO after garbage: %q, %v", v, err)
	}
}

// TestPubSub: a subscribed connection is no longer paired, so reply faults
// do not touch it and published messages flow, in RESP2 and RESP3.
func TestPubSub(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			rdb := e.client(t, redis.Options{Protocol: proto})
			ps := rdb.Subscribe(ctx, "ch")
			t.Cleanup(func() { _ = ps.Close() })
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			accepted := e.p.Accepted()

			// Would reset any paired connection at its next reply.
			e.p.DropReplies(Commands(), 0)
			if err := ps.Ping(ctx, "hi"); err != nil {
				t.Fatal(err)
			}
			if msg, err := ps.Receive(ctx); err != nil {
				t.Fatal(err)
			} else if pong, ok := msg.(*redis.Pong); !ok || pong.Payload != "hi" {
				t.Fatalf("got %#v, want the pong", msg)
			}
			for i := range 3 {
				if err := e.direct.Publish(ctx, "ch", fmt.Sprint("m", i)).Err(); err != nil {
					t.Fatal(err)
				}
				msg, err := ps.ReceiveMessage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if msg.Payload != fmt.Sprint("m", i) {
					t.Fatalf("message %d: %q", i, msg.Payload)
				}
			}
			if d, a := e.p.Dropped(), e.p.Accepted(); d != 0 || a != accepted {
				t.Fatalf("Dropped() = %d, Accepted() %d -> %d: the subscription was disturbed", d, accepted, a)
			}
			if n := e.p.Seen("SUBSCRIBE"); n != 1 {
				t.Fatalf("Seen(SUBSCRIBE) = %d, want 1", n)
			}
		})
	}
}

// pairingPipeline returns commands whose replies cover every RESP2 and
// RESP3 type and are the same on every connection, between the markers
// START and (the reply to drop or delay) TARGET, then more.
func pairingPipeline(proto string) string {
	var b strings.Builder
	b.WriteString(bulkCmd("HELLO", proto)) // its reply differs per connection
	b.WriteString(bulkCmd("ECHO", "START"))
	for _, typ := range []string{"string", "integer", "double", "bignum", "null", "array",
		"set", "map", "attrib", "verbatim", "true", "false"} {
		b.WriteString(bulkCmd("DEBUG", "PROTOCOL", typ))
	}
	b.WriteString(bulkCmd("GET", "big"))
	b.WriteString(bulkCmd("GET", "missing"))
	b.WriteString(bulkCmd("HGETALL", "h"))
	b.WriteString(bulkCmd("COMMAND", "INFO", "GET", "SET"))
	b.WriteString(bulkCmd("EVAL", "return {1,{2,{3,'x'}},redis.status_reply('fine')}", "0"))
	b.WriteString(bulkCmd("EVAL", "return redis.error_reply('ERR boom')", "0"))
	b.WriteString("PING\r\n")
	b.WriteString(bulkCmd("ECHO", "TARGET"))
	b.WriteString(bulkCmd("ECHO", "AFTER"))
	b.WriteString(bulkCmd("QUIT"))
	return b.String()
}

// TestFaultHitsTheMatchingReply runs a pipeline with replies of every type
// once directly and once through the proxy with a fault on one reply, and
// compares the bytes the client receives.
func TestFaultHitsTheMatchingReply(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"2", "3"} {
		t.Run("RESP"+proto, func(t *testing.T) {
			t.Parallel()
			e := setup(t, "--enable-debug-command", "yes")
			ctx := context.Background()
			if err := e.direct.Set(ctx, "big", strings.Repeat("b", 1<<20), 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := e.direct.HSet(ctx, "h", "f1", "v1", "f2", "v2").Err(); err != nil {
				t.Fatal(err)
			}
			in := pairingPipeline(proto)
			c := dial(t, e.srv.Addr)
			send(t, c, in)
			want, err := readAll(c)
			if err != nil {
				t.Fatal(err)
			}
			start := bytes.Index(want, []byte("$5\r\nSTART\r\n"))
			target := bytes.Index(want, []byte("$6\r\nTARGET\r\n"))
			if start < 0 || target < start || !bytes.HasSuffix(want, []byte("$5\r\nAFTER\r\n+OK\r\n")) {
				t.Fatalf("unexpected direct replies: %q", want)
			}
			want = want[start:]
			target -= start

			t.Run("drop", func(t *testing.T) {
				e.p.DropReplies(Commands("ECHO").WithFirstArg("TARGET"), 1)
				c := dial(t, e.p.Addr())
				send(t, c, in)
				got, err := readAll(c)
				t.Logf("read %d bytes, then %v", len(got), err)
				if i := bytes.Index(got, []byte("$5\r\nSTART\r\n")); i >= 0 {
					got = got[i:]
				}
				if !bytes.Equal(got, want[:target]) {
					t.Fatalf("got %d bytes, want the %d before the target reply\n%s", len(got), target, diff(got, want[:target]))
				}
				if d := e.p.Dropped(); d != 1 {
					t.Fatalf("Dropped() = %d, want 1", d)
				}
			})

			t.Run("delay", func(t *testing.T) {
				e.p.DelayReplies(Commands("ECHO").WithFirstArg("TARGET"), time.Second, 1)
				c := dial(t, e.p.Addr())
				send(t, c, in)
				// Everything before the target reply arrives...
				var got []byte
				buf := make([]byte, 64<<10)
				for !bytes.Contains(got, want[:target]) {
					_ = c.SetReadDeadline(time.Now().Add(waitLimit))
					n, err := c.Read(buf)
					got = append(got, buf[:n]...)
					if err != nil {
						t.Fatalf("read %d bytes, then %v", len(got), err)
					}
				}
				// ...and nothing after it while the target is held.
				_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				if n, err := c.Read(buf); n != 0 || !os.IsTimeout(err) {
					t.Fatalf("read %q (%v) while the target reply is held", buf[:n], err)
				}
				rest, err := readAll(c)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, rest...)
				got = got[bytes.Index(got, []byte("$5\r\nSTART\r\n")):]
				if !bytes.Equal(got, want) {
					t.Fatalf("replies differ from the direct ones\n%s", diff(got, want))
				}
			})
		})
	}
}

// TestPushUnpairs: after a RESP3 push frame the connection's replies are
// no longer paired, so a fault on a later command does not apply.
func TestPushUnpairs(t *testing.T) {
	t.Parallel()
	e := setup(t, "--enable-debug-command", "yes")
	e.p.DropReplies(Commands("ECHO"), 0)
	c := dial(t, e.p.Addr())
	send(t, c, bulkCmd("HELLO", "3")+bulkCmd("DEBUG", "PROTOCOL", "push")+bulkCmd("ECHO", "kept")+bulkCmd("QUIT"))
	got, err := readAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(got, []byte("$4\r\nkept\r\n+OK\r\n")) {
		t.Fatalf("the ECHO reply after a push was not forwarded: %q", got)
	}
	if d := e.p.Dropped(); d != 0 {
		t.Fatalf("Dropped() = %d", d)
	}
}

// TestCloseWhileBusy: Close returns while replies are delayed and the
// proxy is paused, resets the clients, and can be called again.
func TestCloseWhileBusy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p, err := New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: time.Hour, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	p.DelayReplies(Commands("INCR"), time.Hour, 0)
	incrDone := make(chan struct{})
	var incrErr error
	go func() {
		defer close(incrDone)
		incrErr = rdb.Incr(ctx, "k").Err()
	}()
	testwait.For(t, waitLimit, "the INCR to run", func() bool { return p.Seen("INCR") == 1 })
	p.Pause()
	paused := dial(t, p.Addr())
	send(t, paused, "PING\r\n")

	closeDone := make(chan struct{})
	go func() {
		defer close(closeDone)
		err = p.Close()
	}()
	await(t, "Close", closeDone)
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	await(t, "the INCR", incrDone)
	if incrErr == nil {
		t.Fatal("INCR succeeded through a closed proxy")
	}
	t.Logf("paused connection: %v", expectEnd(t, paused))
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p.DelayReplies(Commands(), time.Second, 1) // harmless after Close
	p.Pause()
	p.Resume()
	p.Cut(time.Second)
}

// dial connects to addr; the connection is closed when t ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(waitLimit))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// readN reads n bytes from c.
func readN(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read: %v (got %q)", err, b)
	}
	return string(b)
}

// readAll reads c until it is closed or reset (the error, nil for EOF).
func readAll(c net.Conn) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	return io.ReadAll(c)
}

// expectRefused connects to addr and expects the connection to be reset
// at once: the kernel completes the handshake, so either the connect or
// the first read reports it. It returns the error seen.
func expectRefused(t *testing.T, addr string) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitLimit)
	if err != nil {
		return err
	}
	t.Cleanup(func() { _ = c.Close() })
	_, _ = c.Write([]byte("PING\r\n"))
	return expectEnd(t, c)
}

// expectEnd reads c until it ends, failing t if that does not happen or
// if anything is received, and returns why it ended (io.EOF for a FIN).
func expectEnd(t *testing.T, c net.Conn) error {
	t.Helper()
	got, err := readAll(c)
	if os.IsTimeout(err) {
		t.Fatalf("the connection stayed open: %v", err)
	}
	if len(got) > 0 {
		t.Fatalf("received %q", got)
	}
	if err == nil {
		err = io.EOF
	}
	return err
}

// diff describes where got and want first differ.
func diff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	excerpt := func(b []byte) []byte {
		return b[max(0, i-40):min(len(b), i+40)]
	}
	return fmt.Sprintf("first difference at byte %d (got %d, want %d bytes)\n got: %q\nwant: %q", i, len(got), len(want), excerpt(got), excerpt(want))
}
