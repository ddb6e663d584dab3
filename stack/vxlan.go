package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/netip"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/gro"
)

// VXLANConfig configures a VXLAN device (RFC 7348) over IPv6 that ustack
// terminates itself, as a Linux vxlan device made by `ip link add vxlan0
// type vxlan id VNI local LOCAL remote REMOTE dstport 4789` does: an
// Ethernet link inside UDP, with its own MAC address, inner addresses and
// neighbours (ARP and neighbour discovery run inside the tunnel).
//
// Design. The device is a second gVisor NIC, an Ethernet link like
// vxlan0, holding the inner addresses, with a route to each inner subnet.
//
//   - Receive: the NIC model parses VXLAN frames to Port
//     (driver.Config.VXLANPorts: the inner types in the CQE, the header
//     copy estimated from the inner headers) and GRO merges the inner flow
//     inside the tunnel (gro.Config.VXLANPorts: udp_gro_receive ->
//     vxlan_gro_receive -> the inner TCP's gro_receive), so the header copy
//     decides frags or frag_list for tunnelled TCP as in the kernel. Only
//     then is the tunnel terminated, as vxlan_rcv pulls the outer headers
//     off the merged skb: a packet to Local and Port with the VNI goes on
//     as its inner Ethernet frame to the VXLAN NIC (Deliver's stage 3).
//   - Transmit: gVisor routes packets for the inner subnets to the VXLAN
//     NIC, which resolves the inner neighbours by ARP and neighbour
//     discovery through the tunnel and has no GSO and an MTU 70 bytes below
//     the wire's (VXLAN6_HEADROOM). Its WritePackets sends each inner
//     frame as a UDP datagram from Local to Remote, port Port, through a
//     gVisor route on the wire's NIC, as vxlan_xmit_one and
//     udp_tunnel6_xmit_skb do: the UDP source port from the inner flow's
//     hash (udp_flow_src_port), the UDP checksum filled in (Linux's
//     default over IPv6; a receiver refuses a zero one), hop limit 64.
//
// A TAP carries a peer's tunnel super-frames whole only with
// driver.TAPConfig.UDPTunnel; without it the peer's kernel segments them
// before the TAP, and each segment costs a read.
type VXLANConfig struct {
	// Local is ustack's outer IPv6 address, the tunnel's end here (the
	// VTEP). It is added to the wire's NIC; UDP to Port at it is the
	// tunnel's.
	Local netip.Addr
	// Remote is the peer's outer IPv6 address, where the encapsulated
	// frames go (its vxlan device's local address).
	Remote netip.Addr
	// VNI is the VXLAN network identifier, 1 to 2^24-1.
	VNI uint32
	// Port is the UDP destination port; 0 means 4789, the IANA port
	// (Linux's vxlan devices default to 8472 unless given "dstport 4789").
	Port uint16
	// MAC is the device's Ethernet address inside the tunnel; zero means
	// the stack's MAC with its last byte's low bit flipped.
	MAC [6]byte
	// Addrs are ustack's inner addresses with their subnets. They are the
	// VXLAN NIC's, and each subnet is routed through the tunnel.
	Addrs []netip.Prefix
}

// vxlanNICID is the VXLAN device's gVisor NIC.
const vxlanNICID tcpip.NICID = loopbackNICID + 1

// vxlanHeadroom is VXLAN6_HEADROOM: the outer IPv6, UDP and VXLAN headers
// and the inner Ethernet header, which the device's MTU leaves room for.
const vxlanHeadroom = header.IPv6MinimumSize + header.UDPMinimumSize + vxlanHdrLen + header.EthernetMinimumSize

// vxlanHdrLen is the length of struct vxlanhdr.
const vxlanHdrLen = 8

// vxlanOuterLen is the outer headers vxlan_rcv pulls: Ethernet, IPv6 (no
// extension headers), UDP and VXLAN.
const vxlanOuterLen = header.EthernetMinimumSize + header.IPv6MinimumSize + header.UDPMinimumSize + vxlanHdrLen

// vxlanFlagI is VXLAN_HF_VNI, the flags word's "valid VNI" bit.
const vxlanFlagI = 0x08000000

