//go:build linux

package integration

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/driver"
)

// TestUDPRxUSO sends UDP super-frames (a kernel socket with UDP_SEGMENT,
// 16 datagrams of 64 bytes per write) to ustack with -rx-uso on and off,
// read by a train socket (which takes a whole super-frame as one train)
// and by a plain socket (which gets it split into its datagrams), and
// checks every datagram that arrives, byte for byte: none corrupted or
// twice, at least 95% of them, and that rx-uso on handed super-frames up
// whole (rx_uso_packets) where off cut them (rx_gso_segs).
func TestUDPRxUSO(t *testing.T) {
	needRoot(t)
	const (
		size, per = 64, 16
		writes    = 150
		count     = writes * per
		port      = 5354
		window    = 4 * per // datagrams sent but not yet read
	)
	n := 0
	for _, on := range []bool{true, false} {
		for _, train := range []bool{true, false} {
			for _, v6 := range []bool{false, true} {
				n++
				name := fmt.Sprintf("rx-uso=%v/train=%v/%s", on, train, family(v6))
				t.Run(name, func(t *testing.T) {
					r := newRig(t, fmt.Sprintf("usit-uso%d", n), 1500, driver.Config{RxUSO: on})
					ap := r.stackAP(v6, port)
					// read returns the datagrams of the next read.
					var read func([]byte) ([][]byte, error)
					buf := make([]byte, 65536)
					if train {
						tc, err := r.st.ListenUDPTrains(ap)
						if err != nil {
							t.Fatal(err)
						}
						defer tc.Close()
						read = func(b []byte) ([][]byte, error) {
							m, seg, _, err := tc.ReadTrain(b, time.Now().Add(500*time.Millisecond))
							if err != nil {
								return nil, err
							}
							var out [][]byte
							for off := 0; off < m; off += seg {
								out = append(out, b[off:min(off+seg, m)])
							}
							return out, nil
						}
					} else {
						u, err := r.st.ListenUDP(ap)
						if err != nil {
							t.Fatal(err)
						}
						defer u.Close()
						read = func(b []byte) ([][]byte, error) {
							u.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
							m, _, err := u.ReadFrom(b)
							if err != nil {
								return nil, err
							}
							return [][]byte{b[:m]}, nil
						}
					}
					k := dialUDPSegment(t, r, ap, size)
					deadline := time.Now().Add(60 * time.Second)
					k.SetWriteDeadline(deadline)
					var sendDone atomic.Bool
					var got atomic.Int64
					type result struct {
						seen    map[uint32]bool
						corrupt []string
						dups    int
						err     error
					}
					res := make(chan result, 1)
					go func() {
						rr := result{seen: map[uint32]bool{}}
						for len(rr.seen) < count && time.Now().Before(deadline) {
							ds, err := read(buf)
							if err != nil {
								if errTimeout(err) || os.IsTimeout(err) {
									if sendDone.Load() {
										break
									}
									continue
								}
								rr.err = err
								break
							}
							for _, d := range ds {
								got.Add(1)
								seq, err := parseDatagram(d)
								switch {
								case err != nil:
									rr.corrupt = append(rr.corrupt, err.Error())
								case len(d) != size || seq >= count:
									rr.corrupt = append(rr.corrupt, fmt.Sprintf("datagram %d of %d bytes", seq, len(d)))
								case rr.seen[seq]:
									rr.dups++
								default:
									rr.seen[seq] = true
								}
							}
						}
						res <- rr
					}()
					msg := make([]byte, size*per)
					sent := 0
					for w := 0; w < writes && time.Now().Before(deadline); w++ {
						for wait := time.Now().Add(100 * time.Millisecond); int64(sent)-got.Load() >= window && time.Now().Before(wait); {
							time.Sleep(50 * time.Microsecond)
						}
						for i := 0; i < per; i++ {
							fillDatagram(msg[i*size:(i+1)*size], uint32(w*per+i))
						}
						if _, err := k.Write(msg); err != nil {
							t.Fatalf("write %d: %v", w, err)
						}
						sent += per
					}
					sendDone.Store(true)
					rr := <-res
					if rr.err != nil && rr.err != net.ErrClosed {
						t.Errorf("receiver: %v", rr.err)
					}
					if len(rr.corrupt) > 0 {
						t.Errorf("%d corrupted datagrams, want 0; first: %s", len(rr.corrupt), rr.corrupt[0])
					}
					if rr.dups > 0 {
						t.Errorf("%d duplicated datagrams, want 0", rr.dups)
					}
					if got, want := len(rr.seen), count*95/100; got < want {
						t.Errorf("datagrams arrived: %d of %d, want at least %d; drops: %s", got, sent, want, dropReasons(r.st))
					}
					uso, segs := counter(t, r.st, "rx_uso_packets"), counter(t, r.st, "rx_gso_segs")
					if on && (uso == 0 || segs != 0) || !on && (uso != 0 || segs == 0) {
						t.Errorf("rx_uso_packets %d, rx_gso_segs %d: want super-frames whole only with rx-uso on", uso, segs)
					}
					t.Logf("%d of %d datagrams; rx_uso_packets %d, rx_gso_segs %d", len(rr.seen), sent, uso, segs)
				})
			}
		}
	}
}

// dialUDPSegment dials ap from the bed's namespace with a kernel UDP socket
// that sends UDP_SEGMENT super-frames of size-byte datagrams (one USO
// frame per write through the TAP); the test skips without UDP_SEGMENT.
// Cleanup closes it.
func dialUDPSegment(t *testing.T, r *rig, ap netip.AddrPort, size int) *net.UDPConn {
	t.Helper()
	k, err := r.bed.NS.DialUDP(ap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	rc, err := k.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, size) })
	if serr != nil {
		t.Skipf("UDP_SEGMENT: %v", serr)
	}
	return k
}
