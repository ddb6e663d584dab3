package stack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/driver"
)

// TunnelConfig configures an IPv6 tunnel that ustack terminates itself, as
// a Linux ip6tnl device in mode any does: IPv4-in-IPv6 and IPv6-in-IPv6
// (RFC 2473), outer next header 4 or 41, no extension headers sent.
//
// Design. The tunnel is a second gVisor NIC, a point-to-point L3 link like
// ip6tnl0, holding the inner addresses, with a route to each inner subnet.
//
//   - Receive: the driver decapsulates frames to Local before GRO
//     (driver.TunnelConfig), so what reaches the link endpoint is an
//     ordinary Ethernet frame with the inner packet; the link endpoint hands
//     a packet for an inner address to the tunnel NIC instead of the wire's
//     (the weak host model: Linux, too, accepts a packet for an address of
//     one interface on another).
//   - Transmit: gVisor routes replies for the inner peers to the tunnel NIC,
//     which has no GSO and an MTU 40 bytes below the wire's, so TCP sends
//     segments that still fit the wire once encapsulated. Its WritePackets
//     writes each inner packet as the payload of an IPv6 packet from Local
//     to the peer's outer address, next header 4 or 41, hop limit 64,
//     through a gVisor route on the wire's NIC: gVisor builds the outer
//     header (payload length included) and resolves the peer's link address
//     by neighbour discovery, queueing packets meanwhile, as for any packet
//     it sends.
//
// Why not encapsulate in the wire's link endpoint: gVisor would then route
// the inner packets to the wire's NIC, resolve the inner peers' link
// addresses (which do not exist on the wire), segment TCP by the wire's MTU
// and hand it 64 KB TSO super-frames, which a TAP cannot take tunnelled.
// A NIC of its own gives the tunnel its MTU, no GSO and no link resolution,
// as the kernel's ip6tnl device has.
type TunnelConfig struct {
	// Local is ustack's outer IPv6 address, the tunnel's end here. It is
	// added to the wire's NIC (so that the peer can resolve it) and the
	// driver terminates the tunnel at it: TCP and UDP to it are dropped
	// (rx_drop_tunnel_proto), so it must not be one of Config.Addrs.
	Local netip.Addr
	// Remote is the peer's outer IPv6 address, the destination of the
	// encapsulated packets (with Linux ip6tnl, its local address).
	Remote netip.Addr
	// Remote4, if valid, is the outer destination for IPv4 inner packets
	// instead of Remote: for a peer that decapsulates each inner family at
	// an address of its own (Linux seg6local End.DX4 and End.DT6 segments).
	Remote4 netip.Addr
	// Addrs are ustack's inner addresses with their subnets. They are the
	// tunnel NIC's, and each subnet is routed through the tunnel.
	Addrs []netip.Prefix
}

// The outer header's next header: IPv4 in IP and IPv6 in IP (RFC 2473).
const (
	protoIPv4InIP tcpip.TransportProtocolNumber = 4
	protoIPv6InIP tcpip.TransportProtocolNumber = 41
)

// tunnelNICID is the tunnel's gVisor NIC.
const tunnelNICID tcpip.NICID = 2

// tunnelHopLimit is the outer header's hop limit (the kernel's default,
// and ip6tnl's unless set).
const tunnelHopLimit = 64

// validate checks c against the stack's own addresses.
func (c *TunnelConfig) validate(addrs []netip.Prefix) error {
	is6 := func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && !a.IsUnspecified() }
	if !is6(c.Local) || !is6(c.Remote) || (c.Remote4.IsValid() && !is6(c.Remote4)) {
		return fmt.Errorf("stack: tunnel local %s, remote %s, remote4 %s: want IPv6 addresses", c.Local, c.Remote, c.Remote4)
	}
	if len(c.Addrs) == 0 {
		return errors.New("stack: tunnel: no inner address")
	}
	for _, p := range addrs {
		if p.Addr() == c.Local {
			return fmt.Errorf("stack: tunnel local address %s is also a stack address: the tunnel takes its TCP and UDP", c.Local)
		}
	}
	for _, p := range c.Addrs {
		if !p.IsValid() || p.Addr().Is4In6() {
			return fmt.Errorf("stack: tunnel inner address %s: want an IPv4 or IPv6 prefix", p)
		}
	}
	return nil
}

