package stack

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// The socket layer's errors are Go's net errors, built here and nowhere
// else: every failure of a TCPConn, TCPListener or UDPConn call is a
// *net.OpError whose Op, Net, Source and Addr are what Go's net fills for
// the same call (net.go, tcpsock.go, udpsock.go, fd_posix.go), around
//
//   - an *os.SyscallError naming the system call Go's net makes ("connect",
//     "bind", "read", "write", "recvfrom", "sendto", "accept4",
//     "setsockopt") around the syscall.Errno Linux returns, translated from
//     gVisor's tcpip.Error by errnoOf, so that errors.Is(err,
//     syscall.ECONNREFUSED) and the like hold;
//   - net.ErrClosed for any call made on, or blocked in when it was,
//     a socket closed locally;
//   - os.ErrDeadlineExceeded at a read, write or accept deadline;
//   - the context's error as net maps it (errCanceled, dialTimeout) for a
//     dial whose context ended.
//
// The peer's FIN is io.EOF itself, never wrapped (io.Copy, io.ReadAll and
// net/http compare with ==), as Go's conn.Read leaves it.

// errnoOf returns the errno Linux returns where gVisor returns e, as
// gVisor's own sentry translates it (pkg/syserr/netstack.go,
// TranslateNetstackError), or 0 if there is none (ErrClosedForReceive is
// the end of the stream, not an error).
func errnoOf(e tcpip.Error) syscall.Errno {
	switch e.(type) {
	case *tcpip.ErrConnectionRefused:
		return syscall.ECONNREFUSED
	case *tcpip.ErrConnectionReset:
		return syscall.ECONNRESET
	case *tcpip.ErrConnectionAborted:
		return syscall.ECONNABORTED
	case *tcpip.ErrTimeout:
		return syscall.ETIMEDOUT
	case *tcpip.ErrClosedForSend, *tcpip.ErrAborted:
		return syscall.EPIPE
	case *tcpip.ErrPortInUse:
		return syscall.EADDRINUSE
	case *tcpip.ErrBadLocalAddress:
		return syscall.EADDRNOTAVAIL
	case *tcpip.ErrNetworkUnreachable:
		return syscall.ENETUNREACH
	case *tcpip.ErrHostUnreachable:
		return syscall.EHOSTUNREACH
	case *tcpip.ErrHostDown:
		return syscall.EHOSTDOWN
	case *tcpip.ErrNoNet:
		return errNoNet
	case *tcpip.ErrNotConnected:
		return syscall.ENOTCONN
	case *tcpip.ErrAlreadyConnected:
		return syscall.EISCONN
	case *tcpip.ErrAlreadyConnecting:
		return syscall.EALREADY
	case *tcpip.ErrConnectStarted:
		return syscall.EINPROGRESS
	case *tcpip.ErrWouldBlock, *tcpip.ErrNoPortAvailable:
		return syscall.EAGAIN
	case *tcpip.ErrDestinationRequired:
		return syscall.EDESTADDRREQ
	case *tcpip.ErrMessageTooLong:
		return syscall.EMSGSIZE
	case *tcpip.ErrNoBufferSpace:
		return syscall.ENOBUFS
	case *tcpip.ErrBroadcastDisabled:
		return syscall.EACCES
	case *tcpip.ErrNotPermitted:
		return syscall.EPERM
	case *tcpip.ErrAddressFamilyNotSupported:
		return syscall.EAFNOSUPPORT
	case *tcpip.ErrNotSupported:
		return syscall.EOPNOTSUPP
	case *tcpip.ErrUnknownProtocolOption:
		return syscall.ENOPROTOOPT
	case *tcpip.ErrQueueSizeNotSupported:
		return syscall.ENOTTY
	case *tcpip.ErrBadAddress, *tcpip.ErrBadBuffer:
		return syscall.EFAULT
	case *tcpip.ErrUnknownNICID, *tcpip.ErrUnknownDevice, *tcpip.ErrInvalidNICID:
		return syscall.ENODEV
	case *tcpip.ErrDuplicateNICID, *tcpip.ErrDuplicateAddress:
		return syscall.EEXIST
	case *tcpip.ErrNoSuchFile:
		return syscall.ENOENT
	case *tcpip.ErrEndpointBusy:
		return syscall.EBUSY
	case *tcpip.ErrUnknownProtocol, *tcpip.ErrAlreadyBound, *tcpip.ErrInvalidEndpointState,
		*tcpip.ErrInvalidOptionValue, *tcpip.ErrMalformedHeader, *tcpip.ErrInvalidPortRange,
		*tcpip.ErrMulticastInputCannotBeOutput, *tcpip.ErrMissingRequiredFields:
		return syscall.EINVAL
	}
	return 0
}

