package stack

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// This file is the stack's ICMP echo socket: Linux's unprivileged ping
// socket (socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP), net/ipv4/ping.c),
// which golang.org/x/net/icmp.ListenPacket("udp4", ...) opens, with the
// constructors wireguard-go's tun/netstack offers (DialPingAddr,
// ListenPingAddr) and Dial/Listen-style ones by network and host
// strings. It runs on gVisor's ICMP endpoint (transport/icmp), which does
// what ping.c does: it sets the identifier of every request to the
// socket's, computes the checksum, and delivers the echo replies to that
// identifier only.

// PingConn is an ICMP echo socket of the stack, as Linux's ping socket:
// the application writes an ICMP echo request message (ICMPv4 type 8 or
// ICMPv6 type 128, code 0), header included,
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     Type      |     Code      |          Checksum             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|           Identifier          |        Sequence Number        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     Data ...
//	+-+-+-+-+-
//
// (RFC 792, RFC 4443 section 4.1); the stack overwrites the identifier
// with the socket's (ID) and computes the checksum, as ping_v4_sendmsg
// does. A message shorter than 8 bytes, of another type or of a code
// other than 0 fails with EINVAL, one over 65535 bytes with EMSGSIZE.
// Reads return the echo replies whose identifier is the socket's, ICMP
// header included, cut to the buffer given (recvfrom's truncation);
// nothing else (no other ICMP message, no IP header) reaches the socket.
// A dialed socket (DialPingAddr, DialPing) receives the replies of its
// peer only, where Linux's ping_lookup would also take those of other
// hosts. The loopback addresses (127.0.0.1, ::1) and the stack's IPv6
// addresses answer the stack's own pings; its IPv4 wire addresses do
// not: the loopback interface takes a packet for them as gVisor's
// "temporary" address, and gVisor's IPv4 sends no echo reply for one.
//
// It is a net.Conn and a net.PacketConn, whose addresses are *net.IPAddr.
// Its errors are Go's net errors (errors.go): a *net.OpError around the
// errno Linux returns (ENETUNREACH at once for a destination with no
// route, EINVAL for a malformed message, EDESTADDRREQ for Write on a
// socket not dialed), net.ErrClosed for any call on the closed socket,
// os.ErrDeadlineExceeded at a deadline. All its methods are safe for
// concurrent use; reads are serialized with each other, and writes.
type PingConn struct {
	dgramSock
	id    uint16 // the echo identifier, the socket's "port"
	laddr *net.IPAddr
	raddr *net.IPAddr // nil: not connected
}

// PingAddr is an ICMP socket's address as wireguard-go's tun/netstack
// names it: an IP address, of network "ping4" or "ping6". PingConn's
// WriteTo takes one, as a value or a pointer, as it takes a *net.IPAddr.
type PingAddr struct{ addr netip.Addr }

// PingAddrFromAddr returns addr as a *PingAddr.
func PingAddrFromAddr(addr netip.Addr) *PingAddr { return &PingAddr{addr} }

// Addr returns the address.
func (a PingAddr) Addr() netip.Addr { return a.addr }

// Network returns "ping4" or "ping6" by the address's family, "ping" for
// the zero PingAddr.
func (a PingAddr) Network() string {
	switch {
	case a.addr.Is4() || a.addr.Is4In6():
		return "ping4"
	case a.addr.Is6():
		return "ping6"
	}
	return "ping"
}

// String returns the address as netip.Addr's String.
func (a PingAddr) String() string { return a.addr.String() }

// pingNetwork returns the network of a ping socket of a's family, as the
// netip-typed constructors name it in their errors.
func pingNetwork(a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return "ping6"
	}
	return "ping4"
}

