package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of the clusters
// StartFailoverCluster starts: a master unreachable for this long is
// flagged as failing and its replica takes over about half a second to two
// seconds later. It is short so that failover tests stay quick.
const ClusterNodeTimeout = 1000 * time.Millisecond

// SteadyNodeTimeout is the cluster-node-timeout of the clusters
// StartCluster starts, for tests that kill no node: long enough that a
// node stalled by a loaded machine (the whole suite on two cores) is not
// taken for a failed one, which would fail over and answer CLUSTERDOWN
// meanwhile.
const SteadyNodeTimeout = 5 * time.Second

// clusterWait bounds how long StartCluster and WaitHealthy wait for the
// cluster to form or heal; generous, for a loaded machine.
const clusterWait = 60 * time.Second

// Cluster is a local Redis Cluster started for a test: every node a
// redis-server on a loopback port in a temp dir of its own, stopped when the
// test ends.
type Cluster struct {
	// Masters are the masters as created, in the order of the slots they
	// serve (Masters[0] has slot 0).
	Masters []string
	// Replicas are the replicas as created; ReplicaOf maps each to the
	// master it replicates.
	Replicas  []string
	ReplicaOf map[string]string

	mu    sync.Mutex
	nodes map[string]*Server // every node, by address; killed ones too
	dead  map[string]bool
	args  map[string][]string // each node's command line, for Restart
	bin   string
}

// StartCluster starts a Redis Cluster of masters masters (at least 3) with
// replicasPerMaster replicas each, created with redis-cli --cluster create,
// and waits until every node reports cluster_state:ok with all 16384 slots
// covered and every replica in sync. It skips t when redis-cli is not
// installed and fails t when redis-server is not, or the cluster does not
// form in time. Every node is killed when t ends. Its nodes take a master
// for failed after SteadyNodeTimeout; tests that kill masters use
// StartFailoverCluster.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	return startCluster(t, masters, replicasPerMaster, SteadyNodeTimeout)
}

// StartFailoverCluster is StartCluster with a cluster-node-timeout of
// ClusterNodeTimeout, so that a killed master's replica takes over within
// a few seconds.
func StartFailoverCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	return startCluster(t, masters, replicasPerMaster, ClusterNodeTimeout)
}

func startCluster(t testing.TB, masters, replicasPerMaster int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("StartCluster: a cluster needs at least 3 masters, not %d", masters)
	}
	if replicasPerMaster < 0 {
		t.Fatalf("StartCluster: negative replicas per master %d", replicasPerMaster)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skipf("redis-cli not found on PATH; it creates the test cluster (install it with redis-server, e.g. apt-get install -y redis-server): %v", err)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH (install it, e.g. apt-get install -y redis-server): %v", err)
	}
	c := &Cluster{ReplicaOf: map[string]string{}, nodes: map[string]*Server{}, dead: map[string]bool{}, args: map[string][]string{}, bin: bin}
	// Registered first, so it runs last, after the test's clients closed: a
	// go-redis pool retries dialing a dead node from a goroutine that
	// sleeps a second between tries and notices the pool's Close only then.
	t.Cleanup(func() {
		c.mu.Lock()
		killed := len(c.dead) > 0
		c.mu.Unlock()
		if killed {
			time.Sleep(1100 * time.Millisecond)
		}
	})
	n := masters * (1 + replicasPerMaster)
	addrs := make([]string, 0, n)
	for range n {
		s, args := startClusterNode(t, bin, nodeTimeout)
		c.nodes[s.Addr] = s
		c.args[s.Addr] = args
		addrs = append(addrs, s.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create failed: %v\n%s%s", err, out, c.logs())
	}

	// The roles redis-cli chose, from one node's view (every node agrees
	// once the cluster is ok, which waitHealthy checks).
	if err := c.waitHealthy(clusterWait, n, masters); err != nil {
		t.Fatalf("the cluster did not become healthy within %v: %v\nredis-cli said:\n%s%s", clusterWait, err, out, c.logs())
	}
	nodes, err := c.clusterNodes(ctx, addrs[0])
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v", err)
	}
	byID := map[string]clusterNode{}
	for _, nd := range nodes {
		byID[nd.id] = nd
	}
	var ms []clusterNode
	for _, nd := range nodes {
		if nd.master {
			ms = append(ms, nd)
		}
	}
	slices.SortFunc(ms, func(a, b clusterNode) int { return a.firstSlot - b.firstSlot })
	for _, m := range ms {
		c.Masters = append(c.Masters, m.addr)
	}
	for _, nd := range nodes {
		if !nd.master {
			c.Replicas = append(c.Replicas, nd.addr)
			c.ReplicaOf[nd.addr] = byID[nd.masterID].addr
		}
	}
	slices.Sort(c.Replicas)
	if len(c.Masters) != masters || len(c.Replicas) != masters*replicasPerMaster {
		t.Fatalf("cluster formed with %d masters and %d replicas, want %d and %d:\n%s", len(c.Masters), len(c.Replicas), masters, masters*replicasPerMaster, out)
	}
	if err := c.waitReplicasInSync(clusterWait); err != nil {
		t.Fatalf("replicas did not sync within %v: %v%s", clusterWait, err, c.logs())
	}
	return c
}

