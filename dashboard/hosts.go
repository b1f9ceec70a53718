package dashboard

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// HostCheck wraps h so that it serves only the requests a dashboard with
// Options.AllowedHosts set to hosts serves: with no Host header, or one
// that names "localhost", an IP address or one of hosts (the same syntax,
// matched the same way). Others get 421 Misdirected Request with a
// plain-text reason. This protects a handler that needs no login and is
// served next to a dashboard, such as Prometheus's /metrics, from DNS
// rebinding: a page on another domain that resolves to the handler's
// address, which the victim's browser then reads as same-origin. HostCheck
// returns an error for a malformed entry; it copies hosts, so changing the
// slice later has no effect. The handler is safe for concurrent use.
func HostCheck(hosts []string, h http.Handler) (http.Handler, error) {
	s, err := newHostSet(hosts)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.allows(r.Host) {
			refuseHost(w, r.Host, "this server", "")
			return
		}
		h.ServeHTTP(w, r)
	}), nil
}

// refuseHost answers 421 to a request for a host that is not allowed: who
// names what refuses, setting (when not "") the option that allows more
// hosts.
func refuseHost(w http.ResponseWriter, host, who, setting string) {
	if setting != "" {
		setting = " (" + setting + ")"
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, fmt.Sprintf("421 misdirected request: %s does not answer to host %q. "+
		"It answers to localhost, IP addresses and the host names it is configured to allow%s, "+
		"which protects it from DNS rebinding; if this is its own name, add it to the allowed hosts.", who, host, setting),
		http.StatusMisdirectedRequest)
}

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
