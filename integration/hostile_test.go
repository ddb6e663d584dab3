//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// hostileSrcMAC is the source address of injected frames: the stack does
// not look at it.
var hostileSrcMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}

// hostileClass is one kind of bad (or odd) frame the generator writes.
type hostileClass struct {
	name string
	// counter is the stack counter each frame of the class must land in:
	// a driver drop counter, or "" for frames the NIC model passes on
	// (gVisor's business: their effect is checked otherwise).
	counter string
	// vnet: the frame starts with a virtio-net header (written through the
	// PACKET_VNET_HDR socket).
	vnet bool
	gen  func(rng *rand.Rand) []byte
}

// hostileEnv is what the generators need to know about the rig.
type hostileEnv struct {
	stackMAC       [6]byte
	k4, s4, k6, s6 netip.Addr // the kernel's and the stack's addresses
	extraPort      uint16     // the stack's UDP socket for odd but valid datagrams
	lro            bool
}

// udpIP returns a valid UDP datagram from the kernel's address to the
// stack's (family v6) as an IP packet, for a caller to break. tcpIP is the
// same for a TCP segment.
func (e *hostileEnv) udpIP(v6 bool, dport uint16, payload []byte) []byte {
	src, dst := e.k4, e.s4
	if v6 {
		src, dst = e.k6, e.s6
	}
	return ipPacket(src, dst, uint8(header.UDPProtocolNumber),
		udpMessage(netip.AddrPortFrom(src, 40000), netip.AddrPortFrom(dst, dport), payload))
}

func (e *hostileEnv) tcpIP(v6 bool, dport uint16, payload []byte) []byte {
	src, dst := e.k4, e.s4
	if v6 {
		src, dst = e.k6, e.s6
	}
	return ipPacket(src, dst, uint8(header.TCPProtocolNumber),
		tcpSegment(netip.AddrPortFrom(src, 40001), netip.AddrPortFrom(dst, dport), 1, 1, header.TCPFlagAck, 1000, payload))
}

func etIP(v6 bool) uint16 {
	if v6 {
		return uint16(header.IPv6ProtocolNumber)
	}
	return uint16(header.IPv4ProtocolNumber)
}

