//go:build linux

package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/internal/testbed"
)

// xskFrame is a UDP/IPv4 frame for TestXSKChecksumThroughKernel with its
// checksum variants.
type xskFrame struct {
	b       []byte
	payload []byte
	pseudo  uint16 // the folded pseudo-header sum: what CHECKSUM_PARTIAL wants in the field
	full    uint16 // the correct checksum
}

// buildXSKFrame builds an Ethernet/IPv4/UDP frame from src to dst with the
// given payload; its UDP checksum field holds the pseudo-header sum only.
func buildXSKFrame(dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) xskFrame {
	const l2, l3, l4 = header.EthernetMinimumSize, header.IPv4MinimumSize, header.UDPMinimumSize
	b := make([]byte, l2+l3+l4+len(payload))
	header.Ethernet(b).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x79\x02"),
		DstAddr: tcpip.LinkAddress(dstMAC),
		Type:    header.IPv4ProtocolNumber,
	})
	srcA, dstA := tcpip.AddrFrom4(src.Addr().As4()), tcpip.AddrFrom4(dst.Addr().As4())
	ip := header.IPv4(b[l2:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b) - l2), TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		SrcAddr: srcA, DstAddr: dstA,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	seg := b[l2+l3:]
	udpLen := uint16(len(seg))
	header.UDP(seg).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: udpLen})
	copy(seg[l4:], payload)
	pseudo := header.PseudoHeaderChecksum(header.UDPProtocolNumber, srcA, dstA, udpLen)
	header.UDP(seg).SetChecksum(pseudo)
	full := ^checksum.Checksum(seg, 0) // the sum over the segment includes the pseudo sum in the field
	return xskFrame{b: b, payload: payload, pseudo: pseudo, full: full}
}

// withChecksum returns a copy of f.b with the checksum field set to v.
func (f xskFrame) withChecksum(v uint16) []byte {
	b := bytes.Clone(f.b)
	checksum.Put(b[header.EthernetMinimumSize+header.IPv4MinimumSize+6:], v)
	return b
}

// udpInCsumErrors returns UdpInCsumErrors of ns, from /proc/net/snmp read
// inside it.
func udpInCsumErrors(t *testing.T, ns *testbed.Netns) uint64 {
	t.Helper()
	m, err := ns.SNMP("Udp")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m["InCsumErrors"]
	if !ok {
		t.Fatalf("no Udp InCsumErrors in %s's /proc/net/snmp", ns.Name)
	}
	return v
}

