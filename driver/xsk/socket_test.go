package xsk

import (
	"bytes"
	"errors"
	"math"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/ustack/ustack/driver"
)

var (
	_ Wire = (*driver.MemWire)(nil)
	_ Wire = (*driver.TAP)(nil)
)

// TestConstants pins the numbers the socket shares with the kernel's UAPI
// and with package driver.
func TestConstants(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"vnetHdrLen (driver.VirtioNetHdrLen)", vnetHdrLen, driver.VirtioNetHdrLen},
		{"vnetFNeedsCsum (VIRTIO_NET_HDR_F_NEEDS_CSUM)", vnetFNeedsCsum, driver.VirtioNetHdrFNeedsCsum},
		{"XDP_PKT_CONTD", OptPktContd, 1 << 0},
		{"XDP_TX_METADATA", OptTxMetadata, 1 << 1},
		{"XDP_TXMD_FLAGS_TIMESTAMP", TxmdTimestamp, 1 << 0},
		{"XDP_TXMD_FLAGS_CHECKSUM", TxmdChecksum, 1 << 1},
		{"sizeof(struct xsk_tx_metadata)", TxMetadataSize, 16},
		{"sizeof(struct xdp_desc)", int(unsafeSizeofDesc()), 16},
		{"XDP_UMEM_MIN_CHUNK_SIZE", MinFrameSize, 2048},
		{"MAX_SKB_FRAGS", MaxFrags, 17},
		{"maxTxDescs (MAX_SKB_FRAGS + 1, struct xsk_addrs)", maxTxDescs, 18},
		{"kickBatch > maxTxDescs", boolInt(kickBatch > maxTxDescs), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, c.got, c.want)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestNewConfig(t *testing.T) {
	w := new(discardWire)
	bad := []struct {
		name string
		cfg  Config
		w    Wire
	}{
		{"nil wire", Config{}, nil},
		{"frame size not a power of two", Config{FrameSize: 3000}, w},
		{"frame size below 2048", Config{FrameSize: 1024}, w},
		{"frame size above 64K", Config{FrameSize: 1 << 17}, w},
		{"negative frames", Config{NumFrames: -1}, w},
		{"metadata len below 16", Config{TxMetadataLen: 8}, w},
		{"metadata len not a multiple of 8", Config{TxMetadataLen: 20}, w},
		{"metadata len 256", Config{TxMetadataLen: 256}, w},
		{"negative headroom", Config{Headroom: -1}, w},
		{"headroom fills the frame", Config{FrameSize: 2048, Headroom: 2000}, w},
		{"ring size not a power of two", Config{TxSize: 3}, w},
		{"ring size too big", Config{CompSize: 1 << 25}, w},
		{"multi-buffer with a small TX ring", Config{MultiBuffer: true, TxSize: 16}, w},
		{"multi-buffer with a small completion ring", Config{MultiBuffer: true, CompSize: 32}, w},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg, tt.w); !errors.Is(err, ErrConfig) {
				t.Errorf("got %v, want ErrConfig", err)
			}
		})
	}
	good := []struct {
		name                  string
		cfg                   Config
		frames, size, mdLen   int
		dataRoom, txSize, cqs int
	}{
		{"zero value", Config{}, DefaultNumFrames, DefaultFrameSize, 0, DefaultFrameSize, DefaultRingSize, DefaultRingSize},
		{"TxMetadata defaults to 16", Config{TxMetadata: true, Headroom: 32}, DefaultNumFrames, DefaultFrameSize, 16, DefaultFrameSize - 48, DefaultRingSize, DefaultRingSize},
		{"explicit", Config{NumFrames: 10, FrameSize: 2048, TxMetadataLen: 24, TxSize: 16, CompSize: 32}, 10, 2048, 24, 2048 - 24, 16, 32},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSocket(t, tt.cfg, w)
			u := s.UMEM()
			if u.NumFrames() != tt.frames || u.FrameSize() != tt.size || u.TxMetadataLen() != tt.mdLen ||
				u.DataRoom() != tt.dataRoom || len(u.Bytes()) != tt.frames*tt.size {
				t.Errorf("UMEM: got %d frames of %d, md %d, room %d, %d bytes; want %d of %d, md %d, room %d",
					u.NumFrames(), u.FrameSize(), u.TxMetadataLen(), u.DataRoom(), len(u.Bytes()), tt.frames, tt.size, tt.mdLen, tt.dataRoom)
			}
			if got := s.TX().Size(); int(got) != tt.txSize {
				t.Errorf("TX size: got %d, want %d", got, tt.txSize)
			}
			if got := s.Completion().Size(); int(got) != tt.cqs {
				t.Errorf("completion size: got %d, want %d", got, tt.cqs)
			}
		})
	}
}

// validationConfig is the socket of TestTXValidation: 8 frames of 2048
// bytes, 64 bytes of headroom and 16 of metadata, so DataAddr is 80 bytes
// into a frame and a frame holds 1968 bytes from there.
func validationConfig(multiBuffer, zeroCopy bool) Config {
	return Config{NumFrames: 8, FrameSize: 2048, Headroom: 64, TxMetadataLen: 16, TxSize: 64, CompSize: 64,
		MultiBuffer: multiBuffer, ZeroCopy: zeroCopy, ringStart: math.MaxUint32 - 20}
}

// What the kernel does with one TX descriptor, in TestTXValidation.
const (
	// outSent: sent (or part of a packet sent) and completed.
	outSent = 's'
	// outInvalid: consumed, counted in tx_invalid_descs, never completed
	// (xskq_cons_is_valid_desc, xsk_drop_skb); Kick stops after it.
	outInvalid = 'i'
	// outBadMD: bad metadata on a packet's first descriptor
	// (tx_bad_metadata). Copy mode: Kick fails with ErrBadMetadata and
	// leaves the descriptor in the TX ring, to be sent once repaired;
	// zero-copy: sent without offloads. Completed either way.
	outBadMD = 'b'
)