// hostileClasses returns the frames that the NIC model must drop, each
// under its named counter, for IPv4 and IPv6 where both apply.
func hostileClasses(e *hostileEnv) []hostileClass {
	const closedPort = 6 // nothing listens there
	eth := func(v6 bool, ip []byte) []byte { return etherFrame(e.stackMAC, hostileSrcMAC, etIP(v6), ip) }
	pay := func(rng *rand.Rand, n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	var cs []hostileClass
	add := func(name, counter string, gen func(rng *rand.Rand) []byte) {
		cs = append(cs, hostileClass{name: name, counter: counter, gen: gen})
	}
	add("vlan-truncated", "rx_drop_short_ether", func(rng *rand.Rand) []byte {
		return etherFrame(e.stackMAC, hostileSrcMAC, 0x8100, pay(rng, 1+rng.IntN(3)))
	})
	add("unknown-ethertype", "rx_drop_unknown_ethertype", func(rng *rand.Rand) []byte {
		return etherFrame(e.stackMAC, hostileSrcMAC, 0x88b5, pay(rng, 46))
	})
	add("arp-truncated", "rx_drop_short_arp", func(rng *rand.Rand) []byte {
		return etherFrame(e.stackMAC, hostileSrcMAC, 0x0806, pay(rng, rng.IntN(28)))
	})
	add("vlan-tagged", "rx_drop_vlan", func(rng *rand.Rand) []byte {
		ip := e.udpIP(false, closedPort, pay(rng, 32))
		tag := make([]byte, 4+len(ip))
		binary.BigEndian.PutUint16(tag, 100) // VLAN 100
		binary.BigEndian.PutUint16(tag[2:], etIP(false))
		copy(tag[4:], ip)
		return etherFrame(e.stackMAC, hostileSrcMAC, 0x8100, tag)
	})
	add("other-mac", "rx_drop_other_host", func(rng *rand.Rand) []byte {
		return etherFrame([6]byte{0x02, 0, 0, 0, 0, 0x99}, hostileSrcMAC, etIP(false), e.udpIP(false, closedPort, pay(rng, 64)))
	})
	add("multicast-not-joined", "rx_drop_multicast", func(rng *rand.Rand) []byte {
		// 01:00:5e:01:02:03, the group of 224.1.2.3, which the stack
		// has not joined.
		return etherFrame([6]byte{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}, hostileSrcMAC, etIP(false), e.udpIP(false, closedPort, pay(rng, 64)))
	})
	add("jumbo", "rx_drop_too_big", func(rng *rand.Rand) []byte {
		// Above the stack's MTU of 1500, within the kernel side's 9000.
		return eth(false, e.udpIP(false, closedPort, pay(rng, 1500+rng.IntN(4000))))
	})
	for _, v6 := range []bool{false, true} {
		f := family(v6)
		add(f+"/ip-truncated", "rx_drop_short_ip", func(rng *rand.Rand) []byte {
			min := header.IPv4MinimumSize
			if v6 {
				min = header.IPv6MinimumSize
			}
			return eth(v6, e.udpIP(v6, closedPort, nil)[:rng.IntN(min)])
		})
		add(f+"/ip-version-lies", "rx_drop_bad_ip_version", func(rng *rand.Rand) []byte {
			// The EtherType of one family, the packet of the other.
			return eth(v6, e.udpIP(!v6, closedPort, pay(rng, 64)))
		})
		add(f+"/ip-length-beyond-frame", "rx_drop_bad_ip_len", func(rng *rand.Rand) []byte {
			ip := e.udpIP(v6, closedPort, pay(rng, 64))
			if v6 {
				header.IPv6(ip).SetPayloadLength(uint16(len(ip) + 1 + rng.IntN(1000)))
			} else {
				header.IPv4(ip).SetTotalLength(uint16(len(ip) + 1 + rng.IntN(1000)))
				fixIPv4Checksum(ip)
			}
			return eth(v6, ip)
		})
		add(f+"/tcp-truncated", "rx_drop_short_l4", func(rng *rand.Rand) []byte {
			ip := e.tcpIP(v6, closedPort, nil)
			return eth(v6, setIPLen(v6, ip[:len(ip)-1-rng.IntN(header.TCPMinimumSize)]))
		})
		add(f+"/udp-truncated", "rx_drop_short_l4", func(rng *rand.Rand) []byte {
			ip := e.udpIP(v6, closedPort, nil)
			return eth(v6, setIPLen(v6, ip[:len(ip)-1-rng.IntN(header.UDPMinimumSize)]))
		})
		add(f+"/tcp-offset-lies", "rx_drop_bad_tcp_off", func(rng *rand.Rand) []byte {
			ip := e.tcpIP(v6, closedPort, pay(rng, 8))
			l4 := ip[ipHdrLen(v6):]
			if rng.IntN(2) == 0 {
				l4[12] = byte(rng.IntN(5)) << 4 // < 5 words
			} else {
				l4[12] = 15 << 4 // 60 bytes, beyond the 28 there are
			}
			return eth(v6, ip)
		})
		add(f+"/udp-length-lies", "rx_drop_bad_udp_len", func(rng *rand.Rand) []byte {
			ip := e.udpIP(v6, closedPort, pay(rng, 64))
			l4 := header.UDP(ip[ipHdrLen(v6):])
			if rng.IntN(2) == 0 {
				l4.SetLength(uint16(rng.IntN(header.UDPMinimumSize)))
			} else {
				l4.SetLength(uint16(len(l4) + 1 + rng.IntN(100)))
			}
			return eth(v6, ip)
		})
		// A changed checksum can still be right: 0 and 0xffff are the
		// same in one's complement, and 0 is "none" in UDP over IPv4. Try
		// again until it is wrong.
		// The NIC model hands a bad checksum up as CHECKSUM_NONE (as
		// mlx5 does); the stack drops and counts it.
		add(f+"/tcp-bad-checksum", "tcp_checksum_errors", func(rng *rand.Rand) []byte {
			for {
				ip := e.tcpIP(v6, closedPort, pay(rng, 1+rng.IntN(1000)))
				l4 := header.TCP(ip[ipHdrLen(v6):])
				l4.SetChecksum(l4.Checksum() ^ uint16(1+rng.IntN(0xfffe)))
				if f := eth(v6, ip); oracleDrop(f) == "tcp_checksum_errors" {
					return f
				}
			}
		})
		add(f+"/udp-bad-checksum", "udp_checksum_errors", func(rng *rand.Rand) []byte {
			for {
				ip := e.udpIP(v6, e.extraPort, pay(rng, 1+rng.IntN(1000)))
				l4 := header.UDP(ip[ipHdrLen(v6):])
				l4.SetChecksum(l4.Checksum() ^ uint16(1+rng.IntN(0xfffe)))
				if f := eth(v6, ip); oracleDrop(f) == "udp_checksum_errors" {
					return f
				}
			}
		})
	}
	add("ipv4/ihl-lies", "rx_drop_bad_ihl", func(rng *rand.Rand) []byte {
		ip := e.udpIP(false, closedPort, nil) // 28 bytes
		if rng.IntN(2) == 0 {
			ip[0] = 0x40 | byte(rng.IntN(5)) // < 5 words
		} else {
			ip[0] = 0x4f // 60 bytes, beyond the 28 there are
		}
		return eth(false, ip)
	})
	add("ipv4/total-length-below-header", "rx_drop_bad_ip_len", func(rng *rand.Rand) []byte {
		ip := e.udpIP(false, closedPort, pay(rng, 16))
		header.IPv4(ip).SetTotalLength(uint16(rng.IntN(header.IPv4MinimumSize)))
		fixIPv4Checksum(ip)
		return eth(false, ip)
	})
	add("ipv4/bad-header-checksum", "ip_checksum_errors", func(rng *rand.Rand) []byte {
		ip := e.udpIP(false, e.extraPort, pay(rng, 64))
		header.IPv4(ip).SetChecksum(header.IPv4(ip).Checksum() ^ uint16(1+rng.IntN(0xfffe)))
		return eth(false, ip)
	})
	add("ipv6/exthdr-truncated", "rx_drop_bad_ipv6_exthdr", func(rng *rand.Rand) []byte {
		// A destination options header that claims more bytes than follow.
		ext := []byte{uint8(header.UDPProtocolNumber), byte(1 + rng.IntN(4)), 1, 4, 0, 0, 0, 0}
		return eth(true, ipv6Packet(e.k6, e.s6, 60, ext))
	})
	// Random bytes: kept only when the NIC model must drop them (the
	// driver's own parser is the oracle for which counter), so that every
	// one is accounted for.
	add("random", "(oracle)", func(rng *rand.Rand) []byte {
		for {
			b := pay(rng, header.EthernetMinimumSize+rng.IntN(1500))
			copy(b, e.stackMAC[:])
			switch rng.IntN(4) {
			case 0:
				binary.BigEndian.PutUint16(b[12:], etIP(false))
				if len(b) > 14 {
					b[14] = 0x45
				}
			case 1:
				binary.BigEndian.PutUint16(b[12:], etIP(true))
				if len(b) > 14 {
					b[14] = 0x60
				}
			}
			if oracleDrop(b) != "" {
				return b
			}
		}
	})
	// Virtio-net headers the kernel lets through from an AF_PACKET socket
	// (it refuses most bad ones itself: csum_start outside the frame, GSO
	// type and frame mismatch, GSO size 0, unknown flags).
	tinyGSO := "rx_drop_bad_gso" // 1400 segments of 1 byte: more than the NIC cuts
	if e.lro {
		tinyGSO = "" // LRO hands the super-frame up whole
	}
	cs = append(cs, hostileClass{name: "vnet/tso-gso-size-1", counter: tinyGSO, vnet: true, gen: func(rng *rand.Rand) []byte {
		return vnetFrame(driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOTCPv4, GSOSize: 1,
			CsumStart: 34, CsumOffset: 16}, eth(false, e.tcpIP(false, closedPort, pay(rng, 1100+rng.IntN(300)))))
	}})
	cs = append(cs, hostileClass{name: "vnet/tso-bad-ip-checksum", counter: "rx_drop_bad_ip_csum", vnet: true, gen: func(rng *rand.Rand) []byte {
		ip := e.tcpIP(false, closedPort, pay(rng, 1000+rng.IntN(400)))
		header.IPv4(ip).SetChecksum(header.IPv4(ip).Checksum() ^ uint16(1+rng.IntN(0xfffe)))
		return vnetFrame(driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOTCPv4, GSOSize: 100,
			CsumStart: 34, CsumOffset: 16}, eth(false, ip))
	}})
	return cs
}

