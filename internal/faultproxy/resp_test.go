package faultproxy

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// frame is a reply found by the reply parser: [start, end), end -1 when the
// input ended inside it.
type frame struct {
	start, end int64
	push       bool
}

// parseReplies feeds chunks to a new replyParser and returns the replies it
// found and its error.
func parseReplies(chunks ...[]byte) ([]frame, error) {
	p := newReplyParser()
	var frames []frame
	var evs []replyEvent
	for _, c := range chunks {
		var err error
		evs, err = p.feed(c, evs[:0])
		for _, ev := range evs {
			switch ev.kind {
			case evReplyStart:
				frames = append(frames, frame{start: ev.off, end: -1, push: ev.push})
			case evReplyEnd:
				frames[len(frames)-1].end = ev.off
			}
		}
		if err != nil {
			return frames, err
		}
	}
	return frames, nil
}

// splits returns data whole, byte by byte, and cut in two at every offset.
func splits(data []byte) [][][]byte {
	out := [][][]byte{{data}}
	var bytewise [][]byte
	for i := range data {
		bytewise = append(bytewise, data[i:i+1])
	}
	out = append(out, bytewise)
	for i := 1; i < len(data); i++ {
		out = append(out, [][]byte{data[:i], data[i:]})
	}
	return out
}

var replyCases = []struct {
	name   string
	in     string
	frames []frame // ends; starts are implied by the previous end
	bad    bool
}{
	{name: "simple", in: "+OK\r\n", frames: []frame{{0, 5, false}}},
	{name: "error", in: "-ERR wrong\r\n", frames: []frame{{0, 12, false}}},
	{name: "integer", in: ":-123\r\n", frames: []frame{{0, 7, false}}},
	{name: "bulk", in: "$5\r\nhello\r\n", frames: []frame{{0, 11, false}}},
	{name: "bulk with CRLF inside", in: "$4\r\n\r\n\r\n\r\n", frames: []frame{{0, 10, false}}},
	{name: "empty bulk", in: "$0\r\n\r\n", frames: []frame{{0, 6, false}}},
	{name: "null bulk", in: "$-1\r\n", frames: []frame{{0, 5, false}}},
	{name: "null array", in: "*-1\r\n", frames: []frame{{0, 5, false}}},
	{name: "empty array", in: "*0\r\n", frames: []frame{{0, 4, false}}},
	{name: "array", in: "*2\r\n$1\r\na\r\n:1\r\n", frames: []frame{{0, 15, false}}},
	{name: "nested", in: "*3\r\n*1\r\n+a\r\n*0\r\n*2\r\n*-1\r\n$-1\r\n", frames: []frame{{0, 30, false}}},
	{name: "resp3 null", in: "_\r\n", frames: []frame{{0, 3, false}}},
	{name: "boolean", in: "#t\r\n", frames: []frame{{0, 4, false}}},
	{name: "double", in: ",3.14\r\n", frames: []frame{{0, 7, false}}},
	{name: "double inf", in: ",-inf\r\n", frames: []frame{{0, 7, false}}},
	{name: "big number", in: "(3492890328409238509324850943850943825024385\r\n", frames: []frame{{0, 46, false}}},
	{name: "verbatim", in: "=15\r\ntxt:Some string\r\n", frames: []frame{{0, 22, false}}},
	{name: "blob error", in: "!21\r\nSYNTAX invalid syntax\r\n", frames: []frame{{0, 28, false}}},
	{name: "map", in: "%2\r\n+a\r\n:1\r\n+b\r\n:2\r\n", frames: []frame{{0, 20, false}}},
	{name: "empty map", in: "%0\r\n", frames: []frame{{0, 4, false}}},
	{name: "set", in: "~2\r\n+a\r\n+b\r\n", frames: []frame{{0, 12, false}}},
	{name: "push", in: ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n", frames: []frame{{0, 33, true}}},
	{
		name:   "attribute",
		in:     "|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n*2\r\n:2039123\r\n:9543892\r\n",
		frames: []frame{{0, 81, false}},
	},
	{name: "attribute inside", in: "*2\r\n|1\r\n+k\r\n+v\r\n:1\r\n:2\r\n", frames: []frame{{0, 24, false}}},
	{
		name:   "several",
		in:     "+OK\r\n:1\r\n>2\r\n+a\r\n+b\r\n$-1\r\n",
		frames: []frame{{0, 5, false}, {5, 9, false}, {9, 21, true}, {21, 26, false}},
	},
	{name: "incomplete bulk", in: "$5\r\nhel", frames: []frame{{0, -1, false}}},
	{name: "incomplete array", in: "+OK\r\n*2\r\n:1\r\n", frames: []frame{{0, 5, false}, {5, -1, false}}},
	{name: "unknown type", in: "+OK\r\n?x\r\n", frames: []frame{{0, 5, false}, {5, -1, false}}, bad: true},
	{name: "bad length", in: "$abc\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "streamed string", in: "$?\r\n;4\r\nHell\r\n;0\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "no CRLF after payload", in: "$3\r\nabcX\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "bare CR", in: "+OK\rX", frames: []frame{{0, -1, false}}, bad: true},
	{name: "negative count", in: "*-2\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "null map", in: "%-1\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "huge count", in: "*99999999999999999\r\n", frames: []frame{{0, -1, false}}, bad: true},
	{name: "long header", in: "$000000000000000000000000000001\r\n", frames: []frame{{0, -1, false}}, bad: true},
}

func TestReplyParser(t *testing.T) {
	for _, tc := range replyCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunks := range splits([]byte(tc.in)) {
				got, err := parseReplies(chunks...)
				if (err != nil) != tc.bad {
					t.Fatalf("chunks %q: error %v, want error %v", chunks, err, tc.bad)
				}
				if !reflect.DeepEqual(got, tc.frames) {
					t.Fatalf("chunks %q: replies %v, want %v", chunks, got, tc.frames)
				}
			}
		})
	}
}

