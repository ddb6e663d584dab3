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

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
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
// gVisor, read with Read: every byte arrives, frags went as views, pages
// were reused once gVisor let go, and every page is back (pairConfig
// checks the pool after Close).
func TestZeroCopyBulk(t *testing.T) {
	for _, tc := range zcConfigs {
		t.Run(tc.name, func(t *testing.T) {
			rx, peer := pairConfig(t, Config{Driver: tc.dc, ZeroCopy: true})
			bulkTo(t, rx, peer, netip.MustParseAddrPort("192.0.2.1:9"), 8<<20)
			c := counterMap(rx)
			if c["zc_views_lent"] == 0 || c["rx_pp_lent"] == 0 {
				t.Errorf("zc_views_lent %d, rx_pp_lent %d: want > 0", c["zc_views_lent"], c["rx_pp_lent"])
			}
			if c["rx_pp_alloc_fast"] == 0 {
				t.Error("rx_pp_alloc_fast: got 0, want lent pages reused once gVisor let go")
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
// the held bytes did not change, and with zero copy whole pages were mapped
// (with coalescing, most of the bytes) and the rest copied.
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
			t.Logf("mapped %d (whole pages %d), copied %d (copybuf %d) bytes in %d views", st.MappedBytes, st.PageBytes, st.CopiedBytes, st.CopybufBytes, st.Views)
			if st.MappedBytes+st.CopiedBytes != uint64(total) {
				t.Errorf("mapped+copied = %d, want %d", st.MappedBytes+st.CopiedBytes, total)
			}
			if st.PageBytes != st.MappedBytes || st.CopybufBytes > st.CopiedBytes {
				t.Errorf("whole pages %d of %d mapped, copybuf %d of %d copied: want all mapped bytes in whole pages, copybuf within copied", st.PageBytes, st.MappedBytes, st.CopybufBytes, st.CopiedBytes)
			}
			// tcp_mmap's rule: only whole pages are mapped. Frames of MTU
			// 1500 never fill one; coalesced hw-gro frags mostly do. With
			// hw-gro on, the NIC lays a session's payloads back to back in
			// frags of their own, none a whole page
			// (rx_gro_hw_mappable_bytes); but where a poll's end cut a
			// session into several packets (mlx5e_poll_rx_cq flushes the
			// open one), software GRO coalesces the adjacent frags of
			// those packets (gro's package doc: skb_gro_receive does not),
			// so whether some then fill a page depends on where the polls
			// ended, that is on the machine's load: no bound on the bytes
			// mapped there.
			switch hwMappable := counterMap(rx)["rx_gro_hw_mappable_bytes"]; {
			case !zc && (st.MappedBytes != 0 || st.CopybufBytes != 0):
				t.Errorf("mapped %d, copybuf %d bytes without zero copy, want 0", st.MappedBytes, st.CopybufBytes)
			case zc && tc.dc.HWGRO == driver.HWGROCoalesce && st.MappedBytes < uint64(total)/2:
				t.Errorf("mapped %d of %d bytes with coalescing, want at least half", st.MappedBytes, total)
			case zc && tc.dc.HWGRO == driver.HWGROOn && (hwMappable != 0 || st.CopybufBytes == 0):
				t.Errorf("rx_gro_hw_mappable_bytes %d, copybuf %d with hw-gro on: want no whole page from the NIC, copybuf > 0", hwMappable, st.CopybufBytes)
			case zc && !tc.dc.LRO && tc.dc.HWGRO == driver.HWGROOff && (st.MappedBytes != 0 || st.CopybufBytes == 0):
				t.Errorf("mapped %d, copybuf %d bytes with MTU-sized frags, want none mapped, copybuf > 0", st.MappedBytes, st.CopybufBytes)
			}
		})
	}
}

// idleConn returns the zero-copy stack's end of a connection on which the
// peer sends nothing.
func idleConn(t *testing.T, port uint16) *TCPConn {
	t.Helper()
	rx, peer := pairConfig(t, Config{ZeroCopy: true})
	addr := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port)
	l, err := rx.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := peer.DialTCP(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return acceptTCP(t, l)
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
	c := idleConn(t, 11)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	vs, n, err := c.ReadViews(nil, 100)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || n != 0 || len(vs) != 0 {
		t.Fatalf("ReadViews on an idle connection: %d bytes, %d views, %v; want a timeout", n, len(vs), err)
	}
}

// nullDispatcher drops what it is given (dispatch releases it).
type nullDispatcher struct{ n int }

func (d *nullDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {
	d.n++
}

func (d *nullDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// TestLendNoAllocs pins the zero-copy cycle at zero heap allocations per
// packet once warm: a page from the pool filled, lent to gVisor as views in
// a packet of 16 frags, released by gVisor, and reused by the pool.
func TestLendNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 64})
	var d nullDispatcher
	ep := &linkEndpoint{lend: new(lendStats)}
	ep.Attach(&d)
	hdr := make([]byte, 66)
	hdr[12], hdr[13] = 0x08, 0x00
	deliver := func() {
		pkt := bufpool.NewPacket()
		pkt.Linear = append(pkt.Linear, hdr...)
		pkt.HdrLen = len(hdr)
		pkt.Len = len(hdr)
		for range 16 {
			pg, err := pool.Get()
			if err != nil {
				t.Fatal(err)
			}
			pkt.Frags = append(pkt.Frags, bufpool.Frag{Page: pg, Len: 2048})
			pkt.Len += 2048
			pg.IncRef()
			pool.Recycle(pg) // the NIC retires it; the frag holds it
		}
		ep.Deliver(pkt)
	}
	for range 100 {
		deliver()
	}
	if allocs := testing.AllocsPerRun(500, deliver); allocs != 0 {
		t.Errorf("allocations per lent packet: got %v, want 0", allocs)
	}
	st := pool.Stats()
	if st.Lent < 600*16 || st.AllocFast < 500*16 {
		t.Errorf("pages lent %d, reused %d: want every page lent and reused", st.Lent, st.AllocFast)
	}
	if d.n != 601 {
		t.Errorf("packets dispatched: got %d, want 601", d.n)
	}
	pool.Close()
	if n := pool.InUse(); n != 0 {
		t.Errorf("pages in use: got %d, want 0", n)
	}
}

