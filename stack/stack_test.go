package stack

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/ustack/ustack/driver"
)

// pair builds two stacks joined by an in-memory wire: rx (the stack under
// test, configured by dc) at 192.0.2.1 and a peer at 192.0.2.2.
func pair(t testing.TB, dc driver.Config) (rx, peer *Stack) {
	t.Helper()
	return pairConfig(t, Config{Driver: dc})
}

// sendAndHash writes n pseudo-random bytes to c in writes of wsize and
// returns their SHA-256.
func sendAndHash(c net.Conn, n, wsize int, seed uint64) ([32]byte, error) {
	h := sha256.New()
	r := rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, wsize)
	for sent := 0; sent < n; {
		m := min(wsize, n-sent)
		for i := 0; i < m; i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < m; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := c.Write(buf[:m]); err != nil {
			return [32]byte{}, err
		}
		h.Write(buf[:m])
		sent += m
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

func TestTCPBulkMem(t *testing.T) {
	const size = 16 << 20
	for _, tc := range []struct {
		name string
		dc   driver.Config
		v6   bool
	}{
		{"lro-off/hds-auto/striding", driver.Config{}, false},
		{"lro-on/hds-auto/striding", driver.Config{LRO: true}, false},
		{"lro-off/hds-256/cyclic", driver.Config{HDS: 256, RQ: driver.RQCyclic}, false},
		{"lro-on/hds-256/cyclic", driver.Config{HDS: 256, RQ: driver.RQCyclic, LRO: true}, false},
		{"ipv6/lro-off/hds-auto", driver.Config{}, true},
		{"ipv6/lro-on/hds-256", driver.Config{LRO: true, HDS: 256}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx, peer := pair(t, tc.dc)
			addr := netip.MustParseAddrPort("192.0.2.1:9")
			if tc.v6 {
				addr = netip.MustParseAddrPort("[2001:db8::1]:9")
			}
			bulkTo(t, rx, peer, addr, size)
			st := rx.Driver().Stats()
			if tc.dc.LRO && st.LROFrames.Load() == 0 {
				t.Errorf("rx_lro_packets: got 0, want > 0 with LRO on")
			}
			if !tc.dc.LRO && st.GSOSegs.Load() == 0 {
				t.Errorf("rx_gso_segs: got 0, want > 0 with LRO off")
			}
			if !tc.dc.LRO {
				var skbs, pkts, fragList uint64
				rx.EachCounter(func(name string, v uint64) {
					switch name {
					case "rx_gro_skbs":
						skbs = v
					case "rx_gro_packets":
						pkts = v
					case "rx_gro_frag_list":
						fragList = v
					}
				})
				if skbs == 0 {
					t.Errorf("rx_gro_skbs: got 0, want > 0 with LRO off and GRO on")
				}
				// With hds auto the frags move; only a packet whose
				// MAX_SKB_FRAGS (17) are full goes on in the frag_list:
				// at most one chained packet per 8 frames of 1 or 2 frags.
				if tc.dc.HDS == driver.HDSAuto && fragList*8 > pkts {
					t.Errorf("rx_gro_frag_list with hds auto: got %d for %d merged frames, want at most 1 per 8", fragList, pkts)
				}
				if tc.dc.HDS == 256 && fragList == 0 {
					t.Errorf("rx_gro_frag_list with hds 256: got 0, want > 0")
				}
			}
			if tc.dc.HDS == driver.HDSAuto && st.HDSPayload.Load() != 0 {
				t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", st.HDSPayload.Load())
			}
			if tc.dc.HDS == 256 && st.HDSPayload.Load() == 0 {
				t.Errorf("rx_hds_payload_bytes with hds 256: got 0, want > 0")
			}
		})
	}
}

func Example() {
	// Two stacks over an in-memory wire; a real program passes a
	// driver.TAP as the Wire instead.
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

	l, _ := srv.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7"))
	defer l.Close()
	go func() { // echo one connection (stack/serve has the servers)
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	c, err := cli.DialTCP(context.Background(), netip.MustParseAddrPort("192.0.2.1:7"))
	if err != nil {
		panic(err)
	}
	c.Write([]byte("hello"))
	reply := make([]byte, 5)
	io.ReadFull(c, reply)
	c.Close()
	fmt.Println(string(reply))
	// Output: hello
}

func TestGVisorCounters(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	l, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := peer.DialTCP(context.Background(), netip.MustParseAddrPort("192.0.2.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	got := map[string]uint64{}
	peer.EachGVisorCounter(func(name string, v uint64) { got[name] = v })
	if len(got) < 50 {
		t.Errorf("gVisor counters: got %d, want dozens", len(got))
	}
	if got["gvisor_tcp_active_connection_openings"] != 1 {
		t.Errorf("gvisor_tcp_active_connection_openings: got %d, want 1", got["gvisor_tcp_active_connection_openings"])
	}
}
