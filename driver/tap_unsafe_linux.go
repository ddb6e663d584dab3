package driver

// The TAP's system calls that hand the kernel a pointer to memory laid out
// for it (STYLE: unsafe only in *_unsafe.go files). tap_linux.go has the
// rest of the TAP.

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// readv is readv(2) of iov into fd through t.iov; x/sys's Readv allocates
// its iovec array on every call.
func (t *TAP) readv(iov [][]byte) (int, error) {
	if t.iov == nil {
		t.iov = make([]unix.Iovec, maxReadIov)
	}
	v := t.iov[:0]
	for _, b := range iov {
		if len(v) == maxReadIov {
			break
		}
		if len(b) == 0 {
			continue
		}
		v = append(v, unix.Iovec{Base: &b[0]})
		v[len(v)-1].SetLen(len(b))
	}
	if len(v) == 0 {
		return 0, nil
	}
	n, _, e := unix.Syscall(unix.SYS_READV, uintptr(t.fd), uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// ioctlHWAddr returns the MAC address of the interface name with
// SIOCGIFHWADDR on fd (any descriptor the ioctl may be issued on: the
// TAP's own works from any namespace), or the errno.
func ioctlHWAddr(fd int, name string) (net.HardwareAddr, error) {
	// struct ifreq with ifr_hwaddr, a struct sockaddr.
	var ifr struct {
		name   [unix.IFNAMSIZ]byte
		family uint16
		data   [14]byte
		_      [8]byte
	}
	copy(ifr.name[:], name)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFHWADDR, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return nil, errno
	}
	mac := make(net.HardwareAddr, 6)
	copy(mac, ifr.data[:6])
	return mac, nil
}
