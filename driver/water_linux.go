package driver

import (
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/songgao/water"
	"golang.org/x/sys/unix"
)

// waterParams keeps an existing device persistent and lets a new one go
// when closed: water issues TUNSETPERSIST with Persist either way.
func waterParams(name string) water.PlatformSpecificParams {
	_, err := net.InterfaceByName(name)
	return water.PlatformSpecificParams{Name: name, Persist: name != "" && err == nil}
}

// waterSetup does on the descriptor water opened what water does not: it
// sets FD_CLOEXEC, so that a program ustack starts does not inherit the
// TAP, and clears the offloads an earlier user of a persistent device
// enabled (TUNSETOFFLOAD 0). Left on, the kernel would hand a reader
// without a virtio-net header 64 KB GSO frames and frames whose checksums
// it left to the reader (CHECKSUM_PARTIAL), neither of which a bare frame
// can say.
func waterSetup(rw io.ReadWriteCloser) error {
	sc, ok := rw.(syscall.Conn)
	if !ok {
		return fmt.Errorf("water's device has no descriptor (%T)", rw)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		syscall.CloseOnExec(int(fd))
		ioErr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, 0)
	}); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("TUNSETOFFLOAD: %w", ioErr)
	}
	return nil
}
