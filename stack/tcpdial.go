package stack

import (
	"context"
	"net"
	"net/netip"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// dialTCP connects to addr for DialTCP and Dial (network "tcp", "tcp4" or
// "tcp6", for its errors), as net's connect on Linux does:
//
//   - an invalid (zero) addr fails at once, as net's "missing address";
//   - an unspecified address (0.0.0.0, ::) is the loopback address of its
//     family, as ip_route_connect and tcp_v6_connect make it;
//   - a multicast or broadcast address fails at once with ENETUNREACH, as
//     tcp_v4_connect (RTCF_MULTICAST | RTCF_BROADCAST) and tcp_v6_connect
//     refuse them;
//   - a refused connection fails with ECONNREFUSED, one with no route
//     with ENETUNREACH, a neighbour that never answers with EHOSTUNREACH,
//     a peer that never answers with ETIMEDOUT, each an *os.SyscallError
//     of "connect";
//   - a ctx that ends first fails with net's canceledError or an i/o
//     timeout error (dialCtxErr).
//
// The errors are *net.OpError with Op "dial", no Source, addr as Addr.
func (s *Stack) dialTCP(ctx context.Context, network string, addr netip.AddrPort) (*TCPConn, error) {
	if !addr.IsValid() {
		return nil, opError("dial", network, nil, nil, errMissingAddress)
	}
	ra := net.TCPAddrFromAddrPort(addr)
	fail := func(err error) (*TCPConn, error) {
		return nil, opError("dial", network, nil, ra, err)
	}
	if ctx == nil {
		return fail(errNilContext)
	}
	dst := addr.Addr().Unmap()
	switch {
	case dst.IsUnspecified() && dst.Is4():
		dst = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case dst.IsUnspecified():
		dst = netip.IPv6Loopback()
	case dst.IsMulticast() || s.isBroadcast(dst):
		return fail(errnoErr("connect", syscall.ENETUNREACH))
	}
	fa, proto := s.fullAddr(netip.AddrPortFrom(dst, addr.Port()))
	wq := new(waiter.Queue)
	ep, e := s.ip.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if e != nil {
		return fail(syscallErr("socket", e))
	}
	entry, notify := waiter.NewChannelEntry(writeEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	if ctxErr(ctx) != nil {
		ep.Close()
		return fail(dialCtxErr(ctx))
	}
	e = ep.Connect(fa)
	if _, ok := e.(*tcpip.ErrConnectStarted); ok {
		for e = nil; ; {
			select {
			case <-ctx.Done():
				ep.Close()
				return fail(dialCtxErr(ctx))
			case <-notify:
			}
			if e = ep.LastError(); e != nil {
				break
			}
			if _, err := ep.GetRemoteAddress(); err == nil {
				break // connected
			}
		}
	}
	if e != nil {
		ep.Close()
		return fail(syscallErr("connect", e))
	}
	c := newTCPConn(s, wq, ep)
	c.net = network
	return c, nil
}

// isBroadcast reports whether a is the limited broadcast address or the
// broadcast address of one of the stack's IPv4 subnets (/30 and wider).
func (s *Stack) isBroadcast(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	for _, p := range s.cfg.Addrs {
		if !p.Addr().Is4() || p.Bits() >= 31 || !p.Contains(a) {
			continue
		}
		b := p.Masked().Addr().As4()
		host := uint32(1)<<(32-p.Bits()) - 1
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
		if a == netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}) {
			return true
		}
	}
	return false
}
