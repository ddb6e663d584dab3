package driver

import (
	"encoding/binary"
	"testing"
)

func TestVirtioNetHdrRoundTrip(t *testing.T) {
	tests := []VirtioNetHdr{
		{},
		{Flags: VirtioNetHdrFNeedsCsum, GSOType: VirtioNetHdrGSOTCPv4, HdrLen: 66, GSOSize: 1448, CsumStart: 34, CsumOffset: 16},
		{Flags: VirtioNetHdrFNeedsCsum, GSOType: VirtioNetHdrGSOTCPv6 | VirtioNetHdrGSOECN, HdrLen: 86, GSOSize: 1428, CsumStart: 54, CsumOffset: 16},
		{Flags: VirtioNetHdrFDataValid, GSOType: VirtioNetHdrGSOUDPL4, HdrLen: 0xfffe, GSOSize: 0xffff, CsumStart: 0x8001, CsumOffset: 0x0102},
	}
	for _, want := range tests {
		var b [VirtioNetHdrLen]byte
		want.Encode(b[:])
		var got VirtioNetHdr
		if !got.Decode(b[:]) {
			t.Fatalf("Decode(%x): got false, want true", b)
		}
		if got != want {
			t.Errorf("Decode(Encode(%+v)): got %+v", want, got)
		}
	}
}

// TestVirtioNetHdrLayout checks the byte layout of struct virtio_net_hdr:
// two bytes, then four 16-bit fields in host byte order.
func TestVirtioNetHdrLayout(t *testing.T) {
	h := VirtioNetHdr{Flags: 0x01, GSOType: 0x81, HdrLen: 0x0203, GSOSize: 0x0405, CsumStart: 0x0607, CsumOffset: 0x0809}
	var want [VirtioNetHdrLen]byte
	want[0], want[1] = 0x01, 0x81
	for i, v := range []uint16{0x0203, 0x0405, 0x0607, 0x0809} {
		binary.NativeEndian.PutUint16(want[2+2*i:], v)
	}
	// Encode must write exactly VirtioNetHdrLen bytes.
	got := make([]byte, VirtioNetHdrLen+2)
	got[VirtioNetHdrLen], got[VirtioNetHdrLen+1] = 0xaa, 0xbb
	h.Encode(got)
	if string(got[:VirtioNetHdrLen]) != string(want[:]) {
		t.Errorf("Encode: got %x, want %x", got[:VirtioNetHdrLen], want)
	}
	if got[VirtioNetHdrLen] != 0xaa || got[VirtioNetHdrLen+1] != 0xbb {
		t.Errorf("Encode wrote beyond the header: got %x", got[VirtioNetHdrLen:])
	}
}

func TestVirtioNetHdrDecodeShort(t *testing.T) {
	want := VirtioNetHdr{Flags: 7, GSOSize: 9}
	for n := 0; n < VirtioNetHdrLen; n++ {
		got := want
		if got.Decode(make([]byte, n)) {
			t.Errorf("Decode(%d bytes): got true, want false", n)
		}
		if got != want {
			t.Errorf("Decode(%d bytes) changed the header: got %+v, want %+v", n, got, want)
		}
	}
	var h VirtioNetHdr
	if !h.Decode(make([]byte, VirtioNetHdrLen+100)) {
		t.Errorf("Decode(%d bytes): got false, want true", VirtioNetHdrLen+100)
	}
}

func TestVirtioNetHdrEncodeShortPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Encode(%d bytes): got no panic, want one", VirtioNetHdrLen-1)
		}
	}()
	var h VirtioNetHdr
	h.Encode(make([]byte, VirtioNetHdrLen-1))
}
