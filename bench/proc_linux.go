package main

import "syscall"

// childAttr makes a child process (redis-server, crash worker) die with the
// bench, even when the bench itself is killed.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