// TestLentPageNotReusedWhileHeld: a page gVisor (here a view the test
// keeps, as a socket's receive queue would) still holds is not handed to the
// NIC again, and its bytes stay as delivered; once released it is reused.
func TestLentPageNotReusedWhileHeld(t *testing.T) {
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), RingSize: 8, Poison: true})
	var held []*gstack.PacketBuffer
	d := &keepDispatcher{keep: &held}
	ep := &linkEndpoint{lend: new(lendStats)}
	ep.Attach(d)
	pg, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	copy(pg.Bytes(), "payload bytes")
	pkt := bufpool.NewPacket()
	pkt.Linear = append(pkt.Linear, make([]byte, 14)...)
	pkt.Linear[12] = 0x08
	pkt.HdrLen = 14
	pkt.Frags = append(pkt.Frags, bufpool.Frag{Page: pg, Len: 13})
	pkt.Len = 27
	pg.IncRef()
	pool.Recycle(pg)
	ep.Deliver(pkt)
	if len(held) != 1 {
		t.Fatalf("packets held: %d", len(held))
	}
	for range 4 {
		q, err := pool.Get()
		if err != nil {
			t.Fatal(err)
		}
		if q == pg {
			t.Fatal("the pool handed out a page gVisor still holds")
		}
		copy(q.Bytes(), "overwritten!!")
		pool.Recycle(q)
	}
	if got := string(held[0].Data().AsRange().ToSlice()); got != "payload bytes" {
		t.Fatalf("delivered payload: got %q", got)
	}
	if st := pool.Stats(); st.LentBusy == 0 {
		t.Error("rx_pp_lent_busy: got 0, want > 0")
	}
	held[0].DecRef()
	if q, _ := pool.Get(); q != pg {
		t.Error("a page gVisor let go of was not reused")
	} else {
		pool.Recycle(q)
	}
	pool.Close()
}

// keepDispatcher keeps a reference on every packet, past the parse of the
// Ethernet header.
type keepDispatcher struct{ keep *[]*gstack.PacketBuffer }

func (d *keepDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *gstack.PacketBuffer) {
	pkt.IncRef()
	*d.keep = append(*d.keep, pkt)
}

func (d *keepDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *gstack.PacketBuffer) {}

// TestChunkRefs: the reference count read from gVisor's private layout
// follows clones and releases.
func TestChunkRefs(t *testing.T) {
	if !refsLayout.ok {
		t.Fatal("gVisor's chunk layout was not recognised: lent pages are never reused")
	}
	v := buffer.NewViewSize(4096)
	defer v.Release()
	var clones []*buffer.View
	for i := 1; i <= 5; i++ {
		if n, ok := chunkRefs(v); !ok || n != int64(i) {
			t.Fatalf("refs with %d clones: got %d %v, want %d", i-1, n, ok, i)
		}
		clones = append(clones, v.Clone())
	}
	for _, c := range clones {
		c.Release()
	}
	if n, _ := chunkRefs(v); n != 1 {
		t.Errorf("refs after releasing the clones: got %d, want 1", n)
	}
}

