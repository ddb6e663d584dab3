package stack

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The test zone: host.test has an address of each family on the wire's
// subnets, v4only.test only an IPv4 one, big.test more A records than a
// UDP answer takes (truncated, so asked again over TCP); every other name
// does not exist.
var testZone = map[string][]netip.Addr{
	"host.test.":   {netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")},
	"v4only.test.": {netip.MustParseAddr("192.0.2.2")},
	"big.test.":    bigAnswer(),
}

func bigAnswer() []netip.Addr {
	var out []netip.Addr
	for i := range 40 {
		out = append(out, netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}))
	}
	return out
}

// dnsMode is what a test server does with a query.
type dnsMode int

const (
	dnsAnswer   dnsMode = iota // answers from testZone, NXDOMAIN for other names
	dnsSilent                  // reads the query and never answers
	dnsServFail                // answers SERVFAIL
	dnsRefused                 // answers REFUSED
	dnsNXDomain                // answers NXDOMAIN to every name
)

// dnsServer is a name server on a stack, on UDP and TCP port 53 of one
// address.
type dnsServer struct {
	mode    dnsMode
	queries atomic.Int64  // queries read, over UDP and TCP
	tcp     atomic.Int64  // of them over TCP
	asked   chan struct{} // closed at the first query
	once    sync.Once
}