// tunnelEndpoint is the tunnel's gVisor link endpoint: an L3 link without
// link addresses, GSO or link resolution (see TunnelConfig).
type tunnelEndpoint struct {
	mtu     uint32
	local   tcpip.Address
	remote4 tcpip.Address // +checklocksignore: set by newTunnelEndpoint, read-only after
	remote6 tcpip.Address // +checklocksignore: set by newTunnelEndpoint, read-only after
	// inner are the inner addresses, in wire form, that the link endpoint
	// steers to this NIC.
	inner4 [][4]byte
	inner6 [][16]byte

	tunnelLink
	stats tunnelStats
}

// tunnelLink is what the link endpoints of ustack's tunnel devices (the
// ip6tnl-like tunnelEndpoint, the VXLAN device's vxlanEndpoint) share: the
// dispatcher gVisor attached, the close action, and the routes on the
// wire's NIC to the peer's outer addresses, found on first use.
type tunnelLink struct {
	mu sync.RWMutex
	// +checklocks:mu
	dispatcher gstack.NetworkDispatcher
	// +checklocks:mu
	onClose func()
	// +checklocks:mu
	ip *gstack.Stack
	// +checklocks:mu
	routes [2]*gstack.Route
	// +checklocks:mu
	closed bool
}

// setStack records the gVisor stack the routes are found in.
func (l *tunnelLink) setStack(ip *gstack.Stack) {
	l.mu.Lock()
	l.ip = ip
	l.mu.Unlock()
}

// attached returns the dispatcher, nil before Attach.
func (l *tunnelLink) attached() gstack.NetworkDispatcher {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.dispatcher
}

// route returns route i, on the wire's NIC from local to remote (IPv6),
// finding it on first use.
func (l *tunnelLink) route(i int, local, remote tcpip.Address) (*gstack.Route, tcpip.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.ip == nil {
		return nil, &tcpip.ErrClosedForSend{}
	}
	if l.routes[i] == nil {
		r, err := l.ip.FindRoute(nicID, local, remote, ipv6.ProtocolNumber, false)
		if err != nil {
			return nil, err
		}
		l.routes[i] = r
	}
	return l.routes[i], nil
}

// release drops the cached routes; later writes fail. Called by Stack.Close
// before gVisor is closed.
func (l *tunnelLink) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for i, r := range l.routes {
		if r != nil {
			r.Release()
		}
		l.routes[i] = nil
	}
}

// SetMTU implements gstack.LinkEndpoint. The MTU follows the wire's.
func (l *tunnelLink) SetMTU(uint32) {}

// SetLinkAddress implements gstack.LinkEndpoint.
func (l *tunnelLink) SetLinkAddress(tcpip.LinkAddress) {}

// Attach implements gstack.LinkEndpoint.
func (l *tunnelLink) Attach(d gstack.NetworkDispatcher) {
	l.mu.Lock()
	l.dispatcher = d
	l.mu.Unlock()
}

// IsAttached implements gstack.LinkEndpoint.
func (l *tunnelLink) IsAttached() bool { return l.attached() != nil }

// Wait implements gstack.LinkEndpoint.
func (l *tunnelLink) Wait() {}