// validate checks c and fills in its defaults from the stack's MAC.
func (c *VXLANConfig) validate(mac [6]byte) error {
	is6 := func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && !a.IsUnspecified() && !a.IsMulticast() }
	if !is6(c.Local) || !is6(c.Remote) {
		return fmt.Errorf("stack: vxlan local %s, remote %s: want unicast IPv6 addresses", c.Local, c.Remote)
	}
	if c.VNI == 0 || c.VNI >= 1<<24 {
		return fmt.Errorf("stack: vxlan id %d: want 1..%d", c.VNI, 1<<24-1)
	}
	if len(c.Addrs) == 0 {
		return errors.New("stack: vxlan: no inner address")
	}
	for _, p := range c.Addrs {
		if !p.IsValid() || p.Addr().Is4In6() {
			return fmt.Errorf("stack: vxlan inner address %s: want an IPv4 or IPv6 prefix", p)
		}
	}
	if c.Port == 0 {
		c.Port = gro.VXLANPort
	}
	if c.MAC == [6]byte{} {
		c.MAC = mac
		c.MAC[5] ^= 1
	}
	if c.MAC[0]&1 != 0 {
		return fmt.Errorf("stack: vxlan mac %s: a multicast address", net.HardwareAddr(c.MAC[:]))
	}
	return nil
}

// vxlanEndpoint is the VXLAN device's gVisor link endpoint: an Ethernet
// link whose frames travel inside UDP (see VXLANConfig).
type vxlanEndpoint struct {
	tunnelLink
	mtu    uint32
	mac    tcpip.LinkAddress
	macB   [6]byte
	local  tcpip.Address
	remote tcpip.Address
	local6 [16]byte
	port   uint16
	vni    uint32
	seed   maphash.Seed

	stats vxlanStats
}

// vxlanStats are the VXLAN device's counters.
type vxlanStats struct {
	rxPackets, rxDropped, rxOtherHost, txPackets, txErrors atomic.Uint64
}

func (s *vxlanStats) each(fn func(string, uint64)) {
	fn("vxlan_rx_packets", s.rxPackets.Load())
	fn("vxlan_rx_dropped", s.rxDropped.Load())
	fn("vxlan_rx_other_host", s.rxOtherHost.Load())
	fn("vxlan_tx_packets", s.txPackets.Load())
	fn("vxlan_tx_errors", s.txErrors.Load())
}

var _ gstack.LinkEndpoint = (*vxlanEndpoint)(nil)

// newVXLANEndpoint returns the device for c (validated) on a wire of MTU
// wireMTU.
func newVXLANEndpoint(c *VXLANConfig, wireMTU int) *vxlanEndpoint {
	return &vxlanEndpoint{
		mtu:    uint32(wireMTU - vxlanHeadroom),
		mac:    tcpip.LinkAddress(c.MAC[:]),
		macB:   c.MAC,
		local:  tcpip.AddrFrom16(c.Local.As16()),
		remote: tcpip.AddrFrom16(c.Remote.As16()),
		local6: c.Local.As16(),
		port:   c.Port,
		vni:    c.VNI,
		seed:   maphash.MakeSeed(),
	}
}

// setup adds the VXLAN NIC to ip, the local outer address to the wire's NIC,
// the inner addresses to the VXLAN NIC and a route to each inner subnet
// through it. It returns the routes, for the caller's route table.
func (v *vxlanEndpoint) setup(ip *gstack.Stack, c *VXLANConfig, wireAddrs []netip.Prefix) ([]tcpip.Route, error) {
	v.setStack(ip)
	if e := ip.CreateNICWithOptions(vxlanNICID, v, gstack.NICOptions{Name: "vxlan"}); e != nil {
		return nil, fmt.Errorf("stack: create vxlan NIC: %s", e)
	}
	own := false
	for _, p := range wireAddrs {
		own = own || p.Addr() == c.Local
	}
	if !own {
		local := tcpip.ProtocolAddress{Protocol: header.IPv6ProtocolNumber, AddressWithPrefix: v.local.WithPrefix()}
		if e := ip.AddProtocolAddress(nicID, local, gstack.AddressProperties{}); e != nil {
			return nil, fmt.Errorf("stack: add vxlan local address %s: %s", c.Local, e)
		}
	}
	var routes []tcpip.Route
	for _, p := range c.Addrs {
		pa := protocolAddress(p)
		if e := ip.AddProtocolAddress(vxlanNICID, pa, gstack.AddressProperties{}); e != nil {
			return nil, fmt.Errorf("stack: add vxlan address %s: %s", p, e)
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: vxlanNICID})
	}
	return routes, nil
}

// vxlanVerdict is what decap did with a packet.
type vxlanVerdict int

const (
	vxlanNotOurs vxlanVerdict = iota // not for the tunnel: the wire's NIC takes it
	vxlanInner                       // decapsulated: the packet is now the inner frame
	vxlanDrop                        // for the tunnel but refused; counted, the caller releases it
)

