package driver

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// VirtioNetHdrLen is the length of struct virtio_net_hdr
// (include/uapi/linux/virtio_net.h) without the num_buffers field: the
// header a TAP device with IFF_VNET_HDR puts before each frame by default
// (gVisor's header.VirtioNetHeaderSize; gVisor's view of it reads the 16-bit
// fields big-endian, a TAP writes them in host byte order, hence
// VirtioNetHdr).
const VirtioNetHdrLen = header.VirtioNetHeaderSize

// Values of VirtioNetHdr.Flags.
const (
	VirtioNetHdrFNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM: checksum from CsumStart, stored at CsumStart+CsumOffset, is partial
	VirtioNetHdrFDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID: checksums were verified by the sender
)

// Values of VirtioNetHdr.GSOType.
const (
	VirtioNetHdrGSONone  = 0    // VIRTIO_NET_HDR_GSO_NONE: not a GSO frame
	VirtioNetHdrGSOTCPv4 = 1    // VIRTIO_NET_HDR_GSO_TCPV4: TSO over IPv4
	VirtioNetHdrGSOUDP   = 3    // VIRTIO_NET_HDR_GSO_UDP: UFO (IP fragmentation); not supported, dropped as DropBadGSO
	VirtioNetHdrGSOTCPv6 = 4    // VIRTIO_NET_HDR_GSO_TCPV6: TSO over IPv6
	VirtioNetHdrGSOUDPL4 = 5    // VIRTIO_NET_HDR_GSO_UDP_L4: USO
	VirtioNetHdrGSOECN   = 0x80 // VIRTIO_NET_HDR_GSO_ECN: the TCP super-frame has CWR set
)

// VirtioNetHdr is struct virtio_net_hdr. On the wire (a TAP device's file
// descriptor) its 16-bit fields are in host byte order, the TAP default
// without TUNSETVNETLE/TUNSETVNETBE.
type VirtioNetHdr struct {
	Flags      uint8  // VirtioNetHdrF* bits
	GSOType    uint8  // VirtioNetHdrGSO* value, possibly or'ed with VirtioNetHdrGSOECN
	HdrLen     uint16 // length of the headers to copy into each segment (a hint)
	GSOSize    uint16 // maximum payload bytes per segment
	CsumStart  uint16 // offset in the frame where checksumming starts
	CsumOffset uint16 // offset after CsumStart where the checksum is stored
}

// Decode fills h from the first VirtioNetHdrLen bytes of b. It returns false,
// leaving h unchanged, if b is shorter than VirtioNetHdrLen.
func (h *VirtioNetHdr) Decode(b []byte) bool {
	if len(b) < VirtioNetHdrLen {
		return false
	}
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.NativeEndian.Uint16(b[2:])
	h.GSOSize = binary.NativeEndian.Uint16(b[4:])
	h.CsumStart = binary.NativeEndian.Uint16(b[6:])
	h.CsumOffset = binary.NativeEndian.Uint16(b[8:])
	return true
}

// Encode writes h into the first VirtioNetHdrLen bytes of b. b must hold at
// least VirtioNetHdrLen bytes; Encode panics otherwise.
func (h *VirtioNetHdr) Encode(b []byte) {
	_ = b[VirtioNetHdrLen-1] // one bounds check for all the stores below
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.NativeEndian.PutUint16(b[2:], h.HdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.GSOSize)
	binary.NativeEndian.PutUint16(b[6:], h.CsumStart)
	binary.NativeEndian.PutUint16(b[8:], h.CsumOffset)
}
