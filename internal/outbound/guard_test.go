package outbound

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func TestIsPublic(t *testing.T) {
	for s, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700::1111": true,
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "100.64.0.1": false, "0.0.0.0": false, "255.255.255.255": false,
		"::1": false, "::": false, "fe80::1": false, "fc00::1": false, "::ffff:127.0.0.1": false,
		"::ffff:10.0.0.1": false, "64:ff9b::a00:1": false, "224.0.0.1": false, "ff02::1": false,
	} {
		if got := IsPublic(netip.MustParseAddr(s)); got != want {
			t.Errorf("IsPublic(%s) = %v, want %v", s, got, want)
		}
	}
}

func TestAllowedHosts(t *testing.T) {
	hosts, err := ParseHosts("AllowedHosts", []string{"hooks.example.com", "*.partner.example", "api.example.org:8443", "10.0.0.1", "[::1]:8080", "Upper.Example.NET"})
	if err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]bool{
		"https://hooks.example.com/x":          true,
		"http://hooks.example.com:9000/x":      true,
		"https://HOOKS.example.com./x":         true,
		"https://evil.com/x":                   false,
		"https://hooks.example.com.evil.com/":  false,
		"https://a.partner.example/":           true,
		"https://a.b.partner.example/":         true,
		"https://partner.example/":             false,
		"https://xpartner.example/":            false,
		"https://api.example.org:8443/":        true,
		"https://api.example.org/":             false,
		"http://api.example.org:8443/":         true,
		"http://10.0.0.1/":                     true,
		"http://[::1]:8080/":                   true,
		"http://[::1]/":                        false,
		"https://upper.example.net/":           true,
		"https://hooks.example.com@evil.com/":  false,
		"https://evil.com#@hooks.example.com/": false,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := hosts.Allows(u); got != want {
			t.Errorf("Allows(%s) = %v, want %v", raw, got, want)
		}
	}
}

func TestLocationIsSanitised(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, loc, want string
	}{
		{"relative", "/moved?sig=secret#frag", "http://a.example/moved"},
		{"credentials", "https://user:pa55@b.example/x", "https://b.example/x"},
		{"bidi override", "https://b.example/\u202ex", "https://b.example/%E2%80%AEx"},
		{"unparsable", "http://b.example/%zz\x01", "(a Location that does not parse)"},
		{"long", "https://b.example/" + strings.Repeat("a", 5000), "https://b.example/" + strings.Repeat("a", 200-len("https://b.example/")) + "…"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(http.MethodPost, "http://a.example/hook?token=t", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp := &http.Response{StatusCode: http.StatusFound, Header: http.Header{"Location": {c.loc}}, Request: req}
			if got := Location(resp); got != c.want {
				t.Errorf("Location(%.40q) = %q, want %q", c.loc, got, c.want)
			}
		})
	}
	if got := Sanitize("a\x00b\u202ec\u0085d"); got != "a b c d" {
		t.Errorf("Sanitize = %q, want control and formatting characters replaced", got)
	}
}
