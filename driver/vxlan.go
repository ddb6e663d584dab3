package driver

// VXLAN (RFC 7348) as the NIC sees it. A NIC told the VXLAN ports
// (Config.VXLANPorts, mlx5e_vxlan_set_port) parses past a frame's outer
// UDP header: its CQE reports the inner packet's L3 and L4 types with the
// tunnelled flag (cqe_is_tunneled; DPDK's mlx5_set_ptype_table reads the
// same bits as the inner packet's types), and it checks the inner
// checksums too (mlx5e_handle_csum sets csum_level 1 for such a frame).
// The frame still goes up whole: the tunnel is terminated above GRO, as
// the kernel's vxlan_rcv runs after udp_gro_receive merged the flow.

// vxlanHdrLen is the length of struct vxlanhdr.
const vxlanHdrLen = 8

// vxlanFrame is what the NIC model found inside a VXLAN frame: inner is the
// inner frame's layout, its offsets relative to the inner Ethernet header
// at off (the outer Ethernet, IP, UDP and VXLAN headers' length).
type vxlanFrame struct {
	off   int
	inner FrameInfo
}

// hdrLen is the length of every header of the frame, outer Ethernet to
// inner L4: what the kernel's GRO pulls into the linear part before it
// can merge the inner flow (skb_gro_header_slow at each layer).
func (v *vxlanFrame) hdrLen() int { return v.off + v.inner.HeaderLen() }

// parseVXLAN reports whether frame, parsed into fi, is a VXLAN frame to one
// of ports whose inner Ethernet frame parses, and fills v if so. A frame
// that is not (another port, a fragment, a short or unparsable inner
// frame) is an ordinary UDP frame to the NIC. The VXLAN header's flags are
// the tunnel's to check (vxlan_rcv), not the NIC's. It never panics and
// never allocates.
func parseVXLAN(frame []byte, fi *FrameInfo, ports []uint16, v *vxlanFrame) bool {
	if len(ports) == 0 || fi.L4 != L4UDP || fi.Fragment || fi.VLAN {
		return false
	}
	l4 := fi.L2Len + fi.L3Len
	end := fi.L2Len + fi.IPLen
	if end > len(frame) || l4+udpHdrLen > end {
		return false
	}
	dport := uint16(frame[l4+2])<<8 | uint16(frame[l4+3])
	found := false
	for _, p := range ports {
		found = found || p == dport
	}
	off := l4 + udpHdrLen + vxlanHdrLen
	if !found || off > end {
		return false
	}
	if ParseFrame(frame[off:end], &v.inner) != DropNone || v.inner.VLAN {
		return false
	}
	v.off = off
	return true
}

// tunnelChecksum is the NIC's check of a VXLAN frame's inner checksums, for
// a frame whose outer checksums it verified (CsumComplete): a bad inner
// one makes the frame CHECKSUM_NONE, for the stack to check again and
// drop, as a bad outer one does.
func tunnelChecksum(frame []byte, v *vxlanFrame, cs CsumState) CsumState {
	if cs != CsumComplete {
		return cs
	}
	if VerifyChecksums(frame[v.off:], &v.inner, true) != DropNone {
		return CsumNone
	}
	return cs
}

// wireVnetHdrLen is the length of the virtio-net header before each frame
// on w: VirtioNetHdrTunnelLen for a wire that says so (a TAP opened with
// TAPConfig.UDPTunnel), VirtioNetHdrLen otherwise.
func wireVnetHdrLen(w Wire) int {
	if h, ok := w.(interface{ VnetHdrLen() int }); ok && h.VnetHdrLen() == VirtioNetHdrTunnelLen {
		return VirtioNetHdrTunnelLen
	}
	return VirtioNetHdrLen
}