// TestTXValidation submits descriptors the socket must reject, followed by
// a good one, in copy and zero-copy mode, and kicks until every one is
// consumed: each bad one is counted under its counter as the kernel counts
// it, only the sent ones are completed, in order, and the good one still
// goes out. In copy mode a descriptor with bad metadata fails the Kick and
// stays at the head of the ring: the test repairs it there (clears
// OptTxMetadata in its ring slot, as an application may: the kernel reads
// a descriptor it has not consumed again on the next sendto) and it goes
// out on the next Kick.
func TestTXValidation(t *testing.T) {
	const (
		fs      = 2048
		dataOff = 80
		size    = 8 * fs
	)
	d0 := uint64(dataOff)
	setMD := func(flags uint64, start, off uint16) func(TxMetadata) {
		return func(m TxMetadata) {
			m.SetFlags(flags)
			m.SetChecksumRequest(start, off)
		}
	}
	type mdDesc struct {
		d   Desc
		md  func(TxMetadata) // written before d.Addr, if set
		out byte             // outSent, outInvalid or outBadMD
	}
	plain := func(addr uint64, l uint32, out byte) mdDesc { return mdDesc{d: Desc{Addr: addr, Len: l}, out: out} }
	opt := func(addr uint64, l, o uint32, out byte) mdDesc {
		return mdDesc{d: Desc{Addr: addr, Len: l, Options: o}, out: out}
	}
	withMD := func(addr uint64, l, o uint32, md func(TxMetadata), out byte) mdDesc {
		return mdDesc{d: Desc{Addr: addr, Len: l, Options: OptTxMetadata | o}, md: md, out: out}
	}
	chain := func(n int) []mdDesc {
		var ds []mdDesc
		for i := range n - 1 {
			ds = append(ds, opt(uint64(i%8)*fs+d0, 60, OptPktContd, outSent))
		}
		return append(ds, plain(d0, 60, outSent))
	}
	tests := []struct {
		name        string
		noMetadata  bool // socket without TxMetadataLen
		multiBuffer bool
		descs       []mdDesc
		sent        int // packets written
	}{
		{name: "good", descs: []mdDesc{plain(d0, 100, 's')}, sent: 1},
		{name: "addr past the UMEM", descs: []mdDesc{plain(size+d0, 100, 'i')}},
		{name: "addr near 2^64", descs: []mdDesc{plain(math.MaxUint64-50, 40, 'i')}},
		{name: "addr at the UMEM's end", descs: []mdDesc{plain(size, 1, 'i')}},
		{name: "len past the frame", descs: []mdDesc{plain(d0, fs-dataOff+1, 'i')}},
		{name: "len fills the frame", descs: []mdDesc{plain(d0, fs-dataOff, 's')}, sent: 1},
		{name: "len 2^32-1", descs: []mdDesc{plain(d0, math.MaxUint32, 'i')}},
		{name: "crosses into the next frame", descs: []mdDesc{plain(fs+1900, 200, 'i')}},
		{name: "crosses the UMEM's end", descs: []mdDesc{plain(7*fs+1900, 200, 'i')}},
		{name: "empty", descs: []mdDesc{plain(d0, 0, 'i')}},
		{name: "metadata would start in the previous frame", descs: []mdDesc{plain(fs+10, 100, 'i')}},
		{name: "in the headroom, metadata in the frame", descs: []mdDesc{plain(fs+16, 100, 's')}, sent: 1},
		{name: "frame start without metadata", noMetadata: true, descs: []mdDesc{plain(fs, 100, 's')}, sent: 1},
		{name: "unknown option", descs: []mdDesc{opt(d0, 100, 1<<2, 'i')}},
		{name: "high option bit", descs: []mdDesc{opt(d0, 100, 1<<31, 'i')}},
		{name: "XDP_PKT_CONTD without MultiBuffer", descs: []mdDesc{opt(d0, 100, OptPktContd, 'i')}},
		{name: "metadata: unknown flag", descs: []mdDesc{withMD(d0, 100, 0, setMD(1<<2, 0, 0), 'b')}, sent: 1},
		{name: "metadata: high flag", descs: []mdDesc{withMD(d0, 100, 0, setMD(1<<63|TxmdTimestamp, 0, 0), 'b')}, sent: 1},
		{name: "metadata: no flags", descs: []mdDesc{withMD(d0, 100, 0, setMD(0, 0, 0), 's')}, sent: 1},
		{name: "checksum field ends at the data's end", descs: []mdDesc{withMD(d0, 100, 0, setMD(TxmdChecksum, 90, 8), 's')}, sent: 1},
		{name: "checksum field past the data's end", descs: []mdDesc{withMD(d0, 100, 0, setMD(TxmdChecksum, 90, 9), 'b')}, sent: 1},
		{name: "checksum start past the data", descs: []mdDesc{withMD(d0, 100, 0, setMD(TxmdChecksum, 200, 0), 'b')}, sent: 1},
		{name: "checksum offsets 0xffff", descs: []mdDesc{withMD(d0, 1000, 0, setMD(TxmdChecksum, 0xffff, 0xffff), 'b')}, sent: 1},
		{name: "metadata on a socket without metadata", noMetadata: true, descs: []mdDesc{opt(64, 100, OptTxMetadata, 'b')}, sent: 1},
		{name: "invalid and metadata: address first", descs: []mdDesc{withMD(size+d0, 100, 0, nil, 'i')}},
		{name: "several", descs: []mdDesc{
			plain(size, 10, 'i'), plain(d0, 100, 's'), withMD(fs+d0, 100, 0, setMD(1<<5, 0, 0), 'b'),
			plain(2*fs+d0, 100, 's'), opt(3*fs+d0, 10, 1<<7, 'i'),
		}, sent: 3},
		{name: "multi-buffer: good", multiBuffer: true, descs: []mdDesc{
			withMD(d0, 100, OptPktContd, setMD(TxmdChecksum, 34, 6), 's'), opt(fs+d0, 100, OptPktContd, 's'), plain(2*fs+d0, 100, 's'),
		}, sent: 1},
		{name: "multi-buffer: metadata on the second chunk ignored", multiBuffer: true, descs: []mdDesc{
			opt(d0, 100, OptPktContd, 's'), withMD(fs+d0, 100, OptPktContd, setMD(1<<5, 0xffff, 0), 's'), plain(2*fs+d0, 100, 's'),
		}, sent: 1},
		{name: "multi-buffer: metadata on the last chunk ignored", multiBuffer: true, descs: []mdDesc{
			opt(d0, 100, OptPktContd, 's'), withMD(fs+d0, 100, 0, setMD(TxmdChecksum, 0xffff, 0xffff), 's'),
		}, sent: 1},
		{name: "multi-buffer: metadata on a socket without metadata, later chunk", noMetadata: true, multiBuffer: true, descs: []mdDesc{
			opt(64, 100, OptPktContd, 's'), opt(fs+64, 100, OptTxMetadata, 's'),
		}, sent: 1},
		{name: "multi-buffer: invalid middle chunk", multiBuffer: true, descs: []mdDesc{
			// xsk_drop_skb drops the first two; the third is a packet of
			// its own.
			opt(d0, 100, OptPktContd, 'i'), opt(size+d0, 100, OptPktContd, 'i'), plain(2*fs+d0, 100, 's'),
		}, sent: 1},
		{name: "multi-buffer: checksum past the first chunk", multiBuffer: true, descs: []mdDesc{
			withMD(d0, 40, OptPktContd, setMD(TxmdChecksum, 34, 6), 'b'), plain(fs+d0, 100, 's'),
		}, sent: 1},
		{name: "multi-buffer: unknown option", multiBuffer: true, descs: []mdDesc{
			opt(d0, 100, OptPktContd|1<<4, 'i'), plain(fs+d0, 100, 's'),
		}, sent: 1},
		{name: "multi-buffer: MaxFrags+1 chunks", multiBuffer: true, descs: chain(MaxFrags + 1), sent: 1},
	}
	for _, tt := range tests {
		for _, zc := range []bool{false, true} {
			name := tt.name + "/copy"
			if zc {
				name = tt.name + "/zerocopy"
			}
			t.Run(name, func(t *testing.T) {
				cfg := validationConfig(tt.multiBuffer, zc)
				if tt.noMetadata {
					cfg.TxMetadataLen = 0
				}
				w := new(recordWire)
				s := newTestSocket(t, cfg, w)
				var descs []Desc
				var invalid, badMD uint64
				var want []uint64 // completions
				for _, md := range tt.descs {
					if md.md != nil {
						md.md(s.UMEM().Metadata(md.d.Addr))
					}
					descs = append(descs, md.d)
					switch md.out {
					case outInvalid:
						invalid++
					case outBadMD:
						badMD++
					}
					if md.out != outInvalid {
						want = append(want, md.d.Addr)
					}
				}
				good := place(s, 5, buildFrame(udp4, 60, 1, true).b)
				descs = append(descs, good)
				want = append(want, good.Addr)
				idx := submit(t, s, descs...)

				consumed, einval := 0, uint64(0)
				for kicks := 0; consumed < len(descs); kicks++ {
					if kicks > 2*len(descs) {
						t.Fatalf("%d of %d descriptors consumed after %d Kicks; counters %v", consumed, len(descs), kicks, nonZero(s))
					}
					n, err := s.Kick()
					consumed += n
					switch {
					case err == ErrBadMetadata && !zc:
						if !errors.Is(err, syscall.EINVAL) {
							t.Errorf("ErrBadMetadata is not EINVAL")
						}
						einval++
						// The descriptor at the head of the ring is the one
						// with bad metadata: repair it in place.
						head := s.TX().Entry(idx + uint32(consumed))
						if tt.descs[consumed].out != outBadMD || head.Options&OptTxMetadata == 0 {
							t.Fatalf("ErrBadMetadata with descriptor %d (%+v, outcome %c) at the head", consumed, *head, tt.descs[consumed].out)
						}
						head.Options &^= OptTxMetadata
					case err != nil:
						t.Fatalf("Kick: %v", err)
					}
				}
				if !zc && einval != badMD {
					t.Errorf("Kicks failed with ErrBadMetadata: %d, want %d", einval, badMD)
				}
				if got := reap(s); !slices.Equal(got, want) {
					t.Errorf("completions: got %x, want %x", got, want)
				}
				c := counters(s)
				if c["tx_invalid_descs"] != invalid || c["tx_bad_metadata"] != badMD {
					t.Errorf("tx_invalid_descs %d, tx_bad_metadata %d; want %d, %d (counters %v)",
						c["tx_invalid_descs"], c["tx_bad_metadata"], invalid, badMD, nonZero(s))
				}
				frames := w.take()
				if len(frames) != tt.sent+1 || c["tx_packets"] != uint64(tt.sent+1) {
					t.Fatalf("frames written: got %d (tx_packets %d), want %d", len(frames), c["tx_packets"], tt.sent+1)
				}
				if last := frames[len(frames)-1][vnetHdrLen:]; !bytes.Equal(last, s.UMEM().Data(good.Addr, int(good.Len))) {
					t.Errorf("last frame written is not the good one")
				}
			})
		}
	}
}

