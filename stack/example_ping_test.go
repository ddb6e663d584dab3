package stack

import (
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/ustack/ustack/driver"
)

// ExampleStack_DialPing pings one stack from another over an in-memory
// wire, as golang.org/x/net/icmp pings over a Linux ping socket: the
// application writes an echo request, the stack sets its identifier (the
// socket's ID) and checksum, and the read returns the reply to that
// identifier (docs/embedding.md).
func ExampleStack_DialPing() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	peer, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		b.Close()
		panic(err)
	}
	defer peer.Close()
	s, err := New(Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	c, err := s.DialPing("ping4", "192.0.2.2")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	req, err := (&icmp.Message{
		Type: ipv4.ICMPTypeEcho,
		Body: &icmp.Echo{Seq: 1, Data: []byte("hello")}, // ID: the stack's
	}).Marshal(nil)
	if err != nil {
		panic(err)
	}
	if _, err := c.Write(req); err != nil {
		panic(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		panic(err)
	}
	m, err := icmp.ParseMessage(ipv4.ICMPTypeEcho.Protocol(), buf[:n])
	if err != nil {
		panic(err)
	}
	echo := m.Body.(*icmp.Echo)
	fmt.Printf("%v from %v: seq %d, %q, our id %t\n", m.Type, from, echo.Seq, echo.Data, echo.ID == int(c.ID()))
	// Output: echo reply from 192.0.2.2: seq 1, "hello", our id true
}
