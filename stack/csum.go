package stack

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/driver"
)

// csumCheck is the stack's own check of the checksums of a packet nobody
// verified (driver.Packet.CsumVerified false: the NIC model found a checksum
// bad and handed the frame up as CHECKSUM_NONE, as mlx5 does, and GRO,
// which checks such a packet in software, found it bad too or did not look
// at it). The link endpoint tells gVisor that it offloads RX checksums
// (CapabilityRXChecksumOffload), so gVisor checks none itself: this is
// where such a packet is dropped and counted, as the kernel's tcp_v4_rcv,
// udp_rcv and ip_rcv_core drop and count it (TcpInCsumErrors,
// UdpInCsumErrors, IpInHdrErrors: tcp_checksum_errors, udp_checksum_errors,
// ip_checksum_errors). The frame still shows in the post-GRO
// pcap, as on the kernel's AF_PACKET tap, which sees it before IP does.
// Safe for concurrent use (cpumap workers deliver too): mu serializes the
// checks, which only packets nobody verified take (ARP, bad checksums).
type csumCheck struct {
	mu sync.Mutex
	// buf holds a copy of the frame being checked, grown to the largest
	// frame; frame is the frame last checked, in buf.
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	frame []byte
	// +checklocks:mu
	fi driver.FrameInfo

	tcp, udp, ip atomic.Uint64 // bad TCP, UDP checksums; bad IPv4 header (and ICMP) checksums
}

// bad reports whether p, whose checksums are not verified, has a bad one,
// and if so counts it. It borrows p.
//
// +checklocks:c.mu
func (c *csumCheck) bad(p *driver.Packet, l3 bool) bool {
	n := p.TotalLen()
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
	frame := c.buf[:p.CopyTo(c.buf[:n])]
	c.frame = frame
	parse := driver.ParseFrame
	if l3 {
		parse = driver.ParseL3Frame // a TUN's packet
	}
	if parse(frame, &c.fi) != driver.DropNone {
		return false // for gVisor to judge, as before
	}
	switch driver.VerifyChecksums(frame, &c.fi, true) {
	case driver.DropBadIPCsum:
		c.ip.Add(1)
	case driver.DropBadL4Csum:
		switch c.fi.L4 {
		case driver.L4TCP:
			c.tcp.Add(1)
		case driver.L4UDP:
			c.udp.Add(1)
		default: // ICMP: counted with the bad IP headers
			c.ip.Add(1)
		}
	default:
		return false
	}
	return true
}

// dropBadCsum drops p, counted, if its checksums are not verified and one
// is bad (csumCheck), after writing it to the pcap; it reports whether it
// did. It takes ownership of p only when it reports true.
func (e *linkEndpoint) dropBadCsum(p *driver.Packet) bool {
	if p.CsumVerified {
		return false
	}
	e.csum.mu.Lock()
	defer e.csum.mu.Unlock()
	if !e.csum.bad(p, e.l3) {
		return false
	}
	if e.pcap != nil {
		e.pcap.WriteFrame(time.Now(), e.csum.frame)
	}
	p.Release()
	return true
}
