package driver

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// VirtioNetHdrTunnelLen is the length of struct virtio_net_hdr_v1_hash_tunnel
// (include/uapi/linux/virtio_net.h): the header a TAP device puts before each
// frame once TUNSETVNETHDRSZ sets 24 and TUNSETOFFLOAD enables
// TUN_F_UDP_TUNNEL_GSO (tun_vnet_parse_size: the tunnel layout whenever the
// device has NETIF_F_GSO_UDP_TUNNEL). Its first 10 bytes are struct
// virtio_net_hdr, then num_buffers, the hash report fields and the two
// tunnel offsets.
const VirtioNetHdrTunnelLen = 24

// Values of VirtioNetHdr.GSOType for a GSO frame inside a UDP tunnel
// (VXLAN, GENEVE, ...), or'ed with the GSO type of the inner packet.
const (
	VirtioNetHdrGSOUDPTunnelIPv4 = 0x20 // VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4: the outer header is IPv4 + UDP
	VirtioNetHdrGSOUDPTunnelIPv6 = 0x40 // VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6: the outer header is IPv6 + UDP
)

// virtioNetHdrGSOUDPTunnel is VIRTIO_NET_HDR_GSO_UDP_TUNNEL: both tunnel
// bits.
const virtioNetHdrGSOUDPTunnel = VirtioNetHdrGSOUDPTunnelIPv4 | VirtioNetHdrGSOUDPTunnelIPv6

// VirtioNetHdrFUDPTunnelCsum is VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM, a value of
// VirtioNetHdr.Flags: the outer UDP header of a tunnel GSO frame has a
// checksum (SKB_GSO_UDP_TUNNEL_CSUM); its field holds the pseudo-header
// partial sum, as the inner L4 checksum does with NEEDS_CSUM.
const VirtioNetHdrFUDPTunnelCsum = 8

// VirtioNetHdrTunnel is struct virtio_net_hdr_v1_hash_tunnel. The embedded
// VirtioNetHdr is decoded as VirtioNetHdr decodes it (host byte order); the
// fields after it are __le16 (hash_value as __le16 lo and hi halves) and are
// read and written little-endian, as the kernel does (le16_to_cpu in
// virtio_net_hdr_tnl_to_skb, cpu_to_le16 in virtio_net_hdr_tnl_from_skb):
// host byte order on the little-endian machines a TAP is read on.
// num_buffers (bytes 10-11) and padding (bytes 18-19) are not kept: Decode
// skips them and Encode writes zeros, as tun_put_user's memset leaves them.
type VirtioNetHdrTunnel struct {
	VirtioNetHdr
	HashValue     uint32 // hash_value_lo | hash_value_hi<<16
	HashReport    uint16 // VIRTIO_NET_HASH_REPORT_*
	OuterTHOffset uint16 // outer_th_offset: offset of the outer UDP header in the frame
	InnerNHOffset uint16 // inner_nh_offset: offset of the inner IP header in the frame
}

// Decode fills h from the first VirtioNetHdrTunnelLen bytes of b. It returns
// false, leaving h unchanged, if b is shorter than VirtioNetHdrTunnelLen.
func (h *VirtioNetHdrTunnel) Decode(b []byte) bool {
	if len(b) < VirtioNetHdrTunnelLen {
		return false
	}
	h.VirtioNetHdr.Decode(b)
	h.HashValue = binary.LittleEndian.Uint32(b[12:])
	h.HashReport = binary.LittleEndian.Uint16(b[16:])
	h.OuterTHOffset = binary.LittleEndian.Uint16(b[20:])
	h.InnerNHOffset = binary.LittleEndian.Uint16(b[22:])
	return true
}

// Encode writes h into the first VirtioNetHdrTunnelLen bytes of b. b must
// hold at least VirtioNetHdrTunnelLen bytes; Encode panics otherwise.
func (h *VirtioNetHdrTunnel) Encode(b []byte) {
	_ = b[VirtioNetHdrTunnelLen-1] // one bounds check for all the stores below
	h.VirtioNetHdr.Encode(b)
	b[10], b[11] = 0, 0 // num_buffers
	binary.LittleEndian.PutUint32(b[12:], h.HashValue)
	binary.LittleEndian.PutUint16(b[16:], h.HashReport)
	b[18], b[19] = 0, 0 // padding
	binary.LittleEndian.PutUint16(b[20:], h.OuterTHOffset)
	binary.LittleEndian.PutUint16(b[22:], h.InnerNHOffset)
}

// Inner returns the GSO type of the inner packet: GSOType without the
// tunnel bits, VirtioNetHdrGSOECN kept (virtio_net_hdr_tnl_to_skb hands
// gso_type & ~gso_tunnel_type to __virtio_net_hdr_to_skb).
func (h *VirtioNetHdrTunnel) Inner() uint8 {
	return h.GSOType &^ virtioNetHdrGSOUDPTunnel
}

