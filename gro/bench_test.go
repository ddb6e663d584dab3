package gro

import (
	"fmt"
	"github.com/ustack/ustack/internal/testutil"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	gvgro "gvisor.dev/gvisor/pkg/tcpip/stack/gro"
)

// workload is a cycle of frames fed to GRO over and over.
type workload struct {
	name   string
	l      layout
	frames []built
}

// tcpWrites returns 64 KB TCP writes as a kernel sender's TSO cuts them:
// 45 segments of 1448 bytes (MSS 1448 with timestamps, MTU 1500), PSH on
// the last.
func tcpWrites(v6 bool, writes int) []built {
	bd := newBuilder()
	var out []built
	for range writes {
		for i := range 45 {
			s := seg{v6: v6, n: 1448}
			if i == 44 {
				s.flags = header.TCPFlagPsh
			}
			out = append(out, bd.build(s))
		}
	}
	return out
}

// udpDatagrams returns k datagrams of size bytes of one flow.
func udpDatagrams(v6 bool, size, k int) []built {
	bd := newBuilder()
	out := make([]built, k)
	for i := range out {
		out[i] = bd.build(seg{v6: v6, udp: true, n: size})
	}
	return out
}

func workloads() []workload {
	return []workload{
		{"tcp4-1448", layoutSplit, tcpWrites(false, 2)},
		{"tcp4-1448-hds256", layout256, tcpWrites(false, 2)},
		{"tcp6-1428-shampo", layoutShampo, tcpWrites(true, 2)},
		{"udp4-64", layoutSplit, udpDatagrams(false, 64, 128)},
	}
}

// templates are packets cut once from a workload's frames; clone makes a
// packet of one as the driver's poll loop builds one from a completion: a
// header copy and references on the pages.
type templates struct {
	w    *wire
	pkts []*bufpool.Packet
}

func newTemplates(tb testing.TB, pool *bufpool.Pool, wl workload) *templates {
	t := &templates{w: newWire(tb, pool)}
	for _, f := range wl.frames {
		t.pkts = append(t.pkts, f.packet(t.w, wl.l))
	}
	return t
}

func (t *templates) clone(i int) *bufpool.Packet {
	src := t.pkts[i]
	p := bufpool.NewPacket()
	p.Linear = append(p.Linear[:0], src.Linear...)
	for _, f := range src.Frags {
		f.Page.IncRef()
		p.Frags = append(p.Frags, f)
	}
	p.Len, p.HdrLen, p.CsumVerified = src.Len, src.HdrLen, src.CsumVerified
	return p
}

func (t *templates) release() {
	for _, p := range t.pkts {
		p.Release()
	}
	t.pkts = nil
	t.w.close()
}

// TestNoAllocs pins Receive and EndBatch at zero heap allocations per
// packet in steady state.
func TestNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, wl := range workloads() {
		for _, none := range []bool{false, true} {
			name := wl.name
			if none {
				// CHECKSUM_NONE: GRO checksums each in software.
				name += "/csum-none"
			}
			t.Run(name, func(t *testing.T) { noAllocs(t, wl, none) })
		}
	}
}

// noAllocs checks that a batch of wl allocates nothing; with none the
// packets come as CHECKSUM_NONE.
func noAllocs(t *testing.T, wl workload, none bool) {
	pool := newPool(t)
	tm := newTemplates(t, pool, wl)
	defer tm.release()
	r := &releaser{}
	e := New(Config{}, r)
	i := 0
	batch := func() {
		for range 45 {
			p := tm.clone(i)
			p.CsumVerified = p.CsumVerified && !none
			e.Receive(p, 0)
			i = (i + 1) % len(tm.pkts)
		}
		e.EndBatch(0)
	}
	for range 100 {
		batch() // warm the caches
	}
	if got := testing.AllocsPerRun(100, batch); got != 0 {
		t.Errorf("allocations per batch of 45: got %v, want 0", got)
	}
	if e.Stats().SKBs.Load() == 0 {
		t.Errorf("rx_gro_skbs: got 0, want merges")
	}
	if none && e.Stats().CsumSoftware.Load() == 0 {
		t.Errorf("rx_gro_csum_sw: got 0, want checksums verified in software")
	}
}

// gvDispatcher counts what gVisor's GRO hands up.
type gvDispatcher struct{ pkts, bytes int }

func (d *gvDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	d.pkts++
	d.bytes += pkt.Data().Size()
}

