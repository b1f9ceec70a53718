package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The crash workload re-executes the bench binary as a worker process (these
// environment variables select the child mode), waits until its handler has
// started the task, SIGKILLs it and measures until the task starts again in
// a server of the parent process.
const (
	envChild    = "TIDE_BENCH_CHILD" // system name
	envRedis    = "TIDE_BENCH_REDIS"
	envLease    = "TIDE_BENCH_LEASE"
	startedKey  = "tide-bench:crash:started"
	childMaxRun = 5 * time.Minute
)

// childMain runs the worker process: a server whose handler records that it
// started, then blocks until the process is killed.
func childMain(kind string) int {
	if os.Getenv(envRole) == "rolling" {
		return rollingChild(kind)
	}
	go func() { // never outlive a lost parent for long
		time.Sleep(childMaxRun)
		os.Exit(3)
	}()
	addr := os.Getenv(envRedis)
	lease, _ := time.ParseDuration(os.Getenv(envLease))
	s, err := newSystem(kind, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	mark := redis.NewClient(&redis.Options{Addr: addr})
	_, err = s.startServer(serverConfig{concurrency: 10, lease: lease}, func(ctx context.Context, p []byte) error {
		if err := mark.Set(context.Background(), startedKey, time.Now().UnixNano(), 0).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "child: mark started:", err)
		}
		select { // the parent kills us here
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(childMaxRun):
			return errors.New("child: not killed")
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	select {}
}

func runCrash(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	if err := s.enqueue(ctx, defaultQueue, makePayload(kindTask, 0, time.Now()), time.Time{}); err != nil {
		return nil, err
	}

	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envChild+"="+kind, envRedis+"="+e.addr, envLease+"="+e.sz.crashLease.String())
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker process: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	// Wait for the child's handler to start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := e.admin.Exists(ctx, startedKey).Result()
		if err != nil {
			return nil, err
		}
		if n == 1 {
			break
		}
		select {
		case err := <-exited:
			killed = true
			return nil, fmt.Errorf("worker process exited before starting the task: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("worker process did not start the task within 30s\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Second) // mid-task
	select {
	case err := <-exited:
		killed = true
		return nil, fmt.Errorf("worker process exited on its own: %v\n%s", err, out.String())
	default:
	}
	killedAt := time.Now()
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		return nil, err
	}
	<-exited
	killed = true

	rec := newRecorder(1)
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency, lease: e.sz.crashLease}, rec.handle)
	if err != nil {
		return nil, err
	}
	defer srv.stop(time.Minute)
	werr := rec.wait(ctx, e.sz.crashCap)
	if werr != nil {
		if rec.got.Load() == 0 && ctx.Err() == nil {
			e.note("crash/%s: the task had not started again %v after the kill; gave up (cap, see -crash-cap)", kind, e.sz.crashCap)
			return results{"crash": {v: ms(e.sz.crashCap), atLeast: true}}, nil
		}
		return nil, werr
	}
	took := time.Unix(0, rec.starts[0].Load()).Sub(killedAt)
	startedNs, _ := e.admin.Get(ctx, startedKey).Result()
	if ns, err := strconv.ParseInt(startedNs, 10, 64); err == nil {
		e.note("crash/%s: killed %v after the worker started the task; restarted %v after the kill", kind, killedAt.Sub(time.Unix(0, ns)).Round(time.Millisecond), took.Round(time.Millisecond))
	}
	return results{"crash": {v: ms(took)}}, nil
}
