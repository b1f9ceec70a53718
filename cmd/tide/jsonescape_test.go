package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
	"github.com/tidequeue/tide/tidetype"
)

// rawUnsafe returns, quoted, where s has a character --json must escape:
// DEL, a C1 control, a format character, a line or paragraph separator,
// or a byte that is not UTF-8; "" when it has none.
func rawUnsafe(s string) string {
	for i, r := range s {
		if r == utf8.RuneError || r >= 0x7f && unsafeRune(r) {
			return strconv.QuoteToASCII(s[max(0, i-16):min(len(s), i+16)])
		}
	}
	return ""
}

// checkJSONOutput checks that out, one JSON document or one per line, has
// no raw character a terminal may act on and decodes.
func checkJSONOutput(t *testing.T, what, out string) {
	t.Helper()
	if c := rawUnsafe(out); c != "" {
		t.Errorf("%s: raw in --json output: %s", what, c)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%s: not JSON: %v\n%s", what, err, out)
			return
		}
	}
}

func TestJSONSafe(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":"plain é 日本 ✓ 🙂"}`:               `{"a":"plain é 日本 ✓ 🙂"}`,
		"{\"a\":\"\u009b31m\u0085\x7f\"}":      `{"a":"\u009b31m\u0085\u007f"}`,
		"{\"\u202ekey\":\"zero\u200b\ufeff\"}": `{"\u202ekey":"zero\u200b\ufeff"}`,
		"[\"line\u2028para\u2029\"]":           `["line\u2028para\u2029"]`,
		"[\"tag\U000e0041\"]":                  `["tag\udb40\udc41"]`,
		"[\"bad \xff\x9b byte\"]":              `["bad \ufffd\ufffd byte"]`,
		"[\"kept \\\\u009b\", 1]\n":            "[\"kept \\\\u009b\", 1]\n",
	} {
		got := string(jsonSafe([]byte(in)))
		if got != want {
			t.Errorf("jsonSafe(%q) = %q, want %q", in, got, want)
			continue
		}
		// The same value, with invalid bytes read as U+FFFD as a decoder
		// reads them.
		var a, b any
		if err := json.Unmarshal([]byte(in), &a); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if err := json.Unmarshal([]byte(got), &b); err != nil {
			t.Errorf("jsonSafe(%q) does not decode: %v", in, err)
		}
		if ja, jb := mustMarshal(t, a), mustMarshal(t, b); ja != jb {
			t.Errorf("jsonSafe(%q) decodes to %s, the input to %s", in, jb, ja)
		}
	}
	// The JSON log lines pass through it too.
	var buf bytes.Buffer
	a := &app{stderr: &buf, globals: globals{json: true}}
	t.Cleanup(func() { redisLogTarget.CompareAndSwap(a.logger(), nil) })
	a.logger().Info("evil\u009b", "type", "evil\u202etype\u0085")
	checkJSONOutput(t, "log line", buf.String())
	if !strings.Contains(buf.String(), `"type":"evil\u202etype\u0085"`) {
		t.Errorf("log line: %s", buf.String())
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every --json output escapes the C1 controls and format characters of
// stored text (task types, IDs, errors, payloads, headers, group, host
// and scheduler names), and still decodes to the exact text.
func TestJSONEscapesStoredText(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const (
		typ     = "evil\u202etype\u0085"
		id      = "id\u009b2J\u202e"
		payload = "{\"note\":\"\u202eevil\u009b31m\"}" // raw characters in a JSON payload
		group   = "g\u009b\u202e"
		batchID = "row-\u202eevil\u009b2J"
	)
	e.tide("events", "on", "q", "--force").want(t, exitOK)
	srv := tide.NewServer(e.b, tide.Config{Queues: map[string]int{"q": 1, "flows": 1}, ShutdownTimeout: time.Second, Logger: quietLogger()})
	if err := srv.Start(tide.HandlerFunc(func(_ context.Context, task *tide.Task) error {
		if strings.HasPrefix(task.Type(), "evil") {
			return errors.New(evilErr)
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	task := tide.NewTask(typ, []byte(payload))
	task.Headers()["x-evil"] = "\u009b\u202e"
	if _, err := e.c.Enqueue(ctx, task, tide.Queue("q"), tide.TaskID(id), tide.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.EnqueueWorkflow(ctx, tide.NewWorkflow("wf-evil").
		Add("bad", tide.NewTask("evil-step", nil, tide.MaxRetry(0))), tide.Queue("flows")); err != nil {
		t.Fatal(err)
	}
	b, err := e.c.EnqueueBatch(ctx, []*tide.Task{tide.NewTask("evil-member", nil, tide.TaskID(batchID), tide.MaxRetry(0))}, tide.Queue("flows"))
	if err != nil {
		t.Fatal(err)
	}
	// A queue no server serves keeps its group waiting.
	e.enqueue("t", "{}", tide.Queue("gq"), tide.Group(group))
	err = e.b.RegisterServer(ctx, tidetype.ServerInfo{
		ID: "srv\u009b", Host: "web\u202e", PID: 1, Concurrency: 1, Queues: map[string]int{"q": 1}, StartedAt: time.Now(),
		Active: []tidetype.ActiveTask{{Queue: "q", ID: id, Type: typ, StartedAt: time.Now()}},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = e.b.RegisterSchedulerEntries(ctx, "sched\u202e", []tidetype.SchedulerEntry{
		{SchedulerID: "sched\u202e", ID: "n\u009b", Spec: "@every 1h", Type: typ, Queue: "q", Next: time.Now().Add(time.Hour)},
	}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "the evil task to be archived", func() bool {
		ti, err := e.in.GetTaskInfo(ctx, "q", id)
		return err == nil && ti.State == tide.StateArchived
	})
	flowEnded(t, e, "wf-evil")
	flowEnded(t, e, b.ID)

	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"tasks", "ls", "q", "--state", "archived"}, exitOK},
		{[]string{"tasks", "ls", "q", "--state", "archived", "--type", "evil"}, exitOK},
		{[]string{"tasks", "show", "q", id}, exitOK},
		{[]string{"tasks", "wait", "q", id}, exitArchived},
		{[]string{"events", "tail", "q", "--oldest", "--count", "4"}, exitOK},
		{[]string{"workflows", "ls"}, exitOK},
		{[]string{"workflows", "show", "wf-evil"}, exitOK},
		{[]string{"batches", "ls"}, exitOK},
		{[]string{"batches", "show", b.ID}, exitOK},
		{[]string{"servers"}, exitOK},
		{[]string{"cron", "ls"}, exitOK},
		{[]string{"groups", "gq"}, exitOK},
		{[]string{"queues"}, exitOK},
		{[]string{"stats"}, exitOK},
		{[]string{"stats", "--watch", "--count", "1"}, exitOK},
		{[]string{"limits", "get", "q"}, exitOK},
		{[]string{"tasks", "show", "q", "gone\u009b"}, exitNotFound}, // an error, on stderr
		{[]string{"tasks", "run", "q", id}, exitOK},                  // last: it runs the task again
	} {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		r := e.tideCtx(ctx, append(c.args, "--json")...)
		cancel()
		what := "tide " + strings.Join(c.args, " ") + " --json"
		if r.code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", what, r.code, c.code, r.stdout, r.stderr)
		}
		checkJSONOutput(t, what+" (stdout)", r.stdout)
		checkJSONOutput(t, what+" (stderr)", r.stderr)
		// The text decodes exactly.
		switch strings.Join(c.args[:min(2, len(c.args))], " ") {
		case "tasks show", "tasks wait":
			if c.code == exitNotFound {
				break
			}
			var got taskJSON
			var note struct{ Note string }
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.ID != id || got.Type != typ ||
				got.LastError != evilErr || json.Unmarshal(got.Payload, &note) != nil || note.Note != "\u202eevil\u009b31m" ||
				got.Headers["x-evil"] != "\u009b\u202e" {
				t.Errorf("%s is not exact: %v\n%s", what, err, r.stdout)
			}
		case "events tail":
			evs := events(t, r.stdout)
			if len(evs) != 4 || evs[0].TaskID != id || evs[0].Type != typ || evs[2].Error != evilErr {
				t.Errorf("%s is not exact: %+v", what, evs)
			}
		case "batches show":
			var got struct {
				FailedIDs []string `json:"failed_ids"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.FailedIDs) != 1 || got.FailedIDs[0] != batchID {
				t.Errorf("%s is not exact: %v\n%s", what, err, r.stdout)
			}
		}
	}
}
