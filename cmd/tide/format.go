package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// table writes aligned columns. Every cell is passed through escape: cells
// hold text read back from Redis (task types, IDs, errors, headers, host
// names...), which must not drive the terminal.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

// cellLayout turns the characters that would break a table's layout into
// spaces; escape shows the other control characters.
var cellLayout = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = escape(cellLayout.Replace(c))
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() { t.tw.Flush() }

// when shows a time relative to now: "in 14m59s", "3s ago", "-" for zero.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	if d >= 0 {
		return "in " + short(d)
	}
	return short(-d) + " ago"
}

// stamp shows an absolute time in UTC with its relative form.
func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 MST") + " (" + when(t, now) + ")"
}

// short rounds a duration for people: 850ms, 4.2s, 3m12s, 5h3m, 2d4h.
func short(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute-50*time.Millisecond:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour-500*time.Millisecond:
		return d.Round(time.Second).String()
	}
	d = d.Round(time.Minute)
	if d < 48*time.Hour {
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// escapeHelp documents escape, for the help texts.
const escapeHelp = `Text read from Redis (task types, IDs, errors, headers, payloads, queue,
host and server names) is printed with its control characters escaped, so
that it cannot drive your terminal (clear the screen, set the window title,
reorder text): ASCII control characters and bytes that are not UTF-8 are
shown as \xHH (ESC as \x1b), and Unicode control and format characters (C1
controls, bidirectional overrides, zero-width characters, line and
paragraph separators) as \uHHHH (RIGHT-TO-LEFT OVERRIDE as \u202e).
Backslashes in the text itself are shown as they are. --json output is
exact: JSON escapes the control characters, and tide also writes the C1
controls, format characters, line and paragraph separators and DEL as
\uHHHH escapes (and bytes that are not UTF-8 as \ufffd, what a JSON
decoder reads them as), so that the raw output is safe on a terminal too
and decodes to the same text.`

// escape makes text read back from Redis safe to print on a terminal: the
// ASCII control characters (C0 and DEL) and bytes that are not UTF-8 become
// \xHH, and the Unicode control and format characters (C1, bidirectional
// controls, zero-width characters, U+2028 and U+2029) become \uHHHH (or
// \UHHHHHHHH). See escapeHelp.
func escape(s string) string { return escapeKeeping(s, "") }

// escapeLines is escape for multi-line text: it keeps newlines and tabs
// (stack traces are indented with tabs) and drops the carriage return of a
// CRLF line end.
func escapeLines(s string) string {
	return escapeKeeping(strings.ReplaceAll(s, "\r\n", "\n"), "\n\t")
}

func escapeKeeping(s, keep string) string {
	i := strings.IndexFunc(s, func(r rune) bool { return (r == utf8.RuneError || unsafeRune(r)) && !strings.ContainsRune(keep, r) })
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case strings.ContainsRune(keep, r):
			b.WriteRune(r)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r) && r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// jsonSafe returns the JSON text js with the characters that a terminal
// may act on and that JSON encoders leave raw written as \uXXXX escapes:
// DEL, the C1 controls (U+0080 to U+009F, U+009B is CSI to xterm), the
// format characters (Unicode category Cf: bidirectional overrides,
// zero-width characters, ...) and U+2028 and U+2029; see unsafeRune. (The
// C0 controls JSON escapes itself, and raw ones are its white space.) A
// character past U+FFFF becomes a UTF-16 surrogate pair, and a byte that is
// not UTF-8 becomes \ufffd, which a decoder reads it as. Outside its
// strings JSON text is ASCII, so each escape lands in a string, outside
// any escape sequence, and the decoded value stays the same. js is
// returned as it is when it needs no escape.
func jsonSafe(js []byte) []byte {
	i := 0
	for i < len(js) {
		if js[i] < 0x7f {
			i++
			continue
		}
		r, size := utf8.DecodeRune(js[i:])
		if r == utf8.RuneError && size == 1 || unsafeRune(r) {
			break
		}
		i += size
	}
	if i == len(js) {
		return js
	}
	out := make([]byte, 0, len(js)+32)
	out = append(out, js[:i]...)
	for i < len(js) {
		if js[i] < 0x7f {
			out = append(out, js[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(js[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case !unsafeRune(r):
			out = append(out, js[i:i+size]...)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

// unsafeRune reports whether r may change what a terminal shows beyond
// printing a character: a control character (C0, DEL, C1), a format
// character (Unicode category Cf: bidirectional controls, zero-width
// characters, soft hyphen, tags...) or a line or paragraph separator.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// firstLine returns s's first line, cut to n runes.
func firstLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n-1]) + "…"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// plural words a count: "1 task", "2 tasks", "0 tasks".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