// tryBogusVnet writes, once each, virtio-net headers that no honest
// sender writes. The kernel refuses most of them (the AF_PACKET socket
// checks the header as a TAP's writer would); any it lets through must be
// dropped under the counter given here, which is added to expect. It
// returns the names of the refused ones and the number tried.
func tryBogusVnet(t *testing.T, e *hostileEnv, vinj *testbed.Injector, expect map[string]int64) (refused []string, tried int) {
	t.Helper()
	tcp := etherFrame(e.stackMAC, hostileSrcMAC, etIP(false), e.tcpIP(false, 6, make([]byte, 1400)))
	udp := etherFrame(e.stackMAC, hostileSrcMAC, etIP(false), e.udpIP(false, 6, make([]byte, 1400)))
	const csum = driver.VirtioNetHdrFNeedsCsum
	bogus := []struct {
		name    string
		h       driver.VirtioNetHdr
		frame   []byte
		counter string
	}{
		{"gso-size-0", driver.VirtioNetHdr{Flags: csum, GSOType: driver.VirtioNetHdrGSOTCPv4, CsumStart: 34, CsumOffset: 16}, tcp, "rx_drop_bad_gso"},
		{"csum-start-beyond-frame", driver.VirtioNetHdr{Flags: csum, CsumStart: 2000, CsumOffset: 6}, udp, "rx_drop_bad_vnet_hdr"},
		{"unknown-flags", driver.VirtioNetHdr{Flags: 0xff}, udp, "rx_drop_bad_vnet_hdr"},
		{"tso6-on-ipv4", driver.VirtioNetHdr{Flags: csum, GSOType: driver.VirtioNetHdrGSOTCPv6, GSOSize: 100, CsumStart: 34, CsumOffset: 16}, tcp, "rx_drop_bad_gso"},
		{"tso-on-udp", driver.VirtioNetHdr{Flags: csum, GSOType: driver.VirtioNetHdrGSOTCPv4, GSOSize: 100, CsumStart: 34, CsumOffset: 6}, udp, "rx_drop_bad_gso"},
		{"unknown-gso-type", driver.VirtioNetHdr{Flags: csum, GSOType: 7, GSOSize: 100, CsumStart: 34, CsumOffset: 16}, tcp, "rx_drop_bad_gso"},
		{"uso-size-1", driver.VirtioNetHdr{Flags: csum, GSOType: driver.VirtioNetHdrGSOUDPL4, GSOSize: 1, CsumStart: 34, CsumOffset: 6}, udp, "rx_drop_bad_gso"},
	}
	for _, c := range bogus {
		switch err := vinj.Write(vnetFrame(c.h, c.frame)); {
		case err == nil:
			expect[c.counter]++
		case errors.Is(err, unix.EINVAL):
			refused = append(refused, c.name)
		default:
			t.Fatalf("bogus virtio-net header %s: %v", c.name, err)
		}
	}
	return refused, len(bogus)
}