// startClusterNode starts one cluster-enabled redis-server on a free port
// whose cluster bus port (port+10000) is free too, retrying on port races.
func startClusterNode(t testing.TB, bin string, nodeTimeout time.Duration) (*Server, []string) {
	t.Helper()
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		port, err := freeClusterPort()
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir}
		_ = os.Remove(filepath.Join(dir, "nodes.conf")) // left by a failed attempt
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"),
			"--protected-mode", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			// Let a replica take over however long its link was down.
			"--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
		}
		if lastErr = s.launch(bin, args, 5*time.Second); lastErr != nil {
			continue
		}
		t.Cleanup(s.Stop)
		return s, args
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	t.Fatalf("cluster node did not start: %v\n%s", lastErr, log)
	return nil, nil
}

// freeClusterPort returns a free port whose bus port (+10000) is free too.
func freeClusterPort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port with a free cluster bus port after 50 tries")
}

// Addrs returns the addresses of every node started, killed ones included.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.nodes))
	for a := range c.nodes {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Live returns the addresses of the nodes not killed.
func (c *Cluster) Live() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for a := range c.nodes {
		if !c.dead[a] {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// Client returns a cluster client seeded with every node, closed when t
// ends. opts may adjust the options (timeouts, ClusterStateReloadInterval)
// before the client is made.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Node returns a plain client of one node, closed when t ends.
func (c *Cluster) Node(t testing.TB, addr string) *redis.Client {
	t.Helper()
	return Client(t, addr)
}

// Kill kills the node at addr with SIGKILL and waits for it to exit.
func (c *Cluster) Kill(addr string) {
	c.mu.Lock()
	s := c.nodes[addr]
	c.dead[addr] = true
	c.mu.Unlock()
	if s == nil {
		panic("redistest: Kill: no cluster node at " + addr)
	}
	s.Stop()
}

// Restart starts the killed node at addr again, on the same port and with
// its nodes.conf, and waits until it answers. A killed master rejoins as a
// replica of the replica that took its place; WaitReplicaSynced waits for
// it to have the data.
func (c *Cluster) Restart(t testing.TB, addr string) {
	t.Helper()
	c.mu.Lock()
	s, args, dead := c.nodes[addr], c.args[addr], c.dead[addr]
	c.mu.Unlock()
	if s == nil || !dead {
		t.Fatalf("Restart: %s is not a killed node of the cluster", addr)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.launch(c.bin, args, 5*time.Second); lastErr == nil {
			c.mu.Lock()
			delete(c.dead, addr)
			c.mu.Unlock()
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("restarting %s failed (its port may have been taken meanwhile): %v%s", addr, lastErr, c.logs())
}

// WaitReplicaSynced waits until the node at addr is a replica whose link to
// its master is up (the initial sync done), and returns that master.
func (c *Cluster) WaitReplicaSynced(t testing.TB, addr string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := infoMap(ctx, addr, "replication")
		cancel()
		if err == nil && info["role"] == "slave" && info["master_link_status"] == "up" {
			return net.JoinHostPort(info["master_host"], info["master_port"])
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become a synced replica within %v: role:%s master_link_status:%s (%v)%s",
				addr, timeout, info["role"], info["master_link_status"], err, c.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CutReplication breaks the replication link of the replica at addr and
// keeps it broken (the replica cannot authenticate to its master) until the
// returned function is called. Its master goes on acknowledging writes the
// replica never gets: the situation asynchronous replication allows, made
// to last, for tests of what a failover then loses.
func CutReplication(t testing.TB, addr string) (restore func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	// The master's default user takes any password, so name a user that
	// does not exist there.
	for _, kv := range [][2]string{{"masteruser", "redistest-no-such-user"}, {"masterauth", "x"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s on %s: %v", kv[0], addr, err)
		}
	}
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "master").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE master on %s: %v", addr, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer rdb.Close()
		_ = rdb.ConfigSet(ctx, "masteruser", "").Err()
		_ = rdb.ConfigSet(ctx, "masterauth", "").Err()
	}
}

// MasterOfSlot returns the address of the master serving slot, as the live
// node at via (or the first live node when via is empty) sees it.
func (c *Cluster) MasterOfSlot(ctx context.Context, via string, slot int) (string, error) {
	if via == "" {
		live := c.Live()
		if len(live) == 0 {
			return "", fmt.Errorf("no live node")
		}
		via = live[0]
	}
	nodes, err := c.clusterNodes(ctx, via)
	if err != nil {
		return "", err
	}
	for _, nd := range nodes {
		if nd.master && !nd.failed && nd.serves(slot) {
			return nd.addr, nil
		}
	}
	return "", fmt.Errorf("no master serves slot %d (as seen by %s)", slot, via)
}

// logs returns the tail of every node's log, for failure messages.
func (c *Cluster) logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for addr, s := range c.nodes {
		data, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "\n--- %s (last lines of redis.log) ---\n%s", addr, strings.Join(lines, "\n"))
	}
	return b.String()
}

// MigrateSlot moves slot to the master at to while clients keep using it,
// as redis-cli --cluster reshard does: the target imports and the source
// migrates the slot, its keys move one MIGRATE at a time with pace between
// them (so that clients meet ASK and TRYAGAIN for a while), then every
// master is told the new owner.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, to string, pace time.Duration) error {
	from, err := c.MasterOfSlot(ctx, to, slot)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	nodes, err := c.clusterNodes(ctx, to)
	if err != nil {
		return err
	}
	ids := map[string]string{}
	var masters []string
	for _, nd := range nodes {
		ids[nd.addr] = nd.id
		if nd.master && !nd.failed {
			masters = append(masters, nd.addr)
		}
	}
	src := redis.NewClient(&redis.Options{Addr: from, MaxRetries: -1})
	defer src.Close()
	dst := redis.NewClient(&redis.Options{Addr: to, MaxRetries: -1})
	defer dst.Close()
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return fmt.Errorf("importing: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	host, port, _ := strings.Cut(to, ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			return fmt.Errorf("keys in slot: %w", err)
		}
		if len(keys) == 0 {
			break
		}
		if err := src.Do(ctx, "MIGRATE", host, port, "", 0, 5000, "KEYS", keys[0]).Err(); err != nil && !errors.Is(err, redis.Nil) && err.Error() != "NOKEY" {
			return fmt.Errorf("migrate %s: %w", keys[0], err)
		}
		time.Sleep(pace)
	}
	for _, m := range append([]string{to, from}, masters...) {
		r := redis.NewClient(&redis.Options{Addr: m, MaxRetries: -1})
		err := r.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err()
		r.Close()
		if err != nil {
			return fmt.Errorf("setslot node on %s: %w", m, err)
		}
	}
	return nil
}
