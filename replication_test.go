package tide_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

func TestWaitForReplicas(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	rdb := redistest.Client(t, primary.Addr)
	c := tide.NewClient(redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t))))
	ctx := context.Background()

	// No replica: the task is stored, but not confirmed.
	info, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.WaitForReplicas(1, 100*time.Millisecond), tide.TaskID("lonely"))
	if !errors.Is(err, tide.ErrNotReplicated) || info == nil || info.ID != "lonely" {
		t.Fatalf("without a replica: %v, %v", info, err)
	}
	if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.TaskID("lonely")); !errors.Is(err, tide.ErrTaskIDConflict) {
		t.Fatalf("the unconfirmed task was not stored: %v", err)
	}

	// With a replica attached the same call succeeds.
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica := redistest.Start(t, "--replicaof", host, port)
	rrdb := redistest.Client(t, replica.Addr)
	testwait.For(t, 20*time.Second, "the replica to sync", func() bool {
		return strings.Contains(rrdb.Info(ctx, "replication").Val(), "master_link_status:up")
	})
	if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), tide.WaitForReplicas(1, 5*time.Second)); err != nil {
		t.Fatalf("with a replica: %v", err)
	}
	for _, bad := range []tide.Option{tide.WaitForReplicas(0, time.Second), tide.WaitForReplicas(1, 0)} {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", nil), bad); !errors.Is(err, tide.ErrInvalidTask) {
			t.Fatalf("bad option accepted: %v", err)
		}
	}
}
