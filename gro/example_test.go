package gro_test

import (
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/gro"
)

// printSink prints what the engine hands up.
type printSink struct{}

func (printSink) Deliver(p *bufpool.Packet) {
	ip := header.IPv4(p.Linear[header.EthernetMinimumSize:])
	fmt.Printf("%d segments, %d bytes, gso %d, IP total length %d, payload in %d frag(s)\n",
		p.Segs, p.Len, p.GSOSize, ip.TotalLength(), len(p.Frags))
	p.Release()
}

// tcpSegment builds one TCP segment as the driver hands it up with header
// split: its headers in the linear part, its payload in a frag of pg at
// off.
func tcpSegment(pg *bufpool.Page, off, size int, seq uint32) *bufpool.Packet {
	const hlen = header.EthernetMinimumSize + header.IPv4MinimumSize + header.TCPMinimumSize
	p := bufpool.NewPacket()
	h := make([]byte, hlen)
	header.Ethernet(h).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02"), DstAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x01"),
		Type: header.IPv4ProtocolNumber,
	})
	ip := header.IPv4(h[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(header.IPv4MinimumSize + header.TCPMinimumSize + size),
		Flags:       header.IPv4FlagDontFragment, TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), DstAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 1}),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	header.TCP(h[hlen-header.TCPMinimumSize:]).Encode(&header.TCPFields{
		SrcPort: 40000, DstPort: 5201, SeqNum: seq, AckNum: 1,
		DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 65535,
	})
	p.Linear = append(p.Linear[:0], h...)
	pg.IncRef() // the frag's reference
	p.Frags = append(p.Frags, bufpool.Frag{Page: pg, Off: uint32(off), Len: uint32(size)})
	// The TCP checksum is left 0: the NIC vouched for it (CsumVerified).
	p.Len, p.HdrLen, p.CsumVerified, p.Segs = hlen+size, hlen, true, 1
	return p
}

// Two back-to-back segments of one flow, their payloads adjacent in one
// page, leave the engine as one packet at the batch end, the second's
// payload coalesced into the first's frag (seed 002).
func Example() {
	pool, err := bufpool.New(bufpool.Config{})
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	pg, _ := pool.Get()
	defer pool.Recycle(pg)

	e := gro.New(gro.Config{}, printSink{})
	e.Receive(tcpSegment(pg, 0, 1448, 1000), 0)
	e.Receive(tcpSegment(pg, 1448, 1448, 1000+1448), 0)
	fmt.Println("held:", e.Held())
	e.EndBatch(0)
	fmt.Println("rx_gro_packets", e.Stats().Packets.Load())
	// Output:
	// held: 1
	// 2 segments, 2950 bytes, gso 1448, IP total length 2936, payload in 1 frag(s)
	// rx_gro_packets 2
}
