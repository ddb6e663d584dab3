package driver_test

import (
	"fmt"
	"time"

	"github.com/ustack/ustack/driver"
)

// printer is a driver.Handler that prints what the poll loop hands it.
type printer struct{ done chan struct{} }

func (p printer) Deliver(pkt *driver.Packet) {
	fmt.Printf("%d bytes, %d in the linear part\n", pkt.Len, len(pkt.Linear))
	pkt.Release() // the packet owns page references: give them back
	close(p.done)
}

func (printer) Flush(more bool) time.Duration { return 0 }

// A driver on one end of an in-memory wire receives an ARP request written
// into the other end, behind its virtio-net header: the header copy (HDS
// auto) takes the Ethernet header, and the driver pulls the ARP header
// behind it out of the RX page, as arp_rcv's pskb_may_pull would, so that
// the headers are all in the linear part. A program gives New a TAP
// (driver.OpenTAP) instead.
func Example() {
	nic, peer := driver.NewMemPair(64, driver.VirtioNetHdrLen+1518)
	d, err := driver.New(nic, driver.Config{
		MAC:    [6]byte{2, 0, 0, 0, 0, 1},
		LRO:    true,
		RQSize: 16, // WQEs the NIC model may fill ahead of the poll loop
	})
	if err != nil {
		panic(err)
	}
	h := printer{done: make(chan struct{})}
	d.Start(h)

	frame := make([]byte, driver.VirtioNetHdrLen, driver.VirtioNetHdrLen+42)
	(&driver.VirtioNetHdr{}).Encode(frame) // no offload
	frame = append(frame,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // to everyone
		2, 0, 0, 0, 0, 2, // from the peer
		0x08, 0x06, // ARP
		0, 1, 0x08, 0x00, 6, 4, 0, 1, // Ethernet/IPv4 request
		2, 0, 0, 0, 0, 2, 192, 0, 2, 2, // sender
		0, 0, 0, 0, 0, 0, 192, 0, 2, 1) // target
	if err := peer.Write(frame); err != nil {
		panic(err)
	}
	<-h.done
	d.Close() // stops the NIC model and the poll loop; the counters are final
	fmt.Println("rx_packets", d.Stats().Packets.Load(), "rx_rq_stalls", d.Stats().RQStalls.Load())
	// Output:
	// 42 bytes, 42 in the linear part
	// rx_packets 1 rx_rq_stalls 0
}
