package stack

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
)

// This file is the stack's stub resolver: Go's pure-Go DNS client
// (net/dnsclient_unix.go) and wireguard-go's tun/netstack, asking
// Config.DNSServers over the stack's own sockets. It never reads the
// host's /etc/resolv.conf or /etc/hosts.

// The resolver's defaults, resolv.conf's: each server gets dnsTimeout for
// one query (options timeout:5), and the servers are asked in turn
// dnsAttempts times (options attempts:2).
const (
	dnsTimeout  = 5 * time.Second
	dnsAttempts = 2
)

// maxDNSPacketSize is the UDP payload the resolver accepts and advertises
// with EDNS(0), as Go's (RFC 6891; the DNS flag day 2020's 1232 bytes).
const maxDNSPacketSize = 1232

// Errors in a *net.DNSError, with the text Go's resolver gives them
// (net.go, dnsclient_unix.go).
var (
	errNoSuchHost                   = errors.New("no such host")
	errNoDNSServers                 = errors.New("no DNS servers configured")
	errLameReferral                 = errors.New("lame referral")
	errCannotUnmarshalDNSMessage    = errors.New("cannot unmarshal DNS message")
	errCannotMarshalDNSMessage      = errors.New("cannot marshal DNS message")
	errServerMisbehaving            = errors.New("server misbehaving")
	errInvalidDNSResponse           = errors.New("invalid DNS response")
	errNoAnswerFromDNSServer        = errors.New("no answer from DNS server")
	errServerTemporarilyMisbehaving = &temporaryError{"server misbehaving"}
	errCanceled                     = canceledError{}
	errIOTimeout                    = &ioTimeoutError{}
)

// canceledError is a canceled context's error in net's words ("operation
// was canceled"); errors.Is(err, context.Canceled) holds.
type canceledError struct{}

func (canceledError) Error() string     { return "operation was canceled" }
func (canceledError) Is(err error) bool { return err == context.Canceled }

// ioTimeoutError is a passed deadline's error in net's words ("i/o
// timeout"), a net.Error whose Timeout is true; errors.Is(err,
// context.DeadlineExceeded) holds.
type ioTimeoutError struct{}

func (*ioTimeoutError) Error() string     { return "i/o timeout" }
func (*ioTimeoutError) Timeout() bool     { return true }
func (*ioTimeoutError) Temporary() bool   { return true }
func (*ioTimeoutError) Is(err error) bool { return err == context.DeadlineExceeded }

// temporaryError is a net.Error whose Temporary is true.
type temporaryError struct{ s string }

func (e *temporaryError) Error() string { return e.s }
func (*temporaryError) Timeout() bool   { return false }
func (*temporaryError) Temporary() bool { return true }

// mapCtxErr turns a context's error into net's (mapErr).
func mapCtxErr(err error) error {
	switch err {
	case context.Canceled:
		return errCanceled
	case context.DeadlineExceeded:
		return errIOTimeout
	}
	return err
}

// ctxErr is ctx.Err, also once ctx's deadline is past but its timer has
// not fired yet (a socket's deadline, set to it, may fire first).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// newDNSError makes the *net.DNSError Go's resolver makes of err
// (newDNSError): Timeout and Temporary from err, IsNotFound for "no such
// host", and a context's error kept for Unwrap, so that errors.Is(err,
// context.Canceled) and errors.Is(err, context.DeadlineExceeded) hold.
func newDNSError(err error, name, server string) *net.DNSError {
	e := &net.DNSError{Err: err.Error(), Name: name, Server: server, IsNotFound: err == errNoSuchHost}
	if ne, ok := err.(net.Error); ok {
		e.IsTimeout, e.IsTemporary = ne.Timeout(), ne.Temporary()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		e.UnwrapErr = err
	}
	return e
}

// LookupHost looks host up with LookupContextHost and no deadline.
func (s *Stack) LookupHost(host string) ([]string, error) {
	return s.LookupContextHost(context.Background(), host)
}

