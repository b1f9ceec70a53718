package dashboard

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestViewBlob(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		in       []byte
		kind     string
		contains string
	}{
		{"empty", nil, "empty", ""},
		{"text", []byte("hello\r\nworld"), "text", "hello\nworld"},
		{"json indented", []byte(`{"a":[1,2]}`), "json", "{\n  \"a\": [\n    1,\n    2\n  ]\n}"},
		{"binary", []byte{0, 1, 2, 3}, "binary", ""},
		{"invalid utf8", []byte{'a', 0xff, 'b'}, "binary", ""},
		{"bidi escaped", []byte("abc\u202edef ghi jkl mno pqr"), "text", `abc\u202edef`},
		{"emoji kept", []byte("ok 👩‍💻"), "text", "👩‍💻"},
		{"mostly control", []byte("\x01\x02\x03a"), "binary", ""},
	}
	for _, c := range cases {
		b := viewBlob(c.in)
		if b.Kind != c.kind {
			t.Errorf("%s: kind %q, want %q", c.name, b.Kind, c.kind)
		}
		if b.Size != len(c.in) {
			t.Errorf("%s: size %d", c.name, b.Size)
		}
		if c.contains != "" && !strings.Contains(b.Text, c.contains) {
			t.Errorf("%s: text %q lacks %q", c.name, b.Text, c.contains)
		}
	}
	bin := viewBlob([]byte{0xde, 0xad, 0xbe, 0xef})
	if !strings.HasPrefix(bin.Hex, "00000000  de ad be ef   ") || !strings.HasSuffix(bin.Hex, "  |....|\n") || bin.Base64 != "3q2+7w==" {
		t.Errorf("binary: hex %q base64 %q", bin.Hex, bin.Base64)
	}
}

func TestViewBlobBounds(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("é"), detailBytes) // 2 bytes each
	b := viewBlob(big)
	if !b.Truncated || len(b.Text) > detailBytes || !utf8.ValidString(b.Text) {
		t.Errorf("big text: truncated %v, %d bytes, valid %v", b.Truncated, len(b.Text), utf8.ValidString(b.Text))
	}
	bin := viewBlob(bytes.Repeat([]byte{0}, 1<<20))
	if !bin.Truncated || strings.Count(bin.Hex, "\n") != hexDumpBytes/16 || len(bin.Base64) > detailBytes*4/3+4 {
		t.Errorf("big binary: truncated %v, %d hex lines, %d base64 bytes", bin.Truncated, strings.Count(bin.Hex, "\n"), len(bin.Base64))
	}
	// Deep JSON is valid but not re-indented (its indentation would be huge).
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	d := viewBlob([]byte(deep))
	if d.Kind != "json" || d.Text != deep {
		t.Errorf("deep JSON: kind %q, %d bytes", d.Kind, len(d.Text))
	}
}

func TestPreview(t *testing.T) {
	t.Parallel()
	if got := preview(nil); got != "(empty)" {
		t.Errorf("empty: %q", got)
	}
	if got := preview([]byte("a\n\n  b\tc")); got != "a b c" {
		t.Errorf("whitespace: %q", got)
	}
	long := preview(bytes.Repeat([]byte("x"), 10000))
	if n := utf8.RuneCountInString(long); n > previewRunes+2 || !strings.HasSuffix(long, "…") {
		t.Errorf("long: %d runes %q", n, long[len(long)-10:])
	}
	if got := preview([]byte{0, 1, 2}); got != "binary, 3 B: 00 01 02" {
		t.Errorf("binary: %q", got)
	}
	if got := preview(bytes.Repeat([]byte{0}, 100)); !strings.HasSuffix(got, " …") || !strings.HasPrefix(got, "binary, 100 B: 00 00") {
		t.Errorf("long binary: %q", got)
	}
}

func TestHumanAndRelative(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 850 * time.Millisecond: "850ms", 42 * time.Second: "42s",
		3*time.Minute + 4*time.Second: "3m 4s", 2*time.Hour + 5*time.Minute: "2h 5m", 76 * time.Hour: "3d 4h",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := relative(now.Add(90*time.Second), now); got != "in 1m 30s" {
		t.Errorf("future: %q", got)
	}
	if got := relative(now.Add(-time.Hour), now); got != "1h 0m ago" {
		t.Errorf("past: %q", got)
	}
	if got := relative(time.Time{}, now); got != "—" {
		t.Errorf("zero: %q", got)
	}
	if got := number(-1234567); got != "-1,234,567" {
		t.Errorf("number: %q", got)
	}
}