func (d *gvDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// gvInput builds gVisor PacketBuffers of a workload's frames the same way
// ustack's packets are built: the headers copied, the payload referenced
// (a clone of a view that holds it).
type gvInput struct {
	hdrs     [][]byte
	payloads []*buffer.View
	proto    []tcpip.NetworkProtocolNumber
}

func newGVInput(wl workload) *gvInput {
	in := &gvInput{}
	for _, f := range wl.frames {
		in.hdrs = append(in.hdrs, f.frame[:f.hlen])
		in.payloads = append(in.payloads, buffer.NewViewWithData(f.frame[f.hlen:]))
		proto := header.IPv4ProtocolNumber
		if f.seg.v6 {
			proto = header.IPv6ProtocolNumber
		}
		in.proto = append(in.proto, proto)
	}
	return in
}

func (in *gvInput) packet(i int) *stack.PacketBuffer {
	buf := buffer.MakeWithData(in.hdrs[i])
	buf.Append(in.payloads[i].Clone())
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	pkt.NetworkProtocolNumber = in.proto[i]
	pkt.RXChecksumValidated = true
	return pkt
}

func (in *gvInput) release() {
	for _, v := range in.payloads {
		v.Release()
	}
}

// TestGVisorGRODriven checks that the benchmark drives gVisor's GRO the way
// fdbased does (Init, Dispatcher, Enqueue then DecRef, Flush per batch) and
// that it merges: one 64 KB TCP write comes out as one packet.
func TestGVisorGRODriven(t *testing.T) {
	wl := workload{"tcp4", layoutSplit, tcpWrites(false, 1)}
	in := newGVInput(wl)
	defer in.release()
	d := &gvDispatcher{}
	var g gvgro.GRO
	g.Init(true)
	g.Dispatcher = d
	for i := range wl.frames {
		pkt := in.packet(i)
		g.Enqueue(pkt)
		pkt.DecRef()
	}
	g.Flush()
	if d.pkts != 1 || d.bytes != 20+32+45*1448 {
		t.Errorf("gVisor GRO: got %d packets of %d bytes, want 1 of %d", d.pkts, d.bytes, 20+32+45*1448)
	}
}

// BenchmarkGRO runs ustack's engine and gVisor's pkg/tcpip/stack/gro side
// by side on the same frames, per batch size (EndBatch / Flush after each
// batch). Each figure includes building the packets (header copy, page or
// view references); the build-only runs measure that part alone, so GRO's
// own cost is the difference. gVisor's GRO merges TCP only: UDP passes
// through it.
func BenchmarkGRO(b *testing.B) {
	for _, wl := range workloads() {
		for _, batch := range []int{8, 64} {
			name := fmt.Sprintf("%s/batch=%d", wl.name, batch)
			b.Run(name+"/ustack", func(b *testing.B) { benchUstack(b, wl, batch, true) })
			b.Run(name+"/gvisor", func(b *testing.B) { benchGVisor(b, wl, batch, true) })
			b.Run(name+"/ustack-build-only", func(b *testing.B) { benchUstack(b, wl, batch, false) })
			b.Run(name+"/gvisor-build-only", func(b *testing.B) { benchGVisor(b, wl, batch, false) })
		}
	}
}

func benchUstack(b *testing.B, wl workload, batch int, gro bool) {
	benchUstackCfg(b, Config{}, wl, batch, gro)
}

// BenchmarkGROVXLAN runs ustack's engine with VXLAN GRO on
// (Config.VXLANPorts): TCP writes in VXLAN, and plain TCP through the same
// configuration.
func BenchmarkGROVXLAN(b *testing.B) {
	for _, wl := range []workload{
		{"vxlan4-tcp4", layoutSplit, vxWrites(false, false, 2)},
		{"vxlan6-tcp6-hds256", layout256, vxWrites(true, true, 2)},
		{"plain-tcp4-1448", layoutSplit, tcpWrites(false, 2)},
	} {
		for _, batch := range []int{8, 64} {
			name := fmt.Sprintf("%s/batch=%d", wl.name, batch)
			b.Run(name, func(b *testing.B) { benchUstackCfg(b, vxCfg, wl, batch, true) })
		}
	}
}

func benchUstackCfg(b *testing.B, cfg Config, wl workload, batch int, gro bool) {
	b.ReportAllocs()
	pool, err := bufpool.New(bufpool.Config{})
	if err != nil {
		b.Fatal(err)
	}
	tm := newTemplates(b, pool, wl)
	defer tm.release()
	r := &releaser{}
	e := New(cfg, r)
	i, pkts := 0, 0
	for b.Loop() {
		for range batch {
			p := tm.clone(i)
			if gro {
				e.Receive(p, 0)
			} else {
				r.Deliver(p)
			}
			i = (i + 1) % len(tm.pkts)
		}
		e.EndBatch(0)
		pkts += batch
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pkts), "ns/pkt")
	if gro {
		b.ReportMetric(float64(pkts)/float64(r.n), "frames/delivered")
	}
}

func benchGVisor(b *testing.B, wl workload, batch int, gro bool) {
	b.ReportAllocs()
	in := newGVInput(wl)
	defer in.release()
	d := &gvDispatcher{}
	var g gvgro.GRO
	g.Init(true)
	g.Dispatcher = d
	i, pkts := 0, 0
	for b.Loop() {
		for range batch {
			pkt := in.packet(i)
			if gro {
				g.Enqueue(pkt)
			}
			pkt.DecRef()
			i = (i + 1) % len(in.hdrs)
		}
		g.Flush()
		pkts += batch
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pkts), "ns/pkt")
	if gro {
		b.ReportMetric(float64(pkts)/float64(d.pkts), "frames/delivered")
	}
}
