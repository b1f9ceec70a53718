//go:build unix && !linux

package sqltest

import "syscall"

// sysProcAttr runs the server as c (nil: as we are).
func sysProcAttr(c *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: c, Setpgid: true}
}
