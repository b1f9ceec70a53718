package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

func TestQueuesRm(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	queues := func() []string {
		qs, err := e.in.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return qs
	}
	e.enqueue("t", "{}", tide.Queue("full"), tide.TaskID("a"))
	e.enqueue("t", "{}", tide.Queue("full"), tide.TaskID("b"), tide.ProcessIn(time.Hour))
	if err := e.in.ArchiveTask(ctx, "full", "b"); err != nil {
		t.Fatal(err)
	}
	e.enqueue("t", "{}", tide.Queue("keep"))

	// A queue with tasks is refused, with what it holds and how to empty it.
	r := e.tide("queues", "rm", "full")
	if r.code != exitError || !strings.Contains(r.stderr, "tide: cannot remove queue full: queue is not empty") ||
		!strings.Contains(r.stderr, "It holds 1 pending, 1 archived. Delete its tasks first:\n    tide tasks delete full --all --state pending\n    tide tasks delete full --all --state archived") {
		t.Errorf("rm of a queue with tasks: exit %d\n%s", r.code, r.stderr)
	}
	r = e.tide("queues", "rm", "full", "--json")
	if msg, code := jsonError(t, r); code != exitError || !strings.Contains(msg, "queue is not empty") {
		t.Errorf("--json: %d %q", code, msg)
	}
	if !slices.Contains(queues(), "full") {
		t.Fatal("the refused queue was removed")
	}
	// Unknown: exit 3, like pause.
	r = e.tide("queues", "rm", "nosuch")
	if r.code != exitNotFound || !strings.Contains(r.stderr, `no queue "nosuch"`) || !strings.Contains(r.stderr, "queues: full, keep") {
		t.Errorf("rm of an unknown queue: exit %d\n%s", r.code, r.stderr)
	}
	if r := e.tide("queues", "rm", "bad queue"); r.code != exitUsage {
		t.Errorf("rm of an invalid name: exit %d\n%s", r.code, r.stderr)
	}

	// Emptied, it goes.
	e.tide("tasks", "delete", "full", "--all", "--state", "pending").want(t, exitOK)
	e.tide("tasks", "delete", "full", "--all", "--state", "archived").want(t, exitOK)
	e.tide("queues", "rm", "full").want(t, exitOK, "Queue full removed.")
	if qs := queues(); !slices.Equal(qs, []string{"keep"}) {
		t.Errorf("queues after rm: %q", qs)
	}
	e.tide("queues", "rm", "full").want(t, exitNotFound)

	// Every partition of a partitioned queue, and its recorded count, go;
	// the alias and --json work.
	b4 := redisbroker.New(redistest.Client(t, e.addr), redisbroker.WithPrefix(e.prefix), redisbroker.WithPartitions(4))
	c4 := tide.NewClient(b4)
	for _, id := range []string{"w1", "w2", "w3", "w4", "w5", "w6"} {
		if _, err := c4.Enqueue(ctx, tide.NewTask("t", nil), tide.Queue("wide"), tide.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	e.tide("tasks", "delete", "wide", "--all", "--state", "pending").want(t, exitOK, "Deleted 6 tasks")
	r = e.tide("queues", "delete", "wide", "--json")
	r.want(t, exitOK)
	var out struct {
		Queue   string `json:"queue"`
		Removed bool   `json:"removed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Queue != "wide" || !out.Removed {
		t.Errorf("rm --json: %v %s", err, r.stdout)
	}
	rdb := redistest.Client(t, e.addr)
	if n, err := rdb.HExists(ctx, e.prefix+":partitions", "wide").Result(); err != nil || n {
		t.Errorf("the partition count of wide is still recorded: %v %v", n, err)
	}
	// (Only the broker's request caches, which expire, may be left.)
	keys, err := rdb.Keys(ctx, e.prefix+"*wide*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl, err := rdb.TTL(ctx, k).Result(); err != nil || ttl <= 0 {
			t.Errorf("key %s of wide is left (TTL %v, %v)", k, ttl, err)
		}
	}
	if qs := queues(); !slices.Equal(qs, []string{"keep"}) {
		t.Errorf("queues after rm: %q", qs)
	}
}

// pause --for pauses the queue with an end, which 'tide queues' shows, and
// refuses a duration that is not positive.
func TestPauseFor(t *testing.T) {
	e := setup(t)
	e.enqueue("t", "{}", tide.Queue("pay"))
	e.tide("pause", "pay", "--for", "15m").want(t, exitOK, "Queue pay paused for 15m0s; it resumes by itself.")
	qi, err := e.in.QueueInfo(context.Background(), "pay")
	if err != nil || !qi.Paused || time.Until(qi.PausedUntil) < 14*time.Minute || time.Until(qi.PausedUntil) > 15*time.Minute+time.Second { // the broker reads the Redis clock
		t.Fatalf("after pause --for 15m: %+v, %v", qi, err)
	}
	e.tide("queues").want(t, exitOK, "for 1")
	r := e.tide("queues", "--json")
	r.want(t, exitOK, `"paused_until": "`)
	if r := e.tide("pause", "pay", "--for", "-5m"); r.code != exitUsage || !strings.Contains(r.stderr, "--for") {
		t.Errorf("pause --for -5m: exit %d\n%s", r.code, r.stderr)
	}
	e.tide("unpause", "pay").want(t, exitOK, "Queue pay unpaused.")
	if qi, err := e.in.QueueInfo(context.Background(), "pay"); err != nil || qi.Paused || !qi.PausedUntil.IsZero() {
		t.Fatalf("after unpause: %+v, %v", qi, err)
	}
}
