package driver

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
)

// closeWithin closes d and fails the test if Close has not returned within
// 30 s (a NIC model stuck in a wait never closes nicDone).
func closeWithin(t testing.TB, d *Driver) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		d.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		st := d.Stats()
		t.Fatalf("Driver.Close did not return within 30 s (rx_rq_stalls %d, rx_cqe_stalls %d, wire reads %d)",
			st.RQStalls.Load(), st.CQEStalls.Load(), st.WireReads.Load())
	}
}

// newPoolDriver is newTestDriver with a page pool of pc (Poison set) and a
// wire that queues 4096 frames; Cleanup's Close must return within 30 s.
func newPoolDriver(t *testing.T, cfg Config, pc bufpool.Config, h Handler) (*Driver, *MemWire) {
	t.Helper()
	pc.Poison = true
	return startTestDriver(t, cfg, pc, h, 4096)
}

// flowFrames returns n super-frames of one TCP flow (source port sport),
// payload bytes each, in sequence, with PSH on every one when psh is set,
// each followed by a pure ACK of the flow when acks is set, and the
// payload they carry.
func flowFrames(t *testing.T, sport uint16, n, payload int, psh, acks bool) ([][]byte, []byte) {
	t.Helper()
	var frames [][]byte
	var want []byte
	seq := uint32(1000)
	for i := range n {
		p := make([]byte, payload)
		for j := range p {
			p[j] = byte(int(sport) + i*31 + j*7 + j>>9)
		}
		flags := header.TCPFlagAck
		if psh {
			flags |= header.TCPFlagPsh
		}
		spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: flags, seq: seq, ack: 1, payload: p}
		h, frame, fi := pkSuperFrame(t, spec, VirtioNetHdrGSOTCPv4, mss4)
		// The partial checksum leaves the ports out: changing one is fine.
		header.TCP(frame[fi.L2Len+fi.L3Len:]).SetSourcePort(sport)
		if payload <= mss4 {
			h.GSOType, h.GSOSize = VirtioNetHdrGSONone, 0
		}
		frames = append(frames, wireFrame(h, frame))
		want = append(want, p...)
		seq += uint32(payload)
		if acks {
			spec := pkSpec{l3: L3IPv4, proto: protoTCP, tcpTS: true, tcpFlags: header.TCPFlagAck, seq: seq, ack: 1}
			f := spec.build()
			tcp := header.TCP(f[14+20:])
			tcp.SetSourcePort(sport)
			tcp.SetChecksum(0)
			xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, pkSrc4, pkDst4, uint16(len(tcp)))
			tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
			frames = append(frames, wireFrame(VirtioNetHdr{}, f))
		}
	}
	return frames, want
}

// flowCollector keeps each flow's TCP payload, by source port, in the
// order delivered.
type flowCollector struct {
	mu sync.Mutex
	// +checklocks:mu
	flows map[uint16][]byte
	// +checklocks:mu
	bytes int
}

func (c *flowCollector) Deliver(p *Packet) {
	b := make([]byte, p.Len)
	p.CopyTo(b)
	p.Release()
	var fi FrameInfo
	if ParseFrame(b, &fi) != DropNone || fi.L4 != L4TCP {
		return
	}
	sport := header.TCP(b[fi.L2Len+fi.L3Len:]).SourcePort()
	pl := b[fi.HeaderLen() : fi.L2Len+fi.IPLen]
	c.mu.Lock()
	if c.flows == nil {
		c.flows = map[uint16][]byte{}
	}
	c.flows[sport] = append(c.flows[sport], pl...)
	c.bytes += len(pl)
	c.mu.Unlock()
}

func (c *flowCollector) Flush(bool) time.Duration { return 0 }

