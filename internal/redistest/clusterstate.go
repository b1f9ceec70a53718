package redistest

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// WaitHealthy waits until every live node reports cluster_state:ok with all
// slots served by live masters: after Kill of a master, until its replica
// has taken over. It returns how long it waited and fails t after timeout.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := c.waitHealthy(timeout, 0, 0); err != nil {
		t.Fatalf("the cluster did not become healthy within %v: %v%s", timeout, err, c.logs())
	}
	return time.Since(start)
}

// waitHealthy polls until every live node is ok, knows known nodes (0: any
// number), sees all slots served by live, non-failed masters and, when
// masters > 0, sees that many masters and every other node as a replica.
func (c *Cluster) waitHealthy(timeout time.Duration, known, masters int) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		lastErr = c.healthy(known, masters)
		if lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return lastErr
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) healthy(known, masters int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	live := c.Live()
	liveSet := map[string]bool{}
	for _, a := range live {
		liveSet[a] = true
	}
	for _, a := range live {
		info, err := c.clusterInfo(ctx, a)
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", a, err)
		}
		if info["cluster_state"] != "ok" || info["cluster_slots_ok"] != "16384" {
			return fmt.Errorf("%s: cluster_state:%s cluster_slots_ok:%s cluster_slots_pfail:%s cluster_slots_fail:%s",
				a, info["cluster_state"], info["cluster_slots_ok"], info["cluster_slots_pfail"], info["cluster_slots_fail"])
		}
		if known > 0 && info["cluster_known_nodes"] != strconv.Itoa(known) {
			return fmt.Errorf("%s knows %s nodes, want %d", a, info["cluster_known_nodes"], known)
		}
		nodes, err := c.clusterNodes(ctx, a)
		if err != nil {
			return fmt.Errorf("CLUSTER NODES on %s: %w", a, err)
		}
		covered, ms, replicas := 0, 0, 0
		for _, nd := range nodes {
			if nd.master {
				ms++
			} else if nd.masterID != "-" && strings.Contains(nd.flags, "slave") {
				replicas++
			}
			if nd.master && len(nd.slots) > 0 {
				if !liveSet[nd.addr] || nd.failed {
					return fmt.Errorf("%s still sees slots on %s (flags %s)", a, nd.addr, nd.flags)
				}
				for _, r := range nd.slots {
					covered += r[1] - r[0] + 1
				}
			}
		}
		if covered != 16384 {
			return fmt.Errorf("%s sees %d of 16384 slots served", a, covered)
		}
		if masters > 0 && (ms != masters || ms+replicas != len(nodes)) {
			return fmt.Errorf("%s sees %d masters and %d replicas among %d nodes, want %d masters", a, ms, replicas, len(nodes), masters)
		}
	}
	return nil
}

// waitReplicasInSync waits until every live replica's link to its master is
// up, so that a failover test starts with replicas that have the data.
func (c *Cluster) waitReplicasInSync(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, r := range c.Replicas {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			info, err := infoMap(ctx, r, "replication")
			cancel()
			if err == nil && info["master_link_status"] == "up" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("replica %s: master_link_status:%s (%v)", r, info["master_link_status"], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, flags, masterID string
	master, failed            bool
	slots                     [][2]int
	firstSlot                 int
}

func (n clusterNode) serves(slot int) bool {
	for _, r := range n.slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

func (c *Cluster) clusterNodes(ctx context.Context, addr string) ([]clusterNode, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	txt, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 {
			continue
		}
		nd := clusterNode{id: f[0], flags: f[2], masterID: f[3], firstSlot: 1 << 20}
		nd.addr, _, _ = strings.Cut(f[1], "@")
		for _, fl := range strings.Split(f[2], ",") {
			switch fl {
			case "master":
				nd.master = true
			case "fail", "fail?", "noaddr", "handshake":
				nd.failed = true
			}
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue // a slot being migrated
			}
			lo, hi, isRange := strings.Cut(s, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil {
				continue
			}
			nd.slots = append(nd.slots, [2]int{a, b})
			nd.firstSlot = min(nd.firstSlot, a)
		}
		out = append(out, nd)
	}
	return out, nil
}

func (c *Cluster) clusterInfo(ctx context.Context, addr string) (map[string]string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	txt, err := rdb.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	return parseInfo(txt), nil
}

// infoMap runs INFO section on addr and parses it.
func infoMap(ctx context.Context, addr, section string) (map[string]string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	txt, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	return parseInfo(txt), nil
}

// parseInfo parses "key:value" lines (INFO, CLUSTER INFO).
func parseInfo(txt string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// Info runs INFO section on the node at addr and returns its fields.
func Info(ctx context.Context, addr, section string) (map[string]string, error) {
	return infoMap(ctx, addr, section)
}