// startDNS serves mode on addr:53 of s until the test ends.
func startDNS(t *testing.T, s *Stack, addr string, mode dnsMode) *dnsServer {
	t.Helper()
	d := &dnsServer{mode: mode, asked: make(chan struct{})}
	pc, err := s.ListenPacket("udp", net.JoinHostPort(addr, "53"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Listen("tcp", net.JoinHostPort(addr, "53"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := d.answer(buf[:n], true); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	go func() {
		defer wg.Done()
		var cwg sync.WaitGroup
		defer cwg.Wait()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				var l2 [2]byte
				if _, err := io.ReadFull(c, l2[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l2[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				d.tcp.Add(1)
				if resp := d.answer(q, false); resp != nil {
					c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(resp))))
					c.Write(resp)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		l.Close()
		wg.Wait()
	})
	return d
}

// answer returns the response to query q (nil: none), truncated over UDP
// when it would not fit in 512 bytes.
func (d *dnsServer) answer(q []byte, udp bool) []byte {
	d.queries.Add(1)
	d.once.Do(func() { close(d.asked) })
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	var ans []netip.Addr
	switch d.mode {
	case dnsSilent:
		return nil
	case dnsServFail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case dnsRefused:
		rh.RCode = dnsmessage.RCodeRefused
	case dnsNXDomain:
		rh.RCode = dnsmessage.RCodeNameError
	case dnsAnswer:
		addrs, ok := testZone[qs[0].Name.String()]
		if !ok {
			rh.RCode = dnsmessage.RCodeNameError
		}
		for _, a := range addrs {
			if a.Is4() == (qs[0].Type == dnsmessage.TypeA) {
				ans = append(ans, a)
			}
		}
	}
	if udp && len(ans) > 20 {
		rh.Truncated, ans = true, nil
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.StartQuestions()
	b.Question(qs[0])
	b.StartAnswers()
	for _, a := range ans {
		h := dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: 60}
		if a.Is4() {
			b.AResource(h, dnsmessage.AResource{A: a.As4()})
		} else {
			b.AAAAResource(h, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	resp, err := b.Finish()
	if err != nil {
		return nil
	}
	return resp
}

// dnsPair is routePair with name servers on the peer: each of modes on
// 192.0.2.2, .3, .4, ... in turn, the receiver asking them in that order
// with a short timeout per query.
func dnsPair(t *testing.T, modes ...dnsMode) (rx, peer *Stack, servers []*dnsServer) {
	t.Helper()
	var addrs []netip.Addr
	pa := slices.Clone(peerAddrs)
	for i := range modes {
		a := netip.AddrFrom4([4]byte{192, 0, 2, byte(2 + i)})
		addrs = append(addrs, a)
		if i > 0 {
			pa = append(pa, netip.PrefixFrom(a, 24))
		}
	}
	rx, peer = newPair(t, Config{Addrs: rxAddrs, DNSServers: addrs}, Config{Addrs: pa})
	rx.dnsTimeout = time.Second
	for i, m := range modes {
		servers = append(servers, startDNS(t, peer, addrs[i].String(), m))
	}
	return rx, peer, servers
}

func TestLookupLiteralsAndLocalhost(t *testing.T) {
	rx, _ := routePair(t, nil, nil) // no name servers: nothing is asked
	for _, tc := range []struct {
		host string
		want []string
	}{
		{"192.0.2.7", []string{"192.0.2.7"}},
		{"2001:db8::7", []string{"2001:db8::7"}},
		{"fe80::1%eth0", []string{"fe80::1%eth0"}},
		{"localhost", []string{"127.0.0.1", "::1"}},
		{"LocalHost.", []string{"127.0.0.1", "::1"}},
		{"www.example.localhost", []string{"127.0.0.1", "::1"}},
	} {
		got, err := rx.LookupHost(tc.host)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("LookupHost(%q): got %v, %v; want %v", tc.host, got, err, tc.want)
		}
	}
	for _, host := range []string{"", "host.test", "localhost.example"} {
		_, err := rx.LookupHost(host)
		var de *net.DNSError
		if !errors.As(err, &de) || de.Name != host {
			t.Errorf("LookupHost(%q): got %#v, want a *net.DNSError for the name", host, err)
		}
	}
	_, err := rx.LookupHost("host.test")
	if want := "lookup host.test: no DNS servers configured"; err == nil || err.Error() != want {
		t.Errorf("LookupHost without servers: got %v, want %q", err, want)
	}
}

func TestLookupFailover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first dnsMode
	}{
		{"silent", dnsSilent},
		{"servfail", dnsServFail},
		{"refused", dnsRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx, _, srv := dnsPair(t, tc.first, dnsAnswer)
			got, err := rx.LookupContextHost(context.Background(), "host.test")
			want := []string{"2001:db8::2", "192.0.2.2"}
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("LookupContextHost: got %v, %v; want %v", got, err, want)
			}
			if srv[0].queries.Load() == 0 {
				t.Errorf("the first server was not asked")
			}
			got, err = rx.LookupHost("v4only.test")
			if err != nil || !slices.Equal(got, []string{"192.0.2.2"}) {
				t.Errorf("LookupHost(v4only.test): got %v, %v; want [192.0.2.2]", got, err)
			}
		})
	}
}

func TestLookupNXDomain(t *testing.T) {
	rx, _, srv := dnsPair(t, dnsAnswer)
	_, err := rx.LookupHost("missing.test")
	var de *net.DNSError
	if !errors.As(err, &de) || !de.IsNotFound || de.Name != "missing.test" || de.Server != "192.0.2.2:53" || de.Err != "no such host" {
		t.Errorf("LookupHost(missing.test): got %#v, want NXDOMAIN from 192.0.2.2:53", err)
	}
	if srv[0].queries.Load() == 0 {
		t.Errorf("the server was not asked")
	}

	// NXDOMAIN is final: the next server, which knows the name, is not
	// asked.
	rx, _, srv = dnsPair(t, dnsNXDomain, dnsAnswer)
	_, err = rx.LookupHost("host.test")
	if !errors.As(err, &de) || !de.IsNotFound {
		t.Errorf("LookupHost after NXDOMAIN: got %#v, want IsNotFound", err)
	}
	if n := srv[1].queries.Load(); n != 0 {
		t.Errorf("the second server got %d queries after NXDOMAIN, want 0", n)
	}
}

func TestLookupTruncatedTCP(t *testing.T) {
	rx, _, srv := dnsPair(t, dnsAnswer)
	got, err := rx.LookupHost("big.test")
	var want []string
	for _, a := range testZone["big.test."] {
		want = append(want, a.String())
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("LookupHost(big.test): got %v, %v; want %v", got, err, want)
	}
	if srv[0].tcp.Load() == 0 {
		t.Errorf("no query over TCP after a truncated answer")
	}
}

func TestLookupTimeout(t *testing.T) {
	rx, _, _ := dnsPair(t, dnsSilent, dnsSilent)
	rx.dnsTimeout = 200 * time.Millisecond
	_, err := rx.LookupHost("host.test")
	var de *net.DNSError
	if !errors.As(err, &de) || !de.IsTimeout || de.IsNotFound || de.Name != "host.test" || de.Server == "" {
		t.Errorf("LookupHost with silent servers: got %#v, want IsTimeout", err)
	}
}

func TestLookupCancel(t *testing.T) {
	rx, _, srv := dnsPair(t, dnsSilent)
	rx.dnsTimeout = time.Hour

	// ctx is cancelled while the server is being asked.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-srv[0].asked
		cancel()
	}()
	_, err := rx.LookupContextHost(ctx, "host.test")
	var de *net.DNSError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &de) || de.Err != "operation was canceled" || de.Name != "host.test" {
		t.Errorf("LookupContextHost, cancelled: got %#v, want a DNSError that is context.Canceled", err)
	}
	// A dial by name shows it as net does.
	_, err = rx.DialContext(ctx, "tcp", "host.test:80")
	var oe *net.OpError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &oe) || oe.Op != "dial" || !errors.As(err, &de) {
		t.Errorf("DialContext, cancelled: got %#v, want a dial OpError around a DNSError that is context.Canceled", err)
	}

	// ctx's deadline passes while the server is being asked.
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	_, err = rx.LookupContextHost(dctx, "host.test")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &de) || !de.IsTimeout || de.Err != "i/o timeout" {
		t.Errorf("LookupContextHost past its deadline: got %#v, want a timeout that is context.DeadlineExceeded", err)
	}
}