// LookupContextHost returns host's addresses, as net.Resolver.LookupHost
// but on the stack: an IP literal is returned as it is; "localhost" and
// the names under ".localhost" are 127.0.0.1 and ::1 without a query (RFC
// 6761 section 6.3); any other name is asked of Config.DNSServers, for A
// and AAAA records at once, each server in turn until one answers (a
// server that times out, fails (SERVFAIL) or refuses goes to the next;
// NXDOMAIN is final), over UDP and, when the answer is truncated, TCP.
// The addresses the stack has a route to come first, IPv6 before IPv4
// (RFC 6724's rules 1 and 6). Errors are *net.DNSError, filled as Go's
// resolver fills them: IsNotFound for a name that does not exist,
// IsTimeout when the servers did not answer in time, and errors.Is(err,
// context.Canceled) or context.DeadlineExceeded when ctx ended first.
// It is safe for concurrent use.
func (s *Stack) LookupContextHost(ctx context.Context, host string) ([]string, error) {
	if _, err := netip.ParseAddr(host); err == nil {
		return []string{host}, nil
	}
	addrs, err := s.lookupIP(ctx, 0, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out, nil
}

// lookupIP is LookupContextHost's lookup, for the addresses of family fam
// ('4': A records only, '6': AAAA only, 0: both).
func (s *Stack) lookupIP(ctx context.Context, fam byte, host string) ([]netip.Addr, error) {
	if host == "" {
		return nil, newDNSError(errNoSuchHost, host, "")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	if isLocalhost(host) {
		return []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}, nil
	}
	if !isDomainName(host) || hasSuffixFold(strings.TrimSuffix(host, "."), ".onion") {
		// RFC 7686: .onion names are not for DNS.
		return nil, newDNSError(errNoSuchHost, host, "")
	}
	if len(s.cfg.DNSServers) == 0 {
		return nil, newDNSError(errNoDNSServers, host, "")
	}
	if err := ctx.Err(); err != nil {
		return nil, newDNSError(mapCtxErr(err), host, "")
	}
	fqdn := host
	if !strings.HasSuffix(fqdn, ".") {
		fqdn += "."
	}
	qtypes := []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA}
	switch fam {
	case '4':
		qtypes = qtypes[:1]
	case '6':
		qtypes = qtypes[1:]
	}
	type result struct {
		addrs []netip.Addr
		err   error
	}
	lane := make(chan result, len(qtypes))
	for _, qt := range qtypes {
		go func() {
			addrs, err := s.tryOneName(ctx, fqdn, qt)
			lane <- result{addrs, err}
		}()
	}
	var addrs []netip.Addr
	var lastErr error
	for range qtypes {
		r := <-lane // every lane ends before the lookup returns
		if r.err != nil {
			lastErr = r.err
			continue
		}
		addrs = append(addrs, r.addrs...)
	}
	if err := ctxErr(ctx); err != nil {
		return nil, newDNSError(mapCtxErr(err), host, "")
	}
	if len(addrs) == 0 {
		if e, ok := lastErr.(*net.DNSError); ok {
			e.Name = host // the name asked for, not the rooted one
		}
		return nil, lastErr
	}
	s.sortAddrs(addrs)
	return addrs, nil
}

// sortAddrs orders a lookup's addresses as RFC 6724's destination address
// selection does with its default policy table, by its rules 1 and 6:
// those the stack has a route to first, and among them IPv6 before IPv4
// (precedence 40 against 35 for ::ffff:0:0/96).
func (s *Stack) sortAddrs(addrs []netip.Addr) {
	rank := func(a netip.Addr) int {
		r := 0
		if !s.routable(a) {
			r += 2
		}
		if a.Is4() {
			r++
		}
		return r
	}
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int { return rank(a) - rank(b) })
}

// routable reports whether the stack has a route (or a local one) to a.
func (s *Stack) routable(a netip.Addr) bool {
	proto := ipv6.ProtocolNumber
	if a.Is4() {
		proto = ipv4.ProtocolNumber
	}
	r, e := s.ip.FindRoute(0, tcpip.Address{}, tcpip.AddrFromSlice(a.AsSlice()), proto, false)
	if e != nil {
		return false
	}
	r.Release()
	return true
}

