package stack

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// BenchmarkUDPRead measures the datagrams per second a reader gets from
// USO super-frames (64 datagrams of 64 bytes, MTU 1500, rx-uso on) written
// into an in-memory wire, 16 super-frames at a time, each window queued
// whole before the reads are timed, so that it is the reader's cost alone
// (the poll loop is idle meanwhile): one iteration is one datagram. Readers: ReadBatch (64 messages a call),
// ReadBatch with SetGRO (one train per message), ReadTrain, and a gVisor
// socket's ReadFrom (the train split by udpsplit.go). Not a test: run it
// under the bench lock, e.g.
//
//	flock /work/ab/bench.lock go test -run '^$' -bench UDPRead -benchtime 2s -count 3 ./stack/
func BenchmarkUDPRead(b *testing.B) {
	const seg, segs, window = 64, 64, 16 * 64
	for _, reader := range []string{"ReadBatch", "ReadBatch-GRO", "ReadTrain", "ReadFrom"} {
		b.Run(reader, func(b *testing.B) {
			b.ReportAllocs()
			st, w := usoStack(b, false) // no poison: its writes are no reader's cost
			dst := netip.MustParseAddrPort("192.0.2.1:7000")
			var read func() int      // reads, returns the datagrams it got
			var queued func() int64  // the datagrams queued and not yet read
			var sent, consumed int64 // datagrams written, read
			udpIn := st.GVisor().Stats().UDP.PacketsReceived
			switch reader {
			case "ReadFrom":
				u, err := st.ListenUDPBuffer(dst, 64<<20)
				if err != nil {
					b.Fatal(err)
				}
				defer u.Close()
				buf := make([]byte, 2048)
				base := udpIn.Value()
				queued = func() int64 { return int64(udpIn.Value()-base) - consumed }
				read = func() int {
					if _, _, err := u.ReadFrom(buf); err != nil {
						b.Fatal(err)
					}
					return 1
				}
			default:
				c, err := st.ListenUDPTrains(dst)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				queued = c.segs.Load
				if reader == "ReadTrain" {
					buf := make([]byte, 65536)
					read = func() int {
						n, s, _, err := c.ReadTrain(buf, time.Time{})
						if err != nil {
							b.Fatal(err)
						}
						return (n + s - 1) / s
					}
					break
				}
				c.SetGRO(reader == "ReadBatch-GRO")
				ms := make([]Message, 64)
				room := 2048
				if c.b.gro.Load() {
					room = 65536
				}
				for i := range ms {
					ms[i].Buffers = [][]byte{make([]byte, room)}
				}
				read = func() int {
					n, err := c.ReadBatch(ms, time.Time{})
					if err != nil {
						b.Fatal(err)
					}
					k := 0
					for _, m := range ms[:n] {
						k += (m.N + m.SegSize - 1) / m.SegSize
					}
					return k
				}
			}
			payload := make([]byte, seg*segs)
			for i := range payload {
				payload[i] = byte(i)
			}
			frame := usoFrame(payload, seg, dst)
			// refill writes a window of super-frames with the timer
			// stopped, and waits until the stack has queued them all, so
			// that the timed reads measure the reader alone.
			refill := func() {
				b.StopTimer()
				defer b.StartTimer()
				for range window / segs {
					if err := w.Write(frame); err != nil {
						b.Fatal(err)
					}
				}
				sent += window
				for end := time.Now().Add(30 * time.Second); queued() < sent-consumed; {
					if time.Now().After(end) {
						b.Fatalf("queued %d of %d datagrams; wire dropped %d", queued(), sent-consumed, w.Dropped())
					}
					runtime.Gosched()
				}
			}
			have := 0
			for b.Loop() {
				if have == 0 {
					if sent == consumed {
						refill()
					}
					have = read()
					consumed += int64(have)
				}
				have--
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "datagrams/s")
		})
	}
}

// usoStack builds a stack at 192.0.2.1/24 with rx-uso on, MTU 1500, over
// an in-memory wire, and returns it with the wire's other end, into which
// a test writes frames (usoFrame); poison: the pool poisons pages. Cleanup closes both and checks the pool.
func usoStack(tb testing.TB, poison bool) (*Stack, *driver.MemWire) {
	a, w := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65535+18)
	pool := testutil.NewPool(tb, bufpool.Config{RingSize: 1 << 15, Poison: poison})
	st, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		MAC: [6]byte{2, 0, 0, 0, 0, 1}, Driver: driver.Config{RxUSO: true, MTU: 1500, Pool: pool}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		st.Close()
		w.Close()
		if n := pool.InUse(); n != 0 {
			tb.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	return st, w
}

// usoFrame builds a virtio-net header and an Ethernet frame holding a UDP
// GSO super-frame (VIRTIO_NET_HDR_GSO_UDP_L4, checksum partial) of payload
// in datagrams of seg bytes (the last may be shorter) from 192.0.2.2:5000
// to dst.
func usoFrame(payload []byte, seg int, dst netip.AddrPort) []byte {
	f := testutil.Frame{
		Headroom: driver.VirtioNetHdrLen,
		SrcMAC:   tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2}), DstMAC: tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1}),
		Src: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), Dst: tcpip.AddrFrom4(dst.Addr().As4()),
		Proto: header.UDPProtocolNumber, SrcPort: 5000, DstPort: dst.Port(),
		Payload: payload, Csum: testutil.CsumPartial,
	}
	b := f.Build()
	l4 := header.EthernetMinimumSize + header.IPv4MinimumSize
	h := driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOUDPL4,
		HdrLen: uint16(l4 + header.UDPMinimumSize), GSOSize: uint16(seg),
		CsumStart: uint16(l4), CsumOffset: 6,
	}
	h.Encode(b)
	return b
}
