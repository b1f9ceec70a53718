package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// recorder is a model's log (the flow model's and the limit model's): one
// total order of events (a sequence number each) stamped with one clock,
// shared by the test and every server, which outlives any of them. In Redis
// it is a list appended to by one Lua script (the order and the clock are
// Redis's: TIME); in process a slice under a mutex, stamped with the
// process's clock.
type recorder interface {
	// add appends line and returns its sequence number. When look is not
	// "", it also reports whether marker look (set by mark: a flow's
	// cancel marker, a task's "already deferred once") was set before this
	// line.
	add(ctx context.Context, line, look string) (seq int64, marked bool, err error)
	// mark appends line and sets marker flow (once): for the flow model,
	// what comes later in the log came after that CancelWorkflow returned.
	mark(ctx context.Context, line, flow string) (int64, error)
	// lines returns the whole log in order, each line with its sequence
	// number and time.
	lines(ctx context.Context) ([]modelLine, error)
}

// modelLine is one line of the model's log.
type modelLine struct {
	seq  int64
	at   time.Time // Redis's TIME when it was added (in process: time.Now)
	text string
}

// recordScript appends to the model's log in Redis.
//
//	KEYS[1] sequence  KEYS[2] log list  KEYS[3] markers (hash: marker -> seq)
//	ARGV[1] line  ARGV[2] flow whose marker to look up ('')  ARGV[3] flow to mark ('')
//	returns {seq, 1 when ARGV[2]'s marker was set, else 0}
var recordScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[2], n .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]) .. ' ' .. ARGV[1])
if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[3], ARGV[3], n) end
local late = 0
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then late = 1 end
return {n, late}
`)

type redisRecorder struct {
	rdb  *redis.Client
	keys []string
}

// newRedisRecorder returns the log kept in Redis under the keys
// "<prefix>:<name>:seq", ":log" and ":cx".
func newRedisRecorder(rdb *redis.Client, prefix, name string) *redisRecorder {
	k := prefix + ":" + name + ":"
	return &redisRecorder{rdb: rdb, keys: []string{k + "seq", k + "log", k + "cx"}}
}

// clear deletes the log's keys.
func (r *redisRecorder) clear(ctx context.Context) error {
	return r.rdb.Del(ctx, r.keys...).Err()
}

func (r *redisRecorder) run(ctx context.Context, line, look, mark string) (int64, bool, error) {
	if strings.ContainsAny(line, "\n") {
		return 0, false, fmt.Errorf("log line with a newline: %q", line)
	}
	v, err := recordScript.Run(ctx, r.rdb, r.keys, line, look, mark).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	return v[0], v[1] == 1, nil
}

func (r *redisRecorder) add(ctx context.Context, line, look string) (int64, bool, error) {
	return r.run(ctx, line, look, "")
}

func (r *redisRecorder) mark(ctx context.Context, line, flow string) (int64, error) {
	n, _, err := r.run(ctx, line, "", flow)
	return n, err
}

func (r *redisRecorder) lines(ctx context.Context) ([]modelLine, error) {
	raw, err := r.rdb.LRange(ctx, r.keys[1], 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]modelLine, 0, len(raw))
	for _, s := range raw {
		seq, rest, ok := strings.Cut(s, " ")
		n, err := strconv.ParseInt(seq, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("bad log line %q", s)
		}
		ts, text, _ := strings.Cut(rest, " ")
		sec, usec, _ := strings.Cut(ts, ".")
		si, err1 := strconv.ParseInt(sec, 10, 64)
		ui, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad time in log line %q", s)
		}
		out = append(out, modelLine{seq: n, at: time.Unix(si, ui*1000), text: text})
	}
	return out, nil
}

// memRecorder is the in-process log of the membroker model.
type memRecorder struct {
	mu      sync.Mutex
	log     []modelLine
	markers map[string]int64
}

func (r *memRecorder) add(_ context.Context, line, look string) (int64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(len(r.log) + 1)
	r.log = append(r.log, modelLine{seq: n, at: time.Now(), text: line})
	_, marked := r.markers[look]
	return n, look != "" && marked, nil
}

func (r *memRecorder) mark(_ context.Context, line, flow string) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(len(r.log) + 1)
	r.log = append(r.log, modelLine{seq: n, at: time.Now(), text: line})
	if r.markers == nil {
		r.markers = map[string]int64{}
	}
	if _, ok := r.markers[flow]; !ok {
		r.markers[flow] = n
	}
	return n, nil
}

func (r *memRecorder) lines(context.Context) ([]modelLine, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]modelLine(nil), r.log...), nil
}

// keepLines writes a model's log into a new file in dir, for a post-mortem:
// one line each, "<seq> <time> <text>".
func keepLines(t *testing.T, dir, pattern string, lines []modelLine) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		t.Logf("model log not kept: %v", err)
		return
	}
	defer f.Close()
	for _, l := range lines {
		fmt.Fprintf(f, "%d %s %s\n", l.seq, l.at.Format("15:04:05.000000"), l.text)
	}
	t.Logf("model log kept in %s", f.Name())
}

// readKeptLines reads a log written by keepLines. Its times have the day of
// the file's modification time (keepLines writes the time of day only).
func readKeptLines(path string) ([]modelLine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	day := st.ModTime().UTC().Truncate(24 * time.Hour)
	var out []modelLine
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		f := strings.SplitN(l, " ", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("bad kept line %q", l)
		}
		seq, err1 := strconv.ParseInt(f[0], 10, 64)
		at, err2 := time.Parse("15:04:05.000000", f[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad kept line %q", l)
		}
		out = append(out, modelLine{seq: seq, at: day.Add(at.Sub(at.Truncate(24 * time.Hour))), text: f[2]})
	}
	return out, nil
}