// tryOneName asks the servers for name's records of type qtype, each in
// turn, dnsAttempts rounds, as Go's tryOneName: a server that fails,
// times out or is not reachable makes way for the next; a name that does
// not exist (NXDOMAIN), or has no record of the type, ends the search.
// It returns the addresses of the answer.
func (s *Stack) tryOneName(ctx context.Context, name string, qtype dnsmessage.Type) ([]netip.Addr, error) {
	n, err := dnsmessage.NewName(name)
	if err != nil {
		return nil, newDNSError(errCannotMarshalDNSMessage, name, "")
	}
	q := dnsmessage.Question{Name: n, Type: qtype, Class: dnsmessage.ClassINET}
	timeout := s.dnsTimeout
	if timeout == 0 {
		timeout = dnsTimeout
	}
	var lastErr error
	for range dnsAttempts {
		for _, srv := range s.cfg.DNSServers {
			server := netip.AddrPortFrom(srv.Unmap(), 53)
			sname := server.String()
			if err := ctxErr(ctx); err != nil {
				return nil, newDNSError(mapCtxErr(err), name, "")
			}
			p, h, err := s.exchange(ctx, server, q, timeout)
			if err != nil {
				e := newDNSError(err, name, sname)
				if _, ok := err.(*net.OpError); ok {
					e.IsTemporary = true // a socket's error, as Go marks it
				}
				lastErr = e
				continue
			}
			if err := checkHeader(&p, h); err != nil {
				if err == errNoSuchHost {
					return nil, newDNSError(errNoSuchHost, name, sname)
				}
				lastErr = newDNSError(err, name, sname)
				continue
			}
			addrs, err := answers(&p)
			if err == nil && len(addrs) == 0 {
				err = errNoSuchHost // no record of the type (NODATA)
			}
			if err != nil {
				if err == errNoSuchHost {
					return nil, newDNSError(errNoSuchHost, name, sname)
				}
				lastErr = newDNSError(err, name, sname)
				continue
			}
			return addrs, nil
		}
	}
	return nil, lastErr
}

// answers returns the A and AAAA records of the answer section p is at.
// The servers are taken to be recursive, so that the records are for the
// canonical name and CNAMEs can be skipped, as Go's resolver does.
func answers(p *dnsmessage.Parser) ([]netip.Addr, error) {
	var addrs []netip.Addr
	for {
		h, err := p.AnswerHeader()
		if err == dnsmessage.ErrSectionDone {
			return addrs, nil
		}
		if err != nil {
			return nil, errCannotUnmarshalDNSMessage
		}
		switch h.Type {
		case dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				return nil, errCannotUnmarshalDNSMessage
			}
			addrs = append(addrs, netip.AddrFrom4(r.A))
		case dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			if err != nil {
				return nil, errCannotUnmarshalDNSMessage
			}
			addrs = append(addrs, netip.AddrFrom16(r.AAAA))
		default:
			if err := p.SkipAnswer(); err != nil {
				return nil, errCannotUnmarshalDNSMessage
			}
		}
	}
}

// exchange sends q to server and returns the parser at the answer
// section, and the header: over UDP, and again over TCP if the answer was
// truncated (RFC 7766), each try within timeout and ctx. A cancelled ctx
// ends it at once.
func (s *Stack) exchange(ctx context.Context, server netip.AddrPort, q dnsmessage.Question, timeout time.Duration) (dnsmessage.Parser, dnsmessage.Header, error) {
	id, udpReq, tcpReq, err := newRequest(q)
	if err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, errCannotMarshalDNSMessage
	}
	for _, useTCP := range []bool{false, true} {
		p, h, err := s.exchangeOnce(ctx, server, useTCP, id, q, udpReq, tcpReq, timeout)
		if err != nil {
			return dnsmessage.Parser{}, dnsmessage.Header{}, err
		}
		if err := p.SkipQuestion(); err != dnsmessage.ErrSectionDone {
			return dnsmessage.Parser{}, dnsmessage.Header{}, errInvalidDNSResponse
		}
		// A truncated UDP answer is asked again over TCP (RFC 5966); a
		// truncated TCP one is taken as it is, as glibc does.
		if h.Truncated && !useTCP {
			continue
		}
		return p, h, nil
	}
	return dnsmessage.Parser{}, dnsmessage.Header{}, errNoAnswerFromDNSServer
}

