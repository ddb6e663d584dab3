package driver

import "sync/atomic"

// Stats are the driver's counters. Names follow `ethtool -S` where the
// kernel has one. Every field is safe to read while the driver runs.
type Stats struct {
	// Wire and NIC model.
	WireReads       atomic.Uint64 // rx_wire_reads: reads from the wire (one per frame or super-frame)
	WireBytes       atomic.Uint64 // rx_wire_bytes: bytes read, virtio-net headers excluded
	WireErrors      atomic.Uint64 // rx_wire_errors: failed wire reads; the first stops receive (Driver.Err)
	DirectReads     atomic.Uint64 // rx_wire_direct: super-frames read straight into the ring's pages (no copy)
	DirectBytes     atomic.Uint64 // rx_wire_direct_bytes: bytes of them that went straight into the ring
	GSOFrames       atomic.Uint64 // rx_gso_frames: super-frames with a GSO type
	GSOSegs         atomic.Uint64 // rx_gso_segs: frames cut from them (LRO off)
	LROFrames       atomic.Uint64 // rx_lro_packets: super-frames handed up whole (LRO on)
	LROBytes        atomic.Uint64 // rx_lro_bytes
	USOFrames       atomic.Uint64 // rx_uso_packets: UDP super-frames handed up whole (RxUSO)
	USOBytes        atomic.Uint64 // rx_uso_bytes
	CsumPartial     atomic.Uint64 // rx_csum_partial: frames trusted by NEEDS_CSUM
	CsumUnneeded    atomic.Uint64 // rx_csum_unnecessary: frames trusted by DATA_VALID
	CsumComplete    atomic.Uint64 // rx_csum_complete: frames whose checksums the NIC model verified
	CsumNone        atomic.Uint64 // rx_csum_none: frames with no checksum to verify (ARP, ...) or a bad one (CHECKSUM_NONE, as mlx5)
	TunnelDecap     atomic.Uint64 // rx_tunnel_decap: tunnel frames decapsulated (TunnelConfig)
	VXLANFrames     atomic.Uint64 // rx_vxlan_frames: frames the NIC parsed as VXLAN (Config.VXLANPorts), segments of a tunnel super-frame included
	TunnelGSOFrames atomic.Uint64 // rx_gso_tunnel_frames: UDP tunnel super-frames cut into segments (TAPConfig.UDPTunnel)
	WQEs            atomic.Uint64 // rx_wqes: WQEs (buffers) posted
	Strides         atomic.Uint64 // rx_strides: strides consumed
	CQEStalls       atomic.Uint64 // rx_cqe_stalls: times the NIC waited for the poll loop
	RQStalls        atomic.Uint64 // rx_rq_stalls: times the NIC waited for the poll loop to free RQ room (Config.RQSize)
	NICWakeups      atomic.Uint64 // rx_irqs: interrupts raised to wake the poll loop
	TimerIRQs       atomic.Uint64 // rx_irqs_timer: of those, raised by the moderation timer (Config.CoalesceUsecs)
	BusyPolls       atomic.Uint64 // rx_busy_polls: spins on an empty ring (Config.BusyPoll)
	BusyPollHits    atomic.Uint64 // rx_busy_poll_hits: spins a completion ended, no sleep
	RTCSplits       atomic.Uint64 // rx_rtc_splits: times run to completion handed the NIC model to its own goroutine under load (as softirq to ksoftirqd)

	// Poll loop.
	Packets      atomic.Uint64 // rx_packets: frames (CQEs) the poll loop built packets from
	Bytes        atomic.Uint64 // rx_bytes
	Polls        atomic.Uint64 // rx_napi_polls: poll batches
	HDSBytes     atomic.Uint64 // rx_hds_bytes: bytes copied into linear parts
	HDSPayload   atomic.Uint64 // rx_hds_payload_bytes: payload bytes among them (the mlx5 header-copy patch's waste)
	HDSPull      atomic.Uint64 // rx_hds_pull_bytes: header bytes pulled from the frags after a header copy shorter than the headers (pskb_may_pull)
	LinearOnly   atomic.Uint64 // rx_linear_packets: packets that fit entirely in the linear part
	PacketFrags  atomic.Uint64 // rx_frags: payload frags handed up
	SKBLinear    atomic.Uint64 // rx_skb_linear: packets built over their stride, no copy (mlx5e_skb_from_cqe_mpwrq_linear)
	SKBNonlinear atomic.Uint64 // rx_skb_nonlinear: packets built with a header copy (mlx5e_skb_from_cqe_mpwrq_nonlinear)
	Dropped      [NumDrops]atomic.Uint64
	DroppedVLAN  atomic.Uint64 // rx_drop_vlan: tagged frames (no VLAN configured)
	NICCPUNanos  atomic.Int64  // nic_cpu_ns: CPU time of the NIC model's thread
	PollCPUNanos atomic.Int64  // poll_cpu_ns: CPU time of the poll loop's thread (includes delivery to gVisor)

	// Transmit.
	TxPackets atomic.Uint64 // tx_packets: frames written to the wire
	TxBytes   atomic.Uint64 // tx_bytes
	TxGSO     atomic.Uint64 // tx_gso_packets: frames written as GSO super-frames
	TxErrors  atomic.Uint64 // tx_errors: failed writes
}