// TestTXInvalidNotCompleted pins what an invalid descriptor costs: Kick
// consumes it, counts it and stops there, as __xsk_generic_xmit ends its
// pass at one (xskq_cons_peek_desc fails, the descriptor is released); its
// address never reaches the completion ring, and the next Kick sends the
// descriptor after it.
func TestTXInvalidNotCompleted(t *testing.T) {
	for _, zc := range []bool{false, true} {
		w := new(recordWire)
		s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxSize: 8, CompSize: 8, ZeroCopy: zc}, w)
		good := place(s, 1, buildFrame(udp4, 60, 1, true).b)
		bad := Desc{Addr: s.UMEM().Size() + 64, Len: 60}
		submit(t, s, bad, good)
		if n, err := s.Kick(); n != 1 || err != nil {
			t.Fatalf("zc %v: first Kick consumed %d, %v; want 1, nil", zc, n, err)
		}
		if got := reap(s); len(got) != 0 {
			t.Errorf("zc %v: the invalid descriptor was completed: %x", zc, got)
		}
		if free := s.TX().Free(8); free != 7 {
			t.Errorf("zc %v: TX ring has %d free slots, want 7 (the invalid one released)", zc, free)
		}
		if frames := w.take(); len(frames) != 0 {
			t.Errorf("zc %v: %d frames written before the second Kick, want 0", zc, len(frames))
		}
		if n, err := s.Kick(); n != 1 || err != nil {
			t.Fatalf("zc %v: second Kick consumed %d, %v; want 1, nil", zc, n, err)
		}
		if got := reap(s); !slices.Equal(got, []uint64{good.Addr}) {
			t.Errorf("zc %v: completions %x, want only %x", zc, got, good.Addr)
		}
		if c := counters(s); c["tx_invalid_descs"] != 1 || c["tx_packets"] != 1 {
			t.Errorf("zc %v: counters %v, want tx_invalid_descs 1, tx_packets 1", zc, nonZero(s))
		}
	}
}

