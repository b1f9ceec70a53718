package dashboard

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// hostSet is the set of host names a dashboard answers to, besides
// "localhost" and IP literals. It is immutable after newHostSet.
type hostSet map[string][]string // name -> ports; an empty port means any

// newHostSet parses Options.AllowedHosts.
func newHostSet(hosts []string) (hostSet, error) {
	s := make(hostSet)
	for _, h := range hosts {
		name, port, ok := splitHost(h)
		if !ok || !validName(name) {
			return nil, fmt.Errorf("tide/dashboard: AllowedHosts: %q is not a host name or host:port (like tide.example.com or tide.example.com:8080)", h)
		}
		s[name] = append(s[name], port)
	}
	return s, nil
}

// allows reports whether a request with Host header host may be served:
// no Host at all (only HTTP/1.0 clients omit it, and browsers are what DNS
// rebinding uses), an IP literal, "localhost", or an allowed host.
func (s hostSet) allows(host string) bool {
	if host == "" {
		return true
	}
	name, port, ok := splitHost(host)
	if !ok {
		return false
	}
	if name == "localhost" {
		return true
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	for _, p := range s[name] {
		if p == "" || p == port {
			return true
		}
	}
	return false
}

// splitHost splits a Host header or an AllowedHosts entry into a lower-case
// name without a trailing dot (an IPv6 literal without its brackets) and a
// port ("" when there is none).
func splitHost(h string) (name, port string, ok bool) {
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", "", false
		}
		name, rest := h[1:end], h[end+1:]
		if _, err := netip.ParseAddr(name); err != nil {
			return "", "", false
		}
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok || !validPort(p) {
				return "", "", false
			}
			port = canonPort(p)
		}
		return name, port, true
	}
	name = h
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		if strings.IndexByte(h[:i], ':') >= 0 {
			// An IPv6 literal without brackets has no port.
			_, err := netip.ParseAddr(h)
			return h, "", err == nil
		}
		name, port = h[:i], h[i+1:]
		if !validPort(port) {
			return "", "", false
		}
		port = canonPort(port)
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	return name, port, name != ""
}

func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return err == nil && n > 0 && len(p) <= 5
}

// canonPort returns the valid port p without leading zeros.
func canonPort(p string) string { return strings.TrimLeft(p, "0") }

// validName reports whether name is an ASCII host name (or an IP literal).
func validName(name string) bool {
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	if len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
