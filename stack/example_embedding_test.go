package stack

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/ustack/ustack/driver"
)

// ExampleStack_Listen serves HTTP on a stack and fetches a page from the
// same stack over its loopback interface: "localhost" resolves without a
// name server, and a listener on ":8080" takes it (docs/embedding.md).
func ExampleStack_Listen() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	defer b.Close()
	s, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	l, err := s.Listen("tcp", ":8080")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello from", r.Host)
	})}
	go srv.Serve(l)
	defer srv.Close()

	tr := &http.Transport{DialContext: s.DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://localhost:8080/")
	if err != nil {
		panic(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		panic(err)
	}
	fmt.Print(string(body))
	// Output: hello from localhost:8080
}

// ExampleStack_Shutdown closes a stack gracefully while its peer is
// connected: what the application wrote reaches the peer, and then the
// FIN (io.EOF), not a reset (docs/embedding.md).
func ExampleStack_Shutdown() {
	a, b := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65553)
	srv, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	cli, err := New(Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}})
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	l, err := srv.Listen("tcp", ":7")
	if err != nil {
		panic(err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, err = c.Write([]byte("goodbye")) // not closed: Shutdown sends the FIN
		}
		accepted <- err
	}()
	c, err := cli.Dial("tcp", "192.0.2.1:7")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if err := <-accepted; err != nil {
		panic(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fmt.Println("shutdown:", srv.Shutdown(ctx))
	got, err := io.ReadAll(c) // until the FIN
	fmt.Printf("read %q, %v\n", got, err)
	// Output:
	// shutdown: <nil>
	// read "goodbye", <nil>
}
