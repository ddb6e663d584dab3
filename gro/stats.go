package gro

import "sync/atomic"

// Stats are an Engine's counters, named as ethtool -S names them where a name
// exists (mlx5's rx_gro_*). They are written by the engine's goroutine and
// may be read from any goroutine.
type Stats struct {
	// Packets counts wire frames that went into merged packets (delivered
	// with two or more segments), heads included: rx_gro_packets.
	Packets atomic.Uint64
	// Bytes counts the bytes (Ethernet header plus IP length) of merged
	// packets delivered: rx_gro_bytes.
	Bytes atomic.Uint64
	// SKBs counts merged packets delivered: rx_gro_skbs.
	SKBs atomic.Uint64
	// FragList counts merges done the slow way, by chaining the segment on
	// the held packet's Next list because its linear part held payload:
	// rx_gro_frag_list.
	FragList atomic.Uint64
	// HeldMax is the most packets the engine held at once: rx_gro_held_max.
	HeldMax atomic.Uint64

	// SegsHist counts packets handed up from the flow table (TCP and UDP,
	// single segments included) by their segment count: 1, 2-3, 4-7, 8-15,
	// 16-31, 32-63, 64 or more (rx_gro_segs_hist_*).
	SegsHist [numSegsBuckets]atomic.Uint64

	// Flush reasons, one count per held packet handed up.
	FlushBatchEnd atomic.Uint64 // rx_gro_flush_batch_end: EndBatch (FlushTimeout 0) or Flush
	FlushTimeout  atomic.Uint64 // rx_gro_flush_timeout: held longer than FlushTimeout, or FlushOlderThan
	FlushFull     atomic.Uint64 // rx_gro_flush_full: MaxSize (64 KB), 64 UDP segments
	FlushFlags    atomic.Uint64 // rx_gro_flush_flags: PSH/FIN merged, SYN/RST/URG/CWR or other flag change
	FlushShort    atomic.Uint64 // rx_gro_flush_short: a segment shorter than the first was merged and ends the train
	FlushMismatch atomic.Uint64 // rx_gro_flush_mismatch: headers differ, not contiguous, larger, empty or not mergeable
	FlushEvict    atomic.Uint64 // rx_gro_flush_evict: the flow's hash bucket was full

	// Passthrough counts packets handed up at once, never held:
	// rx_gro_passthrough.
	Passthrough atomic.Uint64

	// CsumSoftware counts packets whose TCP or UDP checksum the NIC did
	// not verify (CHECKSUM_NONE) and GRO found good in software
	// (skb_gro_checksum_validate): rx_gro_csum_sw.
	CsumSoftware atomic.Uint64
	// CsumBad counts packets whose checksum GRO found bad in software:
	// handed up unmerged and unverified, for the stack to drop and count
	// (its TCP or UDP checksum errors): rx_gro_csum_bad.
	CsumBad atomic.Uint64

	// Tunnel GRO (Config.VXLANPorts). TunnelPackets counts the wire
	// frames that went into merged VXLAN packets (part of
	// rx_gro_packets): rx_gro_tunnel_packets.
	TunnelPackets atomic.Uint64
	// TunnelBytes counts the bytes of merged VXLAN packets delivered, as
	// rx_gro_bytes does (the outer Ethernet header and IP length; part of
	// it): rx_gro_tunnel_bytes.
	TunnelBytes atomic.Uint64
	// TunnelSKBs counts merged VXLAN packets delivered (part of
	// rx_gro_skbs): rx_gro_tunnel_skbs.
	TunnelSKBs atomic.Uint64
	// TunnelPassthrough counts UDP datagrams to a VXLAN port handed up at
	// once, never held (part of rx_gro_passthrough): an inner packet that
	// is not TCP over IPv4 or IPv6, a bad outer checksum, any packet the
	// kernel's tunnel GRO would not look up or hold:
	// rx_gro_tunnel_passthrough.
	TunnelPassthrough atomic.Uint64
}

// numSegsBuckets is the number of segment-count histogram buckets.
const numSegsBuckets = 7

var segsHistNames = [numSegsBuckets]string{
	"rx_gro_segs_hist_1",
	"rx_gro_segs_hist_2_3",
	"rx_gro_segs_hist_4_7",
	"rx_gro_segs_hist_8_15",
	"rx_gro_segs_hist_16_31",
	"rx_gro_segs_hist_32_63",
	"rx_gro_segs_hist_64_plus",
}

// segsBucket returns the histogram bucket of a packet of segs segments.
func segsBucket(segs int) int {
	switch {
	case segs < 2:
		return 0
	case segs < 4:
		return 1
	case segs < 8:
		return 2
	case segs < 16:
		return 3
	case segs < 32:
		return 4
	case segs < 64:
		return 5
	}
	return 6
}

// Each calls fn with every counter's name and current value, always in the
// same order. It may be called from any goroutine.
func (s *Stats) Each(fn func(name string, v uint64)) {
	fn("rx_gro_packets", s.Packets.Load())
	fn("rx_gro_bytes", s.Bytes.Load())
	fn("rx_gro_skbs", s.SKBs.Load())
	fn("rx_gro_frag_list", s.FragList.Load())
	fn("rx_gro_held_max", s.HeldMax.Load())
	for i := range s.SegsHist {
		fn(segsHistNames[i], s.SegsHist[i].Load())
	}
	fn("rx_gro_flush_batch_end", s.FlushBatchEnd.Load())
	fn("rx_gro_flush_timeout", s.FlushTimeout.Load())
	fn("rx_gro_flush_full", s.FlushFull.Load())
	fn("rx_gro_flush_flags", s.FlushFlags.Load())
	fn("rx_gro_flush_short", s.FlushShort.Load())
	fn("rx_gro_flush_mismatch", s.FlushMismatch.Load())
	fn("rx_gro_flush_evict", s.FlushEvict.Load())
	fn("rx_gro_passthrough", s.Passthrough.Load())
	fn("rx_gro_csum_sw", s.CsumSoftware.Load())
	fn("rx_gro_csum_bad", s.CsumBad.Load())
	fn("rx_gro_tunnel_packets", s.TunnelPackets.Load())
	fn("rx_gro_tunnel_bytes", s.TunnelBytes.Load())
	fn("rx_gro_tunnel_skbs", s.TunnelSKBs.Load())
	fn("rx_gro_tunnel_passthrough", s.TunnelPassthrough.Load())
}

// SegsAverage returns the mean number of wire frames per merged packet
// (rx_gro_packets / rx_gro_skbs), or 0 before the first one. Single
// segments handed up unmerged are not counted; SegsHist has them.
func (s *Stats) SegsAverage() float64 {
	n := s.SKBs.Load()
	if n == 0 {
		return 0
	}
	return float64(s.Packets.Load()) / float64(n)
}

// flushReason is why a held packet was handed up.
type flushReason uint8

const (
	flushBatchEnd flushReason = iota
	flushTimeout
	flushFull
	flushFlags
	flushShort
	flushMismatch
	flushEvict
)

// flushCounter returns the counter of reason r.
func (s *Stats) flushCounter(r flushReason) *atomic.Uint64 {
	switch r {
	case flushBatchEnd:
		return &s.FlushBatchEnd
	case flushTimeout:
		return &s.FlushTimeout
	case flushFull:
		return &s.FlushFull
	case flushFlags:
		return &s.FlushFlags
	case flushShort:
		return &s.FlushShort
	case flushEvict:
		return &s.FlushEvict
	}
	return &s.FlushMismatch
}
