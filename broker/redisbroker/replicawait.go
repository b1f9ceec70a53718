package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// runAndWait runs the calls and then WAIT on every primary they touch: WAIT
// counts the replicas that have the connection's earlier writes, so each
// primary gets one pipeline holding its partitions' scripts followed by a
// WAIT, and the primaries are waited on in parallel. A WAIT is cut short of
// the client's read timeout (a longer one would time out and be sent again);
// while replicas are missing and time is left, the broker waits again on a
// connection that first writes a throwaway key of the partition, which makes
// WAIT cover everything written before. It returns the last WAIT reply that
// covers each call.
func (b *Broker) runAndWait(ctx context.Context, calls []*call, groups []*group, replicas int, timeout time.Duration) ([]*redis.Cmd, error) {
	cc, cluster := b.rdb.(*redis.ClusterClient)
	deadline := time.Now().Add(timeout)
	slice := waitSlice(b.rdb)
	type node struct {
		c     redis.Cmdable
		calls []int
		wait  *redis.Cmd
	}
	for attempt := 0; ; attempt++ {
		var nodes []*node
		byAddr := map[string]*node{}
		for gi := range calls {
			var c redis.Cmdable = b.rdb
			addr := ""
			if cluster {
				m, err := cc.MasterForKey(ctx, groups[gi].p.k("t"))
				if err != nil {
					return nil, fmt.Errorf("tide: redisbroker: enqueue: find primary: %w", classify(err))
				}
				c, addr = m, m.Options().Addr
			}
			n := byAddr[addr]
			if n == nil {
				n = &node{c: c}
				byAddr[addr] = n
				nodes = append(nodes, n)
			}
			n.calls = append(n.calls, gi)
		}
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(func() {
				for _, useEval := range []bool{false, true} {
					pipe := n.c.Pipeline()
					for _, gi := range n.calls {
						c := calls[gi]
						if useEval {
							c.cmd = c.eval(ctx, pipe)
						} else {
							c.cmd = c.evalSha(ctx, pipe)
						}
					}
					n.wait = pipe.Do(ctx, "WAIT", replicas, waitMS(time.Until(deadline), slice))
					_, _ = pipe.Exec(ctx) // errors are read per command
					if !anyNoScript(calls, n.calls) {
						break
					}
				}
				// Wait more while replicas are missing and time is left.
				for {
					got, err := n.wait.Int64()
					left := time.Until(deadline)
					if err != nil || int(got) >= replicas || left < time.Millisecond || ctx.Err() != nil {
						return
					}
					pipe := n.c.Pipeline()
					pipe.Set(ctx, groups[n.calls[0]].p.k("w"), "1", time.Second)
					n.wait = pipe.Do(ctx, "WAIT", replicas, waitMS(left, slice))
					_, _ = pipe.Exec(ctx)
				}
			})
		}
		wg.Wait()
		waits := make([]*redis.Cmd, len(calls))
		redirected := false
		for _, n := range nodes {
			for _, gi := range n.calls {
				waits[gi] = n.wait
				c := calls[gi]
				c.err = classify(c.cmd.Err())
				if lerr, ok := b.layoutRefused(c.queue, c.cmd.Err()); ok {
					c.err = lerr
				}
				if err := c.cmd.Err(); err != nil && isRedirect(err) {
					redirected = true
				}
			}
		}
		// A redirect means the script did not run on that node: the slot
		// moved (a failover). Learn the new layout and send again, once;
		// the reply cache makes the second send safe for scripts that ran.
		if !redirected || !cluster || attempt > 0 {
			return waits, nil
		}
		cc.ReloadState(ctx)
	}
}

// waitMS is a WAIT timeout in ms for d, at most slice and at least 1 (WAIT 0
// would block until the replicas answer, however long).
func waitMS(d, slice time.Duration) int64 { return max(min(d, slice).Milliseconds(), 1) }

// waitSlice is the longest single WAIT: under the client's read timeout, so
// that go-redis does not time out and send it again.
func waitSlice(rdb redis.UniversalClient) time.Duration {
	read := 3 * time.Second
	switch c := rdb.(type) {
	case *redis.Client:
		if rt := c.Options().ReadTimeout; rt > 0 {
			read = rt
		} else if rt < 0 {
			read = time.Hour
		}
	case *redis.ClusterClient:
		if rt := c.Options().ReadTimeout; rt > 0 {
			read = rt
		} else if rt < 0 {
			read = time.Hour
		}
	}
	return max(read-read/4, 50*time.Millisecond)
}

func anyNoScript(calls []*call, idx []int) bool {
	for _, gi := range idx {
		if noScript(calls[gi].cmd.Err()) {
			return true
		}
	}
	return false
}

// isRedirect reports a cluster reply that means "not here": the command was
// not executed.
func isRedirect(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	s := re.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "CLUSTERDOWN") || strings.HasPrefix(s, "TRYAGAIN")
}
