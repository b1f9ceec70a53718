package sqltest

import "syscall"

// sysProcAttr runs the server as c (nil: as we are) and kills it when the
// test process dies.
func sysProcAttr(c *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: c, Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
