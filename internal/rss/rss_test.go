package rss

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestVectors pins the tables and Hash to the specification's results,
// IPv4 and IPv6, with and without ports.
func TestVectors(t *testing.T) {
	tab := Default()
	for _, v := range SpecVectors {
		t.Run(v.Src, func(t *testing.T) {
			src, dst := netip.MustParseAddr(v.Src).AsSlice(), netip.MustParseAddr(v.Dst).AsSlice()
			ports := binary.BigEndian.AppendUint16(nil, v.SPort)
			ports = binary.BigEndian.AppendUint16(ports, v.DPort)
			if got := tab.Hash(src, dst, nil); got != v.Addrs {
				t.Errorf("addresses: got %#08x, want %#08x", got, v.Addrs)
			}
			if got := tab.Hash(src, dst, ports); got != v.TCP {
				t.Errorf("addresses and ports: got %#08x, want %#08x", got, v.TCP)
			}
			in := append(append(append([]byte{}, src...), dst...), ports...)
			if got := tab.Bytes(0, in); got != v.TCP {
				t.Errorf("Bytes of the 4-tuple: got %#08x, want %#08x", got, v.TCP)
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
