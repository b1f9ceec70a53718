package outbox

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/faultproxy"
	"github.com/tidequeue/tide/internal/redistest"
)

// The outbox model: random transactions enqueue and delete tasks through
// the outbox (some roll back; deleted IDs are enqueued again) while relays
// are killed mid-batch and restarted and the fault proxy between them and
// Redis drops and delays replies. At the end every row is relayed, none
// failed, and Redis holds exactly the tasks whose last committed outbox
// call was an Enqueue: nothing lost, nothing stored twice, no cancel
// missed. Run longer or with another seed:
//
//	go test -race -run TestOutboxModel ./outbox -args -outboxmodel.seed=7 -outboxmodel.scale=5
var (
	outboxModelSeed  = flag.Uint64("outboxmodel.seed", envUint("TIDE_OUTBOXMODEL_SEED", 1), "seed of TestOutboxModel")
	outboxModelScale = flag.Int("outboxmodel.scale", int(envUint("TIDE_OUTBOXMODEL_SCALE", 1)), "length of TestOutboxModel's run")
)

func envUint(name string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// One unit of scale of the outbox model.
const (
	outboxModelTxs     = 300
	outboxModelRelays  = 2
	outboxReadTimeout  = 300 * time.Millisecond
	outboxModelFaultsN = 2 // replies each fault hits (a relay backs off after each)
)

func TestOutboxModel(t *testing.T) {
	both(t, func(t *testing.T, d Dialect) {
		seed, scale := *outboxModelSeed, max(*outboxModelScale, 1)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("outbox model (%s) failed with seed %d, scale %d: go test -race -run 'TestOutboxModel/%s' ./outbox -args -outboxmodel.seed=%d -outboxmodel.scale=%d",
					d, seed, scale, d, seed, scale)
			}
		})
		runOutboxModel(t, d, seed, scale)
	})
}

// outboxModel is one run: what the committed transactions asked for.
type outboxModel struct {
	t *testing.T
	e *env
	r *rand.Rand

	ids       []string        // every task ID enqueued, in order
	live      map[string]bool // ID -> its last committed call was Enqueue
	txs       map[string]int  // by kind and result
	removed   int             // deletes that removed a row not yet relayed
	incarnate atomic.Int64    // relays started
	killed    atomic.Int64    // relays abandoned mid-batch
	calming   atomic.Bool     // the run is over: relays are no longer killed
}

func runOutboxModel(t *testing.T, d Dialect, seed uint64, scale int) {
	addr := redistest.Addr(t)
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	db, dsn := servers[d].NewDB(t)
	e := newEnvOn(t, d, db, dsn, addr, WithClaimTimeout(time.Second), WithBatchSize(10), WithConcurrency(4))
	// The relays' client goes through the proxy, with a short read
	// timeout so that a dropped reply costs little; e.client (direct)
	// checks.
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: outboxReadTimeout})
	t.Cleanup(func() { _ = rdb.Close() })
	faulty := tide.NewClient(redisbroker.New(rdb, redisbroker.WithPrefix(e.prefix)))

	m := &outboxModel{t: t, e: e, r: rand.New(rand.NewPCG(seed, uint64(len(d.String())))), live: map[string]bool{}, txs: map[string]int{}}
	begin := time.Now()
	relayCtx, stopRelays := context.WithCancel(context.Background())
	var relays sync.WaitGroup
	for i := range outboxModelRelays {
		relays.Go(func() { m.relays(relayCtx, d, faulty, rand.New(rand.NewPCG(seed, uint64(10+i)))) })
	}
	t.Cleanup(func() { stopRelays(); relays.Wait() })
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	faults := map[string]int{}
	wg.Go(func() {
		fr := rand.New(rand.NewPCG(seed, 3))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(300+fr.IntN(700)) * time.Millisecond):
			}
			if fr.IntN(2) == 0 {
				px.DropReplies(faultproxy.Commands("EVALSHA"), outboxModelFaultsN)
				faults["replies dropped"] += outboxModelFaultsN
			} else {
				px.DelayReplies(faultproxy.Commands("EVALSHA"), outboxReadTimeout+100*time.Millisecond, outboxModelFaultsN)
				faults["replies delayed past the read timeout"] += outboxModelFaultsN
			}
		}
	})
	for i := range outboxModelTxs * scale {
		m.step(i)
		time.Sleep(time.Duration(2+m.r.IntN(8)) * time.Millisecond)
	}
	activeEnd := time.Now()
	// Calm: the relays are no longer killed and, once the fault goroutine
	// stopped, nothing more is dropped; they drain the table.
	m.calming.Store(true)
	stop()
	wg.Wait()
	px.Clear()
	for e.rows() > 0 && time.Since(activeEnd) < 90*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	stopRelays()
	relays.Wait()
	m.check()
	t.Logf("outbox model on %s: seed %d, scale %d: %d task IDs; transactions %v; %d deletes removed a row before its relay; relays started %d, abandoned mid-batch %d; faults %v, %d replies dropped; seconds: active %.1f, total %.1f",
		d, seed, scale, len(m.ids), m.txs, m.removed, m.incarnate.Load(), m.killed.Load(), faults, px.Dropped(),
		activeEnd.Sub(begin).Seconds(), time.Since(begin).Seconds())
}

