package redisbroker

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// scripts holds every state-changing script, each prefixed with the helpers
// of lib.lua and groups.lua it uses (or with them in place of its helpers
// mark, see link).
//
// Each script's header names its keys and arguments, "KEYS[1] records hash"
// (or "KEYS: 1 records hash  2 pending list" for long lists) and "ARGV[1]
// layout", "ARGV[n..]" for a variable tail. The header is the binding:
// TestConformance/ScriptBindings records every call the conformance suite
// makes and fails when the number of keys or arguments, or any key's
// place, differs from it (bindings_test.go maps each name to its key).
// TestScriptHelperFiles and TestScriptsLinked check the prelude linker.
type scripts struct {
	enqueue, enqueuePlain, enqueueOne, dequeue, dequeuePlain, extend, settle, settlePlain, setResult, remove, maintain, admin, move, registry, drop, limits, share, slots, wait, progress, flow, step, signal, ids, relocate *redis.Script

	byFile map[string]*redis.Script // file name -> script, for tests
}

func loadScripts() *scripts {
	lib := parseLib(mustRead("groups.lua") + "\n" + mustRead("lib.lua"))
	byFile := map[string]*redis.Script{}
	s := func(name string) *redis.Script {
		body := mustRead(name)
		byFile[name] = redis.NewScript(lib.link(body))
		return byFile[name]
	}
	return &scripts{
		byFile:       byFile,
		enqueue:      s("enqueue.lua"),
		enqueuePlain: s("enqueue_plain.lua"),
		enqueueOne:   s("enqueue_one.lua"),
		dequeue:      s("dequeue.lua"),
		dequeuePlain: s("dequeue_plain.lua"),
		extend:       s("extend.lua"),
		settle:       s("settle.lua"),
		settlePlain:  s("settle_plain.lua"),
		setResult:    s("setresult.lua"),
		remove:       s("remove.lua"),
		maintain:     s("maintain.lua"),
		admin:        s("admin.lua"),
		move:         s("move.lua"),
		registry:     s("registry.lua"),
		drop:         s("drop.lua"),
		limits:       s("limits.lua"),
		share:        s("share.lua"),
		slots:        s("slots.lua"),
		wait:         s("wait.lua"),
		progress:     s("progress.lua"),
		flow:         s("flow.lua"),
		step:         s("step.lua"),
		signal:       s("signal.lua"),
		ids:          s("ids.lua"),
		relocate:     s("relocate.lua"),
	}
}

// lib holds the helpers of lib.lua, one "local function" block each.
type lib struct {
	names []string                   // in file order
	code  map[string]string          // name -> block
	calls map[string]map[string]bool // name -> calledNames of its block
}

func parseLib(src string) lib {
	l := lib{code: map[string]string{}, calls: map[string]map[string]bool{}}
	blocks := strings.Split(src, "\nlocal function ")
	for _, b := range blocks[1:] {
		name := b[:strings.IndexAny(b, "( ")]
		// A helper is a one-line "... end" or runs to its last line "end";
		// comments after it belong to the next helper.
		lines := strings.Split(b, "\n")
		n := 1
		if !strings.HasSuffix(lines[0], " end") {
			for i, line := range lines {
				if line == "end" {
					n = i + 1
				}
			}
		}
		l.names = append(l.names, name)
		l.code[name] = "local function " + strings.Join(lines[:n], "\n") + "\n"
		l.calls[name] = calledNames(l.code[name])
	}
	return l
}

// prelude returns the helpers body uses, directly or through other helpers,
// in file order. Redis runs a script's whole text on every call, so defining
// only what is needed keeps each call cheap.
func (l lib) prelude(body string) string {
	need := map[string]bool{}
	var visit func(called map[string]bool)
	visit = func(called map[string]bool) {
		for _, n := range l.names {
			if !need[n] && called[n] {
				need[n] = true
				visit(l.calls[n])
			}
		}
	}
	visit(calledNames(body))
	var sb strings.Builder
	for _, n := range l.names {
		if need[n] {
			sb.WriteString(l.code[n])
		}
	}
	return sb.String()
}

// calledNames returns every name that text holds followed by "(": each
// run of letters, digits and '_' just before a '(', and every tail of it
// (a name is looked for as text, "x_get(" holds "get("). One pass over
// text, where looking for each helper's name in it took a pass a helper
// (a broker links every script when it is made).
func calledNames(text string) map[string]bool {
	called := map[string]bool{}
	for i := 0; i < len(text); i++ {
		if text[i] != '(' {
			continue
		}
		j := i
		for j > 0 && isNameByte(text[j-1]) {
			j--
		}
		for k := j; k < i; k++ {
			called[text[k:i]] = true
		}
	}
	return called
}

func isNameByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// helpersMark is the line of a script body after which its helpers are
// linked, when it has one: the code before it runs without them (and calls
// none), so that a call that returns there does not define them.
const helpersMark = "\n--@helpers\n"

// link returns the script as Redis runs it: the helpers body uses, then
// body; or, when body has a helpersMark line, body with the helpers in
// place of that line.
func (l lib) link(body string) string {
	pre := l.prelude(body)
	if i := strings.Index(body, helpersMark); i >= 0 {
		return body[:i+1] + pre + body[i+len(helpersMark):]
	}
	return pre + body
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("tide: redisbroker: missing embedded script " + name)
	}
	return string(b)
}
