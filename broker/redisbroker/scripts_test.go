package redisbroker

import (
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