// Close implements gstack.LinkEndpoint.
func (l *tunnelLink) Close() {
	l.mu.Lock()
	f := l.onClose
	l.onClose = nil
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// SetOnCloseAction implements gstack.LinkEndpoint.
func (l *tunnelLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	l.onClose = f
	l.mu.Unlock()
}

// tunnelStats are the tunnel NIC's counters.
type tunnelStats struct {
	rxPackets, txPackets, txErrors atomic.Uint64
}

func (s *tunnelStats) each(fn func(string, uint64)) {
	fn("tunnel_rx_packets", s.rxPackets.Load())
	fn("tunnel_tx_packets", s.txPackets.Load())
	fn("tunnel_tx_errors", s.txErrors.Load())
}

var _ gstack.LinkEndpoint = (*tunnelEndpoint)(nil)

func newTunnelEndpoint(c *TunnelConfig, wireMTU int) *tunnelEndpoint {
	t := &tunnelEndpoint{
		mtu:     uint32(wireMTU - header.IPv6MinimumSize),
		local:   tcpip.AddrFrom16(c.Local.As16()),
		remote6: tcpip.AddrFrom16(c.Remote.As16()),
		remote4: tcpip.AddrFrom16(c.Remote.As16()),
	}
	if c.Remote4.IsValid() {
		t.remote4 = tcpip.AddrFrom16(c.Remote4.As16())
	}
	for _, p := range c.Addrs {
		if p.Addr().Is4() {
			t.inner4 = append(t.inner4, p.Addr().As4())
		} else {
			t.inner6 = append(t.inner6, p.Addr().As16())
		}
	}
	return t
}

// driverConfig returns the driver's side of the tunnel.
func (c *TunnelConfig) driverConfig() driver.TunnelConfig {
	return driver.TunnelConfig{Local: []netip.Addr{c.Local}}
}

// setup adds the tunnel NIC to ip, the local outer address to the wire's
// NIC, the inner addresses to the tunnel NIC and a route to each inner
// subnet through it. It returns the routes, for the caller's route table.
func (t *tunnelEndpoint) setup(ip *gstack.Stack, c *TunnelConfig) ([]tcpip.Route, error) {
	t.setStack(ip)
	if e := ip.CreateNICWithOptions(tunnelNICID, t, gstack.NICOptions{Name: "tunnel"}); e != nil {
		return nil, fmt.Errorf("stack: create tunnel NIC: %s", e)
	}
	local := tcpip.ProtocolAddress{Protocol: ipv6.ProtocolNumber, AddressWithPrefix: t.local.WithPrefix()}
	if e := ip.AddProtocolAddress(nicID, local, gstack.AddressProperties{}); e != nil {
		return nil, fmt.Errorf("stack: add tunnel local address %s: %s", c.Local, e)
	}
	var routes []tcpip.Route
	for _, p := range c.Addrs {
		pa := protocolAddress(p)
		if e := ip.AddProtocolAddress(tunnelNICID, pa, gstack.AddressProperties{}); e != nil {
			return nil, fmt.Errorf("stack: add tunnel address %s: %s", p, e)
		}
		routes = append(routes, tcpip.Route{Destination: pa.AddressWithPrefix.Subnet(), NIC: tunnelNICID})
	}
	return routes, nil
}

// protocolAddress converts p for gVisor.
func protocolAddress(p netip.Prefix) tcpip.ProtocolAddress {
	proto := ipv4.ProtocolNumber
	if p.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	a := tcpip.AddrFromSlice(p.Addr().AsSlice())
	return tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddressWithPrefix{Address: a, PrefixLen: p.Bits()}}
}

