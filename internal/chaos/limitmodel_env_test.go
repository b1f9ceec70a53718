package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// TestLimitModel runs the limit model (see runLimitModel) on Redis with
// three server processes of two partitions' queues: w1 and w2 on Redis
// directly, w3 through its own fault proxy. Per unit of scale: w1 or w2 is
// SIGKILLed (and restarted) while it runs tasks, a queue is repartitioned,
// and w3 is cut off from Redis for longer than its lease (requests held,
// or connections refused), so that its slots are recovered by the others
// while its handlers must already have stopped. The producer, the operator
// and the log talk to Redis directly.
func TestLimitModel(t *testing.T) {
	if os.Getenv("TIDE_LIMITMODEL_REDIS") == "" {
		t.Skip("the limit model on Redis (server processes, a SIGKILL, a network cut; about 35 s) runs alone, with " +
			"TIDE_LIMITMODEL_REDIS=1, after the test command in .ci/run: its bounds (a second of idle, half a second " +
			"for a late start record) are those of a machine that is not overloaded, as it is while every package's tests run")
	}
	dir := runDir(t, "limitmodel-")
	rs := redistest.StartIn(t, dir)
	px, err := faultproxy.New(rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	const prefix = "lm"
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(limitPartitions))
	rec := newRedisRecorder(rdb, prefix, "lm")
	t.Cleanup(func() {
		if err := rec.clear(context.Background()); err != nil {
			t.Errorf("clear the model log: %v", err)
		}
	})

	f := newFleet(t, dir, rs.Addr, prefix)
	f.awaitReady = true
	f.env = []string{envModel + "=lm", envDirect + "=" + rs.Addr}
	f.setEnv("w3", envAddr+"="+px.Addr())
	names := []string{"w1", "w2", "w3"}
	logMark := func(line string) {
		if _, _, err := rec.add(context.Background(), line, ""); err != nil {
			t.Errorf("model log: %v", err)
		}
	}
	runLimitModel(t, &limitEnv{
		name:        "redis (3 server processes, one behind the fault proxy)",
		client:      tide.NewClient(b),
		insp:        tide.NewInspector(b),
		rec:         rec,
		servers:     len(names),
		repartition: true,
		start: func() {
			for _, n := range names {
				f.start(n)
			}
			testwait.For(t, 60*time.Second, "the servers to start", func() bool {
				lines, err := rec.lines(context.Background())
				up := 0
				for _, l := range lines {
					if strings.HasPrefix(l.text, "U ") {
						up++
					}
				}
				return err == nil && up == len(names)
			})
		},
		fault: func(kind string, u int, _ *rand.Rand) string {
			switch kind {
			case "kill":
				name := names[u%2]
				inc := f.killAndRestart(name)
				logMark(fmt.Sprintf("K %s.%d", name, inc))
				return "SIGKILL"
			case "cut":
				// When w3 runs a long task (or after 4 s): its handler must
				// stop before its lease can have ended.
				waitLong(t, rec, "w3", 4*time.Second)
				logMark("C start w3")
				how := "cut off (requests held)"
				if u%2 == 0 {
					px.Pause()
					time.Sleep(lmCutFor)
					px.Resume()
				} else {
					how = "cut off (connections refused)"
					px.Cut(lmCutFor)
					for px.Down() {
						time.Sleep(10 * time.Millisecond)
					}
				}
				logMark("C end w3")
				return how
			}
			return ""
		},
		stop: func() []error { return f.shutdown(workerShutdown + 30*time.Second) },
	})
}

// TestLimitModelMem runs the same model on membroker, in process: three
// servers on one broker, and in place of the SIGKILL and the cut a server
// shut down gracefully (its long tasks interrupted and requeued) and
// replaced. membroker has no partitions: no Repartition.
func TestLimitModelMem(t *testing.T) {
	b := membroker.New()
	t.Cleanup(func() { _ = b.Close() })
	rec := &memRecorder{}
	logger := slog.New(slog.DiscardHandler)
	var mu sync.Mutex
	servers := make([]*tide.Server, 3)
	names := make([]string, 3)
	incs := make([]int, 3)
	start := func(i int) {
		incs[i]++
		names[i] = fmt.Sprintf("m%d.%d", i+1, incs[i])
		h := &limitHandler{rec: rec, name: names[i]}
		s := tide.NewServer(b, limitServerConfig(logger, names[i]))
		if err := s.Start(h); err != nil {
			t.Fatalf("Start: %v", err)
		}
		servers[i] = s
		_, _, _ = rec.add(context.Background(), "U "+names[i], "")
	}
	runLimitModel(t, &limitEnv{
		name:    "membroker (3 servers in process)",
		client:  tide.NewClient(b),
		insp:    tide.NewInspector(b),
		rec:     rec,
		servers: len(servers),
		start: func() {
			mu.Lock()
			defer mu.Unlock()
			for i := range servers {
				start(i)
			}
		},
		fault: func(kind string, u int, _ *rand.Rand) string {
			mu.Lock()
			defer mu.Unlock()
			i := (u + map[string]int{"kill": 0, "cut": 1}[kind]) % len(servers)
			old := names[i]
			_, _, _ = rec.add(context.Background(), "G begin "+old, "")
			servers[i].Shutdown()
			start(i)
			_, _, _ = rec.add(context.Background(), "G end "+old, "")
			return "graceful restart"
		},
		stop: func() []error {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range servers {
				s.Shutdown()
			}
			return nil
		},
	})
}

// waitLong waits until server name (any incarnation) runs a task of the
// limit model whose plan lasts lmLong or more, at most d.
func waitLong(t *testing.T, rec recorder, name string, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		lines, err := rec.lines(context.Background())
		if err != nil {
			t.Errorf("model log: %v", err)
			return
		}
		long := map[string]bool{}   // id|version of the long tasks
		open := map[string]string{} // token -> id|version, of name's runs
		for _, l := range lines {
			f := strings.Fields(l.text)
			switch {
			case f[0] == "N" && len(f) == 8:
				if p, err := parseLmPlan(f[5]); err == nil && p.kind == "ok" && p.ms >= lmLong {
					long[f[3]+"|"+f[4]] = true
				}
			case f[0] == "S" && len(f) == 6 && strings.HasPrefix(f[5], name+"."):
				open[f[5]] = f[3] + "|" + f[4]
			case f[0] == "E" && len(f) == 5:
				delete(open, f[3])
			}
		}
		for _, k := range open {
			if long[k] {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLimitModelReplay checks a limit model log kept by a failed run
// (TIDE_CHAOS_KEEP) again: TIDE_LIMITMODEL_REPLAY names the file. Skipped
// without it.
func TestLimitModelReplay(t *testing.T) {
	path := os.Getenv("TIDE_LIMITMODEL_REPLAY")
	if path == "" {
		t.Skip("TIDE_LIMITMODEL_REPLAY names a kept limit model log to check again")
	}
	lines, err := readKeptLines(path)
	if err != nil {
		t.Fatal(err)
	}
	fig := checkLimitModel(t, lines)
	t.Logf("%s", fig.summary())
}
