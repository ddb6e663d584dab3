package stacktest_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack/stacktest"
)

// echo serves a TCP echo on l until l is closed: one goroutine per
// connection, done when every connection is.
func echo(t *testing.T, l net.Listener) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
}

// exchange writes msg on c, half-closes it and checks that the echo
// brings msg back whole before the peer's FIN.
func exchange(t *testing.T, c net.Conn, msg []byte) {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if werr := <-errc; werr != nil {
		t.Fatalf("write: %v", werr)
	}
	if err != nil {
		t.Fatalf("read the echo: %v (%d of %d bytes)", err, len(got), len(msg))
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo: got %d bytes, want the %d written (first difference at %d)", len(got), len(msg), firstDiff(got, msg))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// message is n bytes of a pattern that shows a shifted or repeated byte.
func message(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// TestPair checks that the peer of a Pair reaches the receiver's echo by
// address string, and Counters reads what the receiver counted.
func TestPair(t *testing.T) {
	rx, peer := stacktest.Pair(t, driver.Config{})
	l, err := rx.Listen("tcp", "192.0.2.1:7")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, l)
	c, err := peer.Dial("tcp", "192.0.2.1:7")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := message(256 << 10)
	exchange(t, c, msg)
	if got := stacktest.Counters(rx.EachCounter)["rx_packets"]; got == 0 {
		t.Errorf("rx_packets = 0 after a %d-byte exchange", len(msg))
	}
}

// TestTAP checks a TAPRig end to end: a kernel client, a socket Do creates
// in the peer namespace on a locked thread, dials the stack's echo over
// IPv4 and IPv6 and gets every byte back; Command runs in the peer
// namespace; Close removes the namespace.
func TestTAP(t *testing.T) {
	r := stacktest.NewTAP(t, stacktest.TAPConfig{})
	l, err := r.Stack.Listen("tcp", ":7")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, l)
	for _, addr := range []netip.Prefix{r.StackAddr4, r.StackAddr6} {
		t.Run(addr.Addr().String(), func(t *testing.T) {
			var c net.Conn
			err := r.Do(func() (err error) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var d net.Dialer
				c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr.Addr(), 7).String())
				return err
			})
			if err != nil {
				t.Fatalf("kernel peer dial %s: %v", addr.Addr(), err)
			}
			defer c.Close()
			if got, want := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(), r.PeerAddr4.Addr(); addr.Addr().Is4() && got != want {
				t.Errorf("kernel socket's address %s, want the peer's %s", got, want)
			}
			exchange(t, c, message(1<<20))
		})
	}
	if n := r.Counters()["rx_packets"]; n == 0 {
		t.Errorf("rx_packets = 0 after the exchanges")
	}

	// Command runs in the peer namespace: the device is there.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := r.Command(ctx, "ip", "-o", "link", "show", "dev", r.Device).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show in the peer namespace: %v: %s", err, out)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if open := testbed.OpenNetns(); slices.Contains(open, r.Netns) {
		t.Errorf("namespace %s still open after Close: %v", r.Netns, open)
	}
	if _, err := r.Stack.Dial("tcp", netip.AddrPortFrom(r.PeerAddr4.Addr(), 7).String()); err == nil {
		t.Errorf("Dial on the closed rig's stack succeeded")
	}
}