func TestReplyParserLargeBulkNoBuffering(t *testing.T) {
	// A 100 MB bulk string declared, fed in pieces: the parser counts it.
	p := newReplyParser()
	const n = 100 << 20
	evs, err := p.feed([]byte(fmt.Sprintf("$%d\r\n", n)), nil)
	if err != nil || len(evs) != 1 {
		t.Fatalf("header: %v %v", evs, err)
	}
	chunk := bytes.Repeat([]byte{'x'}, 1<<20)
	for i := 0; i < n/len(chunk); i++ {
		if evs, err = p.feed(chunk, evs[:0]); err != nil || len(evs) != 0 {
			t.Fatalf("payload: %v %v", evs, err)
		}
	}
	if evs, err = p.feed([]byte("\r\n"), evs[:0]); err != nil || len(evs) != 1 || evs[0].kind != evReplyEnd {
		t.Fatalf("end: %v %v", evs, err)
	}
	if cap(p.num) > maxNumLen {
		t.Fatalf("header buffer grew to %d", cap(p.num))
	}
}

// command is a command found by the request parser.
type command struct {
	start, end int64 // end -1: not ended
	name, arg  string
	hasArg     bool
}

// parseCommands feeds chunks to a new reqParser and returns the commands it
// found and its error. It checks that every command is announced before its
// end and that held bytes stay bounded.
func parseCommands(t testing.TB, chunks ...[]byte) ([]command, error) {
	p := newReqParser()
	var cmds []command
	var evs []reqEvent
	for _, c := range chunks {
		var err error
		evs, err = p.feed(c, evs[:0])
		for _, ev := range evs {
			switch ev.kind {
			case evCommand:
				cmds = append(cmds, command{start: ev.off, end: -1, name: ev.name, arg: ev.arg, hasArg: ev.hasArg})
			case evCommandEnd:
				if len(cmds) == 0 || cmds[len(cmds)-1].end != -1 {
					t.Fatalf("end at %d of an unannounced command", ev.off)
				}
				if cmds[len(cmds)-1].name != ev.name {
					t.Fatalf("end of %q announced as %q", ev.name, cmds[len(cmds)-1].name)
				}
				cmds[len(cmds)-1].end = ev.off
			}
		}
		if err != nil {
			return cmds, err
		}
		if h := p.held(); h >= 0 && p.offset()-h > maxInline+1 {
			t.Fatalf("holds %d bytes", p.offset()-h)
		}
	}
	return cmds, nil
}