// deliver hands buf, a decapsulated frame (its link header of l2 bytes
// first: an Ethernet header, or none on a TUN), to the tunnel NIC if it is
// for one of the inner addresses, and reports whether it did; buf is then
// owned by the call. Called from the poll loop (or a cpumap worker); it
// does not allocate.
func (t *tunnelEndpoint) deliver(buf *buffer.Buffer, l2 int, m rxMeta) bool {
	var b [header.EthernetMinimumSize + header.IPv6MinimumSize]byte
	hdr := b[:l2+header.IPv6MinimumSize]
	n, _ := buf.ReadAt(hdr, 0)
	var proto tcpip.NetworkProtocolNumber
	et := netProto(hdr[:n], l2)
	switch {
	case n >= l2+header.IPv4MinimumSize && et == header.IPv4ProtocolNumber:
		dst := [4]byte(header.IPv4(hdr[l2:]).DestinationAddressSlice())
		if !contains4(t.inner4, dst) {
			return false
		}
		proto = ipv4.ProtocolNumber
	case n >= l2+header.IPv6MinimumSize && et == header.IPv6ProtocolNumber:
		dst := [16]byte(header.IPv6(hdr[l2:]).DestinationAddressSlice())
		if !contains16(t.inner6, dst) {
			return false
		}
		proto = ipv6.ProtocolNumber
	default:
		return false
	}
	d := t.attached()
	if d == nil {
		buf.Release()
		return true
	}
	pb := gstack.NewPacketBuffer(gstack.PacketBufferOptions{Payload: *buf})
	defer pb.DecRef()
	if _, ok := pb.LinkHeader().Consume(l2); !ok {
		return true
	}
	pb.NetworkProtocolNumber = proto
	t.stats.rxPackets.Add(1)
	m.set(pb)
	d.DeliverNetworkPacket(proto, pb)
	return true
}

func contains4(s [][4]byte, a [4]byte) bool {
	for _, b := range s {
		if a == b {
			return true
		}
	}
	return false
}

func contains16(s [][16]byte, a [16]byte) bool {
	for _, b := range s {
		if a == b {
			return true
		}
	}
	return false
}

// WritePackets implements gstack.LinkWriter: each inner packet goes out
// encapsulated (see TunnelConfig). A packet that cannot be sent (the stack
// is closing, no route to the peer) is counted in tunnel_tx_errors.
func (t *tunnelEndpoint) WritePackets(pkts gstack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := t.writePacket(pkt); err != nil {
			t.stats.txErrors.Add(1)
			if n == 0 {
				return 0, err
			}
			break
		}
		t.stats.txPackets.Add(1)
		n++
	}
	return n, nil
}

func (t *tunnelEndpoint) writePacket(pkt *gstack.PacketBuffer) tcpip.Error {
	v4 := pkt.NetworkProtocolNumber == ipv4.ProtocolNumber
	i, remote := 0, t.remote6
	if v4 {
		i, remote = 1, t.remote4
	}
	r, err := t.route(i, t.local, remote)
	if err != nil {
		return err
	}
	nh := protoIPv6InIP
	if v4 {
		nh = protoIPv4InIP
	}
	outer := gstack.NewPacketBuffer(gstack.PacketBufferOptions{
		ReserveHeaderBytes: int(r.MaxHeaderLength()),
		Payload:            pkt.ToBuffer(),
	})
	defer outer.DecRef()
	outer.TransportProtocolNumber = nh
	return r.WritePacket(gstack.NetworkHeaderParams{Protocol: nh, TTL: tunnelHopLimit}, outer)
}

// MTU implements gstack.LinkEndpoint: the wire's, less the outer header.
func (t *tunnelEndpoint) MTU() uint32 { return t.mtu }

// MaxHeaderLength implements gstack.LinkEndpoint: the outer headers go in a
// packet of their own.
func (t *tunnelEndpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements gstack.LinkEndpoint: a tunnel has none.
func (t *tunnelEndpoint) LinkAddress() tcpip.LinkAddress { return "" }

// Capabilities implements gstack.LinkEndpoint: the driver verified (or the
// wire vouched for) the inner packet's checksums; transmit checksums are
// gVisor's, as the kernel cannot be asked to complete an inner checksum
// through a packet gVisor encapsulated.
func (t *tunnelEndpoint) Capabilities() gstack.LinkEndpointCapabilities {
	return gstack.CapabilityRXChecksumOffload
}

// ARPHardwareType implements gstack.LinkEndpoint.
func (t *tunnelEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements gstack.LinkEndpoint: no link header.
func (t *tunnelEndpoint) AddHeader(*gstack.PacketBuffer) {}

// ParseHeader implements gstack.LinkEndpoint: no link header.
func (t *tunnelEndpoint) ParseHeader(*gstack.PacketBuffer) bool { return true }
