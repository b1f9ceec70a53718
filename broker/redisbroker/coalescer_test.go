package redisbroker_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// TestConcurrentEnqueueSharesRoundTrips checks that many goroutines enqueueing
// at once all get their own correct results (stored, or ID conflict) and that
// fewer EVALSHA calls than tasks reached Redis.
func TestConcurrentEnqueueSharesRoundTrips(t *testing.T) {
	addr := redistest.Start(t).Addr // own server: the command count is ours alone
	rdb := redistest.Client(t, addr)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	const workers, per = 16, 200
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				id := fmt.Sprintf("%d-%d", w, i)
				if i%50 == 0 {
					id = fmt.Sprintf("shared-%d", i) // every worker races for these IDs
				}
				m := &tidetype.TaskInfo{ID: id, Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now()}
				errs, err := b.Enqueue(ctx, []*tidetype.TaskInfo{m}, broker.EnqueueOptions{})
				if err != nil {
					errc <- err
					return
				}
				if errs[0] != nil && !(i%50 == 0 && errors.Is(errs[0], broker.ErrTaskIDConflict)) {
					errc <- fmt.Errorf("%s: %w", id, errs[0])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	unique := workers*(per-per/50) + per/50
	calls := evalshaCalls(t, rdb.Info(ctx, "commandstats").Val())
	ds, err := b.Dequeue(ctx, []string{"q"}, 100000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != unique {
		t.Fatalf("stored %d tasks, want %d", len(ds), unique)
	}
	if calls >= workers*per {
		t.Fatalf("%d script calls for %d enqueues: concurrent calls did not share round trips", calls, workers*per)
	}
	t.Logf("%d enqueues from %d goroutines took %d script calls", workers*per, workers, calls)
}

// evalshaCalls reads the EVALSHA call count from INFO commandstats.
func evalshaCalls(t *testing.T, info string) int {
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no evalsha in commandstats")
	return 0
}