func bulkCmd(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

func TestRequestParser(t *testing.T) {
	long := strings.Repeat("k", maxCapture+1)
	cases := []struct {
		name string
		in   string
		cmds []command
		bad  bool
	}{
		{name: "one", in: bulkCmd("PING"), cmds: []command{{0, 14, "PING", "", false}}},
		{name: "lower case with key", in: bulkCmd("incr", "k"), cmds: []command{{0, 21, "INCR", "k", true}}},
		{
			name: "pipeline",
			in:   bulkCmd("MULTI") + bulkCmd("INCR", "a") + bulkCmd("EXEC"),
			cmds: []command{{0, 15, "MULTI", "", false}, {15, 36, "INCR", "a", true}, {36, 50, "EXEC", "", false}},
		},
		{name: "binary arg", in: bulkCmd("SET", "a\r\nb", "v"), cmds: []command{{0, 30, "SET", "a\r\nb", true}}},
		{name: "empty arg", in: bulkCmd("GET", ""), cmds: []command{{0, 19, "GET", "", true}}},
		{name: "long key", in: bulkCmd("GET", long), cmds: []command{{0, 85, "GET", "", false}}},
		{name: "long name", in: bulkCmd(long, "k"), cmds: []command{{0, 83, "", "", false}}},
		{name: "empty arrays", in: "*0\r\n*-1\r\n" + bulkCmd("PING"), cmds: []command{{9, 23, "PING", "", false}}},
		{name: "inline", in: "ping\r\n", cmds: []command{{0, 6, "PING", "", false}}},
		{name: "inline LF only", in: "set k v\n", cmds: []command{{0, 8, "SET", "k", true}}},
		{name: "inline spaces quotes", in: "  get \t 'k'  \r\n", cmds: []command{{0, 15, "GET", "k", true}}},
		{name: "inline empty lines", in: "\r\n\n  \r\n" + "PING\r\n", cmds: []command{{7, 13, "PING", "", false}}},
		{name: "inline garbage", in: "\x00\xff hello\r\n", cmds: []command{{0, 10, "\x00\xff", "hello", true}}},
		{name: "inline long token", in: long + " x\r\n", cmds: []command{{0, 69, "", "x", true}}},
		{name: "mixed", in: "PING\r\n" + bulkCmd("ECHO", "x"), cmds: []command{{0, 6, "PING", "", false}, {6, 27, "ECHO", "x", true}}},
		{name: "incomplete", in: bulkCmd("INCR", "k")[:20]},
		{name: "incomplete long key", in: bulkCmd("INCR", long)[:20], cmds: []command{{0, -1, "INCR", "", false}}},
		{name: "bad count", in: "*abc\r\n", bad: true},
		{name: "count too large", in: "*4294967296\r\n", bad: true},
		{name: "not a bulk", in: "*1\r\n:1\r\n", bad: true},
		{name: "negative bulk", in: "*1\r\n$-1\r\n", bad: true},
		{name: "payload too long", in: "*1\r\n$1\r\nab\r\n", bad: true},
		{name: "no LF", in: "*1\r\r", bad: true},
		{name: "header too long", in: "*000000000000000000000001\r\n", bad: true},
		{name: "after a good one", in: bulkCmd("PING") + "*x\r\n", cmds: []command{{0, 14, "PING", "", false}}, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunks := range splits([]byte(tc.in)) {
				got, err := parseCommands(t, chunks...)
				if (err != nil) != tc.bad {
					t.Fatalf("chunks %q: error %v, want error %v", chunks, err, tc.bad)
				}
				if !reflect.DeepEqual(got, tc.cmds) {
					t.Fatalf("chunks %q: commands %+v, want %+v", chunks, got, tc.cmds)
				}
			}
		})
	}
}

func TestRequestParserHoldsUntilIdentified(t *testing.T) {
	p := newReqParser()
	in := bulkCmd("INCR", "k")
	evs, err := p.feed([]byte(in[:16]), nil) // "*2\r\n$4\r\nINCR\r\n$1"
	if err != nil || len(evs) != 0 {
		t.Fatalf("%v %v", evs, err)
	}
	if h := p.held(); h != 0 {
		t.Fatalf("held %d, want 0: the command is not identified yet", h)
	}
	evs, err = p.feed([]byte(in[16:20]), evs[:0]) // "\r\nk\r"
	if err != nil || len(evs) != 0 || p.held() != 0 {
		t.Fatalf("%v %v: announced before the first argument is complete", evs, err)
	}
	evs, err = p.feed([]byte(in[20:]), evs[:0]) // "\n"
	if err != nil || len(evs) != 2 || evs[0].kind != evCommand || evs[0].arg != "k" || evs[1].kind != evCommandEnd {
		t.Fatalf("%+v %v", evs, err)
	}
	if h := p.held(); h != -1 {
		t.Fatalf("held %d after identification", h)
	}
}

