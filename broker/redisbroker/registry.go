package redisbroker

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/tidetype"
)

// registry stores JSON records under <prefix>:<kind>:<id> with a TTL, indexed
// by the sorted set <prefix>:<kind>s (score = expiry), so listing needs no
// key scan.
func (b *Broker) registryPut(ctx context.Context, kind, id string, v any, ttl time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("tide: redisbroker: register %s: %w", kind, err)
	}
	pipe := b.rdb.Pipeline()
	pipe.Set(ctx, b.prefix+":"+kind+":"+id, data, ttl)
	pipe.ZAdd(ctx, b.prefix+":"+kind+"s", redis.Z{Score: float64(time.Now().Add(ttl).UnixMilli()), Member: id})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: register %s: %w", kind, classify(err))
	}
	return nil
}

func (b *Broker) registryDel(ctx context.Context, kind, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	pipe := b.rdb.Pipeline()
	pipe.Del(ctx, b.prefix+":"+kind+":"+id)
	pipe.ZRem(ctx, b.prefix+":"+kind+"s", id)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("tide: redisbroker: unregister %s: %w", kind, classify(err))
	}
	return nil
}

// registryList returns the raw records of live entries and drops expired ones
// from the index.
func (b *Broker) registryList(ctx context.Context, kind string) ([][]byte, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	idx := b.prefix + ":" + kind + "s"
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	b.rdb.ZRemRangeByScore(ctx, idx, "-inf", "("+now)
	ids, err := b.rdb.ZRange(ctx, idx, 0, 999).Result()
	if err != nil {
		return nil, fmt.Errorf("tide: redisbroker: list %ss: %w", kind, classify(err))
	}
	if len(ids) == 0 {
		return nil, nil
	}
	ks := make([]string, len(ids))
	for i, id := range ids {
		ks[i] = b.prefix + ":" + kind + ":" + id
	}
	// One GET per key: on a cluster the keys live in different slots.
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ks))
	for i, k := range ks {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	var out [][]byte
	for _, c := range cmds {
		if v, err := c.Bytes(); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// RegisterServer implements broker.Admin.
func (b *Broker) RegisterServer(ctx context.Context, s tidetype.ServerInfo, ttl time.Duration) error {
	return b.registryPut(ctx, "server", s.ID, s, ttl)
}

// UnregisterServer implements broker.Admin.
func (b *Broker) UnregisterServer(ctx context.Context, id string) error {
	return b.registryDel(ctx, "server", id)
}

// Servers implements broker.Admin.
func (b *Broker) Servers(ctx context.Context) ([]tidetype.ServerInfo, error) {
	raws, err := b.registryList(ctx, "server")
	if err != nil {
		return nil, err
	}
	out := make([]tidetype.ServerInfo, 0, len(raws))
	for _, r := range raws {
		var s tidetype.ServerInfo
		if json.Unmarshal(r, &s) == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RegisterSchedulerEntries implements broker.Admin.
func (b *Broker) RegisterSchedulerEntries(ctx context.Context, schedulerID string, entries []tidetype.SchedulerEntry, ttl time.Duration) error {
	return b.registryPut(ctx, "scheduler", schedulerID, entries, ttl)
}

// SchedulerEntries implements broker.Admin.
func (b *Broker) SchedulerEntries(ctx context.Context) ([]tidetype.SchedulerEntry, error) {
	raws, err := b.registryList(ctx, "scheduler")
	if err != nil {
		return nil, err
	}
	var out []tidetype.SchedulerEntry
	for _, r := range raws {
		var es []tidetype.SchedulerEntry
		if json.Unmarshal(r, &es) == nil {
			out = append(out, es...)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].SchedulerID != out[j].SchedulerID {
			return out[i].SchedulerID < out[j].SchedulerID
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
