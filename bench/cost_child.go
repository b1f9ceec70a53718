package main

// The processes of the cost mode (cost.go): how the bench starts and reads
// them, installs BullMQ, and the Go children themselves (bench -role ...).

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
)

// child is a process of the cost mode, speaking in stdout lines and
// exiting when its stdin closes.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	once   sync.Once
	err    error
}

func startChild(cmd *exec.Cmd) (*child, error) {
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: &strings.Builder{}}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &lockedWriter{w: c.stderr}
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	return c, nil
}

// expect waits for the line that starts with word and returns its fields.
func (c *child) expect(word string, limit time.Duration) ([]string, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				_ = c.stop()
				return nil, fmt.Errorf("exited before %q: %s", word, strings.TrimSpace(c.stderr.String()))
			}
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "error" {
				return nil, errors.New(line)
			}
			if len(f) > 0 && f[0] == word {
				return f, nil
			}
		case <-t.C:
			return nil, fmt.Errorf("no %q within %v", word, limit)
		}
	}
}

// cpu is the process's CPU time so far (all its threads), in seconds.
func (c *child) cpu() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name in parentheses: state is field 3,
	// utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc stat: %q", s)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return float64(u+st) / clockTicks, nil
}

// stop closes the child's stdin and waits for it to exit (killing it after
// a minute). It is idempotent.
func (c *child) stop() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				c.err = fmt.Errorf("%v: %s", err, strings.TrimSpace(c.stderr.String()))
			}
		case <-time.After(time.Minute):
			_ = c.cmd.Process.Kill()
			<-done
			c.err = errors.New("did not exit within a minute of its stdin closing")
		}
	})
	return c.err
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// ensureBullMQ installs the bullmq package into dir (once) and writes
// runner.js beside it.
func ensureBullMQ(dir string) error {
	if _, err := exec.LookPath("node"); err != nil {
		return errors.New("node is not on PATH")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "runner.js"), bullRunner, 0o644); err != nil {
		return err
	}
	installed := func(name, version string) bool {
		pkg, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
		return err == nil && strings.Contains(string(pkg), `"version": "`+version+`"`)
	}
	if installed("bullmq", bullmqVersion) && installed("ioredis", ioredisVersion) {
		return nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return errors.New("npm is not on PATH")
	}
	fmt.Fprintf(os.Stderr, "installing bullmq@%s and ioredis@%s into %s ...\n", bullmqVersion, ioredisVersion, dir)
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", dir, "bullmq@"+bullmqVersion, "ioredis@"+ioredisVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm install bullmq@%s ioredis@%s: %v\n%s", bullmqVersion, ioredisVersion, err, out)
	}
	return nil
}

// ---- the Go children ----

// costChild runs a Go child of the cost mode (bench -role enq|worker ...).
func costChild(args []string) int {
	fs := flag.NewFlagSet("bench -role", flag.ExitOnError)
	role := fs.String("role", "", "enq or worker")
	sys := fs.String("sys", "", "tide or asynq")
	addr := fs.String("redis", "", "host:port")
	n := fs.Int("n", 0, "tasks")
	g := fs.Int("g", 1, "enq: goroutines; worker: concurrency")
	prof := fs.String("cpuprofile", "", "write a CPU profile of this process")
	benchOpts := fs.Bool("bench-rdb", false, "tide: the go-redis options of the other workloads (PoolSize 200, MinIdleConns 8) instead of the defaults")
	_ = fs.Parse(args)
	go func() { // never outlive a lost parent for long
		time.Sleep(15 * time.Minute)
		os.Exit(3)
	}()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	var err error
	switch *role {
	case "enq":
		err = costEnq(*sys, *addr, *n, *g, *benchOpts)
	case "worker":
		err = costWorker(*sys, *addr, *n, *g)
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " "))
		return 1
	}
	return 0
}

// waitStdin returns when the parent closes the child's stdin.
func waitStdin() { _, _ = io.Copy(io.Discard, os.Stdin) }

// costEnq enqueues n tasks with single calls from g goroutines, set up as a
// new user of each system writes it.
func costEnq(sys, addr string, n, g int, benchOpts bool) error {
	ctx := context.Background()
	var enqueue func(ctx context.Context, p []byte) error
	var closeAll func()
	switch sys {
	case sysTide:
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		if benchOpts {
			rdb = newRDB(addr)
		}
		c := tide.NewClient(redisbroker.New(rdb))
		enqueue = func(ctx context.Context, p []byte) error {
			_, err := c.Enqueue(ctx, tide.NewTask(taskType, p))
			return err
		}
		closeAll = func() { _ = c.Close(); _ = rdb.Close() }
	case sysAsynq:
		c := asynq.NewClient(asynq.RedisClientOpt{Addr: addr})
		enqueue = func(ctx context.Context, p []byte) error {
			_, err := c.EnqueueContext(ctx, asynq.NewTask(taskType, p))
			return err
		}
		closeAll = func() { _ = c.Close() }
	default:
		return fmt.Errorf("unknown system %q", sys)
	}
	defer closeAll()
	ps := payloads(n, kindTask, time.Now())
	fmt.Println("ready")
	fmt.Println("start", time.Now().UnixNano())
	err := spread(ctx, g, 1, n, func(ctx context.Context, i, _ int) error {
		if err := enqueue(ctx, ps[i]); err != nil {
			return fmt.Errorf("enqueue task %d: %w", i, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Println("end", time.Now().UnixNano(), n)
	waitStdin()
	return nil
}

// costWorker runs a server with the given concurrency and a no-op handler
// that notes each task, and says done when n distinct tasks have run.
func costWorker(sys, addr string, n, concurrency int) error {
	seen := make([]atomic.Bool, n)
	var got, dups atomic.Int64
	handle := func(p []byte) {
		kind, idx, _, ok := parsePayload(p)
		if !ok || kind != kindTask || idx < 0 || idx >= n || seen[idx].Swap(true) {
			dups.Add(1)
			return
		}
		if got.Add(1) == int64(n) {
			fmt.Println("done", time.Now().UnixNano(), n, dups.Load())
		}
	}
	var shutdown func()
	switch sys {
	case sysTide:
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		srv := tide.NewServer(redisbroker.New(rdb), tide.Config{
			Concurrency: concurrency,
			Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err := srv.Start(tide.HandlerFunc(func(_ context.Context, t *tide.Task) error {
			handle(t.Payload())
			return nil
		})); err != nil {
			return err
		}
		shutdown = func() { srv.Shutdown(); _ = rdb.Close() }
	case sysAsynq:
		srv := asynq.NewServer(asynq.RedisClientOpt{Addr: addr}, asynq.Config{
			Concurrency: concurrency,
			Logger:      nopLogger{},
			LogLevel:    asynq.FatalLevel,
		})
		if err := srv.Start(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
			handle(t.Payload())
			return nil
		})); err != nil {
			return err
		}
		shutdown = srv.Shutdown
	default:
		return fmt.Errorf("unknown system %q", sys)
	}
	fmt.Println("ready")
	waitStdin()
	shutdown()
	if d := dups.Load(); d > 0 {
		fmt.Fprintf(os.Stderr, "%d tasks ran twice or could not be read\n", d)
	}
	return nil
}
