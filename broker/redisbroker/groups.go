package redisbroker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// groupedID returns the task ID of a member of a partition's ready grouped
// tasks ("<group>\0<8-byte sequence><id>", see groups.lua).
func groupedID(member string) (string, bool) {
	i := strings.IndexByte(member, 0)
	if i < 0 || len(member) < i+9 {
		return "", false
	}
	return member[i+9:], true
}

// Groups implements broker.Admin. The groups that may have a backlog are
// those in a partition's rotation, those held back until a time, and those
// with running tasks or a held place (at their limits): their number is
// bounded by the groups in use, not by their tasks. Each one's backlog is
// counted in the ready tasks (ZLEXCOUNT), and the largest are returned.
// Running tasks are counted from the partition's active tasks and their
// groups (the id hash): the groups' counts in the state hash are kept only
// while a group limit is set (groups.lua).
func (b *Broker) Groups(ctx context.Context, queue string, n int) ([]tidetype.GroupInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if n < 1 || n > broker.MaxGroupsListed {
		return nil, fmt.Errorf("%w: Groups(%q, %d): n must be 1 to %d", broker.ErrInvalidTask, queue, n, broker.MaxGroupsListed)
	}
	l, err := b.freshLayout(ctx, queue)
	if err != nil {
		return nil, err
	}
	pipe := b.rdb.Pipeline()
	rotation := make([]*redis.StringSliceCmd, l.total())
	held := make([]*redis.ZSliceCmd, l.total())
	state := make([]*redis.MapStringStringCmd, l.total())
	active := make([]*redis.StringSliceCmd, l.total())
	for i := range l.total() {
		p := b.partAt(queue, l, i)
		active[i] = pipe.ZRange(ctx, p.k("active"), 0, -1)
		rotation[i] = pipe.ZRange(ctx, p.k("gr"), 0, -1)
		held[i] = pipe.ZRangeWithScores(ctx, p.k("gw"), 0, -1) // throttled or over their rate
		state[i] = pipe.HGetAll(ctx, p.k("gs"))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, callErr("groups of "+queue, classify(err))
	}
	pipe = b.rdb.Pipeline()
	activeGroups := make([]*redis.SliceCmd, l.total())
	for i := range l.total() {
		if ids := active[i].Val(); len(ids) > 0 {
			activeGroups[i] = pipe.HMGet(ctx, b.partAt(queue, l, i).k("gid"), ids...)
		}
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, callErr("groups of "+queue, classify(err))
		}
	}
	now := b.Now()
	type key struct {
		part  int
		group string
	}
	byKey := map[key]*tidetype.GroupInfo{}
	get := func(i int, g string) *tidetype.GroupInfo {
		gi := byKey[key{i, g}]
		if gi == nil {
			gi = &tidetype.GroupInfo{Queue: queue, Group: g}
			byKey[key{i, g}] = gi
		}
		return gi
	}
	later := func(gi *tidetype.GroupInfo, at time.Time) {
		if at.After(now) && at.After(gi.ThrottledUntil) {
			gi.ThrottledUntil = at
		}
	}
	for i := range l.total() {
		for _, g := range rotation[i].Val() {
			if g != "" { // '' is the ungrouped tasks' turn
				get(i, g)
			}
		}
		if activeGroups[i] != nil {
			for _, v := range activeGroups[i].Val() {
				if s, ok := v.(string); ok {
					if g, _, ok := strings.Cut(s, "\x00"); ok {
						get(i, g).Running++
					}
				}
			}
		}
		for _, z := range held[i].Val() {
			g, _ := z.Member.(string)
			later(get(i, g), time.UnixMilli(int64(z.Score)))
		}
		for f, v := range state[i].Val() {
			kind, g, ok := strings.Cut(f, ":")
			if !ok || len(kind) != 1 {
				continue // turn, u, seq
			}
			switch kind {
			case "h":
				get(i, g)
			case "t":
				ms, _ := strconv.ParseInt(v, 10, 64)
				later(get(i, g), time.UnixMilli(ms))
			}
		}
	}
	keys := make([]key, 0, len(byKey))
	counts := make([]*redis.IntCmd, 0, len(byKey))
	pipe = b.rdb.Pipeline()
	for k := range byKey {
		keys = append(keys, k)
		counts = append(counts, pipe.ZLexCount(ctx, b.partAt(queue, l, k.part).k("gq"), "["+k.group+"\x00", "("+k.group+"\x01"))
	}
	if len(keys) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, callErr("groups of "+queue, classify(err))
		}
	}
	merged := map[string]*tidetype.GroupInfo{} // a repartition may show a group twice
	for j, k := range keys {
		gi := byKey[k]
		gi.Waiting = int(counts[j].Val())
		m := merged[k.group]
		if m == nil {
			merged[k.group] = gi
			continue
		}
		m.Waiting += gi.Waiting
		m.Running += gi.Running
		if gi.ThrottledUntil.After(m.ThrottledUntil) {
			m.ThrottledUntil = gi.ThrottledUntil
		}
	}
	out := make([]tidetype.GroupInfo, 0, len(merged))
	for _, gi := range merged {
		if gi.Waiting > 0 || gi.Running > 0 || !gi.ThrottledUntil.IsZero() {
			out = append(out, *gi)
		}
	}
	slices.SortFunc(out, func(x, y tidetype.GroupInfo) int {
		return cmp.Or(cmp.Compare(y.Waiting, x.Waiting), cmp.Compare(x.Group, y.Group))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, nil
}
