package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// scriptCmds are the commands that run a script.
var scriptCmds = map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "eval_ro": true, "fcall": true, "fcall_ro": true}

// monitorCounts is what MONITOR saw between the bench's two INFO snapshots.
type monitorCounts struct {
	sent     map[string]int // top-level commands of the server under test
	inScript map[string]int // commands run by Lua scripts ("[0 lua]")
	markers  int            // the bench's own INFO commands seen
	err      error
}

// runIdleCost starts a server on idleQueues empty queues and counts, over
// idleWindow, the commands Redis executes (INFO commandstats, which counts
// commands run inside scripts too) and, with MONITOR, which of them the
// server sent itself and which its scripts ran. The window is bounded by two
// INFO commands the bench sends on its own connection; MONITOR counts only
// the lines between them, so both sources cover the same commands.
func runIdleCost(ctx context.Context, e *env, kind string) (results, error) {
	s, err := newSystem(kind, e.addr)
	if err != nil {
		return nil, err
	}
	defer s.close()
	queues := make([]string, e.sz.idleQueues)
	for i := range queues {
		queues[i] = fmt.Sprintf("q%d", i)
	}
	srv, err := s.startServer(serverConfig{concurrency: e.sz.concurrency, queues: queues}, func(context.Context, []byte) error { return nil })
	if err != nil {
		return nil, err
	}
	defer srv.stop(time.Minute)
	time.Sleep(e.sz.idleWarm)

	adm, err := dialRaw(e.addr)
	if err != nil {
		return nil, err
	}
	defer adm.close()
	mon, err := dialRaw(e.addr)
	if err != nil {
		return nil, err
	}
	defer mon.close()
	if err := mon.send("MONITOR"); err != nil {
		return nil, err
	}
	if line, err := mon.readLine(time.Now().Add(5 * time.Second)); err != nil || line != "+OK" {
		return nil, fmt.Errorf("MONITOR: %q %v", line, err)
	}
	self := adm.localAddr()
	resc := make(chan monitorCounts, 1)
	go func() {
		mc := monitorCounts{sent: map[string]int{}, inScript: map[string]int{}}
		hard := time.Now().Add(e.sz.idleWindow + time.Minute)
		for mc.markers < 2 {
			line, err := mon.readLine(hard)
			if err != nil {
				mc.err = err
				break
			}
			client, cmd, ok := monitorLine(line)
			switch {
			case !ok:
			case client == self:
				if cmd == "info" {
					mc.markers++
				}
			case mc.markers != 1:
				// outside the window
			case client == "lua":
				mc.inScript[cmd]++
			default:
				mc.sent[cmd]++
			}
		}
		resc <- mc
	}()

	text, err := adm.bulk("INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	before := parseCommandStats(text)
	t0 := time.Now()
	select {
	case <-time.After(e.sz.idleWindow):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	text, err = adm.bulk("INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	window := time.Since(t0)
	after := parseCommandStats(text)
	var mc monitorCounts
	select {
	case mc = <-resc:
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("MONITOR did not show the end of the window")
	}
	if mc.err != nil {
		return nil, fmt.Errorf("MONITOR: %w", mc.err)
	}

	executed := 0
	for cmd, n := range after {
		d := int(n - before[cmd])
		if cmd == "info" {
			d-- // the bench's first snapshot
		}
		executed += d
	}
	sum := func(m map[string]int, only map[string]bool) int {
		t := 0
		for c, n := range m {
			if only == nil || only[c] {
				t += n
			}
		}
		return t
	}
	sent, scripts, inScript := sum(mc.sent, nil), sum(mc.sent, scriptCmds), sum(mc.inScript, nil)
	sec := window.Seconds()
	e.note("idlecost/%s: over %.1fs: sent %s; inside scripts %s", kind, sec, topCmds(mc.sent, sec), topCmds(mc.inScript, sec))
	if seen := sent + inScript; math.Abs(float64(seen-executed)) > 0.05*float64(executed)+2 {
		e.note("idlecost/%s: MONITOR saw %d commands but commandstats counted %d", kind, seen, executed)
	}
	return results{
		"idleExec":     {v: float64(executed) / sec},
		"idleSent":     {v: float64(sent) / sec},
		"idleScripts":  {v: float64(scripts) / sec},
		"idleInScript": {v: float64(inScript) / sec},
	}, nil
}

// topCmds formats the per-second rate of each command, busiest first.
func topCmds(m map[string]int, sec float64) string {
	if len(m) == 0 {
		return "none"
	}
	type kv struct {
		k string
		n int
	}
	var list []kv
	for k, n := range m {
		list = append(list, kv{k, n})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n || list[i].n == list[j].n && list[i].k < list[j].k })
	var parts []string
	for _, x := range list {
		parts = append(parts, fmt.Sprintf("%s %.2f/s", x.k, float64(x.n)/sec))
	}
	return strings.Join(parts, ", ")
}
