package stack

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"

	"github.com/ustack/ustack/driver"
)

// ExampleStack_DialContext serves HTTP on one stack and fetches a page
// from another with net/http, whose Transport dials through the stack.
// Listen and DialContext take Go's network and address strings; with
// Config.DNSServers the host may be a name.
func ExampleStack_DialContext() {
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

	l, err := srv.Listen("tcp", ":80")
	if err != nil {
		panic(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from ustack: %s %s\n", r.Method, r.URL.Path)
	})}
	go hs.Serve(l)
	defer hs.Close()

	tr := &http.Transport{DialContext: cli.DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://192.0.2.1/index.html")
	if err != nil {
		panic(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status)
	fmt.Print(string(body))
	// Output:
	// 200 OK
	// hello from ustack: GET /index.html
}