// exchangeOnce is one query of exchange, over UDP or TCP.
func (s *Stack) exchangeOnce(ctx context.Context, server netip.AddrPort, useTCP bool, id uint16, q dnsmessage.Question, udpReq, tcpReq []byte, timeout time.Duration) (dnsmessage.Parser, dnsmessage.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var c net.Conn
	var err error
	if useTCP {
		c, err = s.DialTCP(ctx, server)
	} else {
		c, err = s.dialUDP("udp", server)
	}
	if err != nil {
		network := "udp"
		if useTCP {
			network = "tcp"
		}
		return dnsmessage.Parser{}, dnsmessage.Header{}, dialError(network, netAddr(network, server), err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	// A cancelled ctx wakes the read at once, as a deadline in the past.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var p dnsmessage.Parser
	var h dnsmessage.Header
	if useTCP {
		p, h, err = dnsStreamRoundTrip(c, id, q, tcpReq)
	} else {
		p, h, err = dnsPacketRoundTrip(c, id, q, udpReq)
	}
	return p, h, err
}

// newRequest builds the query for q: id, the UDP message and the TCP one
// (with its length prefix), with EDNS(0) advertising maxDNSPacketSize, as
// Go's newRequest.
func newRequest(q dnsmessage.Question) (id uint16, udpReq, tcpReq []byte, err error) {
	var b2 [2]byte
	if _, err := rand.Read(b2[:]); err != nil {
		return 0, nil, nil, err
	}
	id = binary.BigEndian.Uint16(b2[:])
	b := dnsmessage.NewBuilder(make([]byte, 2, 514), dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return 0, nil, nil, err
	}
	if err := b.Question(q); err != nil {
		return 0, nil, nil, err
	}
	if err := b.StartAdditionals(); err != nil {
		return 0, nil, nil, err
	}
	var rh dnsmessage.ResourceHeader
	if err := rh.SetEDNS0(maxDNSPacketSize, dnsmessage.RCodeSuccess, false); err != nil {
		return 0, nil, nil, err
	}
	if err := b.OPTResource(rh, dnsmessage.OPTResource{}); err != nil {
		return 0, nil, nil, err
	}
	if tcpReq, err = b.Finish(); err != nil {
		return 0, nil, nil, err
	}
	udpReq = tcpReq[2:]
	l := len(tcpReq) - 2
	tcpReq[0], tcpReq[1] = byte(l>>8), byte(l)
	return id, udpReq, tcpReq, nil
}

// checkResponse reports whether a response answers the query id for q.
func checkResponse(id uint16, q dnsmessage.Question, h dnsmessage.Header, rq dnsmessage.Question) bool {
	return h.Response && h.ID == id && q.Type == rq.Type && q.Class == rq.Class && strings.EqualFold(q.Name.String(), rq.Name.String())
}

// dnsPacketRoundTrip sends b on the UDP socket c and reads until the
// answer to id comes; other datagrams are ignored (possible forgeries,
// golang.org/issue/13281).
func dnsPacketRoundTrip(c net.Conn, id uint16, q dnsmessage.Question, b []byte) (dnsmessage.Parser, dnsmessage.Header, error) {
	if _, err := c.Write(b); err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, err
	}
	b = make([]byte, maxDNSPacketSize)
	for {
		n, err := c.Read(b)
		if err != nil {
			return dnsmessage.Parser{}, dnsmessage.Header{}, err
		}
		var p dnsmessage.Parser
		h, err := p.Start(b[:n])
		if err != nil {
			continue
		}
		rq, err := p.Question()
		if err != nil || !checkResponse(id, q, h, rq) {
			continue
		}
		return p, h, nil
	}
}

// dnsStreamRoundTrip sends b on the TCP connection c and reads the
// answer, a length-prefixed message (RFC 1035 section 4.2.2).
func dnsStreamRoundTrip(c net.Conn, id uint16, q dnsmessage.Question, b []byte) (dnsmessage.Parser, dnsmessage.Header, error) {
	if _, err := c.Write(b); err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, err
	}
	var l2 [2]byte
	if _, err := io.ReadFull(c, l2[:]); err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, err
	}
	b = make([]byte, binary.BigEndian.Uint16(l2[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, err
	}
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, errCannotUnmarshalDNSMessage
	}
	rq, err := p.Question()
	if err != nil {
		return dnsmessage.Parser{}, dnsmessage.Header{}, errCannotUnmarshalDNSMessage
	}
	if !checkResponse(id, q, h, rq) {
		return dnsmessage.Parser{}, dnsmessage.Header{}, errInvalidDNSResponse
	}
	return p, h, nil
}

