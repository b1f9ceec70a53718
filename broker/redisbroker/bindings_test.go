package redisbroker_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker/redisbroker"
)

// bindingCalls records, for each script, the shapes of the calls the broker
// made: the key suffixes in order and the number of arguments.
type bindingCalls struct {
	files map[string]string // SHA1 -> file
	mu    sync.Mutex
	seen  map[string]map[string]callShape // file -> signature -> shape
}

type callShape struct {
	keys []string // suffix of each key
	argc int
}

func newBindingCalls() *bindingCalls {
	return &bindingCalls{files: redisbroker.ScriptFiles(), seen: map[string]map[string]callShape{}}
}

// keySuffix is what a key names within its partition or prefix: the part
// after the hash tag, else after the last ':'.
func keySuffix(k string) string {
	if i := strings.LastIndex(k, "}:"); i >= 0 {
		k = k[i+2:]
	} else if i := strings.LastIndex(k, ":"); i >= 0 {
		k = k[i+1:]
	}
	for _, windowed := range []string{"rq:", "rs:", "ik:", "bank:"} {
		if strings.HasPrefix(k, windowed) {
			// Reply caches and idempotency keys carry a window, a bank
			// its queue.
			return windowed[:len(windowed)-1]
		}
	}
	if strings.HasSuffix(k, "}") {
		return "{}" // a key that is its hash tag alone
	}
	return k
}

func (s *bindingCalls) record(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 3 {
		return
	}
	name := strings.ToLower(fmt.Sprint(args[0]))
	var sha string
	switch name {
	case "evalsha", "evalsha_ro":
		sha = fmt.Sprint(args[1])
	case "eval", "eval_ro":
		h := sha1.Sum([]byte(fmt.Sprint(args[1])))
		sha = hex.EncodeToString(h[:])
	default:
		return
	}
	file := s.files[sha]
	if file == "" {
		return
	}
	n, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || 3+n > len(args) {
		return
	}
	sh := callShape{argc: len(args) - 3 - n}
	for _, k := range args[3 : 3+n] {
		sh.keys = append(sh.keys, keySuffix(fmt.Sprint(k)))
	}
	sig := strings.Join(sh.keys, " ") + "|" + strconv.Itoa(sh.argc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[file] == nil {
		s.seen[file] = map[string]callShape{}
	}
	s.seen[file][sig] = sh
}

func (s *bindingCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *bindingCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.record(cmd)
		return next(ctx, cmd)
	}
}

func (s *bindingCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.record(c)
		}
		return next(ctx, cmds)
	}
}

// keyNames maps the name a script header gives a key (or a run of keys)
// to the key suffixes the broker passes for it, in order.
var keyNames = map[string][]string{
	"records hash":                    {"t"},
	"pending list":                    {"pending"},
	"scheduled zset":                  {"scheduled"},
	"retry zset":                      {"retry"},
	"archived zset":                   {"archived"},
	"completed zset":                  {"completed"},
	"results hash":                    {"result"},
	"active zset":                     {"active"},
	"unique locks hash":               {"u"},
	"layout meta":                     {"meta"},
	"reply cache":                     {"rq"},
	"reply slots":                     {"rs"},
	"attempt histories hash":          {"h"},
	"progress hash":                   {"pg"},
	"events stream":                   {"events"},
	"paused flag":                     {"paused"},
	"token sequence":                  {"seq"},
	"stats hash":                      {"stat"},
	"minute counters hash":            {"m"},
	"owner":                           {"owner"},
	"owner key":                       {"owner"},
	"moving zset":                     {"moving"},
	"reserved set":                    {"reserved"},
	"starts zset":                     {"starts"},
	"forgotten starts zset":           {"forgot"},
	"limits hash":                     {"lim"},
	"limits hash of the partition":    {"lim"},
	"the limits hash":                 {"limits"},
	"the queue's bank":                {"bank"},
	"bank hash":                       {"bank"},
	"the partitions hash":             {"partitions"},
	"idempotency keys of this window": {"ik"},
	"idempotency keys of the previous window": {"ik"},
	"pointers zset": {"x"},
	"fences zset":   {"xr"},
	"leaving hash":  {"xl"},
	"waiters hash":  {"wt"},
	"outcomes hash": {"oc"},
	"waiter keys":   {"wt", "oc", "ocx"},
	"group keys":    {"gq", "gr", "gw", "gs", "gid", "gl"},
	// move.lua's retire takes the keys of its other ops, then one more.
	"the keys of every op":  {"t", "pending", "scheduled", "retry", "archived", "completed", "result", "active", "u", "moving", "reserved", "meta", "stat", "seq", "owner", "paused", "h", "m", "gq", "gr", "gw", "gs", "gid", "gl", "pg", "wt", "oc", "ocx"},
	"ready grouped tasks":   {"gq"},
	"group rotation":        {"gr"},
	"group rotation zset":   {"gr"},
	"held-back groups zset": {"gw"},
	"group state hash":      {"gs"},
	"grouped task IDs":      {"gid"},
	"flow hash":             {"{}"},
	"failed task IDs":       {"failed"},
	"step names":            {"names"},
}

