package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// localAddrs is the set of destination addresses a datagram may have to be
// the stack's own, as gVisor's IP endpoints decide before a transport
// protocol sees it (and ip_route_input's RTN_LOCAL, RTN_BROADCAST and
// joined multicast groups in the kernel): IPv4, each address, the
// broadcast address of its subnet (/30 and wider), the limited broadcast
// 255.255.255.255 and the all-systems group 224.0.0.1, which gVisor joins
// on every IPv4 NIC; IPv6, each address, its solicited-node group and the
// all-nodes group ff02::1, which gVisor joins. No other group is joined:
// the NIC model's MAC filter (driver.Config.Multicast) passes only these,
// and a TUN's wire, which has no MAC filter, leaves this the only check.
// The source must not be a multicast or broadcast address either
// (ip_route_input_slow's martian source, ipv6_rcv's multicast source).
//
// It is built when a TrainConn is bound (trainTable.add) and read, never
// written, by the poll loops; has allocates nothing.
type localAddrs struct {
	v4 [][4]byte
	v6 [][16]byte
}

// newLocalAddrs builds the set from the addresses of the stack's gVisor
// NICs that packets from the wire reach (dispatch): the wire's and the
// tunnel's and the VXLAN device's, not a loopback interface's (ip_route_input refuses a loopback
// destination from a device as a martian).
func newLocalAddrs(all map[tcpip.NICID][]tcpip.ProtocolAddress) *localAddrs {
	l := &localAddrs{
		v4: [][4]byte{header.IPv4Broadcast.As4(), header.IPv4AllSystems.As4()},
		v6: [][16]byte{header.IPv6AllNodesMulticastAddress.As16()},
	}
	for _, id := range []tcpip.NICID{nicID, tunnelNICID, vxlanNICID} {
		for _, pa := range all[id] {
			a := pa.AddressWithPrefix
			if a.Address.Len() == header.IPv4AddressSize && a.Address.As4()[0] == 127 || a.Address == header.IPv6Loopback {
				continue
			}
			switch a.Address.Len() {
			case header.IPv4AddressSize:
				l.v4 = append(l.v4, a.Address.As4())
				if a.PrefixLen < 31 { // RFC 3021: a /31 has no broadcast address
					sn := a.Subnet()
					l.v4 = append(l.v4, sn.Broadcast().As4())
				}
			case header.IPv6AddressSize:
				l.v6 = append(l.v6, a.Address.As16(), header.SolicitedNodeAddr(a.Address).As16())
			}
		}
	}
	return l
}

// has reports whether an IP packet from src to dst (4 bytes each for
// IPv4, 16 for IPv6, as ipAddrs returns them) is for the stack.
func (l *localAddrs) has(src, dst []byte) bool {
	switch len(dst) {
	case header.IPv4AddressSize:
		if src[0]&0xf0 == 0xe0 || [4]byte(src) == [4]byte{0xff, 0xff, 0xff, 0xff} {
			return false // multicast (224.0.0.0/4) or limited broadcast
		}
		d := [4]byte(dst)
		for _, a := range l.v4 {
			if a == d {
				return true
			}
		}
	case header.IPv6AddressSize:
		if src[0] == 0xff {
			return false // multicast (ff00::/8)
		}
		d := [16]byte(dst)
		for _, a := range l.v6 {
			if a == d {
				return true
			}
		}
	}
	return false
}
