// Package redistest starts real redis-server processes for tests: each on a
// free loopback port in the test's temp dir, stopped by t.Cleanup. When
// TIDE_REDIS_ADDR is set, that server is used instead and isolation comes
// from a unique key prefix per test (see Prefix).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started for a test.
type Server struct {
	Addr string
	Dir  string
	cmd  *exec.Cmd
	bin  string
	args []string // the command line, for Restart
}

// Start starts a redis-server for t with the extra config arguments (for
// example "--appendonly", "yes") and stops it when t ends. It fails t when
// redis-server is not installed.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return StartIn(t, t.TempDir(), extra...)
}

// StartIn is Start with the data and log in dir.
func StartIn(t testing.TB, dir string, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH (install it, e.g. apt-get install -y redis-server, or set TIDE_REDIS_ADDR): %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir}
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"),
			"--protected-mode", "no"}, extra...)
		if lastErr = s.launch(bin, args, 5*time.Second); lastErr != nil {
			continue
		}
		t.Cleanup(s.Stop)
		return s
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	t.Fatalf("redis-server did not start: %v\n%s", lastErr, log)
	return nil
}

// Restart kills the server with SIGKILL (no shutdown save: only what it had
// already written survives, e.g. an AOF with appendfsync always) and starts
// it again on the same port, data directory and arguments, waiting until it
// answers, which it does once its data is loaded. Starting is retried for a
// few seconds in case the port is briefly unavailable.
func (s *Server) Restart() error {
	s.Stop()
	var err error
	for range 10 {
		if err = s.launch(s.bin, s.args, 30*time.Second); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("redistest: restart %s: %w", s.Addr, err)
}

// launch runs bin with args as s and waits up to limit until it answers
// PING; on failure it leaves no process behind. It remembers the command
// line for Restart.
func (s *Server) launch(bin string, args []string, limit time.Duration) error {
	s.bin, s.args = bin, args
	s.cmd = exec.Command(bin, args...)
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return fmt.Errorf("start %s: %w", bin, err)
	}
	if err := s.waitReady(limit); err != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
		return err
	}
	return nil
}

// Stop kills the server and waits for it to exit. It is idempotent.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (s *Server) waitReady(limit time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return p
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns the address of a Redis for t: TIDE_REDIS_ADDR when set,
// otherwise a server started for t.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv("TIDE_REDIS_ADDR"); a != "" {
		return a
	}
	return Start(t).Addr
}

// Client returns a client of addr closed when t ends.
func Client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

var seq atomic.Int64

// Prefix returns a key prefix unique to t within this process and run, so
// tests sharing one Redis do not see each other's keys. On a shared Redis
// (TIDE_REDIS_ADDR) every key under the prefix is deleted when t ends, so
// that the suite leaves nothing behind.
func Prefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_", "{", "(", "}", ")", "*", "_", "?", "_", "[", "(", "]", ")").Replace(t.Name())
	p := fmt.Sprintf("tt:%s:%d:%d", name, os.Getpid(), seq.Add(1))
	if addr := os.Getenv("TIDE_REDIS_ADDR"); addr != "" {
		t.Cleanup(func() { dropPrefix(t, addr, p) })
	}
	return p
}

// dropPrefix deletes every key under prefix p (and the prefix's pub/sub
// channels need nothing: they hold no data).
func dropPrefix(t testing.TB, addr, p string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, p+":*", 1000).Iterator()
	var batch []string
	flush := func() {
		if len(batch) > 0 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				t.Logf("redistest: cleaning prefix %s: %v", p, err)
			}
			batch = batch[:0]
		}
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			flush()
		}
	}
	flush()
	if err := iter.Err(); err != nil {
		t.Logf("redistest: cleaning prefix %s: %v", p, err)
	}
}
