package bench

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// BlockingFD returns a duplicate of c's descriptor in blocking mode, for
// I/O the way a C program does it: read(2) and write(2) that sleep in the
// kernel, on a thread of their own, with no Go scheduler between the
// kernel's wake-up and the code. O_NONBLOCK belongs to the open file, so
// c's own descriptor turns blocking too: c must not be read or written
// after this, only closed (with the duplicate).
func BlockingFD(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		if fd, derr = unix.Dup(int(s)); derr == nil {
			derr = unix.SetNonblock(fd, false)
		}
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("blocking descriptor: %w", derr)
	}
	return fd, nil
}

// BlockingEcho serves TCP echo on l the way a C echo server does (the
// TAP floor's kernel side, tcprr.c's server): each connection on a
// locked thread of its own, blocking read(2) then write(2) of what it
// read, until the peer closes. It returns when l is closed, after every
// connection has ended.
func BlockingEcho(l net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			sc, ok := c.(syscall.Conn)
			if !ok {
				return
			}
			fd, err := BlockingFD(sc)
			if err != nil {
				return
			}
			defer unix.Close(fd)
			var buf [64 << 10]byte
			for {
				n, err := unix.Read(fd, buf[:])
				if err == unix.EINTR {
					continue
				}
				if n <= 0 || err != nil {
					return
				}
				if writeFull(fd, buf[:n]) != nil {
					return
				}
			}
		}()
	}
}

// writeFull writes all of b to the blocking descriptor fd.
func writeFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// ReadFullFD reads exactly len(b) bytes from the blocking descriptor fd.
func ReadFullFD(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("read: connection closed")
		}
		b = b[n:]
	}
	return nil
}

// WriteFullFD writes all of b to the blocking descriptor fd.
func WriteFullFD(fd int, b []byte) error { return writeFull(fd, b) }
