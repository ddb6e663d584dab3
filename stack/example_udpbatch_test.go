package stack

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/ustack/ustack/driver"
)

// ExampleTrainConn_ReadBatch reads datagrams several per call, as
// x/net's ipv4.PacketConn.ReadBatch does with recvmmsg, and answers them
// with one WriteBatch. A message's Buffers, N and Addr are x/net's; SegSize
// takes the place of the UDP_GRO and UDP_SEGMENT control messages.
func ExampleTrainConn_ReadBatch() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	srv, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	cli, err := New(Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	c, err := srv.ListenUDPTrains(netip.MustParseAddrPort("192.0.2.1:4433"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	peer, err := cli.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5000"))
	if err != nil {
		panic(err)
	}
	defer peer.Close()
	to := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:4433"))
	for _, s := range []string{"one", "two", "six"} {
		peer.WriteTo([]byte(s), to)
	}

	ms := make([]Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1500)}
	}
	for got := 0; got < 3; {
		n, err := c.ReadBatch(ms, time.Now().Add(10*time.Second)) // waits for the first only
		if err != nil {
			panic(err)
		}
		out := make([]Message, n)
		for i, m := range ms[:n] {
			fmt.Printf("%s from %v\n", m.Buffers[0][:m.N], m.Addr)
			// Echo it: a write sends the whole of its Buffers.
			out[i] = Message{Buffers: [][]byte{m.Buffers[0][:m.N]}, Addr: m.Addr}
		}
		if _, err := c.WriteBatch(out); err != nil {
			panic(err)
		}
		got += n
	}
	buf := make([]byte, 1500)
	for range 3 {
		peer.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := peer.ReadFrom(buf)
		if err != nil {
			panic(err)
		}
		fmt.Printf("echo %s\n", buf[:n])
	}
	// UDP keeps no order, and this one may change it: the client's first
	// datagram waits for ARP and can leave after the next two.

	// Unordered output:
	// one from 192.0.2.2:5000
	// two from 192.0.2.2:5000
	// six from 192.0.2.2:5000
	// echo one
	// echo two
	// echo six
}

// ExampleTrainConn_TakeTrain reads trains in place: their payload stays in
// the RX pages until Release, with no copy into the application's buffer.
func ExampleTrainConn_TakeTrain() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	srv, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	cli, err := New(Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	c, err := srv.ListenUDPTrains(netip.MustParseAddrPort("192.0.2.1:4433"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	peer, err := cli.ListenUDP(netip.MustParseAddrPort("192.0.2.2:5000"))
	if err != nil {
		panic(err)
	}
	defer peer.Close()
	to := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.1:4433"))
	for _, s := range []string{"one", "two", "six"} {
		peer.WriteTo([]byte(s), to)
	}

	var t Train // reused: TakeTrain fills it, Release empties it
	var slices [][]byte
	for got := 0; got < 3; {
		if err := c.TakeTrain(&t, time.Now().Add(10*time.Second)); err != nil {
			panic(err)
		}
		// The datagrams back to back, SegSize bytes each, in slices of
		// the RX pages (a train of several may span pages; joined here
		// only to print them).
		payload := bytes.Join(t.Slices(slices[:0]), nil)
		for len(payload) > 0 {
			d := payload[:min(t.SegSize(), len(payload))]
			fmt.Printf("%s from %v\n", d, t.From())
			payload = payload[len(d):]
			got++
		}
		t.Release()
	}

	// Unordered output:
	// one from 192.0.2.2:5000
	// two from 192.0.2.2:5000
	// six from 192.0.2.2:5000
}
