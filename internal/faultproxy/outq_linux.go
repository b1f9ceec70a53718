//go:build linux

package faultproxy

import (
	"net"
	"syscall"
	"unsafe"
)

// unsent returns how many bytes written to c the peer has not acknowledged
// yet (TIOCOUTQ), or 0 when that cannot be known.
func unsent(c net.Conn) int {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		var v int32
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&v))); errno == 0 {
			n = int(v)
		}
	})
	return n
}
