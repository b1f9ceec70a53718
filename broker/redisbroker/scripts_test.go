package redisbroker

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestScriptPreludes checks that each script gets the helpers it calls (and
// their helpers) and not the others.
func TestScriptPreludes(t *testing.T) {
	l := parseLib(mustRead("lib.lua"))
	if len(l.names) < 8 {
		t.Fatalf("parsed %d helpers from lib.lua: %v", len(l.names), l.names)
	}
	enq := l.prelude(mustRead("enqueue.lua"))
	if !strings.Contains(enq, "local function earliest(") || strings.Contains(enq, "local function rec_patch(") {
		t.Fatalf("enqueue prelude:\n%s", enq)
	}
	deq := l.prelude(mustRead("dequeue.lua"))
	for _, want := range []string{"rec_ok", "rec_patch", "rec_end", "rec_token", "rec_corrupt", "redis_now"} {
		if !strings.Contains(deq, "local function "+want+"(") {
			t.Errorf("dequeue prelude lacks %s", want)
		}
	}
	for name, code := range l.code {
		if !strings.HasSuffix(code, "end\n") {
			t.Errorf("helper %s is cut badly:\n%s", name, code)
		}
	}
}

// helperFiles are the files whose helpers the prelude linker copies into
// the scripts that call them (loadScripts).
var helperFiles = []string{"groups.lua", "lib.lua"}

// luaGlobals are the names a script may call without defining them: Lua's
// own functions and the libraries Redis gives scripts.
var luaGlobals = map[string]bool{
	"tonumber": true, "tostring": true, "type": true, "pairs": true, "ipairs": true,
	"unpack": true, "error": true, "pcall": true, "select": true, "next": true,
	"assert": true, "setmetatable": true, "getmetatable": true, "rawget": true,
	"rawset": true, "function": true, "if": true, "while": true, "and": true,
	"or": true, "not": true, "return": true, "elseif": true, "in": true, "until": true,
}

var (
	luaCall    = regexp.MustCompile(`(^|[^.:\w])([A-Za-z_]\w*)\s*\(`)
	luaLocalFn = regexp.MustCompile(`local function ([A-Za-z_]\w*)`)
	luaLocal   = regexp.MustCompile(`local ([A-Za-z_][\w, ]*)=`)
	luaParams  = regexp.MustCompile(`function\s*[\w.:]*\(([^)]*)\)`)
)

// stripLua removes comments and string literals, which may mention names
// followed by a parenthesis.
func stripLua(src string) string {
	var sb strings.Builder
	for _, line := range strings.Split(src, "\n") {
		var out []byte
		for i := 0; i < len(line); i++ {
			c := line[i]
			if c == '-' && i+1 < len(line) && line[i+1] == '-' {
				break
			}
			if c == '\'' || c == '"' {
				j := i + 1
				for j < len(line) && line[j] != c {
					if line[j] == '\\' {
						j++
					}
					j++
				}
				out = append(out, c, c)
				i = j
				continue
			}
			out = append(out, c)
		}
		sb.Write(out)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// defined returns the names src defines: local functions, locals and
// function parameters.
func defined(src string) map[string]bool {
	d := map[string]bool{}
	for _, m := range luaLocalFn.FindAllStringSubmatch(src, -1) {
		d[m[1]] = true
	}
	for _, re := range []*regexp.Regexp{luaLocal, luaParams} {
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			for _, n := range strings.Split(m[1], ",") {
				d[strings.TrimSpace(n)] = true
			}
		}
	}
	return d
}

// TestScriptHelperFiles checks the prelude linker on every helper file:
// each "local function" is parsed as one helper, cut at its own end, and
// calls only helpers defined before it (the prelude keeps file order, and a
// local function is not visible above its definition).
func TestScriptHelperFiles(t *testing.T) {
	for _, file := range helperFiles {
		t.Run(file, func(t *testing.T) {
			src := mustRead(file)
			l := parseLib(src)
			if want := strings.Count(src, "\nlocal function "); len(l.names) != want {
				t.Fatalf("parsed %d helpers, the file defines %d", len(l.names), want)
			}
			before := map[string]bool{}
			for _, n := range l.names {
				code := l.code[n]
				if !strings.HasSuffix(code, "end\n") || strings.Count(code, "\nlocal function ") > 0 {
					t.Errorf("helper %s is cut badly:\n%s", n, code)
				}
				if !strings.Contains(src, code) {
					t.Errorf("helper %s is not a piece of %s as parsed", n, file)
				}
				for _, m := range luaCall.FindAllStringSubmatch(stripLua(code), -1) {
					if c := m[2]; l.code[c] != "" && !before[c] && c != n {
						t.Errorf("helper %s calls %s, defined after it", n, c)
					}
				}
				before[n] = true
			}
		})
	}
	// The helper files are linked together (groups.lua first): a name must
	// not be defined in both.
	g, lb := parseLib(mustRead("groups.lua")), parseLib(mustRead("lib.lua"))
	for _, n := range g.names {
		if lb.code[n] != "" {
			t.Errorf("helper %s is defined in groups.lua and lib.lua", n)
		}
	}
}

// TestScriptsLinked checks every script as loadScripts builds it (prelude
// and body): whatever it calls is defined in it or is Lua's or Redis'
// (Redis refuses globals, so a missing helper would fail only when the
// call runs), and every helper it calls comes with it.
func TestScriptsLinked(t *testing.T) {
	l := parseLib(mustRead("groups.lua") + "\n" + mustRead("lib.lua"))
	files, err := scriptFS.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		name := f.Name()
		if slices.Contains(helperFiles, name) {
			continue
		}
		n++
		t.Run(name, func(t *testing.T) {
			body := mustRead(name)
			full := stripLua(l.link(body))
			defs := defined(full)
			for _, m := range luaCall.FindAllStringSubmatch(full, -1) {
				if c := m[2]; !defs[c] && !luaGlobals[c] {
					t.Errorf("calls %s, which is neither defined in it nor Lua's", c)
				}
			}
			// Before a helpers mark nothing is defined yet: a helper
			// called there would be an undefined global when it runs.
			if i := strings.Index(body, helpersMark); i >= 0 {
				before := stripLua(body[:i])
				for _, m := range luaCall.FindAllStringSubmatch(before, -1) {
					if c := m[2]; !luaGlobals[c] && !defined(before)[c] {
						t.Errorf("calls %s before its helpers mark", c)
					}
				}
			}
		})
	}
	if n < 15 {
		t.Fatalf("found %d scripts", n)
	}
}
