//go:build unix

package driver

import (
	"io"
	"syscall"
)

// rawReader reads a device through its descriptor (an *os.File's
// syscall.RawConn): a non-blocking read is one read(2), a blocking one
// waits in Go's poller for the descriptor to be readable. Its state lives
// in the struct and fn is bound once, so that a read does not allocate.
type rawReader struct {
	rc syscall.RawConn
	fn func(fd uintptr) bool

	// One read's arguments and results, for fn.
	buf   []byte
	block bool
	n     int
	err   error
}

// newRawReader returns a rawReader for rw, or nil when rw has no
// descriptor.
func newRawReader(rw io.ReadWriteCloser) plainReader {
	sc, ok := rw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawReader{rc: rc}
	r.fn = r.readFD
	return r
}

// readFD is the RawConn.Read callback: it reports false (wait for the
// descriptor) only on EAGAIN in a blocking read.
func (r *rawReader) readFD(fd uintptr) bool {
	for {
		r.n, r.err = syscall.Read(int(fd), r.buf)
		if r.err == syscall.EINTR {
			continue
		}
		return r.err != syscall.EAGAIN || !r.block
	}
}

func (r *rawReader) read(b []byte, block bool) (int, error) {
	r.buf, r.block = b, block
	err := r.rc.Read(r.fn)
	r.buf = nil
	switch {
	case err != nil:
		return 0, err // the file was closed
	case r.err == syscall.EAGAIN:
		return 0, ErrNoFrame
	case r.err != nil:
		return 0, r.err
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

func (r *rawReader) close() {}