// TestXSKChecksumThroughKernel proves the XSK socket's TX checksum request
// by the kernel's own UDP checksum verification. The socket writes frames
// into a TAP (vnet header, offloads) whose namespace A forwards them over
// a veth with TX checksum offload off to namespace B, where a kernel UDP
// socket listens. The frames' UDP checksum fields hold only the
// pseudo-header sum:
//
//   - with XDP_TX_METADATA and XDP_TXMD_FLAGS_CHECKSUM (csum_start 34,
//     csum_offset 6) the TAP gets them as NEEDS_CSUM, A must complete the
//     checksum in software before the veth, and B receives them; so it
//     does when the socket completes the checksum itself (no offload);
//   - without the request (also with the metadata filled in but the
//     option bit clear) B drops them and counts UdpInCsumErrors;
//   - a control frame with a correct full checksum and no metadata
//     arrives.
func TestXSKChecksumThroughKernel(t *testing.T) {
	needRoot(t)
	const count = 5 // frames per case
	var (
		subnetA  = netip.MustParsePrefix("10.79.0.0/24") // the TAP link
		vethA    = netip.MustParsePrefix("10.79.1.1/24")
		vethB    = netip.MustParsePrefix("10.79.1.2/24")
		listenAP = netip.AddrPortFrom(vethB.Addr(), 9000)
	)
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "usit-xska", TAPName: "xsktap0", Subnet4: subnetA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	nsB, err := testbed.NewNetns("usit-xskb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nsB.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := testbed.NewVethPair(bed.NS, nsB, "xska", "xskb", 1500); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		ns   *testbed.Netns
		args []string
	}{
		{bed.NS, []string{"addr", "add", vethA.String(), "dev", "xska"}},
		{nsB, []string{"addr", "add", vethB.String(), "dev", "xskb"}},
		// Back to the TAP's subnet through A: a route for rp_filter, not a
		// default route.
		{nsB, []string{"route", "add", subnetA.String(), "via", vethA.Addr().String()}},
	} {
		if err := step.ns.IP(step.args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := bed.NS.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
	}); err != nil {
		t.Fatalf("ip_forward in %s: %v", bed.NS.Name, err)
	}
	// ethtool -K xska tx off, without ethtool (SIOCETHTOOL).
	if err := bed.NS.SetTxChecksum("xska", false); err != nil {
		t.Fatal(err)
	}
	if on, err := bed.NS.TxChecksum("xska"); err != nil || on {
		t.Fatalf("xska's tx checksumming after turning it off: got %v, %v; want off", on, err)
	}

	var tap *driver.TAP
	if err := bed.Open(func() (err error) {
		tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
		return err
	}); err != nil {
		if tap != nil {
			tap.Close()
		}
		t.Fatal(err)
	}
	// Registered after the bed's cleanup, so it runs first.
	t.Cleanup(func() { tap.Close() })
	mac, err := tap.HardwareAddr()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := nsB.ListenUDP(listenAP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	offload, err := xsk.New(xsk.Config{NumFrames: 64, FrameSize: 2048, TxMetadata: true, CsumOffload: true}, tap)
	if err != nil {
		t.Fatal(err)
	}
	software, err := xsk.New(xsk.Config{NumFrames: 64, FrameSize: 2048, TxMetadata: true}, tap)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(bed.StackAddr4.Addr(), 40000)

	// send writes frame b through s: with the checksum (and timestamp)
	// request if request is set, with the metadata filled in but the
	// option bit clear if fillOnly is set.
	frameNo := 0
	send := func(s *xsk.Socket, b []byte, request, fillOnly bool) {
		t.Helper()
		u := s.UMEM()
		addr := u.DataAddr(frameNo % u.NumFrames())
		frameNo++
		copy(u.Data(addr, len(b)), b)
		d := xsk.Desc{Addr: addr, Len: uint32(len(b))}
		md := u.Metadata(addr)
		md.SetFlags(0)
		if request || fillOnly {
			md.SetFlags(xsk.TxmdChecksum | xsk.TxmdTimestamp)
			md.SetChecksumRequest(header.EthernetMinimumSize+header.IPv4MinimumSize, 6)
		}
		if request {
			d.Options = xsk.OptTxMetadata
		}
		before := s.Now()
		got, idx := s.TX().Reserve(1)
		if got != 1 {
			t.Fatal("TX ring full")
		}
		*s.TX().Entry(idx) = d
		s.TX().Submit(1)
		if n, err := s.Kick(); n != 1 || err != nil {
			t.Fatalf("Kick: consumed %d, %v", n, err)
		}
		n, cidx := s.Completion().Peek(1)
		if n != 1 || *s.Completion().Entry(cidx) != addr {
			t.Fatalf("completion: %d entries", n)
		}
		s.Completion().Release(1)
		if request {
			if ts := md.TxTimestamp(); ts < before || ts > s.Now() {
				t.Errorf("TX timestamp %d outside [%d, %d]", ts, before, s.Now())
			}
		}
	}
	// expect reads datagrams until every payload in want has arrived
	// (failing on any other) or the timeout passes, and returns what is
	// missing.
	expect := func(want map[string]bool, timeout time.Duration) []string {
		t.Helper()
		buf := make([]byte, 2048)
		deadline := time.Now().Add(timeout)
		for len(want) > 0 && time.Now().Before(deadline) {
			conn.SetReadDeadline(deadline)
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			p := string(buf[:n])
			if !want[p] {
				t.Errorf("unexpected datagram from %v: %q", from, p)
				continue
			}
			delete(want, p)
		}
		var missing []string
		for p := range want {
			missing = append(missing, p)
		}
		return missing
	}
	frame := func(tag string, i int) xskFrame {
		payload := fmt.Appendf(nil, "xsk %s %d ", tag, i)
		for len(payload) < 100 {
			payload = append(payload, byte('a'+len(payload)%26))
		}
		f := buildXSKFrame(mac, src, listenAP, payload)
		// A zero checksum (no checksum over IPv4) would prove nothing; a
		// pseudo-header sum equal to the full checksum neither.
		if f.pseudo == 0 || f.full == 0 || f.pseudo == f.full {
			t.Fatalf("%s %d: degenerate checksums: pseudo %#x, full %#x", tag, i, f.pseudo, f.full)
		}
		return f
	}

	t.Run("control", func(t *testing.T) {
		want := map[string]bool{}
		for i := range count {
			f := frame("control", i)
			send(offload, f.withChecksum(f.full), false, false)
			want[string(f.payload)] = true
		}
		// Generous: the first frames wait for A's ARP on the veth.
		if missing := expect(want, 10*time.Second); len(missing) > 0 {
			t.Fatalf("control frames with a full checksum did not arrive: %q", missing)
		}
	})
	for _, tc := range []struct {
		name string
		s    *xsk.Socket
		stat string
	}{
		{"request-offload", offload, "tx_csum_offload"},
		{"request-software", software, "tx_csum_sw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := xskCounter(t, tc.s, tc.stat)
			want := map[string]bool{}
			for i := range count {
				f := frame(tc.name, i)
				send(tc.s, f.b, true, false)
				want[string(f.payload)] = true
			}
			if missing := expect(want, 5*time.Second); len(missing) > 0 {
				t.Fatalf("frames with a checksum request did not arrive: %q", missing)
			}
			if got := xskCounter(t, tc.s, tc.stat) - before; got != count {
				t.Errorf("%s: got %d, want %d", tc.stat, got, count)
			}
		})
	}
	t.Run("no-request", func(t *testing.T) {
		errsBefore := udpInCsumErrors(t, nsB)
		for i := range count {
			f := frame("no-request", i)
			// Half with the metadata asking for a checksum but the option
			// bit clear: the socket must not look at it.
			send(offload, f.b, false, i%2 == 1)
		}
		// A control frame after them: once it is in, the others, sent
		// earlier on the same path, have been delivered or dropped.
		f := frame("fence", 0)
		send(offload, f.withChecksum(f.full), false, false)
		if missing := expect(map[string]bool{string(f.payload): true}, 5*time.Second); len(missing) > 0 {
			t.Fatalf("fence frame did not arrive")
		}
		if got := udpInCsumErrors(t, nsB) - errsBefore; got != count {
			t.Errorf("UdpInCsumErrors in %s: rose by %d, want %d", nsB.Name, got, count)
		}
	})
	t.Logf("offload socket: %v", offload.Stats().String())
	t.Logf("software socket: %v", software.Stats().String())
}

