package driver

import "strconv"

// Drop is why the NIC model dropped a frame; DropNone means it was not
// dropped. Each value other than DropNone names one receive drop counter;
// NumDrops sizes an array of counters indexed by Drop.
type Drop uint8

// Drop reasons. The order is part of the API: counters are indexed by Drop.
const (
	DropNone             Drop = iota
	DropShortEther            // shorter than an Ethernet header (or VLAN tag)
	DropUnknownEtherType      // not IPv4, IPv6 or ARP
	DropShortARP              // ARP packet shorter than 28 bytes
	DropShortIP               // shorter than the fixed IPv4/IPv6 header
	DropBadIPVersion          // version field disagrees with EtherType
	DropBadIHL                // IPv4 IHL < 5 or beyond the frame
	DropBadIPLen              // IPv4 total length < IHL*4 or beyond the frame; IPv6 payload length beyond the frame; IPv6 jumbogram
	DropBadIPv6ExtHdr         // extension header chain truncated or too long
	DropShortL4               // TCP/UDP/ICMP header truncated
	DropBadTCPOff             // TCP data offset < 5 or beyond the IP packet
	DropBadUDPLen             // UDP length field < 8 or disagrees with the IP payload length
	DropBadIPCsum             // IPv4 header checksum wrong
	DropBadL4Csum             // TCP/UDP/ICMP checksum wrong
	DropBadVnetHdr            // virtio-net header inconsistent (csum_start/offset outside the frame, unknown flags, GSO without NEEDS_CSUM)
	DropBadGSO                // GSO type unknown/unsupported or not matching the frame, GSO size 0 or larger than the frame, too many segments (UDP: more than UDPMaxSegments)
	DropOtherHost             // unicast frame for another MAC
	DropMulticast             // multicast group not joined
	DropNoBuffer              // no RX buffer
	DropTooBig                // frame larger than the MTU allows
	DropTunnelProto           // to a local tunnel address (TunnelConfig), next header neither 4, 41 nor ICMPv6
	DropBadTunnel             // tunnel frame that cannot be decapsulated: outer fragment, outer header too long, GSO
	DropOutOfBuffer           // the RQ was full, with Config.RQDrop (mlx5's rx_out_of_buffer)
	NumDrops                  // number of Drop values
)

var dropNames = [NumDrops]string{
	DropNone:             "none",
	DropShortEther:       "rx_drop_short_ether",
	DropUnknownEtherType: "rx_drop_unknown_ethertype",
	DropShortARP:         "rx_drop_short_arp",
	DropShortIP:          "rx_drop_short_ip",
	DropBadIPVersion:     "rx_drop_bad_ip_version",
	DropBadIHL:           "rx_drop_bad_ihl",
	DropBadIPLen:         "rx_drop_bad_ip_len",
	DropBadIPv6ExtHdr:    "rx_drop_bad_ipv6_exthdr",
	DropShortL4:          "rx_drop_short_l4",
	DropBadTCPOff:        "rx_drop_bad_tcp_off",
	DropBadUDPLen:        "rx_drop_bad_udp_len",
	DropBadIPCsum:        "rx_drop_bad_ip_csum",
	DropBadL4Csum:        "rx_drop_bad_l4_csum",
	DropBadVnetHdr:       "rx_drop_bad_vnet_hdr",
	DropBadGSO:           "rx_drop_bad_gso",
	DropOtherHost:        "rx_drop_other_host",
	DropMulticast:        "rx_drop_multicast",
	DropNoBuffer:         "rx_drop_no_buffer",
	DropTooBig:           "rx_drop_too_big",
	DropTunnelProto:      "rx_drop_tunnel_proto",
	DropBadTunnel:        "rx_drop_bad_tunnel",
	DropOutOfBuffer:      "rx_drop_out_of_buffer",
}

// String returns the drop counter's name in ethtool -S style, such as
// "rx_drop_bad_ip_csum", or "none" for DropNone. Values outside the defined
// range read "rx_drop_unknown_N".
func (d Drop) String() string {
	if d < NumDrops {
		return dropNames[d]
	}
	return "rx_drop_unknown_" + strconv.Itoa(int(d))
}
