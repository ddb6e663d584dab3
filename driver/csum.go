package driver

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// VerifyChecksums checks the IPv4 header checksum (always, for IPv4) and,
// when l4 is true, the TCP, UDP, ICMPv4 or ICMPv6 checksum over the IP packet
// (frame[fi.L2Len : fi.L2Len+fi.IPLen]) with the pseudo-header where the
// protocol has one. A UDP checksum of 0 over IPv4 means none (valid); over
// IPv6 it is invalid. Fragments and L4Other: only the IPv4 header is checked;
// ARP has no checksum. It returns DropNone, DropBadIPCsum or DropBadL4Csum.
//
// fi must be what ParseFrame returned DropNone for on this frame. An fi whose
// offsets do not fit frame is reported as DropBadIPLen rather than trusted.
// The IPv6 pseudo-header uses the destination in the IPv6 header, which at the
// final destination is also the last address of any routing header. It never
// allocates.
func VerifyChecksums(frame []byte, fi *FrameInfo, l4 bool) Drop {
	var minL3 int
	switch fi.L3 {
	case L3IPv4:
		minL3 = ipv4MinHdrLen
	case L3IPv6:
		minL3 = ipv6HdrLen
	default:
		return DropNone
	}
	if fi.L2Len < 0 || fi.IPLen < 0 || fi.IPLen > len(frame)-fi.L2Len ||
		fi.L3Len < minL3 || fi.L3Len > fi.IPLen ||
		fi.L4Len < 0 || fi.L4Len > fi.IPLen-fi.L3Len {
		return DropBadIPLen
	}
	ip := frame[fi.L2Len : fi.L2Len+fi.IPLen]
	if fi.L3 == L3IPv4 && checksum.Checksum(ip[:fi.L3Len], 0) != 0xffff {
		return DropBadIPCsum
	}
	if !l4 || fi.Fragment {
		return DropNone
	}
	seg := ip[fi.L3Len:]
	var initial uint16
	switch fi.L4 {
	case L4TCP:
		if len(seg) < tcpMinHdrLen {
			return DropBadIPLen
		}
		initial = pseudoHeaderChecksum(ip, fi.L3, protoTCP, len(seg))
	case L4UDP:
		if len(seg) < udpHdrLen {
			return DropBadIPLen
		}
		if seg[6] == 0 && seg[7] == 0 {
			// RFC 768: no checksum. RFC 8200 section 8.1: not allowed
			// over IPv6.
			if fi.L3 == L3IPv4 {
				return DropNone
			}
			return DropBadL4Csum
		}
		initial = pseudoHeaderChecksum(ip, fi.L3, protoUDP, len(seg))
	case L4ICMP:
		if fi.L3 == L3IPv6 {
			initial = pseudoHeaderChecksum(ip, fi.L3, protoICMPv6, len(seg))
		}
	default:
		return DropNone
	}
	if checksum.Checksum(seg, initial) != 0xffff {
		return DropBadL4Csum
	}
	return DropNone
}

// pseudoHeaderChecksum returns the folded, uncomplemented sum of the IPv4 or
// IPv6 pseudo-header of the IP packet whose header starts ip, for an L4
// message of l4Len bytes. ip must hold the fixed header of l3.
func pseudoHeaderChecksum(ip []byte, l3 L3Type, proto uint8, l4Len int) uint16 {
	var src, dst tcpip.Address
	if l3 == L3IPv4 {
		src = tcpip.AddrFrom4Slice(ip[12:16])
		dst = tcpip.AddrFrom4Slice(ip[16:20])
	} else {
		src = tcpip.AddrFrom16Slice(ip[8:24])
		dst = tcpip.AddrFrom16Slice(ip[24:40])
	}
	return header.PseudoHeaderChecksum(tcpip.TransportProtocolNumber(proto), src, dst, uint16(l4Len))
}
