package redisbroker

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// go-redis reloads a cluster client's slot map on MOVED and READONLY
// replies, and otherwise only every ClusterStateReloadInterval (one minute
// by default). After a failover, a client that only ever gets "connection
// refused" or EOF from the dead primary keeps sending that primary's slots to
// it. The broker therefore asks for a reload whenever a command fails in a
// way that says the topology may have changed.

// reloadHooked records the cluster clients that already carry the hook, so
// that several brokers on one client install it once.
var reloadHooked sync.Map // *redis.ClusterClient -> struct{}

// minReloadGap keeps a burst of failures from asking for a reload each.
const minReloadGap = 100 * time.Millisecond

func hookClusterReload(cc *redis.ClusterClient) {
	if _, loaded := reloadHooked.LoadOrStore(cc, struct{}{}); loaded {
		return
	}
	cc.AddHook(&reloadHook{cc: cc})
}

type reloadHook struct {
	cc   *redis.ClusterClient
	mu   sync.Mutex
	last time.Time
}

func (h *reloadHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *reloadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.maybeReload(ctx, err)
		return err
	}
}

func (h *reloadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.maybeReload(ctx, err)
		for _, c := range cmds {
			h.maybeReload(ctx, c.Err())
		}
		return err
	}
}

func (h *reloadHook) maybeReload(ctx context.Context, err error) {
	if err == nil || !topologyError(err) {
		return
	}
	h.mu.Lock()
	if time.Since(h.last) < minReloadGap {
		h.mu.Unlock()
		return
	}
	h.last = time.Now()
	h.mu.Unlock()
	h.cc.ReloadState(context.WithoutCancel(ctx))
}

// topologyError reports whether err suggests that a node went away or a slot
// moved.
func topologyError(err error) bool {
	if errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	s := err.Error()
	for _, frag := range []string{"connection refused", "connection reset", "broken pipe", "EOF", "MOVED", "ASK ", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "LOADING", "MASTERDOWN"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}