// decap terminates the tunnel for p, a packet as GRO let it go, as vxlan_rcv
// does after udp6_lib_rcv found the vxlan socket: a UDP datagram to Local
// and Port whose VXLAN header has the I flag, no other flag or reserved
// bit set, and the device's VNI loses its outer Ethernet, IPv6, UDP and
// VXLAN headers (__iptunnel_pull_header) and goes on as its inner
// Ethernet frame; one with a zero UDP checksum (udp6_csum_zero_error: no
// udp6zerocsumrx), other flags, another VNI or an inner unicast
// destination other than the device's MAC (eth_type_trans's
// PACKET_OTHERHOST, which ip_rcv drops) is dropped and counted. Outer
// extension headers are not the tunnel's: the wire's NIC gets such a
// packet. The headers are in p's linear part: the driver pulled every
// header of a VXLAN frame (driver.Config.VXLANPorts).
func (v *vxlanEndpoint) decap(p *driver.Packet) vxlanVerdict {
	b := p.Linear
	if len(b) < vxlanOuterLen || binary.BigEndian.Uint16(b[12:]) != uint16(header.IPv6ProtocolNumber) {
		return vxlanNotOurs
	}
	ip := header.IPv6(b[header.EthernetMinimumSize:])
	if ip.NextHeader() != uint8(header.UDPProtocolNumber) || [16]byte(ip.DestinationAddressSlice()) != v.local6 {
		return vxlanNotOurs
	}
	udp := header.UDP(b[header.EthernetMinimumSize+header.IPv6MinimumSize:])
	if udp.DestinationPort() != v.port {
		return vxlanNotOurs
	}
	vx := b[vxlanOuterLen-vxlanHdrLen : vxlanOuterLen]
	flags, vni := binary.BigEndian.Uint32(vx), binary.BigEndian.Uint32(vx[4:])
	if udp.Checksum() == 0 || flags != vxlanFlagI || vni != v.vni<<8 ||
		int(udp.Length()) != int(ip.PayloadLength()) || p.Len < vxlanOuterLen+header.EthernetMinimumSize {
		v.stats.rxDropped.Add(1)
		return vxlanDrop
	}
	if len(b) < vxlanOuterLen+header.EthernetMinimumSize {
		v.stats.rxDropped.Add(1) // the inner Ethernet header not pulled: a short frame
		return vxlanDrop
	}
	if dst := b[vxlanOuterLen : vxlanOuterLen+6]; dst[0]&1 == 0 && [6]byte(dst) != v.macB {
		v.stats.rxOtherHost.Add(1)
		return vxlanDrop
	}
	p.PullFront(vxlanOuterLen)
	v.stats.rxPackets.Add(1)
	return vxlanInner
}

// dispatch hands buf, an inner Ethernet frame owned by the call, to the
// VXLAN NIC (Deliver's stage 10 for a decapsulated packet).
func (v *vxlanEndpoint) dispatch(buf buffer.Buffer, m rxMeta) {
	d := v.attached()
	if d == nil {
		buf.Release()
		return
	}
	trimIPv6(&buf, ethLen)
	pb := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: buf})
	defer pb.DecRef()
	hdr, ok := pb.LinkHeader().Consume(header.EthernetMinimumSize)
	if !ok {
		return
	}
	proto := header.Ethernet(hdr).Type()
	pb.NetworkProtocolNumber = proto
	m.set(pb)
	d.DeliverNetworkPacket(proto, pb)
}

// WritePackets implements gstack.LinkWriter: each inner frame goes out
// encapsulated (see VXLANConfig). A frame that cannot be sent (the stack
// is closing, no route to the peer) is counted in vxlan_tx_errors.
func (v *vxlanEndpoint) WritePackets(pkts gstack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := v.writePacket(pkt); err != nil {
			v.stats.txErrors.Add(1)
			if n == 0 {
				return 0, err
			}
			break
		}
		v.stats.txPackets.Add(1)
		n++
	}
	return n, nil
}

