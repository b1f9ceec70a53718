package dashboard

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidequeue/tide/encrypt"
)

// Display limits for task data. Templates escape everything; these only
// keep pages small.
const (
	previewRunes   = 120      // payload and error previews in tables
	detailBytes    = 64 << 10 // text shown on the task page
	hexDumpBytes   = 4 << 10  // binary shown as a hex dump
	indentMaxBytes = 16 << 10 // JSON pretty-printed up to this size
	indentMaxDepth = 32       // ... and this nesting depth
)

// sealedNote is shown for a value sealed by encrypt.Wrap when the
// dashboard's broker cannot open it.
const sealedNote = "Encrypted at rest. Start the dashboard with the keys (tide dash --encryption-keys, or encrypt.Wrap around the broker given to dashboard.New) to see it."

// blob is a payload, result or error text prepared for display.
type blob struct {
	Kind      string // "empty", "encrypted", "text", "json" or "binary"
	Size      int    // bytes in the original
	Text      string // text or JSON (possibly re-indented), truncated
	Hex       string // hex dump of the start of binary data
	Base64    string // base64 of the shown part of binary data
	Truncated bool   // only the start is shown
}

// IsBinary reports whether b is shown as hex and base64.
func (b blob) IsBinary() bool { return b.Kind == "binary" }

// viewBlob prepares data for the task page: text (JSON pretty-printed when
// small) up to detailBytes, binary as a hex dump and base64.
func viewBlob(data []byte) blob {
	b := blob{Size: len(data)}
	if len(data) == 0 {
		b.Kind = "empty"
		return b
	}
	if encrypt.IsSealed(data) {
		b.Kind, b.Text = "encrypted", sealedNote
		return b
	}
	shown := data
	if len(shown) > detailBytes {
		shown, b.Truncated = cutUTF8(shown, detailBytes), true
	}
	text, ok := printable(shown)
	if !ok {
		b.Kind = "binary"
		hx := shown
		if len(hx) > hexDumpBytes {
			hx = hx[:hexDumpBytes]
		}
		b.Hex = hexDump(hx)
		b.Base64 = base64.StdEncoding.EncodeToString(shown)
		return b
	}
	b.Kind, b.Text = "text", text
	if !b.Truncated && json.Valid(data) {
		b.Kind = "json"
		if len(data) <= indentMaxBytes && jsonDepth(data) <= indentMaxDepth {
			var out bytes.Buffer
			if json.Indent(&out, data, "", "  ") == nil {
				b.Text, _ = printable(out.Bytes())
			}
		}
	}
	return b
}

// preview returns a one-line summary of data for tables: the start of the
// text with whitespace collapsed, or the size and first bytes in hex.
func preview(data []byte) string {
	if len(data) == 0 {
		return "(empty)"
	}
	if encrypt.IsSealed(data) {
		return fmt.Sprintf("(encrypted, %s)", byteSize(len(data)))
	}
	head := data
	if len(head) > 4*previewRunes {
		head = cutUTF8(head, 4*previewRunes)
	}
	text, ok := printable(head)
	if !ok {
		hx := head
		if len(hx) > 24 {
			hx = hx[:24]
		}
		s := fmt.Sprintf("binary, %s: % x", byteSize(len(data)), hx)
		if len(data) > len(hx) {
			s += " …"
		}
		return s
	}
	return oneLine(text, previewRunes, len(head) < len(data))
}

// previewText is preview for error messages and other strings.
func previewText(s string) string {
	if s == "" {
		return ""
	}
	return preview([]byte(s))
}

// viewText prepares a long text (an error message) for the task page.
func viewText(s string) blob {
	b := viewBlob([]byte(s))
	if b.Kind == "json" {
		b.Kind = "text"
	}
	return b
}

// oneLine collapses whitespace runs of s into single spaces and truncates
// to n runes, adding an ellipsis when cut (or when more is known to exist).
func oneLine(s string, n int, more bool) string {
	var sb strings.Builder
	runes, space := 0, false
	for _, r := range s {
		if unicode.IsSpace(r) {
			space = true
			continue
		}
		if space && sb.Len() > 0 {
			sb.WriteByte(' ')
			runes++
		}
		space = false
		if runes >= n {
			more = true
			break
		}
		sb.WriteRune(r)
		runes++
	}
	if more {
		sb.WriteString(" …")
	}
	return sb.String()
}

// cutUTF8 returns the first at most n bytes of b, not splitting a UTF-8
// sequence when b is UTF-8.
func cutUTF8(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(b[i]) {
			return b[:i]
		}
	}
	return b[:n]
}

// printable returns b as text when it is valid UTF-8 with few unprintable
// characters; those are shown as \u escapes (so control and bidi characters
// cannot disguise the text). It returns ok false for binary data.
func printable(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	var sb strings.Builder
	sb.Grow(len(b))
	bad, total := 0, 0
	for _, r := range string(b) {
		total++
		switch {
		case r == '\n' || r == '\t':
			sb.WriteRune(r)
		case r == 0:
			return "", false
		case r == '\r':
			// Dropped: CRLF text reads the same.
		case unicode.IsPrint(r) || r == '\u200d' || r == '\ufe0f':
			// Emoji sequences use the zero-width joiner and variation
			// selector; they are harmless.
			sb.WriteRune(r)
		default:
			bad++
			fmt.Fprintf(&sb, "\\u%04x", r)
		}
	}
	if bad*10 > total {
		return "", false
	}
	return sb.String(), true
}

// jsonDepth returns the deepest nesting of arrays and objects in valid JSON.
func jsonDepth(b []byte) int {
	depth, maxDepth, inStr, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case inStr && esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case inStr && c == '"':
			inStr = false
		case inStr:
		case c == '"':
			inStr = true
		case c == '[' || c == '{':
			depth++
			maxDepth = max(maxDepth, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return maxDepth
}

// hexDump formats b like "xxd": offset, 16 bytes in hex, and the printable
// ASCII bytes.
func hexDump(b []byte) string {
	var sb strings.Builder
	for off := 0; off < len(b); off += 16 {
		line := b[off:min(off+16, len(b))]
		fmt.Fprintf(&sb, "%08x  ", off)
		for i := range 16 {
			if i < len(line) {
				fmt.Fprintf(&sb, "%02x ", line[i])
			} else {
				sb.WriteString("   ")
			}
			if i == 7 {
				sb.WriteByte(' ')
			}
		}
		sb.WriteString(" |")
		for _, c := range line {
			if c >= 0x20 && c < 0x7f {
				sb.WriteByte(c)
			} else {
				sb.WriteByte('.')
			}
		}
		sb.WriteString("|\n")
	}
	return sb.String()
}

// byteSize formats n bytes for people.
func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return strconv.Itoa(n) + " B"
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// human formats a duration coarsely: "0s", "850ms", "42s", "3m 4s",
// "2h 5m", "3d 4h".
func human(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d == 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// relative formats t against now: "in 5m 3s", "3m 4s ago", or "—" for the
// zero time.
func relative(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := t.Sub(now)
	if d >= 0 {
		return "in " + human(d)
	}
	return human(-d) + " ago"
}

// stamp formats t as an absolute UTC time, "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// number formats n with thin thousands separators.
func number(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var sb strings.Builder
	if neg {
		sb.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			sb.WriteRune(',')
		}
		sb.WriteRune(c)
	}
	return sb.String()
}
