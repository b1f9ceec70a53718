package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process the bench started for itself.
type redisServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
}

// startRedis starts redis-server on a free loopback port in a temp dir, with
// persistence off so that figures are not disturbed by background saves.
func startRedis() (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (install it, or pass -redis host:port): %w", err)
	}
	dir, err := os.MkdirTemp("", "tide-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		s.cmd = exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no",
			"--logfile", filepath.Join(dir, "redis.log"))
		s.cmd.SysProcAttr = childAttr()
		if err := s.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		if err := waitPing(s.addr, 5*time.Second); err != nil {
			lastErr = err
			_ = s.cmd.Process.Kill()
			_ = s.cmd.Wait()
			continue
		}
		return s, nil
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not start: %v\n%s", lastErr, log)
}

// stop kills the server and removes its directory. It is idempotent.
func (s *redisServer) stop() {
	if s == nil || s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
	_ = os.RemoveAll(s.dir)
}

func waitPing(addr string, limit time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// newRDB returns a go-redis client sized for the workloads: Concurrency 50
// workers, 8 enqueuing goroutines and the servers' background loops.
func newRDB(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 200, MinIdleConns: 8})
}

// infoField returns one "name:value" field of an INFO section.
func infoField(ctx context.Context, rdb *redis.Client, section, name string) (string, error) {
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == name {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no field %q", section, name)
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	v, err := infoField(ctx, rdb, "memory", "used_memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// parseCommandStats reads the calls of each command from the text of
// INFO commandstats ("cmdstat_get:calls=3,usec=...").
func parseCommandStats(s string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "calls" {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out
}

// rawConn is a bare RESP connection: used for MONITOR and for the INFO
// snapshots of the idle-cost workload, so that the bench's own commands can
// be told apart (by client address) from those of the server under test.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(addr string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, r: bufio.NewReader(c)}, nil
}

func (rc *rawConn) localAddr() string { return rc.c.LocalAddr().String() }

func (rc *rawConn) close() { _ = rc.c.Close() }

func (rc *rawConn) send(args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := rc.c.Write([]byte(b.String()))
	return err
}

// readLine reads one RESP line without its CRLF.
func (rc *rawConn) readLine(deadline time.Time) (string, error) {
	_ = rc.c.SetReadDeadline(deadline)
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// bulk sends a command and reads a bulk-string reply.
func (rc *rawConn) bulk(args ...string) (string, error) {
	if err := rc.send(args...); err != nil {
		return "", err
	}
	deadline := time.Now().Add(5 * time.Second)
	head, err := rc.readLine(deadline)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("unexpected reply %q", head)
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil || n < 0 {
		return "", fmt.Errorf("unexpected reply %q", head)
	}
	buf := make([]byte, n+2)
	_ = rc.c.SetReadDeadline(deadline)
	if _, err := io.ReadFull(rc.r, buf); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// monitorLine splits a MONITOR line
// (+1700000000.123456 [0 127.0.0.1:5000] "evalsha" "..." ...) into the
// client ("lua" for commands run by a script) and the lower-case command.
func monitorLine(line string) (client, cmd string, ok bool) {
	if !strings.HasPrefix(line, "+") {
		return "", "", false
	}
	open := strings.IndexByte(line, '[')
	closeIdx := strings.IndexByte(line, ']')
	if open < 0 || closeIdx < open {
		return "", "", false
	}
	inside := line[open+1 : closeIdx]
	_, client, _ = strings.Cut(inside, " ")
	rest := strings.TrimSpace(line[closeIdx+1:])
	if !strings.HasPrefix(rest, "\"") {
		return "", "", false
	}
	end := strings.IndexByte(rest[1:], '"')
	if end < 0 {
		return "", "", false
	}
	return client, strings.ToLower(rest[1 : 1+end]), true
}
