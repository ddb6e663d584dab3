//go:build linux

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack/serve"
)

// udpHdrLen is the test's own header at the start of every datagram: the
// datagram's size (uint16) and sequence number (uint32), big-endian. The
// rest is a pattern derived from both.
const udpHdrLen = 6

// fillDatagram writes datagram seq of len(b) bytes into b.
func fillDatagram(b []byte, seq uint32) {
	binary.BigEndian.PutUint16(b, uint16(len(b)))
	binary.BigEndian.PutUint32(b[2:], seq)
	for i := udpHdrLen; i < len(b); i++ {
		b[i] = byte(uint32(i)*31 + seq*7 + uint32(len(b)))
	}
}

// parseDatagram checks b against the format fillDatagram writes and
// returns its sequence number.
func parseDatagram(b []byte) (uint32, error) {
	if len(b) < udpHdrLen {
		return 0, fmt.Errorf("datagram of %d bytes, shorter than the test header", len(b))
	}
	if size := int(binary.BigEndian.Uint16(b)); size != len(b) {
		return 0, fmt.Errorf("datagram of %d bytes says it has %d", len(b), size)
	}
	seq := binary.BigEndian.Uint32(b[2:])
	for i := udpHdrLen; i < len(b); i++ {
		if want := byte(uint32(i)*31 + seq*7 + uint32(len(b))); b[i] != want {
			return seq, fmt.Errorf("datagram %d (%d bytes): byte %d: got %#x, want %#x", seq, len(b), i, b[i], want)
		}
	}
	return seq, nil
}

// TestUDPReceive sends datagrams of 64 and 1400 bytes from a kernel socket
// to a ustack UDP socket and checks every datagram that arrives. UDP may
// drop, so 95% arriving is enough, but nothing may arrive corrupted or
// twice.
func TestUDPReceive(t *testing.T) {
	needRoot(t)
	const (
		count    = 2000
		minShare = 0.95
		port     = 5353
		// window bounds the datagrams sent but not yet read: gVisor's UDP
		// receive buffer is 32 KiB, which a slow reader (the race
		// detector) lets a burst overflow. It paces, it does not retry: a
		// datagram lost on the way still counts as lost.
		window = 8
	)
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-udp%d", i), 1500, driver.Config{})
			ap := r.stackAP(v6, port)
			u, err := r.st.ListenUDP(ap)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			k, err := r.bed.NS.DialUDP(ap)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()

			for _, size := range []int{64, 1400} {
				deadline := time.Now().Add(60 * time.Second)
				k.SetWriteDeadline(deadline)
				var (
					sendDone atomic.Bool
					read     atomic.Int64
				)
				type result struct {
					seen    map[uint32]bool
					corrupt []string
					dups    int
					err     error
				}
				res := make(chan result, 1)
				go func() {
					rr := result{seen: map[uint32]bool{}}
					buf := make([]byte, 2048)
					for len(rr.seen) < count && time.Now().Before(deadline) {
						// Short read deadlines, so that the reader stops
						// soon after the sender when datagrams were lost.
						u.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
						m, _, err := u.ReadFrom(buf)
						if err != nil {
							if errTimeout(err) {
								if sendDone.Load() {
									break
								}
								continue
							}
							rr.err = err
							break
						}
						read.Add(1)
						seq, err := parseDatagram(buf[:m])
						switch {
						case err != nil:
							rr.corrupt = append(rr.corrupt, err.Error())
						case m != size || seq >= count:
							rr.corrupt = append(rr.corrupt, fmt.Sprintf("datagram %d of %d bytes, want seq < %d of %d bytes", seq, m, count, size))
						case rr.seen[seq]:
							rr.dups++
						default:
							rr.seen[seq] = true
						}
					}
					res <- rr
				}()

				start := time.Now()
				msg := make([]byte, size)
				sent := 0
				for seq := uint32(0); seq < count && time.Now().Before(deadline); seq++ {
					// Wait for the reader to catch up, but not for long:
					// a datagram lost on the way is never read.
					for wait := time.Now().Add(100 * time.Millisecond); int64(sent)-read.Load() >= window && time.Now().Before(wait); {
						time.Sleep(50 * time.Microsecond)
					}
					fillDatagram(msg, seq)
					if _, err := k.Write(msg); err != nil {
						t.Errorf("%d bytes: send %d: %v", size, seq, err)
						break
					}
					sent++
				}
				sendDone.Store(true)
				rr := <-res
				elapsed := time.Since(start)
				if rr.err != nil {
					t.Errorf("%d bytes: receiver: %v", size, rr.err)
				}
				if len(rr.corrupt) > 0 {
					t.Errorf("%d bytes: %d corrupted datagrams, want 0; first: %s", size, len(rr.corrupt), rr.corrupt[0])
				}
				if rr.dups > 0 {
					t.Errorf("%d bytes: duplicated datagrams: got %d, want 0", size, rr.dups)
				}
				if got, want := len(rr.seen), int(minShare*count); got < want {
					t.Errorf("%d bytes: datagrams arrived: got %d of %d sent, want at least %d; udp_receive_buffer_errors %d, drop counters: %s",
						size, got, sent, want, counter(t, r.st, "udp_receive_buffer_errors"), dropReasons(r.st))
				}
				t.Logf("%d-byte datagrams: %d of %d sent arrived in %v", size, len(rr.seen), sent, elapsed.Round(time.Millisecond))
			}
			checkFlowDrops(t, r.st)
		})
	}
}