func (v *vxlanEndpoint) writePacket(pkt *gstack.PacketBuffer) tcpip.Error {
	r, err := v.route(0, v.local, v.remote)
	if err != nil {
		return err
	}
	src := v.srcPort(pkt)
	outer := gstack.NewPacketBuffer(gstack.PacketBufferOptions{
		ReserveHeaderBytes: int(r.MaxHeaderLength()) + header.UDPMinimumSize + vxlanHdrLen,
		Payload:            pkt.ToBuffer(),
	})
	defer outer.DecRef()
	length := header.UDPMinimumSize + vxlanHdrLen + outer.Data().Size()
	h := outer.TransportHeader().Push(header.UDPMinimumSize + vxlanHdrLen)
	binary.BigEndian.PutUint32(h[header.UDPMinimumSize:], vxlanFlagI)
	binary.BigEndian.PutUint32(h[header.UDPMinimumSize+4:], v.vni<<8)
	udp := header.UDP(h)
	udp.Encode(&header.UDPFields{SrcPort: src, DstPort: v.port, Length: uint16(length)})
	// udp6_set_csum: the checksum over the pseudo-header, the UDP and
	// VXLAN headers and the inner frame; 0 is sent as 0xffff.
	sum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, v.local, v.remote, uint16(length))
	sum = checksum.Checksum(h[header.UDPMinimumSize:], checksum.Combine(sum, outer.Data().Checksum()))
	c := ^udp.CalculateChecksum(sum)
	if c == 0 {
		c = 0xffff
	}
	udp.SetChecksum(c)
	outer.TransportProtocolNumber = header.UDPProtocolNumber
	return r.WritePacket(gstack.NetworkHeaderParams{Protocol: header.UDPProtocolNumber, TTL: tunnelHopLimit}, outer)
}

// srcPort is udp_flow_src_port: a port in the local port range (32768 to
// 60999, Linux's default ip_local_port_range) from a hash of the inner
// flow, so that the peer's RSS spreads the tunnel's flows. The hash covers
// the inner IP addresses and the first 4 bytes of the L4 header (the
// ports), or the Ethernet header for a frame that is not IP.
func (v *vxlanEndpoint) srcPort(pkt *gstack.PacketBuffer) uint16 {
	var kb [40]byte
	key := kb[:0]
	nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
	switch {
	case len(nh) >= header.IPv4MinimumSize && nh[0]>>4 == 4:
		key = append(key, nh[12:20]...)
	case len(nh) >= header.IPv6MinimumSize && nh[0]>>4 == 6:
		key = append(key, nh[8:40]...)
	default:
		key = append(key, pkt.LinkHeader().Slice()...)
	}
	if len(th) >= 4 {
		key = append(key, th[:4]...)
	}
	const lo, hi = 32768, 60999
	h := maphash.Bytes(v.seed, key)
	return uint16(lo + (h>>32)*(hi-lo+1)>>32)
}

// MTU implements gstack.LinkEndpoint: the wire's, less VXLAN6_HEADROOM.
func (v *vxlanEndpoint) MTU() uint32 { return v.mtu }

// MaxHeaderLength implements gstack.LinkEndpoint: the inner Ethernet
// header; the outer headers go in a packet of their own.
func (v *vxlanEndpoint) MaxHeaderLength() uint16 { return header.EthernetMinimumSize }

// LinkAddress implements gstack.LinkEndpoint.
func (v *vxlanEndpoint) LinkAddress() tcpip.LinkAddress { return v.mac }

// Capabilities implements gstack.LinkEndpoint: the NIC model verified (or
// the wire vouched for) the inner packet's checksums, and the stack checks
// those nobody verified (csumCheck) after decap; transmit checksums are
// gVisor's. Neighbours are resolved inside the tunnel.
func (v *vxlanEndpoint) Capabilities() gstack.LinkEndpointCapabilities {
	return gstack.CapabilityRXChecksumOffload | gstack.CapabilityResolutionRequired
}

// ARPHardwareType implements gstack.LinkEndpoint.
func (v *vxlanEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }

// AddHeader implements gstack.LinkEndpoint: the inner Ethernet header.
func (v *vxlanEndpoint) AddHeader(pkt *gstack.PacketBuffer) { addEthernet(pkt) }

// ParseHeader implements gstack.LinkEndpoint.
func (v *vxlanEndpoint) ParseHeader(pkt *gstack.PacketBuffer) bool { return parseEthernet(pkt) }

// groConfig is the GRO engines' configuration for cfg: the flush timeout,
// the wire's kind (l3: a TUN's) and the VXLAN device's port, whose
// datagrams GRO merges inside the tunnel as udp_gro_receive does for a
// port with a vxlan socket.
func groConfig(cfg *Config, l3 bool) gro.Config {
	gc := gro.Config{FlushTimeout: cfg.GROFlushTimeout, L3: l3}
	if v := cfg.VXLAN; v != nil {
		gc.VXLANPorts = []uint16{v.Port}
	}
	return gc
}
