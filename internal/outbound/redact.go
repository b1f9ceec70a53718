package outbound

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// snippetLen bounds the response body quoted in an error.
const snippetLen = 256

// Redact returns u without query, fragment and credentials, with control
// and formatting characters replaced and at most about 200 bytes, for
// messages.
func Redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	c.ForceQuery = false
	c.Fragment = ""
	c.RawFragment = ""
	return Clip(Sanitize(c.String()))
}

// Clip bounds a string put in an error message to about 200 bytes, cut at
// a rune boundary.
func Clip(s string) string { return ClipTo(s, 200) }

// ClipTo bounds s to at most n bytes, cut at a rune boundary, and marks a
// cut with "…".
func ClipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Sanitize replaces control and formatting characters (such as
// bidirectional overrides) with spaces.
func Sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ' '
		}
		return r
	}, s)
}

// Snippet returns the start of a response body (or another text from the
// other side) fit for an error message: valid UTF-8, sanitised, at most
// 256 bytes.
func Snippet(data []byte) string {
	s := Sanitize(strings.TrimSpace(string(bytes.ToValidUTF8(data, []byte("�")))))
	if len(s) > snippetLen {
		cut := snippetLen
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// Location returns resp's Location header for an error message: resolved
// against the request's URL, redacted (see Redact); "" when there is none.
func Location(resp *http.Response) string {
	loc := resp.Header.Get("Location")
	if loc == "" {
		return ""
	}
	base := &url.URL{}
	if resp.Request != nil && resp.Request.URL != nil {
		base = resp.Request.URL
	}
	u, err := base.Parse(loc)
	if err != nil {
		return "(a Location that does not parse)"
	}
	return Redact(u)
}
