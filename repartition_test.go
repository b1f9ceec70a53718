package tide_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// A live queue changes its partition count twice (1 -> 4 -> 3) while
// producers enqueue immediate, delayed, ID'd and unique tasks and two
// servers process them; the first change is interrupted halfway and resumed.
// Every task runs exactly once, delayed tasks keep their due times, tasks
// stay findable and deletable by ID throughout, and the old partitions are
// left empty.
func TestRepartitionUnderLoad(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	var mu sync.Mutex
	runs := map[string]int{}
	early := map[string]time.Duration{}
	handler := tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		id, _ := tide.GetTaskID(ctx)
		due, _ := tide.GetDueTime(ctx)
		now := time.Now()
		mu.Lock()
		runs[id]++
		if d := due.Sub(now); d > 50*time.Millisecond { // clocks: Redis's vs this process's
			early[id] = d
		}
		mu.Unlock()
		return nil
	})
	e.server(tide.Config{Concurrency: 20}, handler)
	e.server(tide.Config{Concurrency: 20}, handler)

	// Tasks that wait through both changes, to be found and deleted by ID.
	var keep []string
	for i := range 20 {
		info, err := e.c.Enqueue(ctx, tide.NewTask("later", nil), tide.ProcessIn(time.Hour), tide.TaskID(fmt.Sprint("keep-", i)))
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, info.ID)
	}

	var produced sync.Map // id -> struct{}
	var count atomic.Int64
	stop := make(chan struct{})
	var prod sync.WaitGroup
	for w := range 3 {
		prod.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				opts := []tide.Option{}
				switch i % 4 {
				case 1:
					opts = append(opts, tide.ProcessIn(time.Duration(100+i%700)*time.Millisecond))
				case 2:
					opts = append(opts, tide.TaskID(fmt.Sprintf("w%d-%d", w, i)))
				case 3:
					opts = append(opts, tide.Unique(time.Hour))
				}
				info, err := e.c.Enqueue(ctx, tide.NewTask("job", fmt.Appendf(nil, "%d-%d", w, i)), opts...)
				if err != nil {
					if errors.Is(err, tide.ErrUnavailable) {
						continue // refused while this process learns the new layout: nothing stored
					}
					t.Errorf("enqueue: %v", err)
					return
				}
				produced.Store(info.ID, struct{}{})
				count.Add(1)
			}
		})
	}
	waitProduced := func(n int64) {
		testwait.For(t, 30*time.Second, fmt.Sprint(n, " tasks to be produced"), func() bool { return count.Load() >= n })
	}
	in := tide.NewInspector(e.b)

	waitProduced(500)
	// 1 -> 4, interrupted after its first step, then resumed.
	cctx, cancel := context.WithCancel(ctx)
	err := in.Repartition(cctx, "default", 4, func(moved, left int) { cancel() })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted repartition: %v", err)
	}
	if ti := e.info("default", keep[0]); ti.State != tide.StateScheduled {
		t.Fatalf("a waiting task during the repartition: %+v", ti)
	}
	if err := in.Repartition(ctx, "default", 4, nil); err != nil {
		t.Fatalf("resumed repartition: %v", err)
	}
	waitProduced(count.Load() + 500)
	// 4 -> 3.
	if err := in.Repartition(ctx, "default", 3, nil); err != nil {
		t.Fatalf("second repartition: %v", err)
	}
	waitProduced(count.Load() + 500)
	close(stop)
	prod.Wait()

	if n, err := e.b.Partitions(ctx, "default"); err != nil || n != 3 {
		t.Fatalf("partitions after the repartitions: %d, %v", n, err)
	}
	// The waiting tasks survived both moves and can be deleted by ID.
	for _, id := range keep {
		if ti := e.info("default", id); ti.State != tide.StateScheduled || ti.NextProcessAt.Before(time.Now().Add(50*time.Minute)) {
			t.Fatalf("waiting task %s after the repartitions: %+v", id, ti)
		}
		if err := e.c.Delete(ctx, "default", id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	var want []string
	produced.Range(func(k, _ any) bool { want = append(want, k.(string)); return true })
	testwait.For(t, 60*time.Second, "every produced task to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range want {
			if runs[id] == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range want {
		if runs[id] != 1 {
			t.Errorf("task %s ran %d times", id, runs[id])
		}
	}
	if len(early) > 0 {
		t.Errorf("%d tasks started before they were due: %v", len(early), early)
	}
	// Nothing is left in the retired partitions.
	for _, pat := range []string{":{default:0}:*", ":{default:*@1}:*"} {
		keys, err := e.rdb.Keys(ctx, e.prefix+pat).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.HasSuffix(k, ":meta") {
				continue // "retired": refuses processes that missed the change
			}
			if (strings.Contains(k, ":rq:") || strings.Contains(k, ":rs:")) && e.rdb.PTTL(ctx, k).Val() > 0 {
				continue // a reply cache or reply slots, gone within the replay window
			}
			if strings.HasSuffix(k, ":lim") && e.rdb.PTTL(ctx, k).Val() > 0 {
				continue // the slot transfers it applied, kept a day (redisbroker's Limits)
			}
			t.Errorf("key %s (%s) left in a retired partition", k, e.rdb.Type(ctx, k).Val())
		}
	}
	t.Logf("%d tasks produced and run once each across 1 -> 4 -> 3 partitions", len(want))
}