// waitBytes waits until c holds n payload bytes (60 s bound).
func (c *flowCollector) waitBytes(t *testing.T, d *Driver, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c.mu.Lock()
		got := c.bytes
		c.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			st := d.Stats()
			t.Fatalf("payload delivered: %d of %d bytes after 60 s (wire reads %d, rx_rq_stalls %d, rx_drop_out_of_buffer %d)",
				got, n, st.WireReads.Load(), st.RQStalls.Load(), st.Dropped[DropOutOfBuffer].Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRQAccountingNoDeadlock runs the configurations issue 13 found the NIC
// model waiting for room with nothing outstanding (every completion
// consumed, the RQ's accounting still full of WQE and reservation tails no
// completion carried): receive stopped for good and Close hung. Every byte
// must arrive, each flow's in order, and Close return.
func TestRQAccountingNoDeadlock(t *testing.T) {
	const resvHalf = DefaultWQEBytes // half of an RQ of 2 default WQEs
	for _, tc := range []struct {
		name  string
		cfg   Config
		pool  bufpool.Config
		flows int
		psh   bool
		acks  bool
	}{
		// ustack run -lro off -rq cyclic -rq-size 2
		{name: "cyclic/rq-2", cfg: Config{RQ: RQCyclic, RQSize: 2}, flows: 1},
		{name: "cyclic/order-1/ring-4", cfg: Config{RQ: RQCyclic, RingSize: 4, Budget: 4}, pool: bufpool.Config{Order: 1}, flows: 1},
		{name: "cyclic/order-4/ring-16", cfg: Config{RQ: RQCyclic, RingSize: 16, Budget: 16}, pool: bufpool.Config{Order: 4}, flows: 1},
		{name: "cyclic/64k-pages/ring-16", cfg: Config{RQ: RQCyclic, RingSize: 16, Budget: 16}, pool: bufpool.Config{PageSize: bufpool.PageSize64K}, flows: 1},
		{name: "page-per-frame/order-2/ring-8", cfg: Config{PagePerFrame: true, RingSize: 8, Budget: 8}, pool: bufpool.Config{Order: 2}, flows: 1},
		{name: "hw-gro/resv-half-rq", cfg: Config{HWGRO: HWGROOn, RQSize: 2, Reservation: resvHalf, HWGROTimeout: time.Hour}, flows: 3, psh: true},
		{name: "hw-gro/resv-half-rq/one-flow", cfg: Config{HWGRO: HWGROCoalesce, RQSize: 2, Reservation: resvHalf, HWGROTimeout: time.Hour}, flows: 1},
		// A reservation of half the RQ (8 frames of 1518 bytes), pure
		// ACKs between the data: a session's unused end and a cyclic
		// WQE's page tail fill the old accounting with nothing
		// outstanding.
		{name: "hw-gro/cyclic/resv-half-rq", cfg: Config{HWGRO: HWGROOn, RQ: RQCyclic, RingSize: 8, Budget: 8, Reservation: 4 * (DefaultMTU + 18), HWGROTimeout: time.Hour}, flows: 2, acks: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &flowCollector{}
			d, w := newPoolDriver(t, tc.cfg, tc.pool, c)
			const frames = 24
			payload := 20000
			if tc.cfg.Reservation != 0 && tc.cfg.Reservation < payload {
				payload = mss4
			}
			want := map[uint16][]byte{}
			var all [][][]byte
			for f := range tc.flows {
				sport := uint16(1000 + f)
				fr, p := flowFrames(t, sport, frames, payload, tc.psh, tc.acks)
				all = append(all, fr)
				want[sport] = p
			}
			// The flows interleave frame by frame; the writer waits for
			// each round so that the in-memory wire never overflows.
			per := len(all[0]) / frames
			for i := range frames {
				for f := range tc.flows {
					for _, fr := range all[f][i*per : (i+1)*per] {
						if err := w.Write(fr); err != nil {
							t.Fatal(err)
						}
					}
				}
				c.waitBytes(t, d, (i+1)*tc.flows*payload)
			}
			c.mu.Lock()
			for sport, p := range want {
				if !bytes.Equal(c.flows[sport], p) {
					t.Errorf("flow %d: got %d payload bytes, want %d, or they differ", sport, len(c.flows[sport]), len(p))
				}
			}
			c.mu.Unlock()
			closeWithin(t, d)
		})
	}
}

// gatedFlows is a flowCollector whose first Deliver waits until open is
// closed, as gatedHandler does.
type gatedFlows struct {
	*flowCollector
	open chan struct{}
	once sync.Once
}

func (g *gatedFlows) Deliver(p *Packet) {
	<-g.open
	g.flowCollector.Deliver(p)
}

func (g *gatedFlows) release() { g.once.Do(func() { close(g.open) }) }

// TestRQDropRecovers: with -rq-full drop, frames that find the RQ full are
// dropped while the poll loop stands still, and once it goes on, the RQ
// takes frames again: a dropped frame must leave nothing charged to the
// RQ (the old accounting kept the reservation or WQE tail of every drop,
// and dropped everything after for good). Close returns.
func TestRQDropRecovers(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"hw-gro/rq-2", Config{HWGRO: HWGROOn, RQSize: 2, RQDrop: true, HWGROTimeout: time.Hour}},
		{"hw-gro/cyclic/rq-8", Config{HWGRO: HWGROCoalesce, RQ: RQCyclic, RQSize: 8, RQDrop: true, HWGROTimeout: time.Hour}},
		{"cyclic/rq-2", Config{RQ: RQCyclic, RQSize: 2, RQDrop: true}},
		{"lro/rq-2", Config{LRO: true, RQSize: 2, RQDrop: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gatedFlows{flowCollector: &flowCollector{}, open: make(chan struct{})}
			d, w := newPoolDriver(t, tc.cfg, bufpool.Config{}, g)
			t.Cleanup(g.release) // before the driver's Close
			st := d.Stats()
			// A burst while the poll loop stands still: it overflows
			// every RQ above, one flow per super-frame so that hardware
			// GRO starts a session for each.
			const burst = 40
			var reads uint64
			for i := range burst {
				fr, _ := flowFrames(t, uint16(2000+i), 1, 60000, false, false)
				if err := w.Write(fr[0]); err != nil {
					t.Fatal(err)
				}
			}
			reads = burst
			deadline := time.Now().Add(60 * time.Second)
			for st.WireReads.Load() < reads {
				if time.Now().After(deadline) {
					t.Fatalf("wire reads with the poll loop stopped: %d of %d (with RQDrop the NIC model must not stall)", st.WireReads.Load(), reads)
				}
				time.Sleep(time.Millisecond)
			}
			if st.Dropped[DropOutOfBuffer].Load() == 0 {
				t.Fatalf("rx_drop_out_of_buffer: 0 after a burst of %d super-frames into a stopped poll loop", burst)
			}
			g.release()
			// Let the NIC model finish the burst (every frame of it placed
			// or dropped) and the poll loop take in what it placed.
			segs := uint64(burst * ((60000 + mss4 - 1) / mss4))
			if tc.cfg.LRO {
				segs = burst
			}
			for st.Packets.Load()+st.Dropped[DropOutOfBuffer].Load() != segs || d.cons.Load() != d.prod.Load() {
				if time.Now().After(deadline) {
					t.Fatalf("after the burst: %d frames completed, %d dropped, want %d in all", st.Packets.Load(), st.Dropped[DropOutOfBuffer].Load(), segs)
				}
				time.Sleep(time.Millisecond)
			}
			// Paced frames after the burst, one at a time: every one
			// must arrive.
			const sport, frames, payload = 1000, 24, mss4
			fr, want := flowFrames(t, sport, frames, payload, false, false)
			dropped := st.Dropped[DropOutOfBuffer].Load()
			deadline = time.Now().Add(60 * time.Second)
			for i, f := range fr {
				if err := w.Write(f); err != nil {
					t.Fatal(err)
				}
				for {
					g.mu.Lock()
					got := len(g.flows[sport])
					g.mu.Unlock()
					if got >= (i+1)*payload {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after the burst: %d of %d payload bytes of frame %d delivered; rx_drop_out_of_buffer %d (%d before it)",
							got, (i+1)*payload, i, st.Dropped[DropOutOfBuffer].Load(), dropped)
					}
					time.Sleep(time.Millisecond)
				}
			}
			g.mu.Lock()
			if !bytes.Equal(g.flows[sport], want) {
				t.Errorf("flow after the burst: payload differs from what was sent")
			}
			g.mu.Unlock()
			if n := st.Dropped[DropOutOfBuffer].Load(); n != dropped {
				t.Errorf("rx_drop_out_of_buffer went from %d to %d for paced frames", dropped, n)
			}
			closeWithin(t, d)
		})
	}
}

// TestCloseWhileNICWaits: Close ends a NIC model that waits for room in a
// full RQ while the poll loop stands still (a handler that does not
// return): the wait watches Close, so the NIC model stops (nicDone) before
// the poll loop goes on.
func TestCloseWhileNICWaits(t *testing.T) {
	d, w, g := newGatedDriver(t, Config{LRO: true, RQSize: 2})
	writeSuperFrames(t, w, L3IPv4, 16, 60000)
	st := d.Stats()
	deadline := time.Now().Add(30 * time.Second)
	for st.RQStalls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("rx_rq_stalls: still 0 after 30 s with the poll loop stopped")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() {
		d.Close()
		close(closed)
	}()
	select {
	case <-d.nicDone:
	case <-time.After(30 * time.Second):
		g.release()
		<-closed
		t.Fatalf("the NIC model still waited for room 30 s after Close began")
	}
	g.release()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("Close did not return within 30 s after the poll loop went on")
	}
}
