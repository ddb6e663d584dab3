package stack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// This file is the stack's net-style surface: Dial, DialContext, Listen
// and ListenPacket by network and "host:port" strings, as Go's net package
// (dial.go, ipsock.go) and wireguard-go's tun/netstack offer them, on the
// sockets of the netip-typed DialTCP, ListenTCP and ListenUDP. Names are
// resolved by LookupContextHost (resolve.go), on the stack itself.

// Errors that Go's net package puts in its *net.OpError and *net.AddrError
// (net.go: errMissingAddress, errNoSuitableAddress); their text is Go's.
var (
	errMissingAddress    = errors.New("missing address")
	errNoSuitableAddress = errors.New("no suitable address found")
)

// Dial connects to address on network with DialContext and no deadline.
func (s *Stack) Dial(network, address string) (net.Conn, error) {
	return s.DialContext(context.Background(), network, address)
}

// DialContext connects to address on network, as net.Dialer.DialContext:
// network is "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6"; address is
// "host:port", host an IP literal or a name, resolved with
// LookupContextHost ("tcp4" and "udp4" keep its IPv4 addresses, "tcp6" and
// "udp6" its IPv6 ones), port a number or a service name Go's net knows
// without /etc/services ("http"). The addresses are tried in order, each
// given an equal share of ctx's deadline (at least 2 s while there is
// that much), as net's dialSerial does; the first error is returned. An
// empty or unspecified host dials the loopback address. A "udp" dial
// returns a connected socket. Errors are *net.OpError with Op "dial".
func (s *Stack) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if ctx == nil {
		panic("nil context")
	}
	l4, fam, err := parseNetwork(network)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	if address == "" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errMissingAddress}
	}
	addrs, err := s.resolveAddrList(ctx, "dial", network, fam, address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	var firstErr error // the first address's error is the most relevant
	for i, ap := range addrs {
		ra := netAddr(l4, ap)
		select {
		case <-ctx.Done():
			return nil, &net.OpError{Op: "dial", Net: network, Addr: ra, Err: mapCtxErr(ctx.Err())}
		default:
		}
		dialCtx := ctx
		if deadline, ok := ctx.Deadline(); ok {
			partial, err := partialDeadline(time.Now(), deadline, len(addrs)-i)
			if err != nil {
				if firstErr == nil {
					firstErr = &net.OpError{Op: "dial", Net: network, Addr: ra, Err: err}
				}
				break
			}
			if partial.Before(deadline) {
				var cancel context.CancelFunc
				dialCtx, cancel = context.WithDeadline(ctx, partial)
				defer cancel()
			}
		}
		var c net.Conn
		if l4 == "tcp" {
			var tc *TCPConn
			if tc, err = s.dialTCP(dialCtx, network, ap); err == nil {
				c = tc
			}
		} else {
			c, err = s.dialUDP(network, ap)
		}
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = dialError(network, ra, err)
		}
	}
	if firstErr == nil {
		firstErr = &net.OpError{Op: "dial", Net: network, Err: errMissingAddress}
	}
	return nil, firstErr
}

// Listen listens on address on network, as net.Listen: network is "tcp",
// "tcp4" or "tcp6"; address is "host:port", whose host may be a name
// (its first IPv4 address is taken, else its first one) or empty. An
// empty or unspecified host listens on every address: "tcp" on both
// families (an IPv6 socket that also takes IPv4, as Go's net makes it),
// "tcp4" on IPv4's, "tcp6" on IPv6's only. Accept returns *TCPConn. Errors
// are *net.OpError with Op "listen"; an address the stack does not own
// wraps syscall.EADDRNOTAVAIL, as the kernel's bind.
func (s *Stack) Listen(network, address string) (net.Listener, error) {
	l4, fam, err := parseNetwork(network)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	ap, la, v6only, err := s.listenAddr(l4, fam, address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if l4 != "tcp" {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: la, Err: &net.AddrError{Err: "unexpected address type", Addr: address}}
	}
	return s.listenTCP(network, ap, v6only)
}

