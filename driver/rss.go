package driver

import (
	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/rss"
)

// rssHash is the NIC's RSS hash of a frame whose layout ParseFrame found
// (fi): the Toeplitz hash of the IP addresses and, for a TCP or UDP packet
// that is not a fragment, its ports, with the RSS specification's key
// (rss.Key), as mlx5's hardware computes it for the indirection table and
// reports it in the CQE (rss_hash_result, rss_hash_type). A fragment is
// hashed on its addresses alone, as the kernel's RSS traffic types for IP
// hash a fragment (its ports, if it has them, are not its flow's other
// fragments'); so is an IP packet of another protocol. A frame that is not
// IP has no hash (HashNone: mlx5e_skb_set_hash's PKT_HASH_TYPE_NONE). frame
// starts with the Ethernet header (or the IP header on a TUN's wire) and
// holds the headers fi describes. It never allocates.
func rssHash(frame []byte, fi *FrameInfo) (uint32, bufpool.HashType) {
	var alen, src int
	switch fi.L3 {
	case L3IPv4:
		alen, src = 4, fi.L2Len+12 // RFC 791 section 3.1: source, destination at 12
	case L3IPv6:
		alen, src = 16, fi.L2Len+8 // RFC 8200 section 3: at 8
	default:
		return 0, bufpool.HashNone
	}
	if len(frame) < src+2*alen {
		return 0, bufpool.HashNone // ParseFrame checked; keep the compiler's view simple
	}
	t := rss.Default()
	s, d := frame[src:src+alen], frame[src+alen:src+2*alen]
	if !fi.Fragment && (fi.L4 == L4TCP || fi.L4 == L4UDP) {
		if l4 := fi.L2Len + fi.L3Len; len(frame) >= l4+4 {
			return t.Hash(s, d, frame[l4:l4+4]), bufpool.HashL4
		}
	}
	return t.Hash(s, d, nil), bufpool.HashL3
}

// setRSS records the RSS hash of the frame the CQE reports (cqe.Info set):
// frame holds its headers, from the Ethernet header on (a tunnel frame's
// from the outer header's end: what cqe.Info describes).
func setRSS(cqe *CQE, frame []byte) {
	cqe.RSSHash, cqe.RSSType = rssHash(frame, &cqe.Info)
}

// cqeMeta returns what the CQE says of its frame beside the bytes, as
// mlx5e_build_rx_skb sets an skb's fields from the CQE: the RSS hash
// (mlx5e_skb_set_hash) and the header offsets the NIC parsed, as
// skb->network_header and skb->transport_header (which the kernel's
// eth_type_trans and ip_rcv_core would find in the same places). A frame
// that is not IP (ARP) gets no offsets.
func cqeMeta(cqe *CQE) bufpool.RxMeta {
	m := bufpool.RxMeta{Hash: cqe.RSSHash, HashType: cqe.RSSType}
	if fi := &cqe.Info; fi.L3 == L3IPv4 || fi.L3 == L3IPv6 {
		m.NetworkHeader = uint16(fi.L2Len)
		m.TransportHeader = uint16(fi.L2Len + fi.L3Len)
		m.HeadersSet = true
	}
	return m
}