// oracleDrop is the counter the NIC model must count a frame under when it
// comes without a virtio-net header's help (flags 0: checksums verified),
// or "" if it must pass it on.
func oracleDrop(frame []byte) string {
	var fi driver.FrameInfo
	if d := driver.ParseFrame(frame, &fi); d != driver.DropNone {
		return d.String()
	}
	if fi.VLAN {
		return "rx_drop_vlan"
	}
	switch driver.VerifyChecksums(frame, &fi, true) {
	case driver.DropNone:
	case driver.DropBadL4Csum:
		// Not dropped by the NIC model (CHECKSUM_NONE) but by the
		// stack's check (stack/csum.go).
		switch fi.L4 {
		case driver.L4TCP:
			return "tcp_checksum_errors"
		case driver.L4UDP:
			return "udp_checksum_errors"
		}
		return "ip_checksum_errors"
	case driver.DropBadIPCsum:
		return "ip_checksum_errors"
	default:
		return "rx_drop_bad_ip_len"
	}
	return ""
}

func ipHdrLen(v6 bool) int {
	if v6 {
		return header.IPv6MinimumSize
	}
	return header.IPv4MinimumSize
}

// setIPLen makes ip's length field agree with len(ip).
func setIPLen(v6 bool, ip []byte) []byte {
	if v6 {
		header.IPv6(ip).SetPayloadLength(uint16(len(ip) - header.IPv6MinimumSize))
	} else {
		header.IPv4(ip).SetTotalLength(uint16(len(ip)))
		fixIPv4Checksum(ip)
	}
	return ip
}

func fixIPv4Checksum(ip []byte) {
	h := header.IPv4(ip)
	h.SetChecksum(0)
	h.SetChecksum(^h.CalculateChecksum())
}

func vnetFrame(h driver.VirtioNetHdr, frame []byte) []byte {
	b := make([]byte, driver.VirtioNetHdrLen+len(frame))
	h.Encode(b)
	copy(b[driver.VirtioNetHdrLen:], frame)
	return b
}

// oddDatagrams returns frames of valid datagrams to the stack's extra
// port that take unusual paths: IPv4 options, IPv6 hop-by-hop options, and
// fragments (in and out of order), each carrying datagram seq in the
// fillDatagram format. bad fragment sets (overlapping with different bytes,
// or incomplete) carry garbage and must never be delivered.
func oddDatagrams(e *hostileEnv, v6 bool, seq uint32, rng *rand.Rand) (frames [][]byte, what string) {
	src, dst := e.k4, e.s4
	if v6 {
		src, dst = e.k6, e.s6
	}
	sap, dap := netip.AddrPortFrom(src, 40002), netip.AddrPortFrom(dst, e.extraPort)
	msg := make([]byte, 200+rng.IntN(1000))
	fillDatagram(msg, seq)
	udp := udpMessage(sap, dap, msg)
	eth := func(ip []byte) []byte { return etherFrame(e.stackMAC, hostileSrcMAC, etIP(v6), ip) }
	proto := uint8(header.UDPProtocolNumber)
	// frag returns the fragment of udp at [off, end).
	frag := func(id uint32, off, end int, data []byte) []byte {
		more := end < len(udp)
		if v6 {
			return eth(ipv6Packet(src, dst, 44, append(ipv6FragmentHeader(proto, off, more, id), data[off:end]...)))
		}
		var flags uint8
		if more {
			flags = header.IPv4FlagMoreFragments
		}
		return eth(ipv4Packet(src, dst, ipv4Fields{id: uint16(id), flags: flags, fragOff: uint16(off), protocol: proto}, data[off:end]))
	}
	id := rng.Uint32()
	cut := (len(udp)/3 + 7) &^ 7 // fragment offsets are multiples of 8
	switch k := rng.IntN(4); k {
	case 0: // options
		if v6 {
			hbh := []byte{proto, 0, 1, 4, 0, 0, 0, 0} // hop-by-hop, PadN
			return [][]byte{eth(ipv6Packet(src, dst, 0, append(hbh, udp...)))}, "options"
		}
		opts := header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
		return [][]byte{eth(ipv4Packet(src, dst, ipv4Fields{id: 7, options: opts, protocol: proto}, udp))}, "options"
	case 1: // three fragments, the last first
		return [][]byte{frag(id, 2*cut, len(udp), udp), frag(id, 0, cut, udp), frag(id, cut, 2*cut, udp)}, "fragments"
	case 2: // overlapping fragments that disagree
		bad := append([]byte(nil), udp...)
		for i := cut / 2; i < cut+cut/2; i++ {
			bad[i] ^= 0x5a
		}
		return [][]byte{frag(id, 0, cut, udp), frag(id, cut/2&^7, 2*cut, bad), frag(id, 2*cut, len(udp), udp)}, "overlap"
	default: // the first fragment only
		return [][]byte{frag(id, 0, cut, udp)}, "incomplete"
	}
}

// tcpFlowInfo is what the sniffer learned of the bulk flow's handshake.
type tcpFlowInfo struct {
	kernel, stack netip.AddrPort
	kernelISS     uint32 // the kernel's initial sequence number
	stackISS      uint32
}

