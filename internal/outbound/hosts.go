package outbound

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// HostList is a parsed host allow-list (see ParseHosts). A nil HostList
// given to a Sender allows any host.
type HostList []hostRule

type hostRule struct {
	host     string // lower case; for a wildcard, the suffix with its dot (".example.com")
	port     string // empty: any
	wildcard bool
}

// ParseHosts parses an allow-list: "hooks.example.com" (that host, any
// port), "hooks.example.com:8443" (that host and port), or "*.example.com"
// (any subdomain of example.com, at any depth, but not example.com
// itself). IP literals are allowed as hosts ("127.0.0.1", "[::1]:8080").
// Names are compared case-insensitively. setting names the list in errors
// ("AllowedHosts entry ...: ..."); the error joins one per bad entry. No
// entries give a nil list.
func ParseHosts(setting string, entries []string) (HostList, error) {
	var out HostList
	var errs []error
	for _, e := range entries {
		r, err := parseHost(setting, e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func parseHost(setting, e string) (hostRule, error) {
	s := strings.ToLower(strings.TrimSpace(e))
	bad := func(why string) (hostRule, error) {
		return hostRule{}, fmt.Errorf("%s entry %q: %s", setting, Clip(e), why)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@ ") {
		return bad(`give a host name ("hooks.example.com"), optionally with a port, not a URL`)
	}
	var r hostRule
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("invalid port")
		}
		host, r.port = h, p
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		if rest == "" || strings.Contains(rest, "*") || !strings.Contains(rest, ".") {
			return bad(`a wildcard must be "*." followed by a domain with at least two labels ("*.example.com")`)
		}
		r.wildcard, r.host = true, "."+rest
		return r, nil
	}
	if host == "" || strings.Contains(host, "*") {
		return bad(`"*" is only allowed as the first label ("*.example.com")`)
	}
	r.host = strings.TrimSuffix(host, ".")
	return r, nil
}

// Allows reports whether u's host (and port) is in the list.
func (l HostList) Allows(u *url.URL) bool {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "" {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	for _, r := range l {
		if r.port != "" && r.port != port {
			continue
		}
		if r.wildcard {
			if len(host) > len(r.host) && strings.HasSuffix(host, r.host) {
				return true
			}
			continue
		}
		if host == r.host {
			return true
		}
	}
	return false
}
