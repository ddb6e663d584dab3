package stack

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// zcConfigs are the receive paths zero copy is tested on.
var zcConfigs = []struct {
	name string
	dc   driver.Config
}{
	{"sw-gro", driver.Config{}},
	{"lro", driver.Config{LRO: true}},
	{"hds-256/cyclic", driver.Config{HDS: 256, RQ: driver.RQCyclic}},
	{"hw-gro-on", driver.Config{HWGRO: driver.HWGROOn}},
	{"hw-gro-coalesce", driver.Config{HWGRO: driver.HWGROCoalesce}},
}

// TestZeroCopyBulk sends through every receive path with payload lent to
// gVisor, read with Read: every byte arrives, frags went as views, and
// every page is back (pairConfig checks the pool after Close).
func TestZeroCopyBulk(t *testing.T) {
	for _, tc := range zcConfigs {
		t.Run(tc.name, func(t *testing.T) {
			rx, peer := pairConfig(t, Config{Driver: tc.dc, ZeroCopy: true})
			bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:9"), 8<<20)
			c := counterMap(rx)
			if c["zc_views_lent"] == 0 || c["rx_pp_lent"] == 0 {
				t.Errorf("zc_views_lent %d, rx_pp_lent %d: want > 0", c["zc_views_lent"], c["rx_pp_lent"])
			}
			if c["zc_frags_copied"] != 0 {
				t.Errorf("zc_frags_copied: got %d, want 0", c["zc_frags_copied"])
			}
		})
	}
}

// dialSend connects peer to addr and sends n pseudo-random bytes in the
// background; the returned channel yields their SHA-256.
func dialSend(t *testing.T, peer *Stack, addr netip.AddrPort, n int) <-chan [32]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	want := make(chan [32]byte, 1)
	go func() {
		defer c.Close()
		sum, err := sendAndHash(c, n, 64<<10, 5)
		if err != nil {
			sum = [32]byte{} // matches nothing: the receiver reports it
		}
		want <- sum
	}()
	return want
}

func acceptTCP(t *testing.T, l net.Listener) *TCPConn {
	t.Helper()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tc, ok := c.(*TCPConn)
	if !ok {
		t.Fatalf("Accept returned %T, want *TCPConn", c)
	}
	t.Cleanup(func() { tc.Close() })
	tc.SetReadDeadline(time.Now().Add(60 * time.Second))
	return tc
}

// TestReadViews reads a bulk transfer with ReadViews, holding the views of
// the first 2 MB until the end while 14 MB more arrive: every byte matches,
// the held bytes did not change, and with zero copy the bytes were mapped
// (with coalescing, mostly in whole pages) rather than copied.
func TestReadViews(t *testing.T) {
	const size, held = 16 << 20, 2 << 20
	for _, tc := range append(zcConfigs, struct {
		name string
		dc   driver.Config
	}{"copy", driver.Config{}}) {
		t.Run(tc.name, func(t *testing.T) {
			zc := tc.name != "copy"
			rx, peer := pairConfig(t, Config{Driver: tc.dc, ZeroCopy: zc})
			addr := netip.MustParseAddrPort("192.0.2.1:10")
			l, err := rx.ListenTCP(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			want := dialSend(t, peer, addr, size)
			c := acceptTCP(t, l)

			h := sha256.New()
			var early []View
			heldSum := sha256.New()
			var total int
			vs := make([]View, 0, 64)
			for {
				var n int
				vs, n, err = c.ReadViews(vs[:0], 1<<20)
				if n != sumLen(vs) {
					t.Fatalf("ReadViews returned %d bytes in views of %d", n, sumLen(vs))
				}
				for i := range vs {
					b := vs[i].Bytes()
					h.Write(b)
					if total < held {
						heldSum.Write(b)
						early = append(early, vs[i])
					} else {
						vs[i].Release()
					}
					total += len(b)
				}
				if err != nil {
					break
				}
			}
			if !errors.Is(err, io.EOF) {
				t.Fatalf("ReadViews: %v after %d bytes", err, total)
			}
			var got [32]byte
			h.Sum(got[:0])
			if w := <-want; got != w {
				t.Fatalf("sha256 of %d bytes read: got %x, want %x", total, got, w)
			}
			// The held views still hold what they held.
			again := sha256.New()
			for i := range early {
				again.Write(early[i].Bytes())
				early[i].Release()
			}
			if string(again.Sum(nil)) != string(heldSum.Sum(nil)) {
				t.Fatal("bytes of views held across later traffic changed")
			}
			st := c.ViewStats()
			t.Logf("mapped %d (whole pages %d), copied %d bytes in %d views", st.MappedBytes, st.PageBytes, st.CopiedBytes, st.Views)
			if st.MappedBytes+st.CopiedBytes != uint64(total) {
				t.Errorf("mapped+copied = %d, want %d", st.MappedBytes+st.CopiedBytes, total)
			}
			switch {
			case !zc && st.MappedBytes != 0:
				t.Errorf("mapped %d bytes without zero copy, want 0", st.MappedBytes)
			case zc && tc.dc.HDS == 0 && st.MappedBytes < uint64(total)*9/10:
				t.Errorf("mapped %d of %d bytes with zero copy, want at least 90%%", st.MappedBytes, total)
			case zc && st.MappedBytes < uint64(total)/2:
				// hds 256 copies payload into the linear part: that is copied.
				t.Errorf("mapped %d of %d bytes with zero copy and hds %d, want at least half", st.MappedBytes, total, tc.dc.HDS)
			}
			if tc.dc.HWGRO == driver.HWGROCoalesce && st.PageBytes < uint64(total)/2 {
				t.Errorf("whole-page views with coalescing: %d of %d bytes, want at least half", st.PageBytes, total)
			}
		})
	}
}

func sumLen(vs []View) int {
	n := 0
	for i := range vs {
		n += vs[i].Len()
	}
	return n
}

// TestReadViewsDeadline: ReadViews with nothing to read returns a timeout
// at the read deadline.
func TestReadViewsDeadline(t *testing.T) {
	rx, peer := pairConfig(t, Config{ZeroCopy: true})
	addr := netip.MustParseAddrPort("192.0.2.1:11")
	l, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := peer.DialTCP(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c := acceptTCP(t, l)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	vs, n, err := c.ReadViews(nil, 100)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || n != 0 || len(vs) != 0 {
		t.Fatalf("ReadViews on an idle connection: %d bytes, %d views, %v; want a timeout", n, len(vs), err)
	}
}
