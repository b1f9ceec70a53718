package chaos

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
)

// modelFaultCycle is the faults of one unit of scale on Redis, at offsets
// from its start (modelActive long).
var modelFaultCycle = []struct {
	at   time.Duration
	kind string
}{
	{1500 * time.Millisecond, "kill"},
	{3000 * time.Millisecond, "rolling"},
	{4200 * time.Millisecond, "delay start"},
	{5500 * time.Millisecond, "kill"},
	{6500 * time.Millisecond, "drop start"},
	{7700 * time.Millisecond, "delay end"},
	{7900 * time.Millisecond, "drop end"},
}

// Replies each delay and drop fault hits: go-redis (and the broker, with
// the same request ID) sends those commands again.
const modelResendFaults = 10

// TestFlowModel runs the flow model (see runFlowModel) on Redis with three
// server processes behind the fault proxy. Per unit of scale: two workers
// SIGKILLed and restarted, a rolling restart of all three (SIGTERM, a
// graceful Shutdown that interrupts slow tasks, a goroutine-leak check),
// and replies to the brokers' scripts delayed past the read timeout, then
// dropped, for the servers, the producer and the operator alike. The log
// of the model and the final reads go to Redis directly.
func TestFlowModel(t *testing.T) {
	dir := runDir(t, "flowmodel-")
	rs := redistest.StartIn(t, dir)
	px, err := faultproxy.New(rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	const prefix = "fm"
	crdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: workerReadTimeout})
	t.Cleanup(func() { _ = crdb.Close() })
	b := redisbroker.New(crdb, redisbroker.WithPrefix(prefix))
	ordb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = ordb.Close() })
	obs := tide.NewInspector(redisbroker.New(ordb, redisbroker.WithPrefix(prefix)))
	rec := newRedisRecorder(ordb, prefix, "fm")

	f := newFleet(t, dir, px.Addr(), prefix)
	f.awaitReady = true
	f.env = []string{envModel + "=fm", envDirect + "=" + rs.Addr}
	names := []string{"w1", "w2", "w3"}
	for _, n := range names {
		f.start(n)
	}
	var restartErrs []error
	env := &modelEnv{
		name:   "redis (3 server processes behind the fault proxy)",
		client: tide.NewClient(b),
		insp:   tide.NewInspector(b),
		obs:    obs,
		rec:    rec,
		faults: func(stop <-chan struct{}, r *rand.Rand) map[string]int {
			out := map[string]int{}
			start := time.Now()
			victim := r.IntN(len(names))
			for cycle := 0; ; cycle++ {
				for _, ev := range modelFaultCycle {
					at := start.Add(time.Duration(cycle)*modelActive + ev.at)
					timer := time.NewTimer(time.Until(at))
					select {
					case <-stop:
						timer.Stop()
						out["replies dropped"] = int(px.Dropped())
						return out
					case <-timer.C:
					}
					var mark string
					switch ev.kind {
					case "kill":
						name := names[victim%len(names)]
						victim++
						inc := f.killAndRestart(name)
						mark = fmt.Sprintf("K %s.%d", name, inc)
						out["SIGKILL"]++
					case "rolling":
						for _, n := range names {
							if err := f.restart(n, workerShutdown+30*time.Second); err != nil {
								restartErrs = append(restartErrs, err)
							}
							out["graceful restart"]++
						}
					case "delay start":
						mark = "F delay start"
						px.DelayReplies(faultproxy.Commands("EVALSHA"), workerReadTimeout+500*time.Millisecond, modelResendFaults)
						out["replies delayed past the read timeout"] += modelResendFaults
					case "drop start":
						mark = "F drop start"
						px.DropReplies(faultproxy.Commands("EVALSHA"), modelResendFaults)
					case "delay end":
						mark = "F delay end"
					case "drop end":
						mark = "F drop end"
					}
					if mark != "" {
						if _, _, err := rec.add(t.Context(), mark, ""); err != nil {
							t.Errorf("model log: %v", err)
						}
					}
				}
			}
		},
		calm: func() {
			px.Clear()
			if _, _, err := rec.add(t.Context(), "F delay end", ""); err != nil {
				t.Errorf("model log: %v", err)
			}
			if _, _, err := rec.add(t.Context(), "F drop end", ""); err != nil {
				t.Errorf("model log: %v", err)
			}
		},
		stop: func() []error {
			return append(restartErrs, f.shutdown(workerShutdown+30*time.Second)...)
		},
	}
	runFlowModel(t, env)
	t.Logf("proxy: %d EVALSHA seen, %d replies dropped", px.Seen("EVALSHA"), px.Dropped())
}

// TestFlowModelMem runs the same model on membroker, in process: three
// servers on one broker, one of them shut down gracefully and replaced
// every 300 to 900 ms, with the same operator actions. A shutdown that
// had to abandon handlers (only a starved machine takes that long) counts
// as a kill of that server.
func TestFlowModelMem(t *testing.T) {
	b := membroker.New()
	t.Cleanup(func() { _ = b.Close() })
	rec := &memRecorder{}
	logger := slog.New(slog.DiscardHandler)
	var mu sync.Mutex
	servers := make([]*tide.Server, 3)
	incs := make([]int, 3)
	start := func(i int) error {
		incs[i]++
		h := &modelHandler{rec: rec, name: fmt.Sprintf("m%d.%d", i, incs[i])}
		s := tide.NewServer(b, modelServerConfig(logger, h.name))
		if err := s.Start(h); err != nil {
			return err
		}
		servers[i] = s
		return nil
	}
	for i := range servers {
		if err := start(i); err != nil {
			t.Fatalf("Start: %v", err)
		}
	}
	stopAll := func() []error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range servers {
			s.Shutdown()
		}
		return nil
	}
	env := &modelEnv{
		name:   "membroker (3 servers in process)",
		client: tide.NewClient(b),
		insp:   tide.NewInspector(b),
		obs:    tide.NewInspector(b),
		rec:    rec,
		faults: func(stop <-chan struct{}, r *rand.Rand) map[string]int {
			out := map[string]int{}
			for {
				timer := time.NewTimer(time.Duration(300+r.IntN(600)) * time.Millisecond)
				select {
				case <-stop:
					timer.Stop()
					return out
				case <-timer.C:
				}
				i := r.IntN(len(servers))
				mu.Lock()
				name := fmt.Sprintf("m%d.%d", i, incs[i])
				began := time.Now()
				servers[i].Shutdown()
				if time.Since(began) >= modelShutdown+time.Second {
					// The server gave up on handlers that had not returned
					// within ShutdownTimeout and a second more (a starved
					// machine): their settlements are dropped and their
					// tasks come back through lease recovery, as after a
					// SIGKILL.
					if _, _, err := rec.add(t.Context(), "K "+name, ""); err != nil {
						t.Errorf("model log: %v", err)
					}
					out["graceful restart that abandoned handlers"]++
				}
				err := start(i)
				mu.Unlock()
				if err != nil {
					t.Errorf("Start: %v", err)
					return out
				}
				out["graceful restart"]++
			}
		},
		calm: func() {},
		stop: stopAll,
	}
	runFlowModel(t, env)
}
