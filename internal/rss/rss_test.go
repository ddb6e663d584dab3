package rss

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// vector is one row of the RSS specification's verification suite
// ("Verifying the RSS Hash Calculation"): the hash of the addresses alone
// and of the addresses and ports (the TCP 4-tuple), for Key.
type vector struct {
	src, dst     string
	sport, dport uint16
	addrs, tcp   uint32
}

var vectors = []vector{
	{"66.9.149.187", "161.142.100.80", 2794, 1766, 0x323e8fc2, 0x51ccc178},
	{"199.92.111.2", "65.69.140.83", 14230, 4739, 0xd718262a, 0xc626b0ea},
	{"24.19.198.95", "12.22.207.184", 12898, 38024, 0xd2d0a5de, 0x5c2b394a},
	{"38.27.205.30", "209.142.163.6", 48228, 2217, 0x82989176, 0xafc7327f},
	{"153.39.163.191", "202.188.127.2", 44251, 1303, 0x5d1809c5, 0x10e828a2},
	{"3ffe:2501:200:1fff::7", "3ffe:2501:200:3::1", 2794, 1766, 0x2cc18cd5, 0x40207d3d},
	{"3ffe:501:8::260:97ff:fe40:efab", "ff02::1", 14230, 4739, 0x0f0c461c, 0xdde51bbf},
	{"3ffe:1900:4545:3:200:f8ff:fe21:67cf", "fe80::200:f8ff:fe21:67cf", 44251, 38024, 0x4b61e985, 0x02d1feef},
}

// TestVectors pins the tables and Hash to the specification's results,
// IPv4 and IPv6, with and without ports.
func TestVectors(t *testing.T) {
	tab := Default()
	for _, v := range vectors {
		t.Run(v.src, func(t *testing.T) {
			src, dst := netip.MustParseAddr(v.src).AsSlice(), netip.MustParseAddr(v.dst).AsSlice()
			ports := binary.BigEndian.AppendUint16(nil, v.sport)
			ports = binary.BigEndian.AppendUint16(ports, v.dport)
			if got := tab.Hash(src, dst, nil); got != v.addrs {
				t.Errorf("addresses: got %#08x, want %#08x", got, v.addrs)
			}
			if got := tab.Hash(src, dst, ports); got != v.tcp {
				t.Errorf("addresses and ports: got %#08x, want %#08x", got, v.tcp)
			}
			in := append(append(append([]byte{}, src...), dst...), ports...)
			if got := tab.Bytes(0, in); got != v.tcp {
				t.Errorf("Bytes of the 4-tuple: got %#08x, want %#08x", got, v.tcp)
			}
		})
	}
}

// TestKeyCyclic pins the key's cyclic reading past its 40 bytes: the
// 37th input byte (MaxInput-1) uses key bytes 36..39 and 0.
func TestKeyCyclic(t *testing.T) {
	tab := Default()
	// Input bit 0 (MSB) of byte 36 selects key bits 288..319.
	if got, want := tab.Byte(MaxInput-1, 0x80), binaryBE32(Key[36:40]); got != want {
		t.Errorf("byte 36, bit 0: got %#08x, want %#08x", got, want)
	}
	// Bit 7 of byte 36 selects key bits 295..326: Key[36] low bit on,
	// Key[37..39], then the top 7 bits of Key[0].
	w := uint64(binaryBE32(Key[36:40]))<<8 | uint64(Key[0])
	if got, want := tab.Byte(MaxInput-1, 0x01), uint32(w>>1); got != want {
		t.Errorf("byte 36, bit 7: got %#08x, want %#08x", got, want)
	}
}

func binaryBE32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

func TestHashNoAllocs(t *testing.T) {
	tab := Default()
	src, dst, ports := make([]byte, 16), make([]byte, 16), make([]byte, 4)
	if a := testing.AllocsPerRun(100, func() { _ = tab.Hash(src, dst, ports) }); a != 0 {
		t.Errorf("allocations per hash: got %v, want 0", a)
	}
}
