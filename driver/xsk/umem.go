package xsk

// UMEM is the packet memory shared by the application and the socket: one
// region of NumFrames frames of FrameSize bytes each, addressed by byte
// offset (a UMEM address). Its geometry is fixed for its life. Which side
// may touch a frame follows the rings: the application owns a frame until
// it submits it (TX or fill ring) and again once it comes back (completion
// or RX ring).
type UMEM struct {
	buf       []byte
	frameSize uint64
	numFrames int
	headroom  int
	mdLen     int
	dataOff   uint64 // headroom + mdLen: offset of the data in a frame
}

// Bytes returns the whole region, for the application to write and read
// frames in. xsk_umem__get_data(area, addr) is Bytes()[addr:].
func (u *UMEM) Bytes() []byte { return u.buf }

// Size returns the region's length in bytes: NumFrames*FrameSize.
func (u *UMEM) Size() uint64 { return uint64(len(u.buf)) }

// FrameSize returns the size of a frame, a power of two.
func (u *UMEM) FrameSize() int { return int(u.frameSize) }

// NumFrames returns the number of frames.
func (u *UMEM) NumFrames() int { return u.numFrames }

// Headroom returns the bytes reserved at the start of every frame.
func (u *UMEM) Headroom() int { return u.headroom }

// TxMetadataLen returns the bytes of TX metadata before every packet's data
// (0 if the socket has none).
func (u *UMEM) TxMetadataLen() int { return u.mdLen }

// DataRoom returns the largest packet (or chunk) one frame holds:
// FrameSize - Headroom - TxMetadataLen.
func (u *UMEM) DataRoom() int { return int(u.frameSize - u.dataOff) }

// FrameAddr returns the address of frame i's first byte.
func (u *UMEM) FrameAddr(i int) uint64 { return uint64(i) * u.frameSize }

// DataAddr returns the address of frame i's data: past its headroom and
// metadata. This is where Receive puts frames, and the usual Addr of a TX
// descriptor.
func (u *UMEM) DataAddr(i int) uint64 { return uint64(i)*u.frameSize + u.dataOff }

// Data returns the n bytes at addr, aliasing the region. It panics if they
// are not inside it.
func (u *UMEM) Data(addr uint64, n int) []byte {
	return u.buf[addr : addr+uint64(n) : addr+uint64(n)]
}

// Metadata returns the TX metadata of a packet whose data is at addr: the
// TxMetadataLen bytes before it, aliasing the region. It panics if the
// socket has no TX metadata or addr-TxMetadataLen is outside the region.
func (u *UMEM) Metadata(addr uint64) TxMetadata {
	if u.mdLen == 0 {
		panic("xsk: UMEM.Metadata on a socket without TxMetadataLen")
	}
	return TxMetadata(u.buf[addr-uint64(u.mdLen) : addr : addr])
}