// TestTXBadMetadataCopy: in copy mode bad metadata fails the send with
// EINVAL (xsk_skb_metadata) and the descriptor stays at the head of the TX
// ring, Kick after Kick, while the packets before it go out; once the
// application repairs the metadata in the UMEM it is sent as repaired.
func TestTXBadMetadataCopy(t *testing.T) {
	w := new(recordWire)
	s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxMetadata: true, CsumOffload: true, TxSize: 8, CompSize: 8}, w)
	f := buildFrame(udp4, 100, 1, false)
	good0, good2 := place(s, 0, buildFrame(udp4, 60, 0, true).b), place(s, 2, buildFrame(udp4, 60, 2, true).b)
	bad := place(s, 1, f.b)
	bad.Options = OptTxMetadata
	md := s.UMEM().Metadata(bad.Addr)
	md.SetFlags(TxmdChecksum | TxmdTimestamp | 1<<9)
	md.SetChecksumRequest(f.csumStart, f.csumOffset)
	submit(t, s, good0, bad, good2)
	for i := range 2 {
		n, err := s.Kick()
		if wantN := 1 - i; n != wantN || err != ErrBadMetadata || !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("Kick %d: consumed %d, %v; want %d, ErrBadMetadata", i, n, err, wantN)
		}
	}
	if free := s.TX().Free(8); free != 6 {
		t.Errorf("TX ring has %d free slots, want 6 (the bad descriptor and the one after it still in it)", free)
	}
	if got := reap(s); !slices.Equal(got, []uint64{good0.Addr}) {
		t.Errorf("completions %x, want only the first packet's", got)
	}
	if frames := w.take(); len(frames) != 1 {
		t.Errorf("%d frames written, want 1", len(frames))
	}
	md.SetFlags(TxmdChecksum | TxmdTimestamp)
	if n, err := s.Kick(); n != 2 || err != nil {
		t.Fatalf("Kick after the repair: consumed %d, %v; want 2, nil", n, err)
	}
	frames := w.take()
	if len(frames) != 2 {
		t.Fatalf("%d frames written after the repair, want 2", len(frames))
	}
	var h driver.VirtioNetHdr
	h.Decode(frames[0])
	if h.Flags != driver.VirtioNetHdrFNeedsCsum || h.CsumStart != f.csumStart {
		t.Errorf("repaired packet: virtio-net header %+v, want its checksum offloaded", h)
	}
	if got := reap(s); !slices.Equal(got, []uint64{bad.Addr, good2.Addr}) {
		t.Errorf("completions %x", got)
	}
	if c := counters(s); c["tx_bad_metadata"] != 2 || c["tx_timestamps"] != 1 || c["tx_packets"] != 3 || c["tx_invalid_descs"] != 0 {
		t.Errorf("counters %v, want tx_bad_metadata 2, tx_timestamps 1, tx_packets 3", nonZero(s))
	}
}

// TestTXBadMetadataZeroCopy: a zero-copy driver reads the metadata with
// xsk_buff_get_metadata, which returns none for an unknown flag or a socket
// without metadata ("no way to signal the error to the user"): the packet
// goes out without any offload and without a timestamp. A checksum field
// outside the packet is dropped from the request; its timestamp is still
// written.
func TestTXBadMetadataZeroCopy(t *testing.T) {
	for _, offload := range []bool{false, true} {
		w := new(recordWire)
		s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxMetadata: true, CsumOffload: offload, ZeroCopy: true}, w)
		f := buildFrame(udp4, 100, 1, false)
		var descs []Desc
		for i, flags := range []uint64{TxmdChecksum | TxmdTimestamp | 1<<9, TxmdChecksum | TxmdTimestamp} {
			d := place(s, i, f.b)
			d.Options = OptTxMetadata
			md := s.UMEM().Metadata(d.Addr)
			md.SetFlags(flags)
			md.SetChecksumRequest(f.csumStart, f.csumOffset)
			if i == 1 {
				md.SetChecksumRequest(f.csumStart, 200) // past the packet
			}
			descs = append(descs, d)
		}
		submit(t, s, descs...)
		if n, err := s.Kick(); n != 2 || err != nil {
			t.Fatalf("offload %v: Kick consumed %d, %v; want 2, nil", offload, n, err)
		}
		frames := w.take()
		if len(frames) != 2 {
			t.Fatalf("offload %v: %d frames written, want 2", offload, len(frames))
		}
		for i, fr := range frames {
			if !bytes.Equal(fr[:vnetHdrLen], make([]byte, vnetHdrLen)) || !bytes.Equal(fr[vnetHdrLen:], f.b) {
				t.Errorf("offload %v: packet %d went out with header %x or changed: want it as submitted, no offload", offload, i, fr[:vnetHdrLen])
			}
		}
		if got := reap(s); !slices.Equal(got, []uint64{descs[0].Addr, descs[1].Addr}) {
			t.Errorf("offload %v: completions %x", offload, got)
		}
		if md := s.UMEM().Metadata(descs[0].Addr); md.CsumStart() != f.csumStart || md.CsumOffset() != f.csumOffset {
			t.Errorf("offload %v: the unknown-flag packet got a timestamp: metadata %x", offload, []byte(md))
		}
		if ts := s.UMEM().Metadata(descs[1].Addr).TxTimestamp(); ts == 0 || ts > s.Now() {
			t.Errorf("offload %v: timestamp of the packet with a bad checksum request: %d", offload, ts)
		}
		if c := counters(s); c["tx_bad_metadata"] != 2 || c["tx_timestamps"] != 1 || c["tx_csum_offload"]+c["tx_csum_sw"] != 0 {
			t.Errorf("offload %v: counters %v, want tx_bad_metadata 2, tx_timestamps 1, no checksum", offload, nonZero(s))
		}
	}
}