// TestUDPEcho has ustack echo datagrams back to an unconnected kernel
// socket, which checks that every reply comes from the address and port
// the request went to.
func TestUDPEcho(t *testing.T) {
	needRoot(t)
	const (
		count = 50
		port  = 7
		tries = 3
	)
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-uecho%d", i), 1500, driver.Config{})
			udpEchoServer(t, r, v6, port, count, tries)
		})
	}
}

// udpEchoServer serves UDP echo on r's stack at port and has a kernel
// socket check count datagrams through it (udpEcho).
func udpEchoServer(t *testing.T, r *rig, v6 bool, port uint16, count, tries int) {
	t.Helper()
	ap := r.stackAP(v6, port)
	u, err := r.st.ListenUDP(ap)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.UDPEcho(u) }()
	defer func() {
		u.Close()
		if err := <-served; err != nil {
			t.Errorf("UDPEcho: %v", err)
		}
	}()
	k, err := r.bed.NS.ListenUDP(r.kernelAP(v6, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	udpEcho(t, k, ap, count, tries)
}

// udpEcho sends count datagrams of varying sizes from k to the echo server
// at ap, one at a time with up to tries attempts each, and checks that
// each is echoed unchanged from ap itself.
func udpEcho(t *testing.T, k *net.UDPConn, ap netip.AddrPort, count, tries int) {
	t.Helper()
	buf := make([]byte, 2048)
	echoed := 0
	for seq := uint32(0); seq < uint32(count); seq++ {
		msg := make([]byte, udpHdrLen+int(seq*29)%1400)
		fillDatagram(msg, seq)
		ok := false
		for try := 0; try < tries && !ok; try++ {
			k.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := k.WriteToUDPAddrPort(msg, ap); err != nil {
				t.Fatalf("send %d to %v: %v", seq, ap, err)
			}
			wait := time.Now().Add(time.Second)
			for !ok && time.Now().Before(wait) {
				k.SetReadDeadline(wait)
				m, from, err := k.ReadFromUDPAddrPort(buf)
				if err != nil {
					if errTimeout(err) {
						break
					}
					t.Fatalf("read reply %d: %v", seq, err)
				}
				if from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()); from != ap {
					t.Errorf("reply from %v, want from %v", from, ap)
				}
				got, err := parseDatagram(buf[:m])
				if err != nil {
					t.Errorf("reply: %v", err)
					continue
				}
				if got < seq {
					continue // the late echo of an earlier try
				}
				if got != seq || m != len(msg) {
					t.Errorf("reply: got datagram %d of %d bytes, want %d of %d bytes", got, m, seq, len(msg))
					continue
				}
				ok = true
			}
		}
		if ok {
			echoed++
		}
	}
	if echoed != count {
		t.Errorf("datagrams echoed (%d tries each): got %d, want %d", tries, echoed, count)
	}
}