// BenchmarkTCPRead moves a bulk TCP transfer over the in-memory wire and
// reads it with Read (into one reused buffer) or with ReadViews (released
// at once), with payload copied into gVisor or lent. One op is 64 KB.
func BenchmarkTCPRead(b *testing.B) {
	for _, bc := range []struct {
		name  string
		dc    driver.Config
		zc    bool
		views bool
	}{
		{"sw-gro/copy/Read", driver.Config{}, false, false},
		{"sw-gro/zc/Read", driver.Config{}, true, false},
		{"sw-gro/zc/ReadViews", driver.Config{}, true, true},
		{"hw-gro-on/zc/ReadViews", driver.Config{HWGRO: driver.HWGROOn}, true, true},
		{"hw-gro-coalesce/copy/Read", driver.Config{HWGRO: driver.HWGROCoalesce}, false, false},
		{"hw-gro-coalesce/zc/Read", driver.Config{HWGRO: driver.HWGROCoalesce}, true, false},
		{"hw-gro-coalesce/zc/ReadViews", driver.Config{HWGRO: driver.HWGROCoalesce}, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rx, peer := pairConfig(b, Config{Driver: bc.dc, ZeroCopy: bc.zc})
			addr := netip.MustParseAddrPort("192.0.2.1:12")
			l, err := rx.ListenTCP(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			const chunk = 64 << 10
			total := b.N * chunk
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pc, err := peer.DialTCP(ctx, addr)
			if err != nil {
				b.Fatal(err)
			}
			c, err := l.Accept()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			sent := make(chan error, 1)
			go func() {
				defer pc.Close()
				buf := make([]byte, chunk)
				for range b.N {
					if _, err := pc.Write(buf); err != nil {
						sent <- err
						return
					}
				}
				sent <- nil
			}()
			b.SetBytes(chunk)
			b.ReportAllocs()
			b.ResetTimer()
			tc := c.(*TCPConn)
			buf := make([]byte, 1<<20)
			vs := make([]View, 0, 256)
			for got := 0; got < total; {
				var n int
				if bc.views {
					vs, n, err = tc.ReadViews(vs[:0], 1<<20)
					for i := range vs {
						vs[i].Release()
					}
				} else {
					n, err = tc.Read(buf)
				}
				got += n
				if err != nil {
					b.Fatalf("after %d of %d bytes: %v", got, total, err)
				}
			}
			b.StopTimer()
			if err := <-sent; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestReadViewsClose: Close while ReadViews waits wakes it with an error,
// and Close itself returns.
func TestReadViewsClose(t *testing.T) {
	c := idleConn(t, 13)
	done := make(chan error, 1)
	go func() {
		_, _, err := c.ReadViews(nil, 100)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it block
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("ReadViews on a closed connection: got nil error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadViews still waiting 10 s after Close")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
}

// TestLendChainPerPacket: lendAfter decides "short, so copied" per packet
// of a GRO chain, each on its own payload (the head's after skip, a chained
// packet's after its HdrLen), as it did when called once per packet: a
// short chained segment is copied between lent ones, and the bytes are the
// walk's.
func TestLendChainPerPacket(t *testing.T) {
	pool := testutil.NewPool(t, bufpool.Config{Memory: newViewMemory(), PageSize: bufpool.PageSize64K})
	page, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	b := page.Bytes()
	for i := range b {
		b[i] = byte(i * 7)
	}
	hdr := make([]byte, 54)
	// pkt returns a packet of hdr, then n bytes of payload from offset off
	// of the page: extra of them in the linear part, the rest in a frag.
	pkt := func(off, n, extra int) *bufpool.Packet {
		p := bufpool.NewPacket()
		p.Linear = append(append(p.Linear, hdr...), b[off:off+extra]...)
		p.HdrLen = len(hdr)
		page.IncRef()
		p.Frags = append(p.Frags, bufpool.Frag{Page: page, Off: uint32(off + extra), Len: uint32(n - extra)})
		p.Len = len(hdr) + n
		return p
	}
	// The head's skip (its linear part) is 20 bytes past its HdrLen: a
	// chained packet's payload is counted after its own HdrLen, so 1040
	// bytes are lent.
	head := pkt(0, 2000, 20)
	head.Next = pkt(4000, 1040, 10)
	head.Next.Next = pkt(8000, 100, 0) // < lendMinBytes: copied
	head.Next.Next.Next = pkt(12000, 1448, 0)
	var want []byte
	want = append(want, b[20:2000]...)
	want = append(want, b[4000:5040]...)
	want = append(want, b[8000:8100]...)
	want = append(want, b[12000:13448]...)

	l := &lendStats{minLend: lendMinBytes}
	var buf buffer.Buffer
	l.lendAfter(&buf, head, len(head.Linear))
	head.Release()
	page.DecRef() // Get's reference
	if got := buf.Flatten(); string(got) != string(want) {
		t.Errorf("lent bytes: got %d bytes, want %d (or they differ)", len(got), len(want))
	}
	if got, want := l.views.Load(), uint64(3); got != want {
		t.Errorf("zc_views_lent: got %d, want %d", got, want)
	}
	if got, want := l.copiedSmall.Load(), uint64(1); got != want {
		t.Errorf("zc_frags_copied_small: got %d, want %d", got, want)
	}
	buf.Release()
	pool.Close()
	if n := pool.InUse(); n != 0 {
		t.Errorf("pages in use: got %d, want 0", n)
	}
}
