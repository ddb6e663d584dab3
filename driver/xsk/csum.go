package xsk

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// completeChecksum does in software what NEEDS_CSUM asks of a device (the
// kernel's skb_checksum_help): the ones'-complement sum of pkt[start:],
// whose 16-bit field at start+offset holds the folded pseudo-header sum,
// is complemented into that field. A result of 0 is stored as 0xffff
// (CSUM_MANGLED_0), the same value in ones'-complement arithmetic, since a
// 0 UDP checksum over IPv4 would mean none. The caller has checked that
// start+offset+2 <= len(pkt).
func completeChecksum(pkt []byte, start, offset int) {
	sum := ^checksum.Checksum(pkt[start:], 0)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(pkt[start+offset:], sum)
}
