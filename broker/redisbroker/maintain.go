package redisbroker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Maintain implements broker.Broker.
func (b *Broker) Maintain(ctx context.Context, req broker.MaintainRequest) (broker.MaintainResult, error) {
	if err := b.check(); err != nil {
		return broker.MaintainResult{}, err
	}
	l, err := b.layoutOf(ctx, req.Queue)
	if err != nil {
		return broker.MaintainResult{}, err
	}
	if req.Partition < 0 || req.Partition >= l.total() {
		return broker.MaintainResult{}, fmt.Errorf("%w: queue %q has %d partitions, no partition %d", broker.ErrLayout, req.Queue, l.total(), req.Partition)
	}
	p := b.partAt(req.Queue, l, req.Partition)
	ttl := max(req.OwnerTTL.Milliseconds(), 1)
	release := "0"
	if req.Release {
		release = "1"
	}
	c := &call{
		script: b.s.maintain,
		keys:   append(p.keys("owner", "t", "pending", "active", "scheduled", "retry", "archived", "completed", "result", "u", "stat", "meta", "h", "m"), append(append(p.groupKeys(), p.endKeys()...), p.k("lim"), p.k(eventsKey))...),
		args: []any{p.layout, req.Owner, ttl, p.channel, p.idx, b.maxArchived, b.archiveTTL.Milliseconds(),
			maintainLimit, b.today(), release, req.RecoverBackoff.Milliseconds(), b.minute(), b.doneChannel(req.Queue), b.eventsArg(p), b.eventsAge.Milliseconds(), p.idTag},
		queue: req.Queue,
	}
	b.run(ctx, []*call{c})
	if c.err != nil {
		return broker.MaintainResult{}, callErr(fmt.Sprintf("maintain %s/%d", req.Queue, req.Partition), c.err)
	}
	if !req.Release {
		// Now and then, in case a crash left a transfer of slots
		// outstanding or a partition's wish for slots went unheard.
		b.sweep(req.Queue)
	}
	res, err := c.cmd.Int64Slice()
	if err != nil || len(res) != 9 {
		return broker.MaintainResult{}, fmt.Errorf("tide: redisbroker: maintain: unexpected reply %v (%v)", c.cmd.Val(), err)
	}
	// A refused claim in its last millisecond reports 0 left; round up so
	// callers never spin.
	out := broker.MaintainResult{
		Owned:     res[0] == 1,
		RetryIn:   time.Duration(max(res[1], 1)) * time.Millisecond,
		Pending:   int(res[2]),
		Forwarded: int(res[3]),
		Recovered: int(res[4]),
		Trimmed:   int(res[5]),
		More:      res[6] == 1,
	}
	if res[7] >= 0 {
		out.NextDue = time.UnixMilli(res[7])
	}
	if res[8] >= 0 {
		out.NextLeaseIn = time.Duration(res[8]) * time.Millisecond
	}
	if out.Recovered > 0 && !req.Release {
		// Recovered leases free slots, which a partition held while a
		// lowered Concurrency is paid for cannot use: they go to the bank.
		b.kick(req.Queue)
	}
	if out.Owned && !req.Release {
		// Claims nobody finished, pointers whose task is gone (freeids.go).
		if err := b.sweepIDs(ctx, req.Queue, l, p); err != nil {
			b.log.Warn("tide: redisbroker: sweep of the task index", "queue", req.Queue, "partition", req.Partition, "err", err)
		}
	}
	return out, nil
}