// Tunnel reports whether GSOType has a UDP tunnel bit.
func (h *VirtioNetHdrTunnel) Tunnel() bool {
	return h.GSOType&virtioNetHdrGSOUDPTunnel != 0
}

// TunnelIPv6 reports whether GSOType has VirtioNetHdrGSOUDPTunnelIPv6: the
// outer header is IPv6.
func (h *VirtioNetHdrTunnel) TunnelIPv6() bool {
	return h.GSOType&VirtioNetHdrGSOUDPTunnelIPv6 != 0
}

// check validates h for the frame it comes with as virtio_net_hdr_tnl_to_skb
// (include/linux/virtio_net.h) does before a tunnel GSO packet enters the
// stack, where each failure is -EINVAL. GSO type errors are DropBadGSO,
// inconsistent flags and offsets DropBadVnetHdr. A header without a tunnel
// bit is not a tunnel header: only the UDP_TUNNEL_CSUM rule applies to it,
// the plain rules are Segment's. It never panics, whatever frame holds.
func (h *VirtioNetHdrTunnel) check(frame []byte) Drop {
	tnl := h.GSOType & virtioNetHdrGSOUDPTunnel
	if tnl == 0 {
		// UDP_TUNNEL_CSUM describes the outer UDP header of a tunnel
		// GSO packet; on anything else it is a stray bit (stricter than
		// virtio_net_handle_csum_offload, which lets a virtio-net device
		// report it with DATA_VALID for csum_level 1: a TAP never does).
		if h.Flags&VirtioNetHdrFUDPTunnelCsum != 0 {
			return DropBadVnetHdr
		}
		return DropNone
	}
	// virtio_net_hdr_tnl_to_skb: "Either ipv4 or ipv6."
	if tnl == virtioNetHdrGSOUDPTunnel {
		return DropBadGSO
	}
	// "The UDP tunnel must carry a GSO packet, but no UFO." Unknown inner
	// types fail __virtio_net_hdr_to_skb's switch.
	inner := h.Inner() &^ VirtioNetHdrGSOECN
	var thlen, csumOff int // the inner L4 header's minimum length and checksum offset
	switch inner {
	case VirtioNetHdrGSOTCPv4, VirtioNetHdrGSOTCPv6:
		thlen, csumOff = tcpMinHdrLen, header.TCPChecksumOffset
	case VirtioNetHdrGSOUDPL4:
		thlen, csumOff = udpHdrLen, 6 // offsetof(struct udphdr, check)
	default:
		return DropBadGSO
	}
	// "Rely on csum being present." DATA_VALID is refused with a tunnel
	// GSO type by virtio_net_handle_csum_offload (virtio_net_chk_data_valid
	// when proposed): it excludes NEEDS_CSUM. Other bits are refused as
	// Segment refuses them.
	if h.Flags&VirtioNetHdrFNeedsCsum == 0 ||
		h.Flags&^(VirtioNetHdrFNeedsCsum|VirtioNetHdrFUDPTunnelCsum) != 0 {
		return DropBadVnetHdr
	}
	// __virtio_net_hdr_to_skb: "if (hdr->gso_size == 0) return -EINVAL".
	if h.GSOSize == 0 {
		return DropBadGSO
	}
	// virtio_net_hdr_tnl_to_skb: "Validate offsets." The outer UDP
	// header comes after ETH_HLEN and the fixed outer IP header, the
	// inner IP header after the outer UDP header, the inner transport
	// header (csum_start) after the fixed inner IP header.
	outerL3Min := header.EthernetMinimumSize + ipv4MinHdrLen
	if tnl == VirtioNetHdrGSOUDPTunnelIPv6 {
		outerL3Min = header.EthernetMinimumSize + ipv6HdrLen
	}
	innerL3Min := ipv4MinHdrLen
	if inner == VirtioNetHdrGSOTCPv6 {
		innerL3Min = ipv6HdrLen
	}
	outerTH, innerNH, innerTH := int(h.OuterTHOffset), int(h.InnerNHOffset), int(h.CsumStart)
	if outerTH < outerL3Min || innerNH < outerTH+udpHdrLen || innerTH < innerNH+innerL3Min {
		return DropBadVnetHdr
	}
	// __virtio_net_hdr_to_skb: pskb_may_pull(start + max(thlen, off +
	// 2)) and skb_partial_csum_set put the inner L4 header and its
	// checksum inside the frame; the checksum must be the L4 one
	// (csum_offset offsetof(struct tcphdr, check) or of struct udphdr).
	if int(h.CsumOffset) != csumOff || innerTH+thlen > len(frame) {
		return DropBadVnetHdr
	}
	// "In case of USO, the inner protocol is still unknown": the
	// version at inner_nh decides, inside the frame by the checks above.
	if inner == VirtioNetHdrGSOUDPL4 && frame[innerNH]>>4 == 6 && innerTH < innerNH+ipv6HdrLen {
		return DropBadVnetHdr
	}
	return DropNone
}