// TestTXPlainSkipsMetadata sends descriptors without OptTxMetadata whose
// metadata area holds garbage (flags no socket accepts): the socket must
// neither read it (they are sent) nor write it (no timestamp).
func TestTXPlainSkipsMetadata(t *testing.T) {
	w := new(recordWire)
	s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxMetadata: true}, w)
	var descs []Desc
	for i := range 4 {
		f := buildFrame(udp4, 100+i, uint32(i), true)
		d := place(s, i, f.b)
		md := s.UMEM().Metadata(d.Addr)
		for j := range md {
			md[j] = 0xa5
		}
		descs = append(descs, d)
	}
	submit(t, s, descs...)
	if _, err := s.Kick(); err != nil {
		t.Fatal(err)
	}
	frames := w.take()
	if len(frames) != 4 {
		t.Fatalf("frames written: got %d, want 4 (counters %v)", len(frames), nonZero(s))
	}
	for i, f := range frames {
		if !bytes.Equal(f[:vnetHdrLen], make([]byte, vnetHdrLen)) {
			t.Errorf("frame %d: virtio-net header %x, want zeros", i, f[:vnetHdrLen])
		}
		if !bytes.Equal(f[vnetHdrLen:], s.UMEM().Data(descs[i].Addr, int(descs[i].Len))) {
			t.Errorf("frame %d differs from the UMEM's", i)
		}
		if md := s.UMEM().Metadata(descs[i].Addr); !bytes.Equal(md, bytes.Repeat([]byte{0xa5}, 16)) {
			t.Errorf("frame %d: metadata changed to %x", i, []byte(md))
		}
	}
	if c := counters(s); c["tx_timestamps"] != 0 || c["tx_csum_sw"] != 0 || c["tx_csum_offload"] != 0 || c["tx_bytes"] != 142+143+144+145 {
		t.Errorf("counters: %v", nonZero(s))
	}
}

// TestChecksumSoftware requests checksums from a socket whose wire cannot
// offload them: the written frames must pass driver.VerifyChecksums and
// carry no NEEDS_CSUM, and the UMEM must be left alone.
func TestChecksumSoftware(t *testing.T) {
	for _, kind := range []frameKind{udp4, tcp4, udp6} {
		for _, n := range []int{0, 1, 2, 3, 200, 1399, 1400} {
			w := new(recordWire)
			s := newTestSocket(t, Config{NumFrames: 2, FrameSize: 2048, TxMetadata: true}, w)
			f := buildFrame(kind, n, uint32(n), false)
			d := place(s, 1, f.b)
			d.Options = OptTxMetadata
			md := s.UMEM().Metadata(d.Addr)
			md.SetFlags(TxmdChecksum)
			md.SetChecksumRequest(f.csumStart, f.csumOffset)
			submit(t, s, d)
			if _, err := s.Kick(); err != nil {
				t.Fatal(err)
			}
			frames := w.take()
			if len(frames) != 1 {
				t.Fatalf("%v %d: %d frames written, want 1 (counters %v)", kind, n, len(frames), nonZero(s))
			}
			var h driver.VirtioNetHdr
			h.Decode(frames[0])
			if h != (driver.VirtioNetHdr{}) {
				t.Errorf("%v %d: virtio-net header %+v, want zero", kind, n, h)
			}
			frame := frames[0][vnetHdrLen:]
			var fi driver.FrameInfo
			if drop := driver.ParseFrame(frame, &fi); drop != driver.DropNone {
				t.Fatalf("%v %d: ParseFrame: %v", kind, n, drop)
			}
			if drop := driver.VerifyChecksums(frame, &fi, true); drop != driver.DropNone {
				t.Errorf("%v %d: VerifyChecksums: %v", kind, n, drop)
			}
			if want := buildFrame(kind, n, uint32(n), true).b; !bytes.Equal(frame, want) {
				t.Errorf("%v %d: frame differs from the one with a full checksum", kind, n)
			}
			if !bytes.Equal(s.UMEM().Data(d.Addr, int(d.Len)), f.b) {
				t.Errorf("%v %d: the socket wrote into the UMEM", kind, n)
			}
			if c := counters(s); c["tx_csum_sw"] != 1 || c["tx_csum_offload"] != 0 {
				t.Errorf("%v %d: counters %v, want tx_csum_sw 1", kind, n, nonZero(s))
			}
		}
	}
}

// TestChecksumZeroResult pins CSUM_MANGLED_0: a sum that complements to 0
// is stored as 0xffff.
func TestChecksumZeroResult(t *testing.T) {
	// Words 0x0000 and 0xffff sum to 0xffff; its complement is 0.
	pkt := []byte{0xff, 0xff, 0x00, 0x00}
	completeChecksum(pkt, 0, 2)
	if pkt[2] != 0xff || pkt[3] != 0xff {
		t.Errorf("checksum field: got %x, want ffff", pkt[2:])
	}
}

// TestChecksumOffload requests checksums from a socket whose wire offloads
// them: the frame goes out as submitted, with NEEDS_CSUM and the request's
// offsets in the virtio-net header; finishing it as a device would gives a
// valid frame.
func TestChecksumOffload(t *testing.T) {
	for _, kind := range []frameKind{udp4, tcp4, udp6} {
		w := new(recordWire)
		s := newTestSocket(t, Config{NumFrames: 2, FrameSize: 2048, TxMetadata: true, CsumOffload: true}, w)
		f := buildFrame(kind, 300, 7, false)
		d := place(s, 0, f.b)
		d.Options = OptTxMetadata
		md := s.UMEM().Metadata(d.Addr)
		md.SetFlags(TxmdChecksum | TxmdTimestamp)
		md.SetChecksumRequest(f.csumStart, f.csumOffset)
		submit(t, s, d)
		if _, err := s.Kick(); err != nil {
			t.Fatal(err)
		}
		frames := w.take()
		if len(frames) != 1 {
			t.Fatalf("%v: %d frames written, want 1", kind, len(frames))
		}
		var h driver.VirtioNetHdr
		h.Decode(frames[0])
		want := driver.VirtioNetHdr{Flags: driver.VirtioNetHdrFNeedsCsum, CsumStart: f.csumStart, CsumOffset: f.csumOffset}
		if h != want {
			t.Errorf("%v: virtio-net header %+v, want %+v", kind, h, want)
		}
		frame := frames[0][vnetHdrLen:]
		if !bytes.Equal(frame, f.b) {
			t.Errorf("%v: frame changed on the way", kind)
		}
		completeChecksum(frame, int(h.CsumStart), int(h.CsumOffset))
		var fi driver.FrameInfo
		if drop := driver.ParseFrame(frame, &fi); drop != driver.DropNone || driver.VerifyChecksums(frame, &fi, true) != driver.DropNone {
			t.Errorf("%v: frame completed as NEEDS_CSUM asks does not verify", kind)
		}
		if c := counters(s); c["tx_csum_offload"] != 1 || c["tx_csum_sw"] != 0 || c["tx_timestamps"] != 1 {
			t.Errorf("%v: counters %v", kind, nonZero(s))
		}
	}
}

