package stack

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/ustack/ustack/driver"
)

// ExampleTCPConn_ReadViews reads a transfer in place: with zero copy and
// hardware GRO coalescing, most of the payload arrives in views of whole RX
// pages that gVisor was lent (the rest, parts of pages, is copied, as
// tcp_mmap copies what it cannot map), and the application releases them
// when done.
func ExampleTCPConn_ReadViews() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	srv, err := New(Config{
		Wire:     a,
		Addrs:    []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		Driver:   driver.Config{HWGRO: driver.HWGROCoalesce},
		ZeroCopy: true,
	})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	cli, err := New(Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	l, _ := srv.ListenTCP(netip.MustParseAddrPort("192.0.2.1:9"))
	defer l.Close()
	go func() {
		c, err := cli.DialTCP(context.Background(), netip.MustParseAddrPort("192.0.2.1:9"))
		if err != nil {
			panic(err)
		}
		c.Write(make([]byte, 1<<20))
		c.Close()
	}()
	c, _ := l.Accept()
	defer c.Close()
	conn := c.(*TCPConn)
	vs := make([]View, 0, 64)
	total := 0
	for {
		var n int
		vs, n, err = conn.ReadViews(vs[:0], 256<<10)
		for i := range vs {
			_ = vs[i].Bytes() // read in place
			vs[i].Release()
		}
		total += n
		if err != nil {
			break
		}
	}
	// How much was mapped depends on how long the NIC's sessions were,
	// which the machine's load decides: ViewStats says (MappedBytes of
	// whole pages in place, CopiedBytes the rest).
	st := conn.ViewStats()
	fmt.Println(total, "bytes, all counted:", st.MappedBytes+st.CopiedBytes == uint64(total))
	// Output: 1048576 bytes, all counted: true
}