// relays runs relays one after another until ctx ends: each relays a
// random number of rows, then dies mid-batch (its rows are claimed again
// when their claim runs out), except while the run calms down.
func (m *outboxModel) relays(ctx context.Context, d Dialect, c *tide.Client, r *rand.Rand) {
	for ctx.Err() == nil {
		ob, err := New(m.e.db, d, WithLogger(testLogger(m.t)), WithPollInterval(20*time.Millisecond), WithClaimTimeout(time.Second),
			WithBatchSize(10), WithConcurrency(4))
		if err != nil {
			m.t.Error(err)
			return
		}
		left := int64(3 + r.IntN(25))
		var sent atomic.Int64
		ob.afterSend = func(int64) error {
			if sent.Add(1) >= left && !m.calming.Load() {
				return errAbandon
			}
			return nil
		}
		m.incarnate.Add(1)
		err = ob.Relay(ctx, c)
		switch {
		case errors.Is(err, errAbandon):
			m.killed.Add(1)
		case ctx.Err() != nil:
			return
		default:
			m.t.Errorf("relay: %v", err)
			return
		}
	}
}

// inTx runs f in a transaction, then commits it, or rolls it back when
// commit is false; a MySQL deadlock victim is run again. It reports
// whether f's changes were committed.
func (m *outboxModel) inTx(commit bool, f func(tx *sql.Tx) error) bool {
	for {
		tx, err := m.e.db.BeginTx(context.Background(), nil)
		if err != nil {
			m.t.Fatal(err)
		}
		err = f(tx)
		if err == nil && commit {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil && m.e.d == MySQL && contains(err.Error(), "Deadlock") {
			continue // InnoDB chose this transaction as a deadlock victim
		}
		if err != nil {
			m.t.Fatalf("transaction: %v", err)
		}
		return commit
	}
}

// step runs one random transaction: enqueue new tasks (one to three, an
// ID chosen or not, due now or in an hour), delete a task, enqueue a task
// again and delete it, or enqueue a deleted ID again; one in ten rolls
// back.
func (m *outboxModel) step(i int) {
	r := m.r
	commit := r.IntN(10) != 0
	result := map[bool]string{true: "committed", false: "rolled back"}[commit]
	var dead []string
	for _, id := range m.ids {
		if !m.live[id] {
			dead = append(dead, id)
		}
	}
	switch x := r.IntN(100); {
	case x < 25 && len(m.ids) > 0:
		id := m.ids[r.IntN(len(m.ids))]
		var ok bool
		if m.inTx(commit, func(tx *sql.Tx) error {
			var err error
			ok, err = m.e.ob.Delete(context.Background(), tx, "q", id)
			return err
		}) {
			m.live[id] = false
			if ok {
				m.removed++
			}
		}
		m.txs["delete "+result]++
	case x < 32 && len(m.ids) > 0:
		// A task enqueued again (a timer reset) and deleted in the same
		// transaction (the payment came): its earlier row, maybe relayed
		// already, must be cancelled too.
		id := m.ids[r.IntN(len(m.ids))]
		if m.inTx(commit, func(tx *sql.Tx) error {
			if _, err := m.e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", nil), m.opts(r, id)...); err != nil {
				return err
			}
			_, err := m.e.ob.Delete(context.Background(), tx, "q", id)
			return err
		}) {
			m.live[id] = false
		}
		m.txs["enqueue and delete "+result]++
	case x < 40 && len(dead) > 0:
		id := dead[r.IntN(len(dead))]
		if m.inTx(commit, func(tx *sql.Tx) error {
			_, err := m.e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", nil), m.opts(r, id)...)
			return err
		}) {
			m.live[id] = true
		}
		m.txs["enqueue again "+result]++
	default:
		var ids []string
		n := 1 + r.IntN(3)
		m.inTx(commit, func(tx *sql.Tx) error {
			for j := range n {
				id := ""
				if r.IntN(2) == 0 {
					id = fmt.Sprintf("m-%d-%d", i, j)
				}
				info, err := m.e.ob.Enqueue(context.Background(), tx, tide.NewTask("t", fmt.Appendf(nil, "%d-%d", i, j)), m.opts(r, id)...)
				if err != nil {
					return err
				}
				ids = append(ids, info.ID)
			}
			return nil
		})
		// A rolled-back ID is known too: it must not reach Redis.
		for _, id := range ids {
			m.ids = append(m.ids, id)
			m.live[id] = commit
		}
		m.txs["enqueue "+result]++
	}
}

// opts are a model task's options: queue q, TaskID id unless empty, and
// for half of them a ProcessIn of an hour (no server runs here: pending
// and scheduled tasks alike stay until the check).
func (m *outboxModel) opts(r *rand.Rand, id string) []tide.Option {
	opts := []tide.Option{tide.Queue("q")}
	if id != "" {
		opts = append(opts, tide.TaskID(id))
	}
	if r.IntN(2) == 0 {
		opts = append(opts, tide.ProcessIn(time.Hour))
	}
	return opts
}

// check compares Redis with what the committed transactions asked for.
func (m *outboxModel) check() {
	t, ctx := m.t, context.Background()
	if n := m.e.rows(); n != 0 {
		t.Errorf("%d outbox rows left after the run calmed down", n)
	}
	failed, err := m.e.ob.Failed(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range failed {
		t.Errorf("failed outbox row: %+v", f)
	}
	want := 0
	for _, id := range m.ids {
		_, err := m.e.insp.GetTaskInfo(ctx, "q", id)
		switch {
		case m.live[id] && err != nil:
			t.Errorf("task %s: its last committed call was Enqueue, yet Redis says %v", id, err)
		case !m.live[id] && !errors.Is(err, tide.ErrTaskNotFound):
			t.Errorf("task %s: deleted or rolled back, yet Redis has it (%v)", id, err)
		}
		if m.live[id] {
			want++
		}
	}
	if got := m.e.count("q"); got != want {
		t.Errorf("Redis holds %d tasks, want %d: a task stored twice or unknown", got, want)
	}
}