// Each calls fn for every counter, in a fixed order.
func (s *Stats) Each(fn func(name string, v uint64)) {
	fn("rx_wire_reads", s.WireReads.Load())
	fn("rx_wire_bytes", s.WireBytes.Load())
	fn("rx_wire_errors", s.WireErrors.Load())
	fn("rx_wire_direct", s.DirectReads.Load())
	fn("rx_wire_direct_bytes", s.DirectBytes.Load())
	fn("rx_gso_frames", s.GSOFrames.Load())
	fn("rx_gso_segs", s.GSOSegs.Load())
	fn("rx_lro_packets", s.LROFrames.Load())
	fn("rx_lro_bytes", s.LROBytes.Load())
	fn("rx_uso_packets", s.USOFrames.Load())
	fn("rx_uso_bytes", s.USOBytes.Load())
	fn("rx_packets", s.Packets.Load())
	fn("rx_bytes", s.Bytes.Load())
	fn("rx_napi_polls", s.Polls.Load())
	fn("rx_irqs", s.NICWakeups.Load())
	fn("rx_irqs_timer", s.TimerIRQs.Load())
	fn("rx_busy_polls", s.BusyPolls.Load())
	fn("rx_busy_poll_hits", s.BusyPollHits.Load())
	fn("rx_rtc_splits", s.RTCSplits.Load())
	fn("rx_wqes", s.WQEs.Load())
	fn("rx_strides", s.Strides.Load())
	fn("rx_cqe_stalls", s.CQEStalls.Load())
	fn("rx_rq_stalls", s.RQStalls.Load())
	fn("rx_csum_partial", s.CsumPartial.Load())
	fn("rx_csum_unnecessary", s.CsumUnneeded.Load())
	fn("rx_csum_complete", s.CsumComplete.Load())
	fn("rx_csum_none", s.CsumNone.Load())
	fn("rx_tunnel_decap", s.TunnelDecap.Load())
	fn("rx_vxlan_frames", s.VXLANFrames.Load())
	fn("rx_gso_tunnel_frames", s.TunnelGSOFrames.Load())
	fn("rx_hds_bytes", s.HDSBytes.Load())
	fn("rx_hds_payload_bytes", s.HDSPayload.Load())
	fn("rx_hds_pull_bytes", s.HDSPull.Load())
	fn("rx_linear_packets", s.LinearOnly.Load())
	fn("rx_frags", s.PacketFrags.Load())
	fn("rx_skb_linear", s.SKBLinear.Load())
	fn("rx_skb_nonlinear", s.SKBNonlinear.Load())
	var total uint64
	for i := range s.Dropped {
		total += s.Dropped[i].Load()
	}
	total += s.DroppedVLAN.Load()
	fn("rx_dropped", total)
	for i := Drop(1); i < NumDrops; i++ {
		fn(i.String(), s.Dropped[i].Load())
	}
	fn("rx_drop_vlan", s.DroppedVLAN.Load())
	fn("nic_cpu_ns", uint64(s.NICCPUNanos.Load()))
	fn("poll_cpu_ns", uint64(s.PollCPUNanos.Load()))
	fn("tx_packets", s.TxPackets.Load())
	fn("tx_bytes", s.TxBytes.Load())
	fn("tx_gso_packets", s.TxGSO.Load())
	fn("tx_errors", s.TxErrors.Load())
}
