package stack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// wireStack builds a stack for cfg at 192.0.2.1/24 and 2001:db8::1/64 (MAC
// ...:01) on one end of an in-memory wire, its pool poisoned (of chunk
// pages with ZeroCopy), and returns it with the other end, into which a
// test writes frames behind their virtio-net header. Cleanup closes both
// and checks that every page came back.
func wireStack(t testing.TB, cfg Config) (*Stack, *driver.MemWire) {
	t.Helper()
	a, w := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65535+18)
	pc := bufpool.Config{Poison: true, RingSize: 1 << 15}
	if cfg.ZeroCopy {
		pc.Memory = newViewMemory()
	}
	pool := testutil.NewPool(t, pc)
	cfg.Driver.Pool = pool
	cfg.Wire, cfg.MAC = a, [6]byte{2, 0, 0, 0, 0, 1}
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("2001:db8::1/64")}
	st, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		w.Close()
		if n := pool.InUse(); n != 0 {
			t.Errorf("pages still in use after Close: got %d, want 0", n)
		}
	})
	return st, w
}

// TestHDSShortZeroCopy: with a header copy shorter than the Ethernet header
// (-hds 8) on the nonlinear RQs and zero copy on, ARP or NDP and a TCP
// bulk transfer reach the stack, byte for byte; the driver pulled the
// headers the copy missed (rx_hds_pull_bytes) and GRO merged the segments.
// Before the pull, the first frame with frags panicked the poll loop in
// isIPFragment.
func TestHDSShortZeroCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		dc   driver.Config
	}{
		{"lro/hds-8", driver.Config{LRO: true, HDS: 8}},
		{"cyclic/hds-8", driver.Config{RQ: driver.RQCyclic, HDS: 8}},
		{"hw-gro/hds-8", driver.Config{HWGRO: driver.HWGROOn, HDS: 8}},
	} {
		for _, v6 := range []bool{false, true} {
			name, addr := tc.name+"/v4", netip.MustParseAddrPort("192.0.2.1:9")
			if v6 {
				name, addr = tc.name+"/v6", netip.MustParseAddrPort("[2001:db8::1]:9")
			}
			t.Run(name, func(t *testing.T) {
				rx, peer := pairConfig(t, Config{Driver: tc.dc, ZeroCopy: true})
				bulkTo(t, rx, peer, addr, 4<<20)
				c := counterMap(rx)
				if c["rx_hds_pull_bytes"] == 0 {
					t.Error("rx_hds_pull_bytes: got 0, want the headers past the 8-byte copy pulled")
				}
				if resolve := c["arp_requests_received"] + c["ndp_neighbor_solicits"]; resolve == 0 {
					t.Error("arp_requests_received, ndp_neighbor_solicits: got 0, want the peer's address resolution received")
				}
				if c["zc_views_lent"] == 0 {
					t.Error("zc_views_lent: got 0, want payload lent")
				}
				if tc.dc.HWGRO == driver.HWGROOff && c["rx_gro_packets"] <= c["rx_gro_skbs"] {
					t.Errorf("rx_gro_packets %d, rx_gro_skbs %d: want segments merged", c["rx_gro_packets"], c["rx_gro_skbs"])
				}
				t.Logf("rx_hds_bytes %d, rx_hds_pull_bytes %d, rx_gro_packets %d, rx_gro_skbs %d, zc_views_lent %d",
					c["rx_hds_bytes"], c["rx_hds_pull_bytes"], c["rx_gro_packets"], c["rx_gro_skbs"], c["zc_views_lent"])
			})
		}
	}
}

// TestRxUSOShortHDS: a UDP super-frame (rx-uso) whose header copy (-hds
// 20) ends inside its IP header reaches a plain UDP socket as its
// datagrams, split on the UDP header the driver pulled: three datagrams of
// 10 bytes, not one of 30.
func TestRxUSOShortHDS(t *testing.T) {
	st, w := wireStack(t, Config{Driver: driver.Config{RxUSO: true, HDS: 20}})
	dst := netip.MustParseAddrPort("192.0.2.1:5001")
	u, err := st.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	payload := []byte("0123456789abcdefghijABCDEFGHIJ")
	if err := w.Write(usoFrame(payload, 10, dst)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for i := range 3 {
		u.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, _, err := u.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if want := payload[i*10 : i*10+10]; !bytes.Equal(buf[:n], want) {
			t.Fatalf("datagram %d: got %q, want %q", i, buf[:n], want)
		}
	}
	// The poll loop adds its batch's counters after the batch's delivery.
	waitCounters(t, st, map[string]uint64{"rx_uso_packets": 1, "rx_hds_pull_bytes": 14 + 20 + 8 - 20})
}
