//go:build linux

package integration

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestUDPBatch exercises TrainConn's batch calls against a kernel socket
// over the TAP, with -rx-uso on and off, IPv4 and IPv6. The kernel sends
// UDP_SEGMENT super-frames (16 datagrams of 64 bytes per write), at most
// four writes ahead of the reader, and ReadBatch (32 messages a call, one
// datagram each) must get every datagram, byte for byte, each once, in
// order; then WriteBatch sends batches of 32 datagrams back, each batch
// read by the kernel socket before the next, and the kernel must get every
// one, byte for byte, in order, from the TrainConn's port.
func TestUDPBatch(t *testing.T) {
	needRoot(t)
	const (
		size, per = 64, 16
		writes    = 100
		count     = writes * per
		window    = 4 * per // datagrams sent but not yet read
		port      = 5356
		batch     = 32
		wbatches  = 20
	)
	n := 0
	for _, on := range []bool{true, false} {
		for _, v6 := range []bool{false, true} {
			n++
			t.Run(fmt.Sprintf("rx-uso=%v/%s", on, family(v6)), func(t *testing.T) {
				r := newRig(t, fmt.Sprintf("usit-ub%d", n), 1500, driver.Config{RxUSO: on})
				ap := r.stackAP(v6, port)
				tc, err := r.st.ListenUDPTrains(ap)
				if err != nil {
					t.Fatal(err)
				}
				defer tc.Close()
				k := dialUDPSegment(t, r, ap, size)
				deadline := time.Now().Add(60 * time.Second)
				k.SetDeadline(deadline)

				// Kernel -> ReadBatch.
				type result struct {
					next int // the sequence number expected next
					err  error
				}
				res := make(chan result, 1)
				progress := make(chan int, count)
				go func() {
					ms := make([]stack.Message, batch)
					for i := range ms {
						ms[i].Buffers = [][]byte{make([]byte, 2048)}
					}
					rr := result{}
					for rr.next < count {
						n, err := tc.ReadBatch(ms, deadline)
						if err != nil {
							rr.err = err
							break
						}
						for j := range n {
							m := &ms[j]
							d := m.Buffers[0][:m.N]
							seq, err := parseDatagram(d)
							if err == nil && (len(d) != size || int(seq) != rr.next || m.Flags != 0 || m.SegSize != size) {
								err = fmt.Errorf("datagram %d: %d bytes, flags %#x, SegSize %d, want datagram %d of %d bytes", seq, len(d), m.Flags, m.SegSize, rr.next, size)
							}
							if err != nil {
								rr.err = err
								res <- rr
								return
							}
							rr.next++
						}
						progress <- rr.next
					}
					res <- rr
				}()
				msg := make([]byte, size*per)
				got := 0
				for w := 0; w < writes; w++ {
					for w*per-got >= window {
						select {
						case got = <-progress:
						case rr := <-res:
							t.Fatalf("receiver stopped at datagram %d of %d: %v; drops: %s", rr.next, count, rr.err, dropReasons(r.st))
						}
					}
					for i := range per {
						fillDatagram(msg[i*size:(i+1)*size], uint32(w*per+i))
					}
					if _, err := k.Write(msg); err != nil {
						t.Fatalf("write %d: %v", w, err)
					}
				}
				if rr := <-res; rr.err != nil || rr.next != count {
					t.Fatalf("ReadBatch got %d of %d datagrams in order: %v; drops: %s", rr.next, count, rr.err, dropReasons(r.st))
				}
				uso, segs := counter(t, r.st, "rx_uso_packets"), counter(t, r.st, "rx_gso_segs")
				if on && (uso == 0 || segs != 0) || !on && (uso != 0 || segs == 0) {
					t.Errorf("rx_uso_packets %d, rx_gso_segs %d: want super-frames whole only with rx-uso on", uso, segs)
				}

				// WriteBatch -> kernel.
				to := k.LocalAddr().(*net.UDPAddr).AddrPort()
				ms := make([]stack.Message, batch)
				buf := make([]byte, 2048)
				for b := range wbatches {
					for i := range ms {
						d := make([]byte, size)
						fillDatagram(d, uint32(b*batch+i))
						ms[i] = stack.Message{Buffers: [][]byte{d[:10], d[10:]}, Addr: to}
					}
					if n, err := tc.WriteBatch(ms); n != batch || err != nil {
						t.Fatalf("WriteBatch %d: got %d, %v, want %d, nil", b, n, err, batch)
					}
					for i := range batch {
						m, from, err := k.ReadFromUDPAddrPort(buf)
						if err != nil {
							t.Fatalf("kernel read of datagram %d: %v", b*batch+i, err)
						}
						seq, err := parseDatagram(buf[:m])
						if err != nil || m != size || int(seq) != b*batch+i {
							t.Fatalf("kernel got datagram %d (%v) of %d bytes, want %d of %d", seq, err, m, b*batch+i, size)
						}
						if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) {
							t.Fatalf("kernel got a datagram from %v, want %v", from, ap)
						}
					}
				}

				// WriteBatch with SegSize (UDP_SEGMENT): 4 messages of 16
				// datagrams a batch, each message one USO super-frame
				// where the TAP takes them, which the kernel cuts.
				gsoBefore := counter(t, r.st, "tx_gso_packets")
				const gsoMsgs, gsoBatches = 4, 10
				gms := make([]stack.Message, gsoMsgs)
				for b := range gsoBatches {
					for i := range gms {
						d := make([]byte, size*per)
						for j := range per {
							fillDatagram(d[j*size:(j+1)*size], uint32((b*gsoMsgs+i)*per+j))
						}
						gms[i] = stack.Message{Buffers: [][]byte{d[:100], d[100:]}, Addr: to, SegSize: size}
					}
					if n, err := tc.WriteBatch(gms); n != gsoMsgs || err != nil {
						t.Fatalf("WriteBatch with SegSize, batch %d: got %d, %v, want %d, nil", b, n, err, gsoMsgs)
					}
					for i := range gsoMsgs * per {
						want := (b*gsoMsgs)*per + i
						m, _, err := k.ReadFromUDPAddrPort(buf)
						if err != nil {
							t.Fatalf("kernel read of segment %d: %v", want, err)
						}
						seq, err := parseDatagram(buf[:m])
						if err != nil || m != size || int(seq) != want {
							t.Fatalf("kernel got datagram %d (%v) of %d bytes, want %d of %d", seq, err, m, want, size)
						}
					}
				}
				gso := counter(t, r.st, "tx_gso_packets") - gsoBefore
				if gso < gsoMsgs*gsoBatches { // TestUDPRxUSO assumes USO too

					t.Errorf("tx_gso_packets: %d more, want at least %d (a super-frame per message)", gso, gsoMsgs*gsoBatches)
				}
				t.Logf("%d datagrams read by batch, %d written by batch, %d in %d messages with SegSize (tx_gso_packets %d more); rx_uso_packets %d, rx_gso_segs %d",
					count, wbatches*batch, gsoBatches*gsoMsgs*per, gsoBatches*gsoMsgs, gso, uso, segs)
			})
		}
	}
}