// countingWire counts writes; its count is the fake clock of
// TestTimestampAfterWrite.
type countingWire struct{ n uint64 }

func (w *countingWire) Write([]byte) error { w.n++; return nil }

// TestTimestampAfterWrite uses a clock that reads the wire's write count:
// every packet's timestamp is read for it alone after its own write (i+1
// writes) and before the next, as xsk_destruct_skb stamps each packet at
// its completion, and before its completion was published.
func TestTimestampAfterWrite(t *testing.T) {
	w := new(countingWire)
	s := newTestSocket(t, Config{NumFrames: 8, FrameSize: 2048, TxMetadata: true,
		Clock: func() uint64 { return w.n * 1000 }}, w)
	var descs []Desc
	for i := range 6 {
		d := place(s, i, buildFrame(udp4, 64, uint32(i), true).b)
		if i != 2 { // one without a request in the middle
			d.Options = OptTxMetadata
			md := s.UMEM().Metadata(d.Addr)
			md.SetFlags(TxmdTimestamp)
			md.SetChecksumRequest(0xdead, 0xbeef) // overwritten by the completion
		}
		descs = append(descs, d)
	}
	submit(t, s, descs...)
	if _, err := s.Kick(); err != nil {
		t.Fatal(err)
	}
	if got := reap(s); len(got) != 6 {
		t.Fatalf("%d completions, want 6", len(got))
	}
	for i, d := range descs {
		if i == 2 {
			continue
		}
		if ts, want := s.UMEM().Metadata(d.Addr).TxTimestamp(), uint64(i+1)*1000; ts != want {
			t.Errorf("packet %d: timestamp %d, want %d (after its own write, the %d-th, and before the next)", i, ts, want, i+1)
		}
	}
	if c := counters(s); c["tx_timestamps"] != 5 {
		t.Errorf("tx_timestamps: got %d, want 5", c["tx_timestamps"])
	}
}

// TestTimestampsMixedBatch stamps the right packets of a batch that mixes
// single- and multi-buffer packets with and without a timestamp request,
// with the rings' indexes wrapping inside it: the stamps are found through
// the batch's completion slots, so a slot taken for the wrong packet would
// stamp (or skip) the wrong metadata.
func TestTimestampsMixedBatch(t *testing.T) {
	w := new(countingWire)
	s := newTestSocket(t, Config{NumFrames: 16, FrameSize: 2048, TxMetadata: true, MultiBuffer: true,
		ringStart: math.MaxUint32 - 2, Clock: func() uint64 { return 7000 + w.n }}, w)
	frame := buildFrame(udp4, 300, 0, true).b
	type pkt struct {
		chunks int
		stamp  bool
	}
	pkts := []pkt{{1, false}, {3, true}, {1, true}, {2, false}, {1, false}, {3, true}, {1, true}}
	var descs []Desc
	var firsts []Desc
	slot := 0
	for _, p := range pkts {
		for c := range p.chunks {
			d := place(s, slot, frame[:100])
			slot++
			if c < p.chunks-1 {
				d.Options = OptPktContd
			}
			if c == 0 {
				d.Options |= OptTxMetadata
				md := s.UMEM().Metadata(d.Addr)
				md.SetFlags(0)
				if p.stamp {
					md.SetFlags(TxmdTimestamp)
				}
				md.SetChecksumRequest(0x1234, 0x5678) // the completion overwrites it with a stamp
				firsts = append(firsts, d)
			}
			descs = append(descs, d)
		}
	}
	submit(t, s, descs...)
	if n, err := s.Kick(); n != len(descs) || err != nil {
		t.Fatalf("Kick: consumed %d, %v; want %d", n, err, len(descs))
	}
	if got := reap(s); len(got) != len(descs) {
		t.Fatalf("%d completions, want %d", len(got), len(descs))
	}
	for i, p := range pkts {
		md := s.UMEM().Metadata(firsts[i].Addr)
		want := 7000 + uint64(i+1) // read after the packet's own write, the (i+1)-th
		switch ts := md.TxTimestamp(); {
		case p.stamp && ts != want:
			t.Errorf("packet %d asked for a timestamp: got %d, want %d", i, ts, want)
		case !p.stamp && (md.CsumStart() != 0x1234 || md.CsumOffset() != 0x5678):
			t.Errorf("packet %d asked for none: its metadata changed to %x", i, []byte(md))
		}
	}
	if c := counters(s); c["tx_timestamps"] != 4 || c["tx_packets"] != uint64(len(pkts)) {
		t.Errorf("counters %v, want tx_timestamps 4, tx_packets %d", nonZero(s), len(pkts))
	}
}

// TestTimestampsMonotonic uses the default clock: timestamps come after
// the submission, before the reap, and never go backwards.
func TestTimestampsMonotonic(t *testing.T) {
	s := newTestSocket(t, Config{NumFrames: 64, FrameSize: 2048, TxMetadata: true}, new(discardWire))
	frame := buildFrame(udp4, 64, 0, true).b
	var prev uint64
	for round := range 20 {
		before := s.Now()
		var descs []Desc
		for i := range 3 + round%5 {
			d := place(s, (round*8+i)%64, frame)
			d.Options = OptTxMetadata
			s.UMEM().Metadata(d.Addr).SetFlags(TxmdTimestamp)
			descs = append(descs, d)
		}
		submit(t, s, descs...)
		if _, err := s.Kick(); err != nil {
			t.Fatal(err)
		}
		addrs := reap(s)
		after := s.Now()
		if len(addrs) != len(descs) {
			t.Fatalf("round %d: %d completions, want %d", round, len(addrs), len(descs))
		}
		for _, a := range addrs {
			ts := s.UMEM().Metadata(a).TxTimestamp()
			if ts < before || ts > after {
				t.Errorf("round %d: timestamp %d outside [submission %d, reap %d]", round, ts, before, after)
			}
			if ts < prev {
				t.Errorf("round %d: timestamp %d after %d", round, ts, prev)
			}
			prev = ts
		}
	}
}

