package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/internal/testwait"
)

// rowIDs returns the task IDs of the table rows of a queue page.
func rowIDs(body string) []string {
	var ids []string
	for _, part := range strings.Split(body, `<tr data-task-id="`)[1:] {
		ids = append(ids, part[:strings.IndexByte(part, '"')])
	}
	return ids
}

func TestSearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	e.startServer(tide.Config{Concurrency: 2, Queues: map[string]int{"mail": 1}}, func(_ context.Context, task *tide.Task) error {
		if strings.Contains(string(task.Payload()), "bounce") {
			return fmt.Errorf("smtp 550 <b>mailbox</b> unavailable: %w", tide.SkipRetry)
		}
		return nil
	})
	for i := range 6 {
		kind := "ok"
		if i%2 == 1 {
			kind = "bounce"
		}
		e.enqueue("email:welcome", fmt.Appendf(nil, `{"to":"user%d@example.com","kind":%q}`, i, kind), tide.Queue("mail"), tide.TaskID(fmt.Sprintf("welcome-%d", i)))
	}
	testwait.For(t, 20*time.Second, "three archived tasks", func() bool {
		qi, err := e.in.QueueInfo(e.ctx(), "mail")
		return err == nil && qi.Archived == 3
	})
	for i := range 4 {
		e.enqueue("report:daily", fmt.Appendf(nil, `{"day":%d}`, i), tide.Queue("mail"), tide.ProcessIn(time.Hour), tide.TaskID(fmt.Sprintf("report-%d", i)))
	}
	e.enqueue("email:digest", []byte(`{"to":"ops@example.com"}`), tide.Queue("mail"), tide.ProcessIn(time.Hour), tide.TaskID("digest-1"))

	search := func(state string, terms ...string) []string {
		t.Helper()
		v := url.Values{"q": {"mail"}, "state": {state}}
		for i := 0; i < len(terms); i += 2 {
			v.Set(terms[i], terms[i+1])
		}
		resp, body := e.get("/queue?" + v.Encode())
		wantStatus(t, resp, body, http.StatusOK)
		return rowIDs(body)
	}
	for _, c := range []struct {
		state string
		terms []string
		want  string
	}{
		{"scheduled", []string{"type", "report:"}, "report-0 report-1 report-2 report-3"},
		{"scheduled", []string{"id", "digest"}, "digest-1"},
		{"scheduled", []string{"payload", `"day":2`}, "report-2"},
		{"scheduled", []string{"payload", "ops@", "type", "email"}, "digest-1"},
		{"scheduled", []string{"type", "nothing-matches"}, ""},
		{"archived", []string{"err", "<b>mailbox</b>"}, "welcome-1 welcome-3 welcome-5"},
		{"archived", []string{"err", "550", "payload", "user3@"}, "welcome-3"},
	} {
		if got := strings.Join(search(c.state, c.terms...), " "); !sameSet(got, c.want) {
			t.Errorf("search %s %q: rows %q, want %q", c.state, c.terms, got, c.want)
		}
	}
	// Stored markup in the matching rows is escaped.
	_, body := e.get("/queue?" + url.Values{"q": {"mail"}, "state": {"archived"}, "err": {"<b>mailbox"}}.Encode())
	if strings.Contains(body, "<b>mailbox") || !strings.Contains(body, "&lt;b&gt;mailbox&lt;/b&gt;") {
		t.Errorf("search rows show the stored error unescaped:\n%s", body)
	}

	// A page of two, then the rest from where it stopped.
	resp, body := e.get("/queue?" + url.Values{"q": {"mail"}, "state": {"scheduled"}, "type": {"report"}, "size": {"2"}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
	first := rowIDs(body)
	i := strings.Index(body, `rel="next" href="`)
	if len(first) != 2 || i < 0 {
		t.Fatalf("first search page: rows %q, next link %v", first, i >= 0)
	}
	next := body[i+len(`rel="next" href="`):]
	next = strings.ReplaceAll(next[:strings.IndexByte(next, '"')], "&amp;", "&")
	if !strings.Contains(next, "from=") || !strings.Contains(next, "type=report") {
		t.Errorf("next link %q does not continue the search", next)
	}
	_, body = e.get(next)
	if got := strings.Join(append(first, rowIDs(body)...), " "); !sameSet(got, "report-0 report-1 report-2 report-3") {
		t.Errorf("two search pages: %q", got)
	}

	// Terms are echoed escaped; hostile ones find nothing and break nothing.
	evil := `"><script>alert(1)</script>`
	resp, body = e.get("/queue?" + url.Values{"q": {"mail"}, "state": {"scheduled"}, "payload": {evil}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "search page", body)
	if !strings.Contains(body, `value="&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"`) {
		t.Errorf("the search term is not echoed escaped:\n%s", body)
	}
	// Too long a term: 400 with a message.
	resp, body = e.get("/queue?" + url.Values{"q": {"mail"}, "id": {strings.Repeat("x", maxTermBytes+1)}}.Encode())
	wantStatus(t, resp, body, http.StatusBadRequest)
	if !strings.Contains(body, "search term") {
		t.Errorf("400 without a message:\n%s", body)
	}
	// A bad offset is clamped, not an error.
	resp, body = e.get("/queue?" + url.Values{"q": {"mail"}, "state": {"scheduled"}, "type": {"report"}, "from": {"-5"}}.Encode())
	wantStatus(t, resp, body, http.StatusOK)
}

// sameSet reports whether two space-separated lists hold the same words.
func sameSet(a, b string) bool {
	count := map[string]int{}
	for _, w := range strings.Fields(a) {
		count[w]++
	}
	for _, w := range strings.Fields(b) {
		count[w]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}

func TestSelectionActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testToken)
	var ids []string
	for i := range 4 {
		ti := e.enqueue("order:cancel", fmt.Appendf(nil, `{"order":%d}`, i), tide.ProcessIn(time.Hour), tide.TaskID(fmt.Sprintf("order-%d", i)))
		ids = append(ids, ti.ID)
	}
	evilID := `<img src=x onerror=alert(1)>`
	e.enqueue("x", []byte("1"), tide.TaskID(evilID)) // pending: cannot be run
	session := e.login()
	csrf := e.csrf(session)

	// The page offers the selection to an admin, with its CSRF token.
	_, body := e.get("/queue?q=default&state=scheduled", session)
	for _, want := range []string{`id="selection"`, `formaction="/selection/archive"`, `class="sel-box"`, `id="select-all"`, `name="csrf" value="` + csrf + `"`} {
		if !strings.Contains(body, want) {
			t.Errorf("scheduled tab lacks %s", want)
		}
	}
	// A visitor gets no checkboxes.
	if _, body := e.get("/queue?q=default&state=scheduled"); strings.Contains(body, "sel-box") {
		t.Error("a visitor sees the selection checkboxes")
	}

	sel := func(op string, form url.Values, csrf string) (*http.Response, string) {
		t.Helper()
		form.Set("q", "default")
		return e.post("/selection/"+op, form, session, csrf)
	}
	// Without or with a wrong CSRF token: refused, nothing changes.
	for _, bad := range []string{"", "wrong", csrf + "x"} {
		resp, body := sel("archive", url.Values{"id": {ids[0], ids[1]}}, bad)
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	// Cross-origin with the right token: refused.
	resp, body := e.do(http.MethodPost, "/selection/archive", url.Values{"q": {"default"}, "id": {ids[0]}, "csrf": {csrf}},
		map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, session)
	wantStatus(t, resp, body, http.StatusForbidden)
	for _, id := range ids {
		if st := e.state("default", id); st != tide.StateScheduled {
			t.Fatalf("a refused selection action changed %s to %v", id, st)
		}
	}

	// Archive two: both move, the flash says so.
	resp, body = sel("archive", url.Values{"id": {ids[0], ids[1], ids[0]}, "return": {"/queue?q=default&state=scheduled"}}, csrf)
	wantStatus(t, resp, body, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/queue?q=default&state=scheduled" {
		t.Errorf("Location %q", loc)
	}
	for _, id := range ids[:2] {
		if st := e.state("default", id); st != tide.StateArchived {
			t.Errorf("%s is %v after archive, want archived", id, st)
		}
	}
	_, body = e.get("/", session, cookieNamed(resp, flashCookie))
	if !strings.Contains(body, "2 selected tasks of queue default were archived.") {
		t.Error("no flash after archiving the selection")
	}

	// Run one that can run and one that cannot: a page lists the failure,
	// escaped; the other one ran.
	resp, body = sel("run", url.Values{"id": {ids[0], evilID}}, csrf)
	wantStatus(t, resp, body, http.StatusOK)
	checkNoRaw(t, "selection result", body)
	if !strings.Contains(body, `id="selection-failures"`) || !strings.Contains(body, "&lt;img src=x onerror=alert(1)&gt;") ||
		!strings.Contains(body, "1 of 2 selected tasks") {
		t.Errorf("the result page does not list the failure:\n%s", body)
	}
	if st := e.state("default", ids[0]); st != tide.StatePending {
		t.Errorf("%s is %v after run, want pending", ids[0], st)
	}
	// All fail: the status of the failure.
	resp, body = sel("run", url.Values{"id": {"no-such-task"}}, csrf)
	wantStatus(t, resp, body, http.StatusNotFound)

	// Bad input: 400 with a message, never a panic.
	tooMany := url.Values{}
	for i := range maxSelection + 1 {
		tooMany.Add("id", fmt.Sprint("t", i))
	}
	for name, c := range map[string]struct {
		op   string
		form url.Values
		want int
	}{
		"no ids":       {"archive", url.Values{}, http.StatusBadRequest},
		"too many":     {"archive", tooMany, http.StatusBadRequest},
		"empty id":     {"archive", url.Values{"id": {ids[2], ""}}, http.StatusBadRequest},
		"control char": {"archive", url.Values{"id": {"a\x00b"}}, http.StatusBadRequest},
		"long id":      {"archive", url.Values{"id": {strings.Repeat("x", tide.MaxIDLength+1)}}, http.StatusBadRequest},
		"unknown op":   {"explode", url.Values{"id": {ids[2]}}, http.StatusNotFound},
		"cancel":       {"cancel", url.Values{"id": {ids[2]}}, http.StatusNotFound},
	} {
		resp, body := sel(c.op, c.form, csrf)
		if resp.StatusCode != c.want {
			t.Errorf("%s: status %d, want %d:\n%s", name, resp.StatusCode, c.want, body)
		}
	}
	resp, body = e.post("/selection/archive", url.Values{"q": {"bad queue"}, "id": {ids[2]}}, session, csrf)
	wantStatus(t, resp, body, http.StatusBadRequest)
	if st := e.state("default", ids[2]); st != tide.StateScheduled {
		t.Errorf("a refused request changed %s to %v", ids[2], st)
	}
	resp, body = e.get("/selection/archive")
	wantStatus(t, resp, body, http.StatusMethodNotAllowed)
	// The host check comes first.
	hdr := e.browser()
	hdr["Host"] = "evil.example"
	resp, body = e.do(http.MethodPost, "/selection/archive", url.Values{"q": {"default"}, "id": {ids[2]}, "csrf": {csrf}}, hdr, session)
	wantStatus(t, resp, body, http.StatusMisdirectedRequest)

	// A bearer client gets JSON listing the failures.
	resp, body = e.do(http.MethodPost, "/selection/delete", url.Values{"q": {"default"}, "id": {ids[2], ids[3], "gone"}},
		map[string]string{"Authorization": "Bearer " + testToken})
	wantStatus(t, resp, body, http.StatusOK)
	var out struct {
		OK     bool `json:"ok"`
		Count  int  `json:"count"`
		Failed []struct {
			ID     string `json:"id"`
			Status int    `json:"status"`
		} `json:"failed"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("bearer answer %q: %v", body, err)
	}
	if out.OK || out.Count != 2 || len(out.Failed) != 1 || out.Failed[0].ID != "gone" || out.Failed[0].Status != http.StatusNotFound {
		t.Errorf("bearer answer %+v", out)
	}
}
