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
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMasterName is the name the sentinels of StartSentinel monitor.
const SentinelMasterName = "mymaster"

// SentinelDownAfter is the down-after-milliseconds of those sentinels: a
// master unreachable this long is subjectively down, and the failover
// starts once two sentinels agree.
const SentinelDownAfter = 1000 * time.Millisecond

// Sentinel is a monitored master with one replica and three sentinels,
// each a process on a loopback port in a temp dir of its own, stopped when
// the test ends.
type Sentinel struct {
	Master    *Server   // the master at start
	Replica   *Server   // its replica at start
	Sentinels []*Server // the three sentinels

	mu   sync.Mutex
	dead map[string]bool
}

// StartSentinel starts a master, a replica of it and three sentinels
// (quorum 2, down-after 1s, failover-timeout 5s) and waits until every
// sentinel knows the master, the replica in sync and the two other
// sentinels, so that a failover can start as soon as the master dies. It
// fails t when redis-server is not installed or the setup does not settle
// in time.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH (install it, e.g. apt-get install -y redis-server): %v", err)
	}
	s := &Sentinel{dead: map[string]bool{}}
	// Registered first, so it runs last, after the test's clients closed:
	// a go-redis pool retries dialing a dead server from a goroutine that
	// sleeps a second between tries and notices the pool's Close only then.
	t.Cleanup(func() {
		s.mu.Lock()
		killed := len(s.dead) > 0
		s.mu.Unlock()
		if killed {
			time.Sleep(1100 * time.Millisecond)
		}
	})
	s.Master = Start(t, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = Start(t, "--replicaof", host, port, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
	if err := waitFor(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		info, err := infoMap(ctx, s.Replica.Addr, "replication")
		if err != nil {
			return err
		}
		if info["master_link_status"] != "up" {
			return fmt.Errorf("replica %s: master_link_status:%s", s.Replica.Addr, info["master_link_status"])
		}
		return nil
	}); err != nil {
		t.Fatalf("the replica did not sync: %v", err)
	}
	for range 3 {
		s.Sentinels = append(s.Sentinels, startSentinel(t, bin, s.Master.Addr))
	}
	if err := waitFor(60*time.Second, s.settled); err != nil {
		t.Fatalf("the sentinels did not settle within 60s: %v%s", err, s.logs())
	}
	return s
}

// startSentinel starts one sentinel monitoring master, retrying on port
// races.
func startSentinel(t testing.TB, bin, master string) *Server {
	t.Helper()
	dir := t.TempDir()
	host, mport, _ := net.SplitHostPort(master)
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := strings.Join([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"protected-mode no",
			"dir " + dir,
			"logfile " + filepath.Join(dir, "redis.log"),
			"sentinel resolve-hostnames no",
			fmt.Sprintf("sentinel monitor %s %s %s 2", SentinelMasterName, host, mport),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMasterName, SentinelDownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s 5000", SentinelMasterName),
			fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMasterName),
			"",
		}, "\n")
		// A sentinel rewrites its config file, so each attempt writes a
		// fresh one.
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatalf("write sentinel config: %v", err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir}
		if lastErr = s.launch(bin, []string{conf, "--sentinel"}, 5*time.Second); lastErr != nil {
			continue
		}
		t.Cleanup(s.Stop)
		return s
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	t.Fatalf("sentinel did not start: %v\n%s", lastErr, log)
	return nil
}

// settled reports nil once every sentinel sees the master up, its replica
// up and the two other sentinels.
func (s *Sentinel) settled() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, sn := range s.Sentinels {
		rdb := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
		m, err := rdb.Master(ctx, SentinelMasterName).Result()
		if err != nil {
			rdb.Close()
			return fmt.Errorf("sentinel %s: SENTINEL MASTER: %w", sn.Addr, err)
		}
		if m["flags"] != "master" {
			rdb.Close()
			return fmt.Errorf("sentinel %s sees the master with flags %q", sn.Addr, m["flags"])
		}
		if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
			rdb.Close()
			return fmt.Errorf("sentinel %s sees %s replicas and %s other sentinels, want 1 and 2", sn.Addr, m["num-slaves"], m["num-other-sentinels"])
		}
		reps, err := rdb.Replicas(ctx, SentinelMasterName).Result()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: SENTINEL REPLICAS: %w", sn.Addr, err)
		}
		if len(reps) != 1 || reps[0]["flags"] != "slave" || reps[0]["master-link-status"] != "ok" {
			return fmt.Errorf("sentinel %s sees replicas %v", sn.Addr, reps)
		}
	}
	return nil
}

// MasterName returns the name the sentinels monitor the master under.
func (s *Sentinel) MasterName() string { return SentinelMasterName }

// SentinelAddrs returns the addresses of the sentinels.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		out[i] = sn.Addr
	}
	return out
}

// FailoverClient returns a client that finds the master through the
// sentinels and follows failovers, closed when t ends. opts may adjust the
// options before the client is made.
func (s *Sentinel) FailoverClient(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	o := &redis.FailoverOptions{MasterName: s.MasterName(), SentinelAddrs: s.SentinelAddrs()}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Kill kills the master, the replica or a sentinel at addr with SIGKILL and
// waits for it to exit.
func (s *Sentinel) Kill(addr string) {
	var srv *Server
	for _, x := range append([]*Server{s.Master, s.Replica}, s.Sentinels...) {
		if x.Addr == addr {
			srv = x
		}
	}
	if srv == nil {
		panic("redistest: Kill: no server of the sentinel setup at " + addr)
	}
	s.mu.Lock()
	s.dead[addr] = true
	s.mu.Unlock()
	srv.Stop()
}

// WaitFailover waits until every live sentinel reports a master other than
// old and that server says it is a master, and returns its address. It
// fails t after timeout.
func (s *Sentinel) WaitFailover(t testing.TB, old string, timeout time.Duration) string {
	t.Helper()
	var addr string
	err := waitFor(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addr = ""
		for _, sn := range s.Sentinels {
			s.mu.Lock()
			dead := s.dead[sn.Addr]
			s.mu.Unlock()
			if dead {
				continue
			}
			rdb := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
			hp, err := rdb.GetMasterAddrByName(ctx, SentinelMasterName).Result()
			rdb.Close()
			if err != nil {
				return fmt.Errorf("sentinel %s: %w", sn.Addr, err)
			}
			a := net.JoinHostPort(hp[0], hp[1])
			if a == old {
				return fmt.Errorf("sentinel %s still names %s", sn.Addr, old)
			}
			if addr != "" && a != addr {
				return fmt.Errorf("sentinels disagree: %s and %s", addr, a)
			}
			addr = a
		}
		info, err := infoMap(ctx, addr, "replication")
		if err != nil {
			return err
		}
		if info["role"] != "master" {
			return fmt.Errorf("%s has role %s", addr, info["role"])
		}
		return nil
	})
	if err != nil {
		t.Fatalf("no failover within %v: %v%s", timeout, err, s.logs())
	}
	return addr
}

// waitFor polls f every 50ms until it returns nil or timeout passes, and
// returns its last error.
func waitFor(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Sentinel) logs() string {
	var b strings.Builder
	for _, x := range append([]*Server{s.Master, s.Replica}, s.Sentinels...) {
		data, _ := os.ReadFile(filepath.Join(x.Dir, "redis.log"))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "\n--- %s (last lines of redis.log) ---\n%s", x.Addr, strings.Join(lines, "\n"))
	}
	return b.String()
}