// TestMultiBuffer sends a packet in three chunks with a checksum request on
// the first: the wire gets it whole, checksummed across the chunks. A
// chain whose end is not submitted yet waits; an oversized chain is
// dropped at the limit, and what follows it is a new packet.
func TestMultiBuffer(t *testing.T) {
	w := new(recordWire)
	s := newTestSocket(t, Config{NumFrames: 8, FrameSize: 2048, TxMetadata: true, MultiBuffer: true,
		ringStart: math.MaxUint32 - 3}, w)
	f := buildFrame(udp4, 1400, 9, false)
	parts := [][]byte{f.b[:600], f.b[600:1100], f.b[1100:]}
	var descs []Desc
	for i, p := range parts {
		d := place(s, i, p)
		d.Options = OptPktContd
		descs = append(descs, d)
	}
	descs[0].Options |= OptTxMetadata
	descs[2].Options = 0
	md := s.UMEM().Metadata(descs[0].Addr)
	md.SetFlags(TxmdChecksum)
	md.SetChecksumRequest(f.csumStart, f.csumOffset)

	submit(t, s, descs[:2]...)
	if n, err := s.Kick(); n != 0 || err != nil {
		t.Fatalf("Kick with the last chunk missing: consumed %d, %v; want 0", n, err)
	}
	submit(t, s, descs[2])
	if n, err := s.Kick(); n != 3 || err != nil {
		t.Fatalf("Kick: consumed %d, %v; want 3", n, err)
	}
	if got := reap(s); !slices.Equal(got, []uint64{descs[0].Addr, descs[1].Addr, descs[2].Addr}) {
		t.Errorf("completions %x", got)
	}
	frames := w.take()
	if len(frames) != 1 {
		t.Fatalf("%d frames written, want 1", len(frames))
	}
	frame := frames[0][vnetHdrLen:]
	var fi driver.FrameInfo
	if driver.ParseFrame(frame, &fi) != driver.DropNone || driver.VerifyChecksums(frame, &fi, true) != driver.DropNone {
		t.Errorf("gathered frame does not verify")
	}
	if !bytes.Equal(frame, buildFrame(udp4, 1400, 9, true).b) {
		t.Errorf("gathered frame differs")
	}

	// An oversized chain: at the maxTxDescs-th descriptor with
	// OptPktContd xsk_build_skb fails with -EOVERFLOW and the packet is
	// dropped, every descriptor counted and none completed; the ones after
	// it make a new packet.
	var chain []Desc
	for i := range maxTxDescs {
		chain = append(chain, Desc{Addr: s.UMEM().DataAddr(i % 8), Len: 60, Options: OptPktContd})
	}
	submit(t, s, chain...)
	if n, err := s.Kick(); n != maxTxDescs || err != nil {
		t.Fatalf("Kick of the oversized chain: consumed %d, %v; want %d", n, err, maxTxDescs)
	}
	if got := reap(s); len(got) != 0 {
		t.Errorf("the oversized chain was completed: %x", got)
	}
	good := place(s, 7, buildFrame(udp4, 60, 1, true).b)
	rest := []Desc{{Addr: s.UMEM().DataAddr(1), Len: 60, Options: OptPktContd}, {Addr: s.UMEM().DataAddr(2), Len: 60}, good}
	submit(t, s, rest...)
	if n, err := s.Kick(); n != 3 || err != nil {
		t.Fatalf("Kick after the oversized chain: consumed %d, %v; want 3", n, err)
	}
	if got := reap(s); !slices.Equal(got, []uint64{rest[0].Addr, rest[1].Addr, good.Addr}) {
		t.Errorf("completions: got %x, want the two packets after the chain", got)
	}
	if frames := w.take(); len(frames) != 2 || len(frames[0]) != vnetHdrLen+120 || !bytes.Equal(frames[1][vnetHdrLen:], s.UMEM().Data(good.Addr, int(good.Len))) {
		t.Errorf("after the oversized chain: %d frames written, want the 2-chunk packet and the good one", len(frames))
	}
	if c := counters(s); c["tx_invalid_descs"] != maxTxDescs || c["tx_packets"] != 3 {
		t.Errorf("counters %v, want tx_invalid_descs %d, tx_packets 3", nonZero(s), maxTxDescs)
	}
}

// TestCompletionRingFull gives the socket fewer completion slots than TX
// descriptors: Kick stops, counts tx_cq_full, and goes on once the
// application reaps. A multi-buffer packet waits for room for all its
// completions.
func TestCompletionRingFull(t *testing.T) {
	w := new(recordWire)
	s := newTestSocket(t, Config{NumFrames: 16, FrameSize: 2048, TxSize: 16, CompSize: 4}, w)
	frame := buildFrame(udp4, 60, 0, true).b
	var descs []Desc
	for i := range 10 {
		descs = append(descs, place(s, i, frame))
	}
	submit(t, s, descs...)
	var reaped []uint64
	for i, want := range []int{4, 4, 2} {
		n, err := s.Kick()
		if n != want || err != nil {
			t.Fatalf("Kick %d: consumed %d, %v; want %d", i, n, err, want)
		}
		reaped = append(reaped, reap(s)...)
	}
	if len(reaped) != 10 || len(w.take()) != 10 {
		t.Fatalf("reaped %d, want 10", len(reaped))
	}
	if c := counters(s); c["tx_cq_full"] != 2 {
		t.Errorf("tx_cq_full: got %d, want 2", c["tx_cq_full"])
	}

	// Two free completion slots for a 3-chunk packet.
	s = newTestSocket(t, Config{NumFrames: 16, FrameSize: 2048, TxSize: 64, CompSize: 64, MultiBuffer: true}, w)
	d := place(s, 0, frame)
	for range 62 {
		submit(t, s, d)
	}
	if n, _ := s.Kick(); n != 62 {
		t.Fatalf("Kick: consumed %d, want 62", n)
	}
	submit(t, s,
		Desc{Addr: s.UMEM().DataAddr(1), Len: 30, Options: OptPktContd},
		Desc{Addr: s.UMEM().DataAddr(2), Len: 30, Options: OptPktContd},
		Desc{Addr: s.UMEM().DataAddr(3), Len: 30},
		d)
	if n, _ := s.Kick(); n != 0 {
		t.Fatalf("Kick without room for the packet's completions: consumed %d, want 0", n)
	}
	if c := counters(s); c["tx_cq_full"] != 1 {
		t.Errorf("tx_cq_full: got %d, want 1", c["tx_cq_full"])
	}
	if got := len(reap(s)); got != 62 {
		t.Fatalf("reaped %d, want 62", got)
	}
	if n, _ := s.Kick(); n != 4 {
		t.Fatalf("Kick after reaping: consumed %d, want 4", n)
	}
}

