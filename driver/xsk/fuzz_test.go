package xsk

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
)

// checkWire checks every frame the socket writes: a virtio-net header that
// is all zero, or (offload only) NEEDS_CSUM with the checksum field inside
// the frame, followed by at least one byte.
type checkWire struct {
	offload bool
	frames  int
	bytes   uint64
	err     error
}

func (w *checkWire) Write(b []byte) error {
	w.frames++
	if len(b) <= vnetHdrLen {
		w.fail("frame of %d bytes with its header", len(b))
		return nil
	}
	w.bytes += uint64(len(b) - vnetHdrLen)
	flags := b[0]
	start := binary.NativeEndian.Uint16(b[6:])
	off := binary.NativeEndian.Uint16(b[8:])
	switch {
	case b[1] != 0 || b[2] != 0 || b[3] != 0 || b[4] != 0 || b[5] != 0:
		w.fail("GSO fields set: %x", b[:vnetHdrLen])
	case flags == 0 && (start != 0 || off != 0):
		w.fail("checksum offsets without NEEDS_CSUM: %x", b[:vnetHdrLen])
	case flags != 0 && (!w.offload || flags != vnetFNeedsCsum):
		w.fail("flags %#x (offload %v)", flags, w.offload)
	case flags != 0 && int(start)+int(off)+2 > len(b)-vnetHdrLen:
		w.fail("checksum field at %d+%d outside a %d-byte frame", start, off, len(b)-vnetHdrLen)
	}
	return nil
}

func (w *checkWire) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, args...)
	}
}

// fuzzRecordLen is the size of one descriptor record in FuzzTXDescriptors'
// input:
//
//	 0     1               9       13   14      15    17    19   20
//	+-----+---------------+-------+----+-------+-----+-----+----+
//	| sel |     addr      |  len  |opts|mdflags|start| off |kick|
//	+-----+---------------+-------+----+-------+-----+-----+----+
//
// sel's bits choose raw or plausible values: bit 0 a raw address (else a
// frame number 0-8 and an offset below 2100 from bytes 1-3), bit 1 a raw
// length (else below 2100), bit 2 raw option bits (else the two known
// ones), bit 3 raw metadata flags (else the two known ones), bit 4 raw
// checksum offsets (else below 128 and 16).
const fuzzRecordLen = 20