// sniffHandshake reads the TAP's traffic until it has seen both halves of
// a handshake to the stack's port, or until timeout.
func sniffHandshake(sn *testbed.Injector, port uint16, timeout time.Duration) (tcpFlowInfo, error) {
	var info tcpFlowInfo
	var haveSyn, haveSynAck bool
	buf := make([]byte, 65536)
	end := time.Now().Add(timeout)
	for !(haveSyn && haveSynAck) {
		if time.Now().After(end) {
			return info, fmt.Errorf("no handshake to port %d seen in %v", port, timeout)
		}
		n, _, err := sn.ReadFrame(buf, 100*time.Millisecond)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return info, err
		}
		f := buf[:n]
		var fi driver.FrameInfo
		if driver.ParseFrame(f, &fi) != driver.DropNone || fi.L4 != driver.L4TCP {
			continue
		}
		ip := f[fi.L2Len:]
		var src, dst netip.Addr
		if fi.L3 == driver.L3IPv4 {
			src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		} else {
			src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		}
		t := header.TCP(ip[fi.L3Len:])
		switch {
		case t.Flags() == header.TCPFlagSyn && t.DestinationPort() == port:
			info.kernel = netip.AddrPortFrom(src, t.SourcePort())
			info.stack = netip.AddrPortFrom(dst, port)
			info.kernelISS = t.SequenceNumber()
			haveSyn = true
		case t.Flags() == header.TCPFlagSyn|header.TCPFlagAck && t.SourcePort() == port && haveSyn && t.DestinationPort() == info.kernel.Port():
			info.stackISS = t.SequenceNumber()
			haveSynAck = true
		}
	}
	return info, nil
}

// TestHostileFrames writes bad frames of every kind onto the TAP from the
// kernel's side while a bulk TCP flow and a UDP flow run through the same
// TAP: the flows must arrive intact, every bad frame must be dropped under
// its named counter, nothing may panic. Odd but valid datagrams (IP
// options, fragments) must arrive; bad fragment sets never. Segments that
// attack the TCP flow itself (old or out-of-window data with garbage,
// overlapping copies of the right bytes, an out-of-window RST, a SYN) must
// not change a byte of it.
func TestHostileFrames(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		v6, lro bool
		hwgro   driver.HWGROMode
	}{
		{v6: false, lro: true},
		{v6: true, lro: false, hwgro: driver.HWGROOn},
	} {
		name := fmt.Sprintf("%s/lro-%v/hw-gro-%s", family(tc.v6), tc.lro, tc.hwgro)
		t.Run(name, func(t *testing.T) {
			hostileRow(t, i, tc.v6, tc.lro, tc.hwgro)
		})
	}
}