// TestWireError makes the wire fail: Kick completes the descriptor, counts
// tx_errors, stops and returns the error; once the wire works again the
// rest goes out.
func TestWireError(t *testing.T) {
	w := &recordWire{fail: os.ErrClosed}
	s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxMetadata: true}, w)
	frame := buildFrame(udp4, 60, 0, true).b
	d2 := place(s, 2, frame)
	d2.Options = OptTxMetadata
	s.UMEM().Metadata(d2.Addr).SetFlags(TxmdTimestamp)
	submit(t, s, place(s, 0, frame), place(s, 1, frame), d2)
	n, err := s.Kick()
	if n != 1 || !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Kick: consumed %d, %v; want 1, os.ErrClosed", n, err)
	}
	w.mu.Lock()
	w.fail = nil
	w.mu.Unlock()
	if n, err := s.Kick(); n != 2 || err != nil {
		t.Fatalf("second Kick: consumed %d, %v; want 2, nil", n, err)
	}
	if c := counters(s); c["tx_errors"] != 1 || c["tx_packets"] != 2 || len(reap(s)) != 3 {
		t.Errorf("counters %v", nonZero(s))
	}
}

func TestReceive(t *testing.T) {
	s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, Headroom: 32, TxMetadata: true, FillSize: 4, RxSize: 2,
		ringStart: math.MaxUint32}, new(discardWire))
	u := s.UMEM()
	frame := buildFrame(udp4, 100, 1, true).b
	if s.Receive(frame) {
		t.Fatal("Receive with an empty fill ring succeeded")
	}
	// Any address in a frame stands for the frame; one is outside the UMEM.
	got, idx := s.Fill().Reserve(4)
	*s.Fill().Entry(idx) = u.FrameAddr(2) + 5
	*s.Fill().Entry(idx + 1) = u.Size() + 100
	*s.Fill().Entry(idx + 2) = u.FrameAddr(3)
	*s.Fill().Entry(idx + 3) = u.FrameAddr(1)
	s.Fill().Submit(got)

	if s.Receive(nil) || s.Receive(make([]byte, u.DataRoom()+1)) {
		t.Fatal("Receive of an empty or oversized frame succeeded")
	}
	if !s.Receive(frame) || !s.Receive(frame[:60]) {
		t.Fatal("Receive failed with fill entries posted")
	}
	// The RX ring (2 entries) is full: dropped, and frame 1's fill entry
	// stays on the fill ring.
	if s.Receive(frame) {
		t.Fatal("Receive with the RX ring full succeeded")
	}
	check := func(want ...Desc) {
		t.Helper()
		n, ridx := s.RX().Peek(4)
		if int(n) != len(want) {
			t.Fatalf("RX ring: %d descriptors, want %d", n, len(want))
		}
		for i, w := range want {
			d := *s.RX().Entry(ridx + uint32(i))
			if d.Addr != w.Addr || d.Len != w.Len || d.Options != 0 {
				t.Errorf("RX descriptor %d: %+v, want %+v", i, d, w)
			}
		}
		s.RX().Release(n)
	}
	check(Desc{Addr: u.DataAddr(2), Len: uint32(len(frame))}, Desc{Addr: u.DataAddr(3), Len: 60})
	if !bytes.Equal(u.Data(u.DataAddr(2), len(frame)), frame) || !bytes.Equal(u.Data(u.DataAddr(3), 60), frame[:60]) {
		t.Errorf("RX frames differ from what was received")
	}
	if !bytes.Equal(u.Data(u.FrameAddr(2), 48), make([]byte, 48)) {
		t.Errorf("Receive wrote into the headroom or metadata")
	}
	// ReceiveVec joins its parts (an empty one among them) into frame 1.
	if !s.ReceiveVec([][]byte{frame[:14], nil, frame[14:50], frame[50:]}) {
		t.Fatal("ReceiveVec failed with a fill entry left")
	}
	check(Desc{Addr: u.DataAddr(1), Len: uint32(len(frame))})
	if !bytes.Equal(u.Data(u.DataAddr(1), len(frame)), frame) {
		t.Errorf("ReceiveVec frame differs from its parts")
	}
	if s.Receive(frame) {
		t.Fatal("Receive with an empty fill ring succeeded")
	}
	want := map[string]uint64{"rx_packets": 3, "rx_bytes": uint64(2*len(frame) + 60), "rx_dropped": 4,
		"rx_fill_ring_empty_descs": 2, "rx_ring_full": 1, "rx_invalid_fill": 1}
	for name, v := range want {
		if got := counters(s)[name]; got != v {
			t.Errorf("%s: got %d, want %d", name, got, v)
		}
	}
}

// TestStatsOrder pins the counters' names and order.
func TestStatsOrder(t *testing.T) {
	var names []string
	new(Stats).Each(func(name string, _ uint64) { names = append(names, name) })
	want := []string{"tx_packets", "tx_bytes", "tx_csum_offload", "tx_csum_sw", "tx_timestamps",
		"tx_invalid_descs", "tx_bad_metadata", "tx_errors", "tx_cq_full",
		"rx_packets", "rx_bytes", "rx_dropped", "rx_ring_full", "rx_fill_ring_empty_descs", "rx_invalid_fill"}
	if !slices.Equal(names, want) {
		t.Errorf("counters: got %v, want %v", names, want)
	}
}