// ListenPacket binds a UDP socket to address on network, as
// net.ListenPacket: network is "udp", "udp4" or "udp6", address as in
// Listen. Errors are *net.OpError with Op "listen".
func (s *Stack) ListenPacket(network, address string) (net.PacketConn, error) {
	l4, fam, err := parseNetwork(network)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	ap, la, v6only, err := s.listenAddr(l4, fam, address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if l4 != "udp" {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: la, Err: &net.AddrError{Err: "unexpected address type", Addr: address}}
	}
	return s.listenUDP(network, ap, 0, v6only)
}

// listenAddr resolves Listen's address (on transport l4) to the one to
// bind, as net shows it in its errors (la: no IP for an empty host), and
// reports whether an IPv6 socket on it must take IPv6 only. Like Go's net
// (favoriteAddrFamily), a wildcard host on "tcp" or "udp" makes a dual-
// stack IPv6 socket, and on "tcp6" or "udp6" an IPv6-only one.
func (s *Stack) listenAddr(l4 string, fam byte, address string) (ap netip.AddrPort, la net.Addr, v6only bool, err error) {
	addrs, err := s.resolveAddrList(context.Background(), "listen", l4, fam, address)
	if err != nil {
		return netip.AddrPort{}, nil, false, err
	}
	ap = addrs[0]
	for _, a := range addrs {
		if a.Addr().Is4() {
			ap = a // net's addrList.first(isIPv4)
			break
		}
	}
	la = netAddr(l4, ap)
	if h, _, _ := net.SplitHostPort(address); address == "" || h == "" {
		la = netAddr(l4, netip.AddrPortFrom(netip.Addr{}, ap.Port()))
	}
	if !ap.Addr().IsUnspecified() {
		return ap, la, false, nil
	}
	switch fam {
	case '4':
		return netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port()), la, false, nil
	case '6':
		return netip.AddrPortFrom(netip.IPv6Unspecified(), ap.Port()), la, true, nil
	}
	return netip.AddrPortFrom(netip.IPv6Unspecified(), ap.Port()), la, false, nil
}

// parseNetwork splits network into its transport ("tcp" or "udp") and its
// family ('4', '6' or 0 for both), or returns net.UnknownNetworkError.
func parseNetwork(network string) (l4 string, fam byte, err error) {
	switch network {
	case "tcp", "udp":
		return network, 0, nil
	case "tcp4", "tcp6", "udp4", "udp6":
		return network[:3], network[3], nil
	}
	return "", 0, net.UnknownNetworkError(network)
}

// resolveAddrList resolves address ("host:port") for op ("dial" or
// "listen") to the addresses of family fam, as net's internetAddrList:
// an IP literal stands for itself, a name is looked up, an empty host is
// the unspecified address (which a dial turns into loopback). Its errors
// are what net puts in an OpError: *net.AddrError, *net.DNSError.
func (s *Stack) resolveAddrList(ctx context.Context, op, network string, fam byte, address string) ([]netip.AddrPort, error) {
	var host string
	var port int
	if address != "" {
		h, service, err := net.SplitHostPort(address)
		if err != nil {
			return nil, err
		}
		if port, err = lookupPort(network, service); err != nil {
			return nil, err
		}
		host = h
	}
	var ips []netip.Addr
	if host == "" {
		ips = []netip.Addr{netip.IPv4Unspecified()}
		if fam == '6' {
			ips[0] = netip.IPv6Unspecified()
		}
	} else {
		var err error
		if ips, err = s.lookupIP(ctx, fam, host); err != nil {
			return nil, err
		}
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		ip = ip.WithZone("").Unmap()
		if (fam == '4' && !ip.Is4()) || (fam == '6' && !ip.Is6()) {
			continue
		}
		if op == "dial" && ip.IsUnspecified() {
			// The kernel connects a socket to 0.0.0.0 or :: on loopback.
			if ip.Is6() {
				ip = netip.IPv6Loopback()
			} else {
				ip = netip.AddrFrom4([4]byte{127, 0, 0, 1})
			}
		}
		out = append(out, netip.AddrPortFrom(ip, uint16(port)))
	}
	if len(out) == 0 {
		return nil, &net.AddrError{Err: errNoSuitableAddress.Error(), Addr: host}
	}
	return out, nil
}