func TestRequestParserInlineLimit(t *testing.T) {
	p := newReqParser()
	chunk := bytes.Repeat([]byte("a "), 1<<10)
	var err error
	for i := 0; err == nil && i < 64; i++ {
		_, err = p.feed(chunk, nil)
	}
	if err == nil {
		t.Fatal("an endless inline line was accepted")
	}
}

func TestMatch(t *testing.T) {
	cases := []struct {
		m      Match
		name   string
		arg    string
		hasArg bool
		want   bool
	}{
		{Match{}, "GET", "", false, true},
		{Commands(), "GET", "k", true, true},
		{Commands("evalsha", "EVAL"), "EVALSHA", "", false, true},
		{Commands("evalsha", "EVAL"), "EVAL", "", false, true},
		{Commands("evalsha", "EVAL"), "GET", "", false, false},
		{Commands("INCR").WithFirstArg("k3"), "INCR", "k3", true, true},
		{Commands("INCR").WithFirstArg("k3"), "INCR", "k2", true, false},
		{Commands("INCR").WithFirstArg("k3"), "INCR", "", false, false},
		{Commands().WithFirstArg(""), "GET", "", true, true},
	}
	for i, tc := range cases {
		if got := tc.m.matches(tc.name, tc.arg, tc.hasArg); got != tc.want {
			t.Errorf("case %d: %+v matches %q %q %v = %v, want %v", i, tc.m, tc.name, tc.arg, tc.hasArg, got, tc.want)
		}
	}
}

// chunked cuts data at the offsets given by cuts (taken modulo its length).
func chunked(data, cuts []byte) [][]byte {
	var out [][]byte
	for _, c := range cuts {
		if len(data) == 0 {
			break
		}
		n := int(c)%len(data) + 1
		out = append(out, data[:n])
		data = data[n:]
	}
	if len(data) > 0 {
		out = append(out, data)
	}
	return out
}

func FuzzReplyParser(f *testing.F) {
	for _, tc := range replyCases {
		f.Add([]byte(tc.in), []byte{1, 3})
	}
	f.Add([]byte("*3\r\n%1\r\n~1\r\n|1\r\n+a\r\n+b\r\n(1\r\n=4\r\ntxt:\r\n#f\r\n"), []byte{7})
	f.Add([]byte(">2\r\n$9\r\nsubscribe\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n"), []byte{0, 0, 250})
	f.Add([]byte("*999999999\r\n"), []byte{})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole, werr := parseReplies(data)
		parts, perr := parseReplies(chunked(data, cuts)...)
		if (werr != nil) != (perr != nil) || !reflect.DeepEqual(whole, parts) {
			t.Fatalf("whole: %v %v; in chunks: %v %v", whole, werr, parts, perr)
		}
		last := int64(0)
		for i, fr := range whole {
			if fr.start < last || (fr.end != -1 && fr.end <= fr.start) || fr.end > int64(len(data)) {
				t.Fatalf("reply %d %+v out of order in %d bytes", i, fr, len(data))
			}
			if fr.end == -1 && i != len(whole)-1 {
				t.Fatalf("unfinished reply %d is not the last", i)
			}
			last = fr.end
		}
	})
}

func FuzzRequestParser(f *testing.F) {
	f.Add([]byte(bulkCmd("SET", "k", "v")+"PING\r\n"), []byte{2})
	f.Add([]byte("*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n*0\r\n\r\n"), []byte{})
	f.Add([]byte("*1\r\n$99999999999\r\n"), []byte{5})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole, werr := parseCommands(t, data)
		parts, perr := parseCommands(t, chunked(data, cuts)...)
		if (werr != nil) != (perr != nil) || !reflect.DeepEqual(whole, parts) {
			t.Fatalf("whole: %+v %v; in chunks: %+v %v", whole, werr, parts, perr)
		}
		for _, c := range whole {
			if len(c.name) > maxCapture || len(c.arg) > maxCapture {
				t.Fatalf("captured too much: %+v", c)
			}
		}
	})
}