// syscallErr returns gVisor's e as Go's net reports the failed system call
// call: an *os.SyscallError around e's errno, or around e's own text if it
// has none.
func syscallErr(call string, e tcpip.Error) error {
	if en := errnoOf(e); en != 0 {
		return os.NewSyscallError(call, en)
	}
	return &os.SyscallError{Syscall: call, Err: errors.New(e.String())}
}

// errnoErr is a bad argument's error as the kernel would return it from
// call (EINVAL, say).
func errnoErr(call string, en syscall.Errno) error {
	return os.NewSyscallError(call, en)
}

// opError returns the *net.OpError of op on network ("tcp", "udp6", ...)
// from src to dst, either of which may be nil, around err.
func opError(op, network string, src, dst net.Addr, err error) error {
	return &net.OpError{Op: op, Net: network, Source: src, Addr: dst, Err: err}
}

// tcpOpAddr and udpOpAddr return a as a net.Addr, nil if a is nil, as
// net's opAddr: a nil pointer in an OpError's Source or Addr would print
// "<nil>".
func tcpOpAddr(a *net.TCPAddr) net.Addr {
	if a == nil {
		return nil
	}
	return a
}

func udpOpAddr(a *net.UDPAddr) net.Addr {
	if a == nil {
		return nil
	}
	return a
}

// dialCtxErr is the error in a dial's OpError once its context ended: net
// maps context.Canceled to its canceledError (errors.Is(err,
// context.Canceled)) and a passed deadline to an "i/o timeout" whose
// Timeout is true (mapErr). dialTimeout satisfies errors.Is with both
// context.DeadlineExceeded, as net's errTimeout does, and
// os.ErrDeadlineExceeded, which net's connect returns when the socket's
// deadline, set to the context's, fires before the context's own timer.
func dialCtxErr(ctx context.Context) error {
	switch err := ctxErr(ctx); err {
	case context.Canceled:
		return errCanceled
	case context.DeadlineExceeded:
		return dialTimeout
	case nil:
		return errCanceled // not reached: called once ctx is done
	default:
		return err
	}
}

// dialTimeout is a dial's error at its context's deadline.
var dialTimeout error = dialTimeoutError{}

type dialTimeoutError struct{}

func (dialTimeoutError) Error() string   { return "i/o timeout" }
func (dialTimeoutError) Timeout() bool   { return true }
func (dialTimeoutError) Temporary() bool { return true }
func (dialTimeoutError) Is(err error) bool {
	return err == context.DeadlineExceeded || err == os.ErrDeadlineExceeded
}

// errDeadline is a deadline's error inside an OpError, as Go's net puts it
// there (poll.ErrDeadlineExceeded is os.ErrDeadlineExceeded): a net.Error
// whose Timeout is true.
var errDeadline error = os.ErrDeadlineExceeded

// errNilContext is a dial's error for a nil context, which Go's net
// rejects with a panic.
var errNilContext = errors.New("nil context")

// errBadAddr is the *net.AddrError for an address that cannot be
// converted (an IP of neither 4 nor 16 bytes, a port out of range).
func errBadAddr(what, addr string) error {
	return &net.AddrError{Err: what, Addr: addr}
}