// DialPingAddr returns a ping socket connected to raddr, as wireguard-go's
// Net.DialPingAddr and connect(2) on a Linux ping socket: Write sends to
// raddr, and reads return raddr's echo replies. Its family is raddr's
// (an IPv4-mapped raddr is IPv4); an unspecified raddr is the loopback
// address, as the kernel connects it. laddr, if valid and not
// unspecified, is bound first (it must be the stack's: EADDRNOTAVAIL
// otherwise, as ping_check_bind_addr); the zero laddr lets the stack pick
// the address of the route to raddr. Errors are *net.OpError with Op
// "dial": net's "missing address" for a zero raddr, a laddr of the other
// family as bind fails on it, ENETUNREACH at once for a raddr the stack
// has no route to.
func (s *Stack) DialPingAddr(laddr, raddr netip.Addr) (*PingConn, error) {
	return s.dialPing(pingNetwork(raddr), laddr, raddr)
}

// ListenPingAddr returns a ping socket bound to laddr, not connected, as
// wireguard-go's Net.ListenPingAddr: WriteTo sends to any address of its
// family, and reads return the replies from every host. An unspecified
// laddr (0.0.0.0 or ::) takes the replies to every address of the
// stack's; another must be the stack's (EADDRNOTAVAIL otherwise). Errors
// are *net.OpError with Op "listen"; a zero laddr, whose family is
// unknown, is net's "missing address".
func (s *Stack) ListenPingAddr(laddr netip.Addr) (*PingConn, error) {
	return s.listenPing(pingNetwork(laddr), laddr)
}

// DialPing returns a ping socket connected to address with
// DialPingContext and no deadline.
func (s *Stack) DialPing(network, address string) (*PingConn, error) {
	return s.DialPingContext(context.Background(), network, address)
}