// services are the service names Go's net knows without /etc/services
// (lookup.go), which the stack does not read.
var services = map[string]map[string]int{
	"udp": {"domain": 53},
	"tcp": {"ftp": 21, "ftps": 990, "gopher": 70, "http": 80, "https": 443, "imap2": 143, "imap3": 220, "imaps": 993, "pop3": 110, "pop3s": 995, "smtp": 25, "submissions": 465, "ssh": 22, "telnet": 23},
}

// lookupPort returns service's port number, as net.Resolver.LookupPort
// without /etc/services: a decimal number in 0..65535 or a name of
// services.
func lookupPort(network, service string) (int, error) {
	port, needsLookup := parsePort(service)
	if needsLookup {
		l4 := network[:3]
		p, ok := services[l4][strings.ToLower(service)]
		if !ok {
			return 0, &net.DNSError{Err: "unknown port", Name: l4 + "/" + service, IsNotFound: true}
		}
		port = p
	}
	if port < 0 || port > 65535 {
		return 0, &net.AddrError{Err: "invalid port", Addr: service}
	}
	return port, nil
}

// parsePort parses a decimal port with an optional sign, as net's
// parsePort ("" is port 0), or reports that service is a name.
func parsePort(service string) (port int, needsLookup bool) {
	if service == "" {
		return 0, false
	}
	neg := false
	switch service[0] {
	case '+':
		service = service[1:]
	case '-':
		neg, service = true, service[1:]
	}
	n := 0
	for _, d := range service {
		if d < '0' || d > '9' {
			return 0, true
		}
		n = min(n*10+int(d-'0'), 1<<30)
	}
	if neg {
		n = -n
	}
	return n, false
}

// partialDeadline returns the deadline of one of addrsRemaining dials
// sharing the time to deadline, as net's partialDeadline: an equal share,
// at least 2 s while that much is left.
func partialDeadline(now, deadline time.Time, addrsRemaining int) (time.Time, error) {
	if deadline.IsZero() {
		return deadline, nil
	}
	left := deadline.Sub(now)
	if left <= 0 {
		return time.Time{}, errIOTimeout
	}
	timeout := left / time.Duration(addrsRemaining)
	const saneMinimum = 2 * time.Second
	if timeout < saneMinimum {
		timeout = min(left, saneMinimum)
	}
	return now.Add(timeout), nil
}

// netAddr returns ap as l4's net.Addr.
func netAddr(l4 string, ap netip.AddrPort) net.Addr {
	if l4 == "udp" {
		return net.UDPAddrFromAddrPort(ap)
	}
	return net.TCPAddrFromAddrPort(ap)
}

// dialError shapes a failed dial to ra as net's *net.OpError with Op
// "dial": an OpError is passed on as it is; one wrapped in another error
// (by a caller that added context) is unwrapped and given Op "dial"; any
// other error is wrapped, a context's as net maps it.
func dialError(network string, ra net.Addr, err error) error {
	if _, ok := err.(*net.OpError); ok {
		return err
	}
	if oe := (*net.OpError)(nil); errors.As(err, &oe) {
		return &net.OpError{Op: "dial", Net: network, Source: oe.Source, Addr: oe.Addr, Err: oe.Err}
	}
	switch {
	case errors.Is(err, context.Canceled):
		err = errCanceled
	case errors.Is(err, context.DeadlineExceeded):
		err = errIOTimeout
	}
	return &net.OpError{Op: "dial", Net: network, Addr: ra, Err: err}
}

// listenError shapes a failed socket call (bind, listen) of a listener on
// la as net.Listen's error: a *net.OpError around the *os.SyscallError of
// the errno Linux returns for it (errors.go's syscallErr: EADDRNOTAVAIL for
// an address the stack does not own, EADDRINUSE for a port in use).
func listenError(network string, la net.Addr, call string, e tcpip.Error) error {
	return &net.OpError{Op: "listen", Net: network, Addr: la, Err: syscallErr(call, e)}
}

// dialUDP returns a UDP socket connected to ap (dialUDPConn), as a
// net.Conn. Its errors are *net.OpError with Op "dial" and Net network.
func (s *Stack) dialUDP(network string, ap netip.AddrPort) (net.Conn, error) {
	c, err := s.dialUDPConn(network, ap)
	if err != nil {
		return nil, err
	}
	return c, nil
}
