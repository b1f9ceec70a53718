package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server process that can be killed and started again on
// the same port with the same data directory and arguments, so that a test
// can check what survives a crash (with "--appendonly yes --appendfsync
// always", every acknowledged write does).
type Redis struct {
	Addr string
	Dir  string

	bin  string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// StartRedis starts redis-server on a free loopback port with its data and
// log in dir and the extra config arguments, and waits until it answers.
func StartRedis(dir string, extra ...string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (apt-get install -y redis-server): %w", err)
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		r := &Redis{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Dir:  dir,
			bin:  bin,
			args: append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
				"--save", "", "--logfile", filepath.Join(dir, "redis.log"), "--protected-mode", "no"}, extra...),
		}
		if lastErr = r.Start(); lastErr == nil {
			return r, nil
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	return nil, fmt.Errorf("redis-server did not start: %w\n%s", lastErr, log)
}

// Start starts the server (again) and waits up to 30 s until it answers
// PING, which it does only once its data (the AOF) is loaded.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return errors.New("chaos: redis-server already running")
	}
	cmd := exec.Command(r.bin, r.args...)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := waitReady(r.Addr, exited, 30*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return err
	}
	r.cmd, r.exited = cmd, exited
	return nil
}

// Kill sends SIGKILL to the server and waits for it to exit: no shutdown
// save, no flush beyond what the server already did.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.cmd, r.exited = nil, nil
}

// Restart kills the server and starts it again on the same port and data
// directory. Starting is retried for a few seconds in case the port is
// briefly unavailable.
func (r *Redis) Restart() error {
	r.Kill()
	var err error
	for range 10 {
		if err = r.Start(); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// Stop kills the server; it is idempotent.
func (r *Redis) Stop() { r.Kill() }

// waitReady waits until addr answers PING, failing early when the process
// exits (the port was taken, a bad argument).
func waitReady(addr string, exited <-chan struct{}, limit time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-exited:
			return errors.New("chaos: redis-server exited while starting")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
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
