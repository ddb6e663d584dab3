// Package xsk is an AF_XDP-style socket in user space: a UMEM region of
// fixed-size frames, the four single-producer single-consumer rings of
// AF_XDP (fill, completion, RX and TX) with free-running uint32 indexes,
// and a Socket that plays the kernel's part, including the TX metadata of
// Documentation/networking/xsk-tx-metadata.rst (checksum offload and
// completion timestamps).
//
// # Roles
//
// The application produces on the fill and TX rings and consumes on the
// RX and completion rings, through the libxdp-like Producer and Consumer
// returned by Socket.Fill, Socket.TX, Socket.RX and Socket.Completion. The
// socket consumes the TX ring in Kick (sendto's wakeup: validate, build a
// virtio-net header, write header and frame to the Wire, complete) and
// produces on the RX ring in Receive and ReceiveVec (XDP_REDIRECT into the
// socket in copy mode; package stack calls ReceiveVec from its poll loop
// for frames its XDP program redirects, see stack.Stack.BindXSK).
//
// # Threading
//
// Each application side of a ring is driven by one goroutine at a time;
// different rings may be driven from different goroutines. Kick may be
// called from any number of goroutines concurrently (a mutex serialises
// them, as the kernel's xs->mutex does); so may Receive and ReceiveVec,
// under a second mutex, concurrently with Kick. Both run concurrently with the
// application.
//
// # Ordering
//
// Completions appear on the completion ring in TX ring order, one per TX
// descriptor of every packet sent or failed at the wire (a multi-buffer
// packet completes each of its descriptors). Invalid descriptors are
// consumed without a completion (tx_invalid_descs), as the kernel does.
// A requested TX timestamp is taken per packet after its write (its
// completion) and written into its first descriptor's metadata before its
// address is published on the completion ring, so the application may
// read it as soon as it peeks the address. The socket never writes packet
// data in the UMEM: frames are copied into a per-socket scratch buffer,
// where a software checksum is completed.
//
// # Copy and zero-copy mode
//
// The socket models the kernel's copy path (XDP_COPY: __xsk_generic_xmit
// and xsk_build_skb) unless Config.ZeroCopy selects a zero-copy driver's
// (xsk_tx_peek_desc, xsk_buff_get_metadata, xsk_tx_metadata_request). They
// differ in what bad metadata does: the copy path fails the send with
// EINVAL and leaves the descriptor in the TX ring, a zero-copy driver sends
// the packet without offloads. See Socket.Kick.
//
// # UMEM frame layout
//
// Frame i occupies [i*FrameSize, (i+1)*FrameSize). A TX descriptor's data
// must lie in one frame, at least TxMetadataLen bytes into it; the
// metadata is the TxMetadataLen bytes right before Addr (Addr -
// TxMetadataLen, as in the kernel). The headroom is where Receive leaves
// room; TX data may start in it, as the kernel's xp_aligned_validate_desc
// allows:
//
//	frame base                                          base+FrameSize
//	|  Headroom  | xsk_tx_metadata |  packet data ...               |
//	                               ^ Addr (UMEM.DataAddr(i) at the earliest)
//
// Receive puts a frame at UMEM.DataAddr of the fill address's frame, so an
// RX descriptor is also a valid TX descriptor (forwarding).
package xsk
