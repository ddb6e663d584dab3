//go:build linux

package testutil

import (
	"os"
	"syscall"
	"testing"
)

// SeqpacketPair returns the two ends of a non-blocking AF_UNIX
// SOCK_SEQPACKET socket pair as files, each end's send and receive buffers
// at bufBytes (0: the system's): a device that moves whole frames, one per
// read, as a TAP does, for tests of the plain wire. Cleanup closes both.
func SeqpacketPair(t testing.TB, bufBytes int) (a, b *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if bufBytes > 0 {
			syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, bufBytes)
			syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, bufBytes)
		}
	}
	a, b = os.NewFile(uintptr(fds[0]), "seqpacket-a"), os.NewFile(uintptr(fds[1]), "seqpacket-b")
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