func hostileRow(t *testing.T, row int, v6, lro bool, hwgro driver.HWGROMode) {
	const (
		n         = 32 << 20
		tcpPort   = 9
		udpPort   = 5353
		extraPort = 5354
		udpCount  = 3000
	)
	tl := record("TestHostileFrames")
	r := newRig(t, fmt.Sprintf("usit-hostile%d", row), 1500, driver.Config{LRO: lro, HWGRO: hwgro})
	w := watchPool(r.st)
	bed := r.bed
	// The kernel's side of the TAP may send jumbo frames; the stack's
	// MTU stays 1500, and its TCP MSS keeps the kernel's segments within.
	// A long transmit queue, so that the generator's bursts are not
	// dropped before the stack reads them (the test accounts for what
	// is dropped, tx_dropped, but every drop weakens its counts).
	if err := bed.NS.IP("link", "set", "dev", bed.TAPName, "mtu", "9000", "txqueuelen", "10000"); err != nil {
		t.Fatal(err)
	}
	// No TCP timestamps: the injected segments carry none, and a stack
	// that negotiated them would drop them unseen (RFC 7323 section 3.2).
	// (sysctl -w net.ipv4.tcp_timestamps=0, without procps' sysctl.)
	if err := bed.NS.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_timestamps", []byte("0"), 0)
	}); err != nil {
		t.Fatalf("tcp_timestamps in %s: %v", bed.NS.Name, err)
	}
	env := &hostileEnv{
		stackMAC: stack.DefaultMAC, lro: lro, extraPort: extraPort,
		k4: bed.KernelAddr4.Addr(), s4: bed.StackAddr4.Addr(), k6: bed.KernelAddr6.Addr(), s6: bed.StackAddr6.Addr(),
	}
	deadline := time.Now().Add(transferTimeout(n) + 60*time.Second)
	inj, err := bed.NS.NewInjector(testbed.InjectorConfig{Dev: bed.TAPName, MaxFrames: 200000, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	vinj, err := bed.NS.NewInjector(testbed.InjectorConfig{Dev: bed.TAPName, VnetHdr: true, MaxFrames: 20000, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	defer vinj.Close()
	sniff, err := bed.NS.NewInjector(testbed.InjectorConfig{Dev: bed.TAPName, Receive: true, MaxFrames: 1, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	defer sniff.Close()

	// The stack's sockets.
	l, err := r.st.ListenTCP(r.stackAP(v6, tcpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	u, err := r.st.ListenUDP(r.stackAP(v6, udpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	x, err := r.st.ListenUDP(r.stackAP(v6, extraPort))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()

	base := counters(r.st)
	linkBase, err := bed.NS.LinkStats(bed.TAPName)
	if err != nil {
		t.Fatal(err)
	}

	// The TCP flow: known bytes, so that injected copies of them can be
	// built, and a receiver that says how far it has read.
	data := make([]byte, n)
	randReader(uint64(700 + row)).Read(data)
	want := sha256.Sum256(data)
	var readSoFar atomic.Int64
	res := make(chan hashResult, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			res <- hashResult{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		pc := progressConn{c, deadline}
		res <- recvHashed(readerFunc(func(b []byte) (int, error) {
			m, err := pc.Read(b)
			readSoFar.Add(int64(m))
			return m, err
		}))
	}()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	kc, err := bed.NS.DialTCP(ctx, r.stackAP(v6, tcpPort), cc)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	flow, err := sniffHandshake(sniff, tcpPort, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sniff.Close() // it would copy every frame of the flow
	t.Logf("flow %v -> %v: kernel ISS %d, stack ISS %d", flow.kernel, flow.stack, flow.kernelISS, flow.stackISS)

	// The UDP flow from a kernel socket, paced by what the stack read.
	kudp, err := bed.NS.DialUDP(r.stackAP(v6, udpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer kudp.Close()
	udpRes := make(chan udpResult, 1)
	var udpRead atomic.Int64
	var udpSendDone atomic.Bool
	go func() { udpRes <- readDatagrams(u, udpCount, 1400, deadline, &udpRead, &udpSendDone) }()
	var wg sync.WaitGroup
	wg.Add(1)
	udpSent := 0
	go func() {
		defer wg.Done()
		defer udpSendDone.Store(true)
		msg := make([]byte, 1400)
		kudp.SetWriteDeadline(deadline)
		pace := udpPacer{read: &udpRead}
		for seq := uint32(0); seq < udpCount && time.Now().Before(deadline); seq++ {
			pace.wait(udpSent)
			fillDatagram(msg, seq)
			if _, err := kudp.Write(msg); err != nil {
				t.Errorf("udp sender: %v", err)
				return
			}
			udpSent++
		}
	}()

	// Odd datagrams: their receiver.
	extraRes := make(chan udpResult, 1)
	var extraDone atomic.Bool
	go func() { extraRes <- readDatagrams(x, 1<<30, 0, deadline, nil, &extraDone) }()

	// The TCP sender.
	sendErr := make(chan error, 1)
	go func() {
		kc.SetDeadline(deadline)
		pc := progressConn{kc, deadline}
		for off := 0; off < n; off += writeSize {
			if _, err := pc.Write(data[off:min(off+writeSize, n)]); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- kc.Close()
	}()

	// The generator: rounds of every class in random order, plus attacks
	// on the TCP flow and odd datagrams, until the flows are done (and at
	// least minRounds rounds were written).
	const minRounds, maxRounds = 20, 400
	classes := hostileClasses(env)
	rng := rand.New(rand.NewPCG(uint64(row), 99))
	sent := map[string]int{}
	expect := map[string]int64{}
	refused := map[string]int{}
	oddSent := map[string]int{}
	wantOdd := map[uint32]bool{}
	attacks := map[string]int{}
	tcpDone := make(chan struct{})
	var tcpGot hashResult
	go func() { tcpGot = waitHashQuiet(res, deadline); close(tcpDone) }()
	refusedBogus, tried := tryBogusVnet(t, env, vinj, expect)
	tl.bad.Add(int64(tried))
	seq := uint32(0)
	rounds := 0
gen:
	for ; rounds < maxRounds; rounds++ {
		select {
		case <-tcpDone:
			if rounds >= minRounds {
				break gen
			}
		default:
		}
		rng.Shuffle(len(classes), func(i, j int) { classes[i], classes[j] = classes[j], classes[i] })
		for _, c := range classes {
			f := c.gen(rng)
			w := inj
			if c.vnet {
				w = vinj
			}
			err := w.Write(f)
			switch {
			case errors.Is(err, testbed.ErrInjectLimit):
				break gen
			case err != nil:
				refused[c.name]++
				if !c.vnet {
					t.Fatalf("class %s: the kernel refused the frame: %v", c.name, err)
				}
				continue
			}
			sent[c.name]++
			tl.bad.Add(1)
			switch c.counter {
			case "":
			case "(oracle)":
				expect[oracleDrop(f)]++
			default:
				expect[c.counter]++
			}
		}
		// Odd datagrams, of both kinds.
		frames, what := oddDatagrams(env, v6, seq, rng)
		for _, f := range frames {
			if err := inj.Write(f); err != nil {
				break gen
			}
			tl.bad.Add(1)
		}
		oddSent[what]++
		if what == "options" || what == "fragments" {
			wantOdd[seq] = true
		}
		seq++
		// Attacks on the TCP flow.
		if got := readSoFar.Load(); got > 64<<10 && got < n-(64<<10) {
			for _, a := range tcpAttacks(env, flow, data, got, rng) {
				if err := inj.Write(a.frame); err != nil {
					break gen
				}
				attacks[a.what]++
				tl.bad.Add(1)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	<-tcpDone
	if err := <-sendErr; err != nil {
		t.Errorf("kernel TCP sender: %v", err)
	}
	wg.Wait()
	ok := checkHash(t, tcpGot, n, want)
	if !ok {
		diagnose(t, r)
	}
	recordTransfer(tl, n, ok)

	ur := <-udpRes
	checkUDPResult(t, "udp flow", ur, udpSent, 0.9)
	tl.checked.Add(ur.bytes)
	if len(ur.corrupt) == 0 && ur.err == nil {
		tl.load.Add(1)
	}
	// Let the odd datagrams' receiver see the last ones, then stop it.
	time.Sleep(500 * time.Millisecond)
	extraDone.Store(true)
	xr := <-extraRes
	if len(xr.corrupt) > 0 {
		t.Errorf("odd datagrams: %d delivered corrupted, want 0; first: %s", len(xr.corrupt), xr.corrupt[0])
	}
	tl.checked.Add(xr.bytes)
	arrived, stray := 0, 0
	for s := range xr.seen {
		if wantOdd[s] {
			arrived++
		} else {
			stray++
		}
	}
	if stray > 0 {
		t.Errorf("odd datagrams: %d from overlapping or incomplete fragment sets were delivered, want 0", stray)
	}

	// Every bad frame under its counter. Frames still on their way are
	// waited for; frames the TAP's queue dropped (tx_dropped) never came.
	linkNow, err := bed.NS.LinkStats(bed.TAPName)
	if err != nil {
		t.Fatal(err)
	}
	txDropped := int64(linkNow.TxDropped - linkBase.TxDropped)
	report := checkDropCounts(t, r.st, base, expect, txDropped)
	// A datagram whose frame the TAP's queue dropped never had a chance.
	if want := len(wantOdd)*9/10 - int(txDropped); arrived < want {
		t.Errorf("odd datagrams (IP options, fragments): %d of %d arrived, want at least %d (90%%, less the TAP's tx_dropped %d)", arrived, len(wantOdd), want, txDropped)
	}
	t.Logf("%d rounds; frames per class: %v", rounds, sent)
	t.Logf("drop counters got/want: %s", strings.Join(report, ", "))
	t.Logf("refused by the kernel: %v, and bogus virtio-net headers %v; tap tx_dropped %d", refused, refusedBogus, txDropped)
	t.Logf("odd datagrams sent %v, %d of %d good ones arrived; TCP attack segments %v", oddSent, arrived, len(wantOdd), attacks)
	c := counters(r.st)
	t.Logf("gVisor: ip_malformed %d tcp_invalid_segments %d tcp_checksum_errors %d udp_unknown_port %d udp_receive_buffer_errors %d",
		c["ip_malformed"], c["tcp_invalid_segments"], c["tcp_checksum_errors"], c["udp_unknown_port"], c["udp_receive_buffer_errors"])
	w.end(t, tl)
	r.close(t)
}

// checkDropCounts checks that, since base, each counter of expect grew by
// its expected count, less at most txDropped (frames the TAP's queue
// dropped before the stack could read them), and that no other frame was
// dropped but the kernel's multicast chatter (rx_drop_multicast may grow
// by more than expected). It waits up to 10 s for
// frames still on their way, and returns "counter got/want" for the log.
func checkDropCounts(t *testing.T, st *stack.Stack, base map[string]uint64, expect map[string]int64, txDropped int64) []string {
	t.Helper()
	// The kernel's own multicast chatter lands in rx_drop_multicast too:
	// that counter is checked for at least its share, and left out of the
	// total.
	// Counters other than rx_drop_* (the stack's checksum errors) are
	// not in rx_dropped.
	var total int64
	for k, v := range expect {
		if k != "rx_drop_multicast" && strings.HasPrefix(k, "rx_drop_") {
			total += v
		}
	}
	stackDone := func(d map[string]int64) bool {
		for k, v := range expect {
			if !strings.HasPrefix(k, "rx_drop_") && d[k] < v-txDropped {
				return false
			}
		}
		return true
	}
	var d map[string]int64
	for end := time.Now().Add(10 * time.Second); ; {
		d = map[string]int64{}
		for k, v := range counters(st) {
			d[k] = int64(v - base[k])
		}
		if d["rx_dropped"]-d["rx_drop_multicast"] >= total-txDropped && d["rx_drop_multicast"] >= expect["rx_drop_multicast"]-txDropped && stackDone(d) || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	names := make([]string, 0, len(expect))
	for k := range expect {
		names = append(names, k)
	}
	sort.Strings(names)
	var report []string
	for _, k := range names {
		got, want := d[k], expect[k]
		report = append(report, fmt.Sprintf("%s %d/%d", k, got, want))
		if k == "rx_drop_multicast" {
			if got < want-txDropped {
				t.Errorf("%s: got %d, want at least %d (tap tx_dropped %d)", k, got, want, txDropped)
			}
			continue
		}
		if got > want || got < want-txDropped {
			t.Errorf("%s: got %d, want %d (tap tx_dropped %d)", k, got, want, txDropped)
		}
	}
	if got := d["rx_dropped"] - d["rx_drop_multicast"]; got > total || got < total-txDropped {
		t.Errorf("rx_dropped (not counting multicast): got %d, want %d (the bad frames; tap tx_dropped %d): drops: %s", got, total, txDropped, dropReasons(st))
	}
	return report
}

// waitHashQuiet waits for a receiver's result until deadline plus a grace.
func waitHashQuiet(res <-chan hashResult, deadline time.Time) hashResult {
	select {
	case got := <-res:
		return got
	case <-time.After(time.Until(deadline) + 5*time.Second):
		return hashResult{err: errors.New("receiver did not finish by its deadline")}
	}
}

// tcpAttack is one injected segment aimed at the TCP flow.
type tcpAttack struct {
	what  string
	frame []byte
}

// tcpAttacks returns segments on the flow's own 4-tuple, from the kernel's
// side, given that the stack's application has read got bytes (so
// everything before got is acknowledged): old data with garbage, copies of
// the right bytes overlapping what is in flight, data and a RST far out of
// the window, a SYN.
func tcpAttacks(e *hostileEnv, f tcpFlowInfo, data []byte, got int64, rng *rand.Rand) []tcpAttack {
	seqAt := func(off int64) uint32 { return f.kernelISS + 1 + uint32(off) }
	ack := f.stackISS + 1
	frame := func(seq uint32, flags header.TCPFlags, payload []byte) []byte {
		return tcpFrame(e.stackMAC, hostileSrcMAC, f.kernel, f.stack, seq, ack, flags, 1000, payload)
	}
	garbage := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	var out []tcpAttack
	// Old: entirely before what the application read.
	if got > 32<<10 {
		off := got - int64(16<<10) - int64(rng.IntN(16<<10))
		out = append(out, tcpAttack{"old-garbage", frame(seqAt(off), header.TCPFlagAck|header.TCPFlagPsh, garbage(1+rng.IntN(1400)))})
	}
	// Overlapping copies of the right bytes around the receive point.
	for range 2 {
		off := got + int64(rng.IntN(256<<10)) - int64(rng.IntN(8<<10))
		end := min(off+1+int64(rng.IntN(1400)), int64(len(data)))
		if off >= 0 && off < end {
			out = append(out, tcpAttack{"overlap-right-bytes", frame(seqAt(off), header.TCPFlagAck, data[off:end])})
		}
	}
	far := got + 1<<30 + int64(rng.IntN(1<<20))
	out = append(out,
		tcpAttack{"out-of-window-garbage", frame(seqAt(far), header.TCPFlagAck, garbage(1+rng.IntN(1400)))},
		tcpAttack{"out-of-window-rst", frame(seqAt(far), header.TCPFlagRst, nil)},
	)
	if rng.IntN(8) == 0 {
		// RFC 5961 section 4: a SYN on a synchronized connection gets a
		// challenge ACK, it does not reset it.
		out = append(out, tcpAttack{"syn-in-established", frame(rng.Uint32(), header.TCPFlagSyn, nil)})
	}
	return out
}

// udpResult is what a datagram reader saw.
type udpResult struct {
	seen    map[uint32]bool
	corrupt []string
	dups    int
	bytes   int64
	err     error
}

// readDatagrams reads datagrams in fillDatagram format from u until it has
// count distinct ones, or the sender is done and nothing came for a
// while, or deadline. size, if not 0, is the only size accepted. read, if
// not nil, counts the datagrams read (for a pacing sender).
func readDatagrams(u net.PacketConn, count, size int, deadline time.Time, read *atomic.Int64, done *atomic.Bool) udpResult {
	rr := udpResult{seen: map[uint32]bool{}}
	buf := make([]byte, 65536)
	for len(rr.seen) < count && time.Now().Before(deadline) {
		u.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		m, _, err := u.ReadFrom(buf)
		if err != nil {
			if errTimeout(err) {
				if done.Load() {
					break
				}
				continue
			}
			rr.err = err
			break
		}
		if read != nil {
			read.Add(1)
		}
		seq, err := parseDatagram(buf[:m])
		switch {
		case err != nil:
			rr.corrupt = append(rr.corrupt, err.Error())
		case size != 0 && m != size:
			rr.corrupt = append(rr.corrupt, fmt.Sprintf("datagram %d of %d bytes, want %d bytes", seq, m, size))
		case rr.seen[seq]:
			rr.dups++
		default:
			rr.seen[seq] = true
			rr.bytes += int64(m)
		}
	}
	return rr
}

// checkUDPResult checks a datagram flow of sent datagrams: none corrupted
// or duplicated, at least share of them arrived.
func checkUDPResult(t *testing.T, what string, rr udpResult, sent int, share float64) {
	t.Helper()
	if rr.err != nil {
		t.Errorf("%s: receiver: %v", what, rr.err)
	}
	if len(rr.corrupt) > 0 {
		t.Errorf("%s: %d corrupted datagrams, want 0; first: %s", what, len(rr.corrupt), rr.corrupt[0])
	}
	if rr.dups > 0 {
		t.Errorf("%s: duplicated datagrams: got %d, want 0", what, rr.dups)
	}
	if got, want := len(rr.seen), int(share*float64(sent)); got < want {
		t.Errorf("%s: %d of %d datagrams arrived, want at least %d", what, got, sent, want)
	}
}
