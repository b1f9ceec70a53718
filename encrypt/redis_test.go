package encrypt_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/brokertest"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// TestConformanceRedis runs the broker suite on a wrapped Redis broker, with
// one and with four partitions per queue.
func TestConformanceRedis(t *testing.T) {
	addr := redistest.Addr(t)
	key := newKey(t, 1)
	for name, parts := range map[string]int{"OnePartition": 1, "FourPartitions": 4} {
		t.Run(name, func(t *testing.T) {
			brokertest.Run(t, func(t *testing.T) broker.Broker {
				b := redisbroker.New(redistest.Client(t, addr),
					redisbroker.WithPrefix(redistest.Prefix(t)), redisbroker.WithPartitions(parts))
				w := wrap(t, b, key)
				t.Cleanup(func() { _ = w.Close() })
				return w
			})
		})
	}
}

// redisScenario stores tasks in every state that keeps a payload, with a
// result, through b; it returns the plaintexts it used.
func redisScenario(t *testing.T, b broker.Broker) [][]byte {
	t.Helper()
	ctx := context.Background()
	plains := map[string][]byte{}
	for _, name := range []string{"pending", "scheduled", "archived", "completed", "result", "unique", "retry", "step", "signal"} {
		plains[name] = []byte("PLAINTEXT-" + name + "-4111-1111-1111-1111")
	}
	c := tide.NewClient(b)
	enq := func(name string, opts ...tide.Option) *tide.TaskInfo {
		t.Helper()
		info, err := c.Enqueue(ctx, tide.NewTask("test:"+name, plains[name], opts...))
		if err != nil {
			t.Fatalf("Enqueue %s: %v", name, err)
		}
		return info
	}
	enq("pending", tide.Queue("pending"))
	enq("scheduled", tide.ProcessIn(time.Hour))
	enq("unique", tide.Unique(time.Hour), tide.Queue("unique"))
	for _, name := range []string{"archived", "completed", "retry"} {
		enq(name, tide.Queue(name), tide.Retention(time.Hour))
		ds, err := b.Dequeue(ctx, []string{name}, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Dequeue %s: %v, %v", name, ds, err)
		}
		d := ds[0]
		if !bytes.Equal(d.Task.Payload, plains[name]) {
			t.Fatalf("delivered %s payload %q", name, d.Task.Payload)
		}
		if err := b.SetResult(ctx, d.Lease(), plains["result"]); err != nil {
			t.Fatal(err)
		}
		s := broker.Settlement{Lease: d.Lease(), Task: d.Task, At: time.Now()}
		switch name {
		case "archived":
			s.Kind, s.Err = broker.SettleArchive, "failed for good"
		case "completed":
			s.Kind = broker.SettleDone
		case "retry":
			s.Kind, s.Err, s.RetryAt = broker.SettleRetry, "again", time.Now().Add(time.Hour)
		}
		settle(t, b, s)
	}
	// A durable handler's step result and a signal's payload: sealed at
	// rest, read back in plain.
	enq("step", tide.Queue("durable"))
	ds, err := b.Dequeue(ctx, []string{"durable"}, 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Dequeue durable: %v, %v", ds, err)
	}
	if _, err := b.SaveStep(ctx, ds[0].Lease(), broker.StepRecord{Kind: broker.StepResult, Name: "s", Data: plains["step"]}); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, "durable", ds[0].Task.ID, "paid", string(plains["signal"])); err != nil {
		t.Fatal(err)
	}
	rs, err := b.LoadSteps(ctx, ds[0].Lease())
	if err != nil || len(rs) != 2 || !bytes.Equal(rs[0].Data, plains["step"]) || !bytes.Contains(rs[1].Data, plains["signal"]) {
		t.Fatalf("LoadSteps = %+v, %v; want both records in plain", rs, err)
	}
	r, ok, err := b.ResolveWait(ctx, ds[0].Lease(), "paid", time.Now().Add(time.Hour))
	if err != nil || !ok || !bytes.Contains(r.Data, plains["signal"]) {
		t.Fatalf("ResolveWait = %+v, %v, %v; want the signal in plain", r, ok, err)
	}
	var out [][]byte
	for _, p := range plains {
		out = append(out, p)
	}
	return out
}