// check compares every call recorded with its script's header: the
// number of keys and arguments, and each key's place.
func (s *bindingCalls) check(t *testing.T, want []string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen["flow.lua"] == nil {
		t.Skip("the conformance suite did not run (a -run filter): nothing to check")
	}
	for _, f := range want {
		if len(s.seen[f]) == 0 {
			t.Errorf("%s: no call recorded, so its header was not checked", f)
		}
	}
	for f, shapes := range s.seen {
		hb := parseHeader(redisbroker.ScriptHeader(f))
		for _, sh := range shapes {
			var errs []string
			matched := false
			for mode, decls := range hb.modes {
				n := 0
				for _, d := range decls {
					n = max(n, d.hi)
				}
				if n != len(sh.keys) {
					errs = append(errs, fmt.Sprintf("mode %q declares %d keys", mode, n))
					continue
				}
				bad := false
				for _, d := range decls {
					names, ok := keyNames[d.name]
					if !ok {
						t.Errorf("%s: header names KEYS[%d] %q, which keyNames does not know", f, d.lo, d.name)
						bad = true
						continue
					}
					if len(names) != d.hi-d.lo+1 {
						t.Errorf("%s: KEYS[%d..%d] %q is %d keys, keyNames says %d", f, d.lo, d.hi, d.name, d.hi-d.lo+1, len(names))
						bad = true
						continue
					}
					for i, name := range names {
						if got := sh.keys[d.lo-1+i]; got != name {
							errs = append(errs, fmt.Sprintf("mode %q: KEYS[%d] is to be the %s (%s), the broker passes %s", mode, d.lo+i, d.name, name, got))
							bad = true
						}
					}
				}
				if !bad {
					matched = true
				}
			}
			if !matched {
				t.Errorf("%s: a call with keys [%s] matches no declaration of its header: %s", f, strings.Join(sh.keys, " "), strings.Join(errs, "; "))
			}
			if sh.argc < hb.argv || (!hb.openArgs && sh.argc != hb.argv) {
				t.Errorf("%s: a call passes %d arguments, its header declares ARGV[1..%d] (more allowed: %v)", f, sh.argc, hb.argv, hb.openArgs)
			}
		}
	}
}

// keyDecl is one declared key (or a run of keys) of a script's header.
type keyDecl struct {
	lo, hi int
	name   string
}

// headerBinding is what a script's header declares: its keys (per mode,
// for a script whose keys depend on its mode) and its arguments.
type headerBinding struct {
	modes    map[string][]keyDecl // "" for a script of one mode
	argv     int                  // highest ARGV[n] declared
	openArgs bool                 // more arguments follow (per task, per op)
}

var (
	bracketKey  = regexp.MustCompile(`^KEYS\[(\d+)(?:\.\.(\d+))?\]\s+(.*?)(?:\s{2,}|\s*\(|,|;|$)`)
	declStart   = regexp.MustCompile(`KEYS\[|ARGV\[`)
	numberedKey = regexp.MustCompile(`^KEYS(?: \(([^)]*)\))?:?\s+\d`)
	numberedOne = regexp.MustCompile(`(\d+)(?:\.\.(\d+))?\s+(.*?)(?:\s{2,}|\s*\(|,|$)`)
	argvDecl    = regexp.MustCompile(`(?m)(?:^|\s{2})ARGV\[(\d+)(\.\.)?`)
)

// parseHeader reads the KEYS and ARGV declarations of a script header
// (redisbroker.ScriptHeader). Two forms are understood: "KEYS[1] records
// hash  KEYS[2] pending list" and, for long lists, "KEYS: 1 records hash
// 2 pending list" (or "KEYS (mode) 1 ...") continued on indented lines.
func parseHeader(h string) headerBinding {
	b := headerBinding{modes: map[string][]keyDecl{}}
	lines := strings.Split(h, "\n")
	decl := func(mode string, m []string) {
		lo, _ := strconv.Atoi(m[1])
		hi := lo
		if m[2] != "" {
			hi, _ = strconv.Atoi(m[2])
		}
		b.modes[mode] = append(b.modes[mode], keyDecl{lo, hi, strings.TrimSpace(m[3])})
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := numberedKey.FindStringSubmatch(line); m != nil {
			mode := m[1]
			text := line[strings.IndexFunc(line[4:], func(r rune) bool { return r >= '0' && r <= '9' })+4:]
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "  ") {
				i++
				text += "  " + strings.TrimSpace(lines[i])
			}
			for _, part := range regexp.MustCompile(`\s{2,}`).Split(text, -1) {
				if m := numberedOne.FindStringSubmatch(part); m != nil {
					decl(mode, m)
				}
			}
			continue
		}
		starts := declStart.FindAllStringIndex(line, -1)
		for j, st := range starts {
			end := len(line)
			if j+1 < len(starts) {
				end = starts[j+1][0]
			}
			if m := bracketKey.FindStringSubmatch(line[st[0]:end]); m != nil {
				decl("", m)
			}
		}
	}
	for _, m := range argvDecl.FindAllStringSubmatch(h, -1) {
		n, _ := strconv.Atoi(m[1])
		if m[2] != "" {
			b.openArgs = true // ARGV[n..]: as many as the call needs, maybe none
			n--
		}
		b.argv = max(b.argv, n)
	}
	b.openArgs = b.openArgs || regexp.MustCompile(`(?m)^ARGV.*\bthen\b|^\s*then\b`).MatchString(h)
	return b
}