// FuzzTXDescriptors feeds a socket random descriptors and metadata,
// submitted and kicked in random groups, in copy or zero-copy mode, and
// checks that nothing panics, every descriptor is consumed and either
// completed once, in order, or counted in tx_invalid_descs, and every frame
// written is well-formed and counted. When a Kick fails with
// ErrBadMetadata (copy mode) the harness clears the metadata flags of
// every submitted packet, as an application would repair them, and goes
// on.
func FuzzTXDescriptors(f *testing.F) {
	rec := func(sel byte, frame byte, off uint16, l uint16, opts, mdflags byte, start, csumOff uint16, kick byte) []byte {
		b := make([]byte, fuzzRecordLen)
		b[0], b[1] = sel, frame
		binary.LittleEndian.PutUint16(b[2:], off)
		binary.LittleEndian.PutUint16(b[9:], l)
		b[13], b[14] = opts, mdflags
		binary.LittleEndian.PutUint16(b[15:], start)
		binary.LittleEndian.PutUint16(b[17:], csumOff)
		b[19] = kick
		return b
	}
	f.Add(byte(0), slices.Concat(
		rec(0, 0, 80, 100, 0, 0, 0, 0, 1),
		rec(0, 1, 80, 100, OptTxMetadata, TxmdChecksum|TxmdTimestamp, 34, 6, 0),
		rec(0, 8, 80, 100, 0, 0, 0, 0, 1)))
	f.Add(byte(0b0111), slices.Concat(
		rec(0, 0, 80, 100, OptPktContd|OptTxMetadata, TxmdChecksum, 34, 6, 0),
		rec(0, 1, 80, 100, OptPktContd, 0, 0, 0, 1),
		rec(0, 2, 80, 100, OptTxMetadata, TxmdTimestamp, 0, 0, 1)))
	f.Add(byte(0b1101), slices.Concat(
		rec(1, 0xff, 0xffff, 100, 0, 0, 0, 0, 0),
		rec(2, 0, 64, 0xffff, 0, 0, 0, 0, 0),
		rec(4|8, 3, 90, 100, 0xfe, 0xff, 0, 0, 1),
		rec(16, 3, 90, 100, OptTxMetadata, TxmdChecksum, 0xffff, 0xffff, 1)))
	// The same in zero-copy mode, with bad metadata among them.
	f.Add(byte(0x80|0b0111), slices.Concat(
		rec(0, 0, 80, 100, OptPktContd|OptTxMetadata, TxmdChecksum, 34, 6, 0),
		rec(0, 1, 80, 100, OptPktContd, 0, 0, 0, 1),
		rec(8, 2, 80, 100, OptTxMetadata, 0xff, 0, 0, 1)))
	f.Add(byte(0x80|0b1101), slices.Concat(
		rec(1, 0xff, 0xffff, 100, 0, 0, 0, 0, 0),
		rec(4|8, 3, 90, 100, 0xfe, 0xff, 0, 0, 1),
		rec(16, 3, 90, 100, OptTxMetadata, TxmdChecksum, 0xffff, 0xffff, 1)))
	f.Fuzz(func(t *testing.T, mode byte, data []byte) {
		cfg := Config{NumFrames: 8, FrameSize: 2048, TxSize: 64, CompSize: 64,
			MultiBuffer: mode&1 != 0, CsumOffload: mode&2 != 0, ZeroCopy: mode&0x80 != 0,
			ringStart: math.MaxUint32 - uint32(mode)}
		if !cfg.MultiBuffer && mode&0x40 != 0 {
			cfg.TxSize, cfg.CompSize = 16, 8
		}
		switch mode >> 2 & 3 {
		case 1:
			cfg.TxMetadataLen = 16
		case 2:
			cfg.TxMetadataLen = 24
		case 3:
			cfg.TxMetadataLen, cfg.Headroom = 16, 64
		}
		w := &checkWire{offload: cfg.CsumOffload}
		s := newTestSocket(t, cfg, w)
		u := s.UMEM()
		for i := range u.Bytes() {
			u.Bytes()[i] = byte(i * 7)
		}
		var submitted, completed []uint64
		var consumed int
		kick := func() {
			n, err := s.Kick()
			consumed += n
			switch {
			case err == ErrBadMetadata && !cfg.ZeroCopy:
				for _, a := range submitted {
					if ml := uint64(cfg.TxMetadataLen); a >= ml && a <= u.Size() {
						u.Metadata(a).SetFlags(0)
					}
				}
			case err != nil:
				t.Fatalf("Kick: %v", err)
			}
			completed = append(completed, reap(s)...)
		}
		put := func(d Desc) {
			for tries := 0; s.TX().Free(1) == 0; tries++ {
				if tries == 5 {
					t.Fatalf("TX ring stays full: %d submitted, %d completed", len(submitted), len(completed))
				}
				kick()
			}
			_, idx := s.TX().Reserve(1)
			*s.TX().Entry(idx) = d
			s.TX().Submit(1)
			submitted = append(submitted, d.Addr)
		}
		for len(data) >= fuzzRecordLen {
			b := data[:fuzzRecordLen]
			data = data[fuzzRecordLen:]
			sel := b[0]
			var d Desc
			if sel&1 == 0 {
				d.Addr = uint64(b[1]%9)*2048 + uint64(binary.LittleEndian.Uint16(b[2:])%2100)
			} else {
				d.Addr = binary.LittleEndian.Uint64(b[1:])
			}
			if sel&2 == 0 {
				d.Len = uint32(binary.LittleEndian.Uint16(b[9:]) % 2100)
			} else {
				d.Len = binary.LittleEndian.Uint32(b[9:])
			}
			d.Options = uint32(b[13])
			if sel&4 == 0 {
				d.Options &= OptPktContd | OptTxMetadata
			} else {
				d.Options <<= sel >> 5 * 4
			}
			if cfg.TxMetadataLen == 0 && !cfg.ZeroCopy {
				// Without metadata to repair, the descriptor would stay
				// at the head of the ring for good, as in the kernel.
				d.Options &^= OptTxMetadata
			}
			flags := uint64(b[14])
			if sel&8 == 0 {
				flags &= txmdValid
			} else {
				flags <<= sel >> 5 * 8
			}
			start, csumOff := binary.LittleEndian.Uint16(b[15:]), binary.LittleEndian.Uint16(b[17:])
			if sel&16 == 0 {
				start, csumOff = start%128, csumOff%16
			}
			if ml := uint64(cfg.TxMetadataLen); ml != 0 && d.Addr >= ml && d.Addr <= u.Size() {
				md := u.Metadata(d.Addr)
				md.SetFlags(flags)
				md.SetChecksumRequest(start, csumOff)
			}
			put(d)
			if b[19]&1 != 0 {
				kick()
			}
		}
		// End any open multi-buffer packet, then drain.
		put(Desc{Addr: u.DataAddr(0), Len: 60})
		for tries := 0; consumed < len(submitted); tries++ {
			if tries == len(submitted)+10 {
				t.Fatalf("stalled: %d submitted, %d consumed; counters %v", len(submitted), consumed, nonZero(s))
			}
			kick()
		}
		if !isSubsequence(completed, submitted) {
			t.Fatalf("completions are not the submissions' in order:\n got %x\nfrom %x", completed, submitted)
		}
		if w.err != nil {
			t.Fatal(w.err)
		}
		c := counters(s)
		if c["tx_packets"] != uint64(w.frames) || c["tx_bytes"] != w.bytes || c["tx_errors"] != 0 {
			t.Errorf("counters %v; wire saw %d frames of %d bytes", nonZero(s), w.frames, w.bytes)
		}
		if uint64(len(completed))+c["tx_invalid_descs"] != uint64(len(submitted)) {
			t.Errorf("%d completed and %d invalid of %d descriptors: counters %v", len(completed), c["tx_invalid_descs"], len(submitted), nonZero(s))
		}
		if c["tx_packets"] > uint64(len(completed)) {
			t.Errorf("more packets than completions: %v for %d completions", nonZero(s), len(completed))
		}
		if c["tx_csum_offload"]+c["tx_csum_sw"] > c["tx_packets"] || c["tx_timestamps"] > c["tx_packets"] {
			t.Errorf("offloads beyond packets: %v", nonZero(s))
		}
	})
}

// isSubsequence reports whether sub is seq with some elements left out.
func isSubsequence(sub, seq []uint64) bool {
	i := 0
	for _, v := range seq {
		if i < len(sub) && sub[i] == v {
			i++
		}
	}
	return i == len(sub)
}