// dumpRedis returns every key, field, member and value under prefix.
func dumpRedis(t *testing.T, rdb *redis.Client, prefix string) []byte {
	t.Helper()
	ctx := context.Background()
	var all bytes.Buffer
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatalf("no keys under %q", prefix)
	}
	for _, k := range keys {
		all.WriteString(k + "\n")
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var vals []string
		switch typ {
		case "string":
			v, err := rdb.Get(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			vals = []string{v}
		case "hash":
			m, err := rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			for f, v := range m {
				vals = append(vals, f, v)
			}
		case "list":
			vals, err = rdb.LRange(ctx, k, 0, -1).Result()
		case "zset":
			vals, err = rdb.ZRange(ctx, k, 0, -1).Result()
		case "set":
			vals, err = rdb.SMembers(ctx, k).Result()
		default:
			t.Fatalf("key %s has type %s, which the test does not read", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			all.WriteString(v + "\n")
		}
	}
	return all.Bytes()
}

// TestRedisHoldsNoPlaintext reads everything the Redis broker stored, raw:
// through the wrapper no payload or result appears in it; through a plain
// broker (the control, proving the scan sees values) every one does.
func TestRedisHoldsNoPlaintext(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t, addr)
	for _, encrypted := range []bool{true, false} {
		t.Run(fmt.Sprint("encrypted=", encrypted), func(t *testing.T) {
			prefix := redistest.Prefix(t)
			var b broker.Broker = redisbroker.New(redistest.Client(t, addr),
				redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(4))
			if encrypted {
				b = wrap(t, b, newKey(t, 1))
			}
			t.Cleanup(func() { _ = b.Close() })
			plains := redisScenario(t, b)
			dump := dumpRedis(t, rdb, prefix+":")
			for _, p := range plains {
				if found := bytes.Contains(dump, p); found == encrypted {
					t.Errorf("%q found in Redis: %v, want %v", p, found, !encrypted)
				}
			}
		})
	}
}

// TestRedisRawRecords reads the Redis broker's records with a plain broker (a
// process without keys): sealed payloads and results; a unique task whose ID
// the broker drew (four partitions) is bound to its unique key and reads
// back; a completed task kept with Retention, which the Redis broker writes
// again from the settlement, is sealed again, bound to its ID.
func TestRedisRawRecords(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	plain := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(4))
	t.Cleanup(func() { _ = plain.Close() })
	inner := redisbroker.New(redistest.Client(t, addr), redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(4))
	b := wrap(t, inner, newKey(t, 3))
	t.Cleanup(func() { _ = b.Close() })

	const payload, result = "unique secret payload", "unique secret result"
	info, err := tide.NewClient(b).Enqueue(ctx, tide.NewTask("test:unique", []byte(payload),
		tide.Unique(time.Hour), tide.Retention(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	raw := get(t, plain, "default", info.ID)
	checkSealed(t, "unique payload", raw.Payload, []byte(payload), 3)
	if h := headerOf(raw.Payload); h.binding != 'U' {
		t.Errorf("unique task without ID bound with %q, want 'U'", h.binding)
	}
	if got := get(t, b, "default", info.ID); string(got.Payload) != payload {
		t.Fatalf("unique task: payload %q LastErr %q", got.Payload, got.LastErr)
	}

	ds := dequeue(t, b, "default", 1)
	if len(ds) != 1 || string(ds[0].Task.Payload) != payload {
		t.Fatalf("Dequeue: %v", ds)
	}
	if err := b.SetResult(ctx, ds[0].Lease(), []byte(result)); err != nil {
		t.Fatal(err)
	}
	settle(t, b, broker.Settlement{Lease: ds[0].Lease(), Kind: broker.SettleDone, Task: ds[0].Task, At: time.Now()})
	raw = get(t, plain, "default", info.ID)
	if raw.State != tidetype.StateCompleted {
		t.Fatalf("task is %v, want completed", raw.State)
	}
	checkSealed(t, "completed payload", raw.Payload, []byte(payload), 3)
	checkSealed(t, "completed result", raw.Result, []byte(result), 3)
	if h := headerOf(raw.Payload); h.binding != 'I' {
		t.Errorf("completed task sealed again with binding %q, want 'I'", h.binding)
	}
	got := get(t, b, "default", info.ID)
	if string(got.Payload) != payload || string(got.Result) != result || got.LastErr != "" {
		t.Errorf("completed task: payload %q result %q LastErr %q", got.Payload, got.Result, got.LastErr)
	}
}
