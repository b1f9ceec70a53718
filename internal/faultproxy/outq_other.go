//go:build !linux

package faultproxy

import "net"

// unsent returns 0: where TIOCOUTQ is not available, the proxy cannot tell
// whether the peer has received what was written.
func unsent(net.Conn) int { return 0 }
