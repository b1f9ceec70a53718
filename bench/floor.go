package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
)

// The physical floor: what the same Redis does for an enqueue-like script of
// two commands (HSETNX a record, LPUSH its ID) with no task queue around it,
// measured with redis-benchmark (shipped with redis-server) in the same run as
// the systems. One client with one request in flight (-c 1 -P 1) is the best
// a synchronous call from one goroutine can do: one round trip per call. With
// 8 clients it is 8 round trips in flight.
const (
	floorScript = "redis.call('HSETNX',KEYS[1],ARGV[1],ARGV[2]) return redis.call('LPUSH',KEYS[2],ARGV[1])"
	floorPrefix = "tide-bench:floor:"
	floorRange  = 100000 // -r: keys are spread over this many random numbers
)

// floorClients are the -c values of the floor rows.
var floorClients = []int{1, 8}

func floorKey(c int) string { return fmt.Sprintf("floor%d", c) }

// floorShaKey names the EVALSHA rows: EVAL hashes the script body on every
// call (to find it among the cached scripts), EVALSHA names it by the hash,
// as go-redis's Script.Run and both systems do, so EVALSHA is the floor the
// systems' calls compare with.
func floorShaKey(c int) string { return fmt.Sprintf("floorSha%d", c) }

// runFloor runs redis-benchmark once per entry of floorClients against the
// bench's Redis and removes the keys it wrote.
func runFloor(ctx context.Context, e *env, _ string) (results, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark not found on PATH (it ships with redis-server): %w", err)
	}
	host, port, err := net.SplitHostPort(e.addr)
	if err != nil {
		return nil, err
	}
	payload := strings.Repeat("x", payloadSize)
	sha, err := e.admin.ScriptLoad(ctx, floorScript).Result()
	if err != nil {
		return nil, fmt.Errorf("SCRIPT LOAD the floor script: %w", err)
	}
	res := results{}
	for _, byHash := range []bool{false, true} {
		for _, c := range floorClients {
			n := e.sz.floorN
			if c > 1 {
				n *= 3 // several times faster: keep the run about as long
			}
			// __rand_int__ is replaced by a random number (below -r) in
			// every argument, so the script writes many small keys rather
			// than one ever-growing list.
			cmdArgs := []string{"EVAL", floorScript}
			key := floorKey(c)
			if byHash {
				cmdArgs, key = []string{"EVALSHA", sha}, floorShaKey(c)
			}
			args := append([]string{"-h", host, "-p", port,
				"-c", strconv.Itoa(c), "-P", "1", "-n", strconv.Itoa(n), "-r", strconv.Itoa(floorRange), "--csv"},
				append(cmdArgs, "2", floorPrefix+"h:__rand_int__", floorPrefix+"l:__rand_int__", "__rand_int__", payload)...)
			cmd := exec.CommandContext(ctx, bin, args...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("redis-benchmark %s -c %d: %v\n%s%s", cmdArgs[0], c, err, out.String(), errOut.String())
			}
			rps, err := parseBenchCSV(out.Bytes())
			if err != nil {
				return nil, fmt.Errorf("redis-benchmark %s -c %d: %v\n%s", cmdArgs[0], c, err, out.String())
			}
			res[key] = val{v: rps}
			if err := deleteMatching(ctx, e, floorPrefix+"*"); err != nil {
				return nil, fmt.Errorf("clean up floor keys: %w", err)
			}
		}
	}
	e.note("floor: redis-benchmark -c {1,8} -P 1 -r %d --csv EVAL \"%s\" 2 %sh:__rand_int__ %sl:__rand_int__ __rand_int__ <%d bytes>, and the same with EVALSHA %s (SCRIPT LOAD first); %d / %d requests; keys deleted afterwards",
		floorRange, floorScript, floorPrefix, floorPrefix, payloadSize, sha, e.sz.floorN, 3*e.sz.floorN)
	return res, nil
}

// parseBenchCSV reads the rps column of redis-benchmark --csv output:
//
//	"test","rps","avg_latency_ms",...
//	"EVAL ...","17714.79","0.053",...
func parseBenchCSV(b []byte) (float64, error) { return benchCSVField(b, "rps") }

// benchCSVField reads the named column (rps, p50_latency_ms, ...) of the
// first figure of redis-benchmark --csv output.
func benchCSVField(b []byte, name string) (float64, error) {
	r := csv.NewReader(bytes.NewReader(b))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return 0, err
	}
	col := -1
	for _, rec := range recs {
		if col < 0 {
			for i, f := range rec {
				if f == name {
					col = i
				}
			}
			continue
		}
		if col < len(rec) {
			return strconv.ParseFloat(rec[col], 64)
		}
	}
	return 0, fmt.Errorf("no %s figure in the output", name)
}

// deleteMatching deletes the keys that match pattern.
func deleteMatching(ctx context.Context, e *env, pattern string) error {
	iter := e.admin.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := e.admin.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return flush()
}
