package driver

import (
	"io"
	"net"
	"syscall"

	"github.com/songgao/water"
)

// waterParams keeps an existing device persistent and lets a new one go
// when closed: water issues TUNSETPERSIST with Persist either way.
func waterParams(name string) water.PlatformSpecificParams {
	_, err := net.InterfaceByName(name)
	return water.PlatformSpecificParams{Name: name, Persist: name != "" && err == nil}
}

// waterCloseOnExec sets FD_CLOEXEC on the descriptor water opened without
// it, so that a program ustack starts does not inherit the TAP.
func waterCloseOnExec(rw io.ReadWriteCloser) {
	if sc, ok := rw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { syscall.CloseOnExec(int(fd)) })
		}
	}
}
