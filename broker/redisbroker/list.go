package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/tidetype"
)

// ListTasks implements broker.Admin. Partitions are listed one after
// another; offset counts across them.
func (b *Broker) ListTasks(ctx context.Context, queue string, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if _, ok := stateKey(state); !ok {
		return nil, fmt.Errorf("tide: redisbroker: list tasks: unknown state %d", state)
	}
	if offset < 0 || limit < 1 || limit > maxListLimit {
		return nil, fmt.Errorf("tide: redisbroker: list tasks: offset %d / limit %d out of range (limit 1..%d)", offset, limit, maxListLimit)
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, err
	}
	ts, _, err := b.page(ctx, queue, l, state, offset, limit)
	return ts, err
}

// page reads up to limit tasks of queue in state from offset (counted
// across partitions, one after another) with their results and attempt
// histories, and for active tasks their lease expiry. It returns how many
// positions it went through (tasks that finished between the reads are
// skipped, so that may be more than it returns).
func (b *Broker) page(ctx context.Context, queue string, l layout, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, int, error) {
	name, _ := stateKey(state)
	type ref struct {
		id    string
		part  int
		score float64
	}
	var refs []ref
	for i := 0; i < l.total() && len(refs) < limit; i++ {
		k := b.partAt(queue, l, i)
		var size int64
		var err error
		var listed int64 // the pending list's part of size
		if state == tidetype.StatePending {
			pipe := b.rdb.Pipeline()
			ll, gl := pipe.LLen(ctx, k.k(name)), pipe.ZCard(ctx, k.k("gq"))
			_, err = pipe.Exec(ctx)
			listed, size = ll.Val(), ll.Val()+gl.Val()
		} else {
			size, err = b.rdb.ZCard(ctx, k.k(name)).Result()
		}
		if err != nil {
			return nil, 0, callErr("list tasks", classify(err))
		}
		if int64(offset) >= size {
			offset -= int(size)
			continue
		}
		want := int64(limit - len(refs))
		if state == tidetype.StatePending {
			// Ungrouped first, oldest first: the list is consumed from its
			// right end; then the grouped ones, group by group.
			if int64(offset) < listed {
				stop := -1 - int64(offset)
				page, err := b.rdb.LRange(ctx, k.k(name), max(stop-want+1, -listed), stop).Result()
				if err != nil {
					return nil, 0, callErr("list tasks", classify(err))
				}
				slices.Reverse(page)
				for _, id := range page {
					refs = append(refs, ref{id: id, part: i})
				}
				want -= int64(len(page))
			}
			if want > 0 {
				from := max(int64(offset)-listed, 0)
				page, err := b.rdb.ZRange(ctx, k.k("gq"), from, from+want-1).Result()
				if err != nil {
					return nil, 0, callErr("list tasks", classify(err))
				}
				for _, m := range page {
					if id, ok := groupedID(m); ok {
						refs = append(refs, ref{id: id, part: i})
					}
				}
			}
		} else {
			page, err := b.rdb.ZRangeWithScores(ctx, k.k(name), int64(offset), int64(offset)+want-1).Result()
			if err != nil {
				return nil, 0, callErr("list tasks", classify(err))
			}
			for _, z := range page {
				id, _ := z.Member.(string)
				refs = append(refs, ref{id: id, part: i, score: z.Score})
			}
		}
		offset = 0
	}
	if len(refs) == 0 {
		return nil, 0, nil
	}
	pipe := b.rdb.Pipeline()
	recs := make([]*redis.StringCmd, len(refs))
	results := make([]*redis.StringCmd, len(refs))
	hists := make([]*redis.StringCmd, len(refs))
	progs := make([]*redis.StringCmd, len(refs))
	// Retry and waiting tasks lie together: their durable records say
	// what a waiting one waits for (TaskInfo.WaitingFor, Steps).
	var durs []*redis.StringCmd
	if name == "retry" {
		durs = make([]*redis.StringCmd, len(refs))
	}
	for i, r := range refs {
		k := b.partAt(queue, l, r.part)
		recs[i] = pipe.HGet(ctx, k.k("t"), r.id)
		results[i] = pipe.HGet(ctx, k.k("result"), r.id)
		hists[i] = pipe.HGet(ctx, k.k("h"), r.id)
		progs[i] = pipe.HGet(ctx, k.k("pg"), r.id)
		if durs != nil {
			durs[i] = pipe.HGet(ctx, k.k("result"), "\x00"+r.id)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, callErr("list tasks", classify(err))
	}
	out := make([]*tidetype.TaskInfo, 0, len(refs))
	for i, r := range refs {
		raw, err := recs[i].Bytes()
		if err != nil || string(raw) == placeholder {
			continue // finished between the two reads
		}
		m, err := codec.DecodeHeader(queue, r.id, raw)
		if err != nil {
			m = &tidetype.TaskInfo{ID: r.id, Queue: queue, State: state, LastErr: err.Error()}
		}
		if res, err := results[i].Bytes(); err == nil {
			m.Result = res
		}
		if h, err := hists[i].Bytes(); err == nil {
			m.Attempts = codec.DecodeAttempts(h)
		}
		if p, ok := decodeProgress(progs[i].Val()); ok {
			m.Progress = p
		}
		if durs != nil {
			if d, err := durs[i].Bytes(); err == nil {
				broker.StepInfos(m, broker.DecodeSteps(d))
			}
		}
		if state == tidetype.StateActive {
			m.LeaseExpiresAt = time.UnixMilli(int64(r.score))
		}
		out = append(out, m)
	}
	return out, len(refs), nil
}

// maxSearchScan bounds how many tasks one SearchTasks call looks at.
const maxSearchScan = 5000

// SearchTasks implements broker.Admin: it reads the tasks of queue in
// state from offset, in the order of ListTasks, and keeps those that match f,
// looking at no more than 5,000 per call.
func (b *Broker) SearchTasks(ctx context.Context, queue string, state tidetype.TaskState, f tidetype.TaskFilter, offset, limit int) ([]*tidetype.TaskInfo, int, error) {
	if err := b.check(); err != nil {
		return nil, -1, err
	}
	if _, ok := stateKey(state); !ok {
		return nil, -1, fmt.Errorf("tide: redisbroker: search tasks: unknown state %d", state)
	}
	if offset < 0 || limit < 1 || limit > maxListLimit {
		return nil, -1, fmt.Errorf("tide: redisbroker: search tasks: offset %d / limit %d out of range (limit 1..%d)", offset, limit, maxListLimit)
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, -1, err
	}
	var out []*tidetype.TaskInfo
	for scanned := 0; scanned < maxSearchScan && len(out) < limit; {
		ts, n, err := b.page(ctx, queue, l, state, offset, maxListLimit)
		if err != nil {
			return nil, -1, err
		}
		if n == 0 {
			return out, -1, nil
		}
		for j, t := range ts {
			// Retry and waiting tasks lie together: a search of either
			// keeps its own state only.
			if f.Match(t) && (t.State == state || (state != tidetype.StateRetry && state != tidetype.StateWaiting)) {
				out = append(out, t)
				if len(out) == limit {
					// Continue after this one next time: positions and
					// tasks line up unless some finished meanwhile.
					return out, offset + min(j+1, n), nil
				}
			}
		}
		offset += n
		scanned += n
	}
	return out, offset, nil
}