// DialPingContext returns a ping socket connected to address on network,
// as wireguard-go's Net.DialContext does for its ping networks: network
// is "ping4", "ping6" or "ping" (either family); address is a host, no
// port: an IP literal or a name resolved with LookupContextHost within ctx
// ("ping4" keeps its IPv4 addresses, "ping6" its IPv6 ones, "ping" all, in
// the resolver's order). Each address is tried in turn, as DialPingAddr
// connects, until one succeeds; the first error is returned. Errors are
// *net.OpError with Op "dial": net.UnknownNetworkError, net's "missing
// address" for an empty address, a *net.DNSError or *net.AddrError from
// the resolution, or DialPingAddr's.
func (s *Stack) DialPingContext(ctx context.Context, network, address string) (*PingConn, error) {
	if ctx == nil {
		panic("nil context")
	}
	fam, err := parsePingNetwork(network)
	if err != nil {
		return nil, opError("dial", network, nil, nil, err)
	}
	if address == "" {
		return nil, opError("dial", network, nil, nil, errMissingAddress)
	}
	addrs, err := s.resolvePing(ctx, fam, address)
	if err != nil {
		return nil, opError("dial", network, nil, nil, err)
	}
	var firstErr error // the first address's error is the most relevant
	for _, a := range addrs {
		c, err := s.dialPing(network, netip.Addr{}, a)
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}

// ListenPing returns a ping socket bound to address on network, as
// ListenPingAddr: network is "ping4", "ping6" or "ping"; address is a host,
// no port, resolved as DialPingContext resolves it ("ping" takes its first
// IPv4 address, else its first, as net.ListenPacket does). An empty
// address is 0.0.0.0 ("ping4", "ping") or :: ("ping6"): every address of
// the stack's in that family. Errors are *net.OpError with Op "listen".
func (s *Stack) ListenPing(network, address string) (*PingConn, error) {
	fam, err := parsePingNetwork(network)
	if err != nil {
		return nil, opError("listen", network, nil, nil, err)
	}
	var la netip.Addr
	switch {
	case address == "" && fam == '6':
		la = netip.IPv6Unspecified()
	case address == "":
		la = netip.IPv4Unspecified()
	default:
		addrs, err := s.resolvePing(context.Background(), fam, address)
		if err != nil {
			return nil, opError("listen", network, nil, nil, err)
		}
		la = addrs[0]
		for _, a := range addrs {
			if a.Is4() {
				la = a // net's addrList.first(isIPv4)
				break
			}
		}
	}
	return s.listenPing(network, la)
}

// parsePingNetwork returns network's family ('4', '6' or 0 for either),
// or net.UnknownNetworkError.
func parsePingNetwork(network string) (fam byte, err error) {
	switch network {
	case "ping":
		return 0, nil
	case "ping4", "ping6":
		return network[4], nil
	}
	return 0, net.UnknownNetworkError(network)
}

// resolvePing resolves host, an IP literal or a name, to its addresses of
// family fam (0: both), unmapped and without zone, as resolveAddrList
// does for a host without a port.
func (s *Stack) resolvePing(ctx context.Context, fam byte, host string) ([]netip.Addr, error) {
	ips, err := s.lookupIP(ctx, fam, host)
	if err != nil {
		return nil, err
	}
	out := ips[:0:0]
	for _, ip := range ips {
		ip = ip.WithZone("").Unmap()
		if (fam == '4' && !ip.Is4()) || (fam == '6' && !ip.Is6()) {
			continue
		}
		out = append(out, ip)
	}
	if len(out) == 0 {
		return nil, &net.AddrError{Err: errNoSuitableAddress.Error(), Addr: host}
	}
	return out, nil
}

// dialPing is DialPingAddr on network, for its errors.
func (s *Stack) dialPing(network string, laddr, raddr netip.Addr) (*PingConn, error) {
	la := ipOpAddr(laddr)
	if !raddr.IsValid() {
		return nil, opError("dial", network, la, nil, errMissingAddress)
	}
	// An unspecified raddr is the loopback address: gVisor routes it
	// there, as ip4_datagram_connect and ip6_datagram_connect do.
	raddr = raddr.WithZone("").Unmap()
	ra := ipOpAddr(raddr)
	proto := ipv4.ProtocolNumber
	if raddr.Is6() {
		proto = ipv6.ProtocolNumber
	}
	ep, wq, err := s.newPingEndpoint(proto)
	if err != nil {
		return nil, opError("dial", network, la, ra, err)
	}
	if laddr.IsValid() {
		if err := bindPing(ep, proto, laddr, true); err != nil {
			ep.Close()
			return nil, opError("dial", network, la, ra, err)
		}
	}
	fa, _ := destAddr(netip.AddrPortFrom(raddr, 0))
	if e := ep.Connect(fa); e != nil {
		ep.Close()
		return nil, opError("dial", network, la, ra, syscallErr("connect", e))
	}
	return newPingConn(s, network, wq, ep, proto), nil
}

// listenPing is ListenPingAddr on network, for its errors.
func (s *Stack) listenPing(network string, laddr netip.Addr) (*PingConn, error) {
	if !laddr.IsValid() {
		return nil, opError("listen", network, nil, nil, errMissingAddress)
	}
	la := ipOpAddr(laddr)
	laddr = laddr.WithZone("").Unmap()
	proto := ipv4.ProtocolNumber
	if laddr.Is6() {
		proto = ipv6.ProtocolNumber
	}
	ep, wq, err := s.newPingEndpoint(proto)
	if err != nil {
		return nil, opError("listen", network, nil, la, err)
	}
	// Bound, even to the wildcard, the socket has its identifier (the
	// port inet_autobind would give it on the first send) and receives.
	if err := bindPing(ep, proto, laddr, false); err != nil {
		ep.Close()
		return nil, opError("listen", network, nil, la, err)
	}
	return newPingConn(s, network, wq, ep, proto), nil
}

// newPingEndpoint returns a new ICMP endpoint of proto and its queue.
func (s *Stack) newPingEndpoint(proto tcpip.NetworkProtocolNumber) (tcpip.Endpoint, *waiter.Queue, error) {
	tp := icmp.ProtocolNumber4
	if proto == ipv6.ProtocolNumber {
		tp = icmp.ProtocolNumber6
	}
	wq := new(waiter.Queue)
	ep, e := s.ip.NewEndpoint(tp, proto, wq)
	if e != nil {
		return nil, nil, syscallErr("socket", e)
	}
	return ep, wq, nil
}

// bindPing binds ep, of proto, to a with an identifier of the stack's
// choosing, as bind(2) with port 0 on a ping socket; an unspecified a
// binds to every address, or on a socket about to be connected (connect
// true) is left to Connect, as the kernel binds it there. An IPv4 address
// on an IPv6 socket fails with EINVAL, as ping_check_bind_addr fails on
// an IPv4-mapped one; an IPv6 address on an IPv4 socket with net's
// "non-IPv4 address", as Go's ipToSockaddr.
func bindPing(ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber, a netip.Addr, connect bool) error {
	a = a.WithZone("").Unmap()
	switch {
	case proto == ipv4.ProtocolNumber && !a.Is4():
		return errBadAddr("non-IPv4 address", a.String())
	case proto == ipv6.ProtocolNumber && !a.Is6():
		return errnoErr("bind", syscall.EINVAL)
	}
	var fa tcpip.FullAddress
	if !a.IsUnspecified() {
		fa, _ = destAddr(netip.AddrPortFrom(a, 0))
	} else if connect {
		return nil
	}
	if e := ep.Bind(fa); e != nil {
		return syscallErr("bind", e)
	}
	return nil
}

// newPingConn wraps ep, bound or connected, as a socket of network on
// proto.
func newPingConn(s *Stack, network string, wq *waiter.Queue, ep tcpip.Endpoint, proto tcpip.NetworkProtocolNumber) *PingConn {
	c := &PingConn{}
	c.init(s, network, wq, ep, proto)
	if a, e := ep.GetLocalAddress(); e == nil {
		c.laddr = &net.IPAddr{IP: sockIP(a.Addr, proto)}
		c.id = a.Port
	}
	if a, e := ep.GetRemoteAddress(); e == nil {
		c.raddr = &net.IPAddr{IP: sockIP(a.Addr, proto)}
	}
	return c
}

// ipOpAddr returns a as a *net.IPAddr for an error, nil if a is the zero
// Addr, as net's opAddr leaves an absent address nil.
func ipOpAddr(a netip.Addr) net.Addr {
	if !a.IsValid() {
		return nil
	}
	return &net.IPAddr{IP: a.AsSlice(), Zone: a.Zone()}
}

// ipAddrOrNil returns a as a net.Addr, nil if a is nil.
func ipAddrOrNil(a *net.IPAddr) net.Addr {
	if a == nil {
		return nil
	}
	return a
}

// ID returns the socket's echo identifier: the one the stack writes into
// every request it sends and that its replies carry, the "port" Linux's
// getsockname reports for a ping socket.
func (c *PingConn) ID() uint16 { return c.id }

// ReadFrom reads an echo reply into b and returns its length (at most
// len(b)) and its sender, a *net.IPAddr.
func (c *PingConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, fa, err := c.readFrom(b, "recvfrom")
	if err != nil {
		return n, nil, err
	}
	return n, &net.IPAddr{IP: sockIP(fa.Addr, c.proto)}, nil
}

// Read reads an echo reply into b, as ReadFrom without the sender.
func (c *PingConn) Read(b []byte) (int, error) {
	n, _, err := c.readFrom(b, "read")
	return n, err
}

// readFrom reads one reply into b; call names the system call for its
// errors.
func (c *PingConn) readFrom(b []byte, call string) (int, tcpip.FullAddress, error) {
	n, fa, err := c.recv(b, call)
	if err != nil {
		return 0, fa, c.opError("read", nil, err)
	}
	return n, fa, nil
}

// WriteTo sends b, an echo request message, to addr: a *net.IPAddr, a
// *net.UDPAddr (as golang.org/x/net/icmp's "udp4" sockets take; its port
// is ignored, as ping_v4_sendmsg ignores sin_port) or a PingAddr. Another
// type fails with EINVAL, a nil address with net's "missing address", a
// connected socket with net.ErrWriteToConnected. An address of the other
// family fails as Go's net and Linux fail it: an IPv6 address on an IPv4
// socket with net's "non-IPv4 address", an IPv4 one on an IPv6 socket
// with EINVAL (ping_v6_sendmsg's answer for an IPv4-mapped address). The
// unspecified address is the loopback one, as gVisor and Linux route it.
func (c *PingConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	var ip netip.Addr
	var ok bool
	switch a := addr.(type) {
	case *net.IPAddr:
		if a == nil {
			return 0, c.opError("write", nil, errMissingAddress)
		}
		ip, ok = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		if a == nil {
			return 0, c.opError("write", nil, errMissingAddress)
		}
		ip, ok = netip.AddrFromSlice(a.IP)
	case *PingAddr:
		if a == nil {
			return 0, c.opError("write", nil, errMissingAddress)
		}
		ip, ok = a.addr, a.addr.IsValid()
	case PingAddr:
		ip, ok = a.addr, a.addr.IsValid()
	default:
		return 0, opError("write", c.net, ipAddrOrNil(c.laddr), addr, syscall.EINVAL)
	}
	if c.raddr != nil {
		return 0, opError("write", c.net, ipAddrOrNil(c.laddr), addr, net.ErrWriteToConnected)
	}
	if !ok {
		return 0, opError("write", c.net, ipAddrOrNil(c.laddr), addr, errBadAddr("invalid address", addr.String()))
	}
	ip = ip.WithZone("").Unmap()
	switch {
	case c.proto == ipv4.ProtocolNumber && !ip.Is4():
		return 0, opError("write", c.net, ipAddrOrNil(c.laddr), addr, errBadAddr("non-IPv4 address", ip.String()))
	case c.proto == ipv6.ProtocolNumber && !ip.Is6():
		return 0, opError("write", c.net, ipAddrOrNil(c.laddr), addr, errnoErr("sendto", syscall.EINVAL))
	}
	return c.write(b, ip, true, "sendto", addr)
}

// Write sends b, an echo request message, to the connected socket's peer;
// on a socket that is not connected it fails with EDESTADDRREQ.
func (c *PingConn) Write(b []byte) (int, error) {
	return c.write(b, netip.Addr{}, false, "write", nil)
}

// write sends b to ip (if to) or to the connected peer; call and dst
// (nil: the peer) are for its errors.
func (c *PingConn) write(b []byte, ip netip.Addr, to bool, call string, dst net.Addr) (int, error) {
	n, err := c.send(b, netip.AddrPortFrom(ip, 0), to, call)
	if err != nil {
		return 0, c.opError("write", dst, err)
	}
	return n, nil
}

// Close closes the socket. Calls blocked on it return net.ErrClosed, as
// does every later call, Close included.
func (c *PingConn) Close() error {
	if !c.closeSock() {
		return c.opError("close", nil, net.ErrClosed)
	}
	return nil
}

// LocalAddr returns the socket's address, a *net.IPAddr: the one it was
// bound to (0.0.0.0 or :: for every address), or the one the stack chose
// for a dialed socket.
func (c *PingConn) LocalAddr() net.Addr { return ipAddrOrNil(c.laddr) }

// RemoteAddr returns the connected socket's peer, a *net.IPAddr, or nil.
func (c *PingConn) RemoteAddr() net.Addr { return ipAddrOrNil(c.raddr) }

// SetDeadline sets the read and the write deadline.
func (c *PingConn) SetDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline|writeDeadline))
}

// SetReadDeadline sets the deadline of the reads (zero: none): past it,
// and for reads blocked when it passes, they fail with an error wrapping
// os.ErrDeadlineExceeded, whose Timeout is true.
func (c *PingConn) SetReadDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, readDeadline))
}

// SetWriteDeadline sets the deadline of the writes, as SetReadDeadline.
func (c *PingConn) SetWriteDeadline(t time.Time) error {
	return c.setError(c.setDeadlines(t, writeDeadline))
}

// opError is an error of c's op with the peer dst, as net's IPConn
// reports it: the local address as Source; dst nil is the connected
// peer, if any.
func (c *PingConn) opError(op string, dst net.Addr, err error) error {
	if dst == nil {
		dst = ipAddrOrNil(c.raddr)
	}
	return opError(op, c.net, ipAddrOrNil(c.laddr), dst, err)
}

// setError is a failed deadline's: no Source, the local address as Addr.
func (c *PingConn) setError(err error) error {
	if err == nil {
		return nil
	}
	return opError("set", c.net, nil, ipAddrOrNil(c.laddr), err)
}

var (
	_ net.Conn       = (*PingConn)(nil)
	_ net.PacketConn = (*PingConn)(nil)
)