func xskCounter(t *testing.T, s *xsk.Socket, name string) uint64 {
	t.Helper()
	var v uint64
	found := false
	s.Stats().Each(func(n string, x uint64) {
		if n == name {
			v, found = x, true
		}
	})
	if !found {
		t.Fatalf("xsk socket has no counter %q", name)
	}
	return v
}

// TestXSKGen runs `ustack xskgen` in all three modes, interleaved, and
// checks its report: every mode sent its share, the kernel socket in the
// namespace received every datagram (so the -m frames' offloaded checksums
// were completed and verified: xskgen fails on a checksum error), and the
// per-packet comparison against plain is printed for -M and -m.
func TestXSKGen(t *testing.T) {
	needRoot(t)
	bin := ustackBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "xskgen", "-s", "200", "-n", "6000", "-rounds", "3", "-t", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("ustack xskgen: %v\n%s", err, out)
	}
	s := string(out)
	for _, mode := range []string{"plain", "-M fill", "-m request"} {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(mode) + ` +sent 6000 packets \d+ bits, took [0-9.]+ sec, [0-9.]+ gbps [0-9.]+ mpps$`)
		if !re.MatchString(s) {
			t.Errorf("no seed-style line for mode %q in:\n%s", mode, s)
		}
	}
	if !strings.Contains(s, "kernel UDP socket received 18000 of 18000 datagrams") {
		t.Errorf("the kernel socket did not receive all 18000 datagrams:\n%s", s)
	}
	if !regexp.MustCompile(`-m request +counters: .*tx_csum_offload=6000 tx_timestamps=6000`).MatchString(s) {
		t.Errorf("-m did not offload 6000 checksums and stamp 6000 packets:\n%s", s)
	}
	for _, mode := range []string{"-M fill", "-m request"} {
		re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(mode) + ` .* [+-][0-9.]+ ns \([+-][0-9.]+\.\.[+-][0-9.]+\)`)
		if !re.MatchString(s) {
			t.Errorf("no paired comparison against plain for %q in:\n%s", mode, s)
		}
	}
}
