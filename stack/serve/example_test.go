package serve_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

func ExampleEcho() {
	// Two stacks over an in-memory wire; a real program passes a
	// driver.TAP as the Wire instead.
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	srv, err := stack.New(stack.Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	cli, err := stack.New(stack.Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	l, _ := srv.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7"))
	defer l.Close()
	var st serve.Stats
	go serve.Config{Stats: &st}.Echo(l) // returns when l is closed
	c, err := cli.DialTCP(context.Background(), netip.MustParseAddrPort("192.0.2.1:7"))
	if err != nil {
		panic(err)
	}
	c.Write([]byte("hello"))
	reply := make([]byte, 5)
	io.ReadFull(c, reply)
	c.Close()
	fmt.Println(string(reply))
	st.EachCounter(func(name string, v uint64) {
		if name == "server_conns_refused" {
			fmt.Println(name, v)
		}
	})
	// Output:
	// hello
	// server_conns_refused 0
}