func TestDialByName(t *testing.T) {
	rx, peer, _ := dnsPair(t, dnsAnswer)
	l, err := peer.Listen("tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	echoListener(t, l)
	for _, tc := range []struct{ network, addr, remote string }{
		{"tcp", "host.test:8080", "[2001:db8::2]:8080"},
		{"tcp4", "host.test:8080", "192.0.2.2:8080"},
		{"tcp6", "host.test:8080", "[2001:db8::2]:8080"},
		{"tcp", "v4only.test:8080", "192.0.2.2:8080"},
	} {
		c, err := rx.Dial(tc.network, tc.addr)
		if err != nil {
			t.Fatalf("Dial(%s, %s): %v", tc.network, tc.addr, err)
		}
		if got := c.RemoteAddr().String(); got != tc.remote {
			t.Errorf("Dial(%s, %s): connected to %s, want %s", tc.network, tc.addr, got, tc.remote)
		}
		checkEcho(t, c, tc.network+" "+tc.addr)
	}
	// tcp6 asks for AAAA records only, as Go's resolver: none is no such
	// host, as a name that does not exist.
	for _, a := range []string{"v4only.test:8080", "missing.test:8080"} {
		_, err = rx.Dial("tcp6", a)
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound || de.Server != "192.0.2.2:53" {
			t.Errorf("Dial(tcp6, %s): got %v, want a not-found DNSError from 192.0.2.2:53", a, err)
		}
	}

	// Where the first address refuses (nothing listens on IPv6 port
	// 8081), the next one is dialed.
	l4, err := peer.Listen("tcp4", ":8081")
	if err != nil {
		t.Fatal(err)
	}
	echoListener(t, l4)
	c, err := rx.Dial("tcp", "host.test:8081")
	if err != nil {
		t.Fatalf("Dial(tcp, host.test:8081): %v", err)
	}
	if got, want := c.RemoteAddr().String(), "192.0.2.2:8081"; got != want {
		t.Errorf("Dial(tcp, host.test:8081): connected to %s, want %s", got, want)
	}
	checkEcho(t, c, "tcp host.test:8081")
}

// TestHTTPByName fetches a 1 MiB body over HTTP from the peer, by name,
// with net/http's client dialing through the stack, and checks every byte.
func TestHTTPByName(t *testing.T) {
	rx, peer, _ := dnsPair(t, dnsAnswer)
	blob := make([]byte, 1<<20)
	for i := range blob {
		blob[i] = byte(i*7 + i>>11)
	}
	l, err := peer.Listen("tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(blob)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		hs.Serve(l)
	}()
	defer func() {
		hs.Close()
		<-done
	}()
	tr := &http.Transport{DialContext: rx.DialContext}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, url := range []string{"http://host.test:8080/blob", "http://[2001:db8::2]:8080/"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		if !bytes.Equal(got, blob) {
			t.Errorf("GET %s: got %d bytes, want the %d bytes served, byte for byte", url, len(got), len(blob))
		}
	}
}