func TestChart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 15, 0, 0, 0, time.UTC)
	today := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	a := []day{{Date: today, Processed: 10, Failed: 2}, {Date: today.AddDate(0, 0, -2), Processed: 5, Failed: 5}}
	b := []day{{Date: today, Processed: 1}, {Date: today.AddDate(0, 0, -30), Processed: 99}} // out of range
	days := mergeHistory([][]day{a, b}, 7, now)
	if len(days) != 7 || !days[6].Date.Equal(today) || days[6].Processed != 11 || days[6].Failed != 2 || days[4].Failed != 5 {
		t.Fatalf("merged: %+v", days)
	}
	c := newChart(days)
	if c.Processed != 16 || c.Failed != 7 || c.Empty || len(c.Bars) != 7 || len(c.Labels) != 7 {
		t.Fatalf("chart: %+v", c)
	}
	for i, bar := range c.Bars {
		if bar.OkH < 0 || bar.FailH < 0 || bar.FailY < c.Top-0.1 || bar.OkY+bar.OkH > c.Base+0.1 {
			t.Errorf("bar %d out of the plot: %+v", i, bar)
		}
	}
	// The tallest bar (11) fits under the top tick.
	if top := c.Ticks[len(c.Ticks)-1]; top.Y > c.Bars[6].FailY {
		t.Errorf("top tick %+v below the tallest bar %+v", top, c.Bars[6])
	}
	empty := newChart(mergeHistory(nil, 30, now))
	if !empty.Empty || len(empty.Bars) != 30 || len(empty.Labels) != 6 {
		t.Errorf("empty chart: empty %v, %d bars, %d labels", empty.Empty, len(empty.Bars), len(empty.Labels))
	}
	for x, want := range map[float64]float64{0: 1, 0.3: 1, 1.5: 2, 3: 5, 7: 10, 12: 20, 2500: 5000} {
		if got := niceStep(x); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", x, got, want)
		}
	}
}

func TestSessionCookie(t *testing.T) {
	t.Parallel()
	a := newAuth("token-one", "")
	now := time.Unix(1_700_000_000, 0)
	v := a.newSession(roleAdmin, now)
	s, ok := a.parseSession(v, now.Add(time.Hour))
	if !ok {
		t.Fatal("fresh session refused")
	}
	if _, ok := a.parseSession(v, now.Add(sessionTTL)); ok {
		t.Error("expired session accepted")
	}
	if _, ok := newAuth("token-two", "").parseSession(v, now); ok {
		t.Error("session of another token accepted")
	}
	parts := strings.Split(v, ".")
	parts[1] = "9999999999" // extend the expiry without re-signing
	if _, ok := a.parseSession(strings.Join(parts, "."), now); ok {
		t.Error("forged expiry accepted")
	}
	for _, bad := range []string{"", "v1", "v1...", "v2.1.2.3", strings.Repeat("a", 300)} {
		if _, ok := a.parseSession(bad, now); ok {
			t.Errorf("%q accepted", bad)
		}
	}
	if !a.checkCSRF(s, a.csrfToken(s)) || a.checkCSRF(s, "") || a.checkCSRF(s, a.csrfToken(session{nonce: "x"})) {
		t.Error("CSRF check wrong")
	}
	if a.checkToken("token-one") != roleAdmin || a.checkToken("token-on") != roleNone || a.checkToken("") != roleNone {
		t.Error("token check wrong")
	}
}

func TestLocalPathAndBase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/queue?q=a&state=b": "/queue?q=a&state=b", "": "/", "queue": "/", "//evil.example": "/",
		"/\\evil.example": "/", "https://evil.example/": "/", "/a\nb": "/", "/login?next=/x": "/login?next=/x",
	} {
		if got := localPath(in); got != want {
			t.Errorf("localPath(%q) = %q, want %q", in, got, want)
		}
	}
	if got := nextPath("/login?next=/"); got != "/" {
		t.Errorf("nextPath(login) = %q", got)
	}
	r := httptest.NewRequest("GET", "/admin/tide/queue?q=x", nil)
	r.URL.Path = "/queue"
	if got := basePath(r); got != "/admin/tide" {
		t.Errorf("basePath = %q", got)
	}
	r = httptest.NewRequest("GET", "/queue", nil)
	if got := basePath(r); got != "" {
		t.Errorf("basePath at root = %q", got)
	}
}

// FuzzViewBlob checks that any payload renders without panicking, as valid
// UTF-8, within the size limits.
func FuzzViewBlob(f *testing.F) {
	for _, s := range []string{"", "hello", `{"a":1}`, "\x00\x01", "a\u202eb", "[[[]]]", "\xff\xfe", `"\"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := viewBlob(data)
		for _, s := range []string{b.Text, b.Hex, b.Base64} {
			if !utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 output for %q", data)
			}
		}
		if len(b.Hex) > (hexDumpBytes/16+1)*80 {
			t.Fatalf("hex dump too long: %d", len(b.Hex))
		}
		p := preview(data)
		if !utf8.ValidString(p) || utf8.RuneCountInString(p) > previewRunes+80 {
			t.Fatalf("bad preview %q", p)
		}
		_ = jsonDepth(data)
	})
}

// A value sealed by encrypt.Wrap (seen by a dashboard without the keys) is
// named as encrypted, not dumped as binary.
func TestViewBlobSealed(t *testing.T) {
	sealed := append([]byte{0xFF, 'T', 'E', 2, 1, 'I'}, bytes.Repeat([]byte{0x9c}, 40)...)
	if b := viewBlob(sealed); b.Kind != "encrypted" || b.Text != sealedNote || b.Hex != "" || b.Size != len(sealed) {
		t.Fatalf("viewBlob(sealed) = %+v", b)
	}
	if p := preview(sealed); p != "(encrypted, 46 B)" {
		t.Fatalf("preview(sealed) = %q", p)
	}
	if b := viewBlob([]byte{0xFF, 'T'}); b.Kind != "binary" {
		t.Fatalf("two bytes 0xFF 'T' are %q, want binary", b.Kind)
	}
}
