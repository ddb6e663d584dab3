package xsk

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// Stats are a socket's counters. Every field is safe to read while the
// socket runs. Kick adds its TX counts once per call, not per packet, so a
// reader sees them move in steps. The RX drop counters are named and
// counted as the kernel's struct xdp_statistics (XDP_STATISTICS, with
// XDP_STATISTICS' extra fields).
type Stats struct {
	TxPackets     atomic.Uint64 // tx_packets: packets written to the wire
	TxBytes       atomic.Uint64 // tx_bytes: their bytes, virtio-net headers excluded
	TxCsumOffload atomic.Uint64 // tx_csum_offload: checksum requests handed to the wire as NEEDS_CSUM
	TxCsumSW      atomic.Uint64 // tx_csum_sw: checksum requests completed in software (XDP_UMEM_TX_SW_CSUM)
	TxTimestamps  atomic.Uint64 // tx_timestamps: completion timestamps written
	TxInvalid     atomic.Uint64 // tx_invalid_descs: descriptors consumed and not completed, as XDP_STATISTICS' tx_invalid_descs: invalid address, length or options, and every descriptor of a multi-buffer packet dropped with one or for too many
	TxBadMetadata atomic.Uint64 // tx_bad_metadata: bad metadata on a packet's first descriptor (none reserved, unknown flag, checksum outside the descriptor): copy mode, Kicks failed with ErrBadMetadata; zero-copy, packets sent without the offloads
	TxErrors      atomic.Uint64 // tx_errors: packets the wire's Write failed
	TxCQFull      atomic.Uint64 // tx_cq_full: times Kick stopped with TX descriptors left because the completion ring was full
	RxPackets     atomic.Uint64 // rx_packets: frames Receive posted on the RX ring
	RxBytes       atomic.Uint64 // rx_bytes
	RxDropped     atomic.Uint64 // rx_dropped: frames dropped for another reason than a full RX ring: no fill ring entry, or empty or longer than UMEM.DataRoom (struct xdp_statistics' rx_dropped)
	RxRingFull    atomic.Uint64 // rx_ring_full: frames dropped because the RX ring was full (rx_ring_full)
	RxFillEmpty   atomic.Uint64 // rx_fill_ring_empty_descs: times a frame found the fill ring empty, each also in rx_dropped (rx_fill_ring_empty_descs)
	RxInvalidFill atomic.Uint64 // rx_invalid_fill: fill ring addresses outside the UMEM, skipped
}

// Each calls fn for every counter, in a fixed order.
func (s *Stats) Each(fn func(name string, v uint64)) {
	fn("tx_packets", s.TxPackets.Load())
	fn("tx_bytes", s.TxBytes.Load())
	fn("tx_csum_offload", s.TxCsumOffload.Load())
	fn("tx_csum_sw", s.TxCsumSW.Load())
	fn("tx_timestamps", s.TxTimestamps.Load())
	fn("tx_invalid_descs", s.TxInvalid.Load())
	fn("tx_bad_metadata", s.TxBadMetadata.Load())
	fn("tx_errors", s.TxErrors.Load())
	fn("tx_cq_full", s.TxCQFull.Load())
	fn("rx_packets", s.RxPackets.Load())
	fn("rx_bytes", s.RxBytes.Load())
	fn("rx_dropped", s.RxDropped.Load())
	fn("rx_ring_full", s.RxRingFull.Load())
	fn("rx_fill_ring_empty_descs", s.RxFillEmpty.Load())
	fn("rx_invalid_fill", s.RxInvalidFill.Load())
}

// txCounts accumulates one Kick's TX counts, added to Stats at its end.
type txCounts struct {
	packets, bytes, csumOffload, csumSW, timestamps uint64
	invalid, badMetadata, errors, cqFull            uint64
}

// addNonZero adds v to c unless it is 0: most counts of a Kick are, and an
// atomic add is a locked instruction.
func addNonZero(c *atomic.Uint64, v uint64) {
	if v != 0 {
		c.Add(v)
	}
}

func (t *txCounts) flush(s *Stats) {
	addNonZero(&s.TxPackets, t.packets)
	addNonZero(&s.TxBytes, t.bytes)
	addNonZero(&s.TxCsumOffload, t.csumOffload)
	addNonZero(&s.TxCsumSW, t.csumSW)
	addNonZero(&s.TxTimestamps, t.timestamps)
	addNonZero(&s.TxInvalid, t.invalid)
	addNonZero(&s.TxBadMetadata, t.badMetadata)
	addNonZero(&s.TxErrors, t.errors)
	addNonZero(&s.TxCQFull, t.cqFull)
}

// String lists the non-zero counters as name=value, in Each's order.
func (s *Stats) String() string {
	var out []string
	s.Each(func(name string, v uint64) {
		if v != 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, v))
		}
	})
	return strings.Join(out, " ")
}
