package outbound

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// NewTransport returns the transport a Sender uses when given no client: no
// proxy from the environment, and, unless allowPrivate, a dialer that
// refuses non-public addresses after DNS resolution (see Guard); optIn names
// the setting that allows them, for the error.
func NewTransport(allowPrivate bool, optIn string) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = Guard(optIn)
	}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   10,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Guard returns a net.Dialer Control function that refuses non-public
// addresses with a *RefusedError. It runs with the resolved address just
// before connecting, so it also catches names that resolve, or are
// rebound, to internal addresses. optIn names the setting that allows
// them ("AllowPrivateNetworks"); the error tells to set it.
func Guard(optIn string) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return &RefusedError{Msg: fmt.Sprintf("cannot check dial address %q: %v", address, err)}
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return &RefusedError{Msg: fmt.Sprintf("cannot check dial address %q: %v", address, err)}
		}
		if !IsPublic(ip) {
			return &RefusedError{Msg: fmt.Sprintf("address %s is not public (loopback, private, link-local or reserved); set %s to allow it", ip, optIn)}
		}
		return nil
	}
}

// RefusedError is a request a Sender refuses to make: a scheme other than
// http and https, a host not allowed, or a dial to a non-public address.
// Msg is fit for an error message (no query or credentials).
type RefusedError struct{ Msg string }

// Error returns Msg.
func (e *RefusedError) Error() string { return e.Msg }

// nonPublic lists the ranges, beyond what netip classifies, that are not
// reachable public unicast addresses.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (CGNAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // TEST-NET-1
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // TEST-NET-2
	netip.MustParsePrefix("203.0.113.0/24"),  // TEST-NET-3
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64: may embed a private IPv4 address
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("2002::/16"),       // 6to4: may embed a private IPv4 address
	netip.MustParsePrefix("100::/64"),        // discard-only
}

// IsPublic reports whether ip is a public unicast address.
func IsPublic(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.Zone() != "" || !ip.IsGlobalUnicast() || ip.IsPrivate() ||
		ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}