// checkHeader checks an answer's header as Go's checkHeader: NXDOMAIN is
// errNoSuchHost; SERVFAIL a temporary error and any other failure code
// (REFUSED, ...) errServerMisbehaving, both sending the caller to the
// next server; an empty non-authoritative answer from a server that does
// not recurse is a lame referral. p stays at the answer section.
func checkHeader(p *dnsmessage.Parser, h dnsmessage.Header) error {
	rcode, hasAdd := extendedRCode(*p, h)
	if rcode == dnsmessage.RCodeNameError {
		return errNoSuchHost
	}
	q := *p
	_, err := q.AnswerHeader()
	if err != nil && err != dnsmessage.ErrSectionDone {
		return errCannotUnmarshalDNSMessage
	}
	// libresolv goes on to the next server after an invalid referral
	// (golang.org/issue/15434).
	if rcode == dnsmessage.RCodeSuccess && !h.Authoritative && !h.RecursionAvailable && err == dnsmessage.ErrSectionDone && !hasAdd {
		return errLameReferral
	}
	if rcode != dnsmessage.RCodeSuccess {
		if rcode == dnsmessage.RCodeServerFailure {
			return errServerTemporarilyMisbehaving
		}
		return errServerMisbehaving
	}
	return nil
}

// extendedRCode returns the answer's RCode, extended by its EDNS(0) OPT
// record if it has one, and whether it has additional records.
func extendedRCode(p dnsmessage.Parser, h dnsmessage.Header) (dnsmessage.RCode, bool) {
	p.SkipAllAnswers()
	p.SkipAllAuthorities()
	hasAdd := false
	for {
		ah, err := p.AdditionalHeader()
		if err != nil {
			return h.RCode, hasAdd
		}
		hasAdd = true
		if ah.Type == dnsmessage.TypeOPT {
			return ah.ExtendedRCode(h.RCode), hasAdd
		}
		if err := p.SkipAdditional(); err != nil {
			return h.RCode, hasAdd
		}
	}
}

// isLocalhost reports whether host is "localhost" or a name under
// ".localhost", in any case, rooted or not (RFC 6761 section 6.3).
func isLocalhost(host string) bool {
	h := strings.TrimSuffix(host, ".")
	return strings.EqualFold(h, "localhost") || hasSuffixFold(h, ".localhost")
}

// hasSuffixFold is strings.HasSuffix ignoring ASCII case.
func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// isDomainName reports whether s is a valid domain name as Go's resolver
// checks it (dnsclient.go's isDomainName, RFC 1035 with the underscores
// and all-digit labels seen in practice): labels of 1..63 bytes of
// letters, digits, '-' and '_', not starting or ending with '-', 253
// bytes at most (254 with the root's dot).
func isDomainName(s string) bool {
	if s == "." {
		return true
	}
	l := len(s)
	if l == 0 || l > 254 || l == 254 && s[l-1] != '.' {
		return false
	}
	last := byte('.')
	nonNumeric := false
	partlen := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		default:
			return false
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_':
			nonNumeric = true
			partlen++
		case '0' <= c && c <= '9':
			partlen++
		case c == '-':
			if last == '.' {
				return false
			}
			partlen++
			nonNumeric = true
		case c == '.':
			if last == '.' || last == '-' {
				return false
			}
			if partlen > 63 || partlen == 0 {
				return false
			}
			partlen = 0
		}
		last = c
	}
	if last == '-' || partlen > 63 {
		return false
	}
	return nonNumeric
}
