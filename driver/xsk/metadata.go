package xsk

import "encoding/binary"

// Desc is struct xdp_desc (include/uapi/linux/if_xdp.h), an entry of the RX
// and TX rings:
//
//	 0               8       12      16
//	+---------------+-------+-------+
//	|     addr      |  len  |options|
//	+---------------+-------+-------+
//
// Addr is a UMEM address (a byte offset into the region), Len the bytes of
// packet data there, Options a set of Opt* bits.
type Desc struct {
	Addr    uint64
	Len     uint32
	Options uint32
}

// Descriptor option bits (if_xdp.h).
const (
	// OptPktContd is XDP_PKT_CONTD: the packet continues in the next
	// descriptor. Only a socket with Config.MultiBuffer (XDP_USE_SG)
	// accepts it on TX; RX never sets it (Receive takes whole frames).
	OptPktContd = 1 << 0
	// OptTxMetadata is XDP_TX_METADATA: TxMetadataLen bytes right before
	// Addr hold a struct xsk_tx_metadata (see TxMetadata). It counts on a
	// packet's first descriptor only; on a later one it is ignored, as
	// xsk_build_skb reads the metadata of the first.
	OptTxMetadata = 1 << 1
)

// TxMetadata flag bits (XDP_TXMD_FLAGS_*).
const (
	// TxmdTimestamp asks for the completion time in TxMetadata's
	// TxTimestamp, written before the address reaches the completion ring.
	TxmdTimestamp = 1 << 0
	// TxmdChecksum asks for the 16-bit ones'-complement checksum from
	// CsumStart to the end of the packet to be stored at
	// CsumStart+CsumOffset, both relative to the descriptor's Addr. As
	// with CHECKSUM_PARTIAL, the field must hold the folded pseudo-header
	// sum beforehand.
	TxmdChecksum = 1 << 1

	// txmdValid is every flag the socket implements; the kernel's
	// XDP_TXMD_FLAGS_VALID. Any other bit makes the metadata invalid
	// (tx_bad_metadata), as xsk_buff_valid_tx_metadata does: the send
	// fails in copy mode, the packet goes without offloads in zero-copy.
	txmdValid = TxmdTimestamp | TxmdChecksum
)

// TxMetadataSize is sizeof(struct xsk_tx_metadata): the smallest, and the
// default, Config.TxMetadataLen.
const TxMetadataSize = 16

// TxMetadata is a view of struct xsk_tx_metadata, the TxMetadataLen bytes
// right before a TX descriptor's Addr (UMEM.Metadata returns one). Its
// fields are in host byte order, as the kernel's:
//
//	 0                               8       10      12              16
//	+-------------------------------+-------+-------+---------------+
//	|            flags              | start | offset|   (padding)   |  request
//	+-------------------------------+-------+-------+---------------+
//	|            flags              |          tx_timestamp         |  completion
//	+-------------------------------+-------------------------------+
//
// The request and completion parts are a union: writing TxTimestamp
// overwrites CsumStart and CsumOffset. A TxMetadata must hold at least
// TxMetadataSize bytes; the accessors panic otherwise.
type TxMetadata []byte

// Flags returns the Txmd* flags.
func (m TxMetadata) Flags() uint64 { return binary.NativeEndian.Uint64(m[0:8]) }

// SetFlags sets the Txmd* flags.
func (m TxMetadata) SetFlags(f uint64) { binary.NativeEndian.PutUint64(m[0:8], f) }

// CsumStart returns request.csum_start: where checksumming starts, from
// the descriptor's Addr.
func (m TxMetadata) CsumStart() uint16 { return binary.NativeEndian.Uint16(m[8:10]) }

// CsumOffset returns request.csum_offset: where the checksum goes, from
// CsumStart.
func (m TxMetadata) CsumOffset() uint16 { return binary.NativeEndian.Uint16(m[10:12]) }

// SetChecksumRequest sets CsumStart and CsumOffset with one bounds check.
func (m TxMetadata) SetChecksumRequest(start, offset uint16) {
	_ = m[11]
	binary.NativeEndian.PutUint16(m[8:10], start)
	binary.NativeEndian.PutUint16(m[10:12], offset)
}

// TxTimestamp returns completion.tx_timestamp: the socket clock's reading
// (TAI nanoseconds by default, see Config.Clock) taken for this packet
// after it went to the wire, as xsk_destruct_skb takes it at completion. Valid
// once the descriptor's address came back on the completion ring, if
// TxmdTimestamp was requested.
func (m TxMetadata) TxTimestamp() uint64 { return binary.NativeEndian.Uint64(m[8:16]) }
