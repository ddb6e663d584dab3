package cpumap

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// tagged returns a packet whose linear part holds tag and which holds one
// page of pool as a frag, so that a packet never released shows as a page
// in use.
func tagged(t testing.TB, pool *bufpool.Pool, tag uint64) *bufpool.Packet {
	pg, err := pool.Get()
	if err != nil {
		t.Fatalf("pool.Get: %v", err)
	}
	p := bufpool.NewPacket()
	p.Linear = binary.LittleEndian.AppendUint64(p.Linear[:0], tag)
	p.Frags = append(p.Frags, bufpool.Frag{Page: pg, Off: 0, Len: 64})
	p.Len = len(p.Linear) + 64
	return p
}

func tagOf(p *bufpool.Packet) uint64 { return binary.LittleEndian.Uint64(p.Linear) }

// event is something a recorder saw, in order.
type event struct {
	kind byte   // 'R' Receive, 'E' EndBatch, 'F' Flush
	tag  uint64 // Receive: the packet's tag
	n    int    // frames received so far
}

// recorder is a Receiver and Flusher that records what it is given and
// releases each packet. With gate set, its first Receive signals blocked
// and then waits until gate is closed, holding the worker.
type recorder struct {
	mu sync.Mutex
	// +checklocks:mu
	events []event
	// +checklocks:mu
	n       int
	gate    chan struct{}
	blocked chan struct{}
	once    sync.Once
}

func newGatedRecorder() *recorder {
	return &recorder{gate: make(chan struct{}), blocked: make(chan struct{})}
}

func (r *recorder) Receive(p *bufpool.Packet, now int64) {
	if r.gate != nil {
		r.once.Do(func() {
			close(r.blocked)
			<-r.gate
		})
	}
	r.mu.Lock()
	r.n++
	r.events = append(r.events, event{kind: 'R', tag: tagOf(p), n: r.n})
	r.mu.Unlock()
	p.Release()
}

func (r *recorder) EndBatch(now int64) {
	r.mu.Lock()
	r.events = append(r.events, event{kind: 'E', n: r.n})
	r.mu.Unlock()
}

func (r *recorder) Flush() {
	r.mu.Lock()
	r.events = append(r.events, event{kind: 'F', n: r.n})
	r.mu.Unlock()
}

func (r *recorder) received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// tags returns the tags received, in order.
func (r *recorder) tags() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for _, e := range r.events {
		if e.kind == 'R' {
			out = append(out, e.tag)
		}
	}
	return out
}

// batchEnds returns the frame counts at which EndBatch ('E') or Flush
// ('F') was called.
func (r *recorder) batchEnds(kind byte) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, e := range r.events {
		if e.kind == kind {
			out = append(out, e.n)
		}
	}
	return out
}

// newTestMap returns a map of n entries on CPUs 0..n-1 whose receivers are
// recs (nil ones become plain recorders), closed at the end of the test.
func newTestMap(t testing.TB, cfg Config, recs ...*recorder) *Map {
	t.Helper()
	if cfg.CPUs == nil {
		for i := range recs {
			cfg.CPUs = append(cfg.CPUs, i)
		}
	}
	for i := range recs {
		if recs[i] == nil {
			recs[i] = &recorder{}
		}
	}
	cfg.NewReceiver = func(i int) Receiver { return recs[i] }
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// fragKind is where a test frame sits in a fragmented datagram.
type fragKind int

const (
	fragNone  fragKind = iota
	fragFirst          // IPv4 MF, offset 0; IPv6 fragment header with M, offset 0
	fragLater          // offset 1480 bytes, M set
)

// frameSpec describes a test frame. The zero value is an IPv4 TCP segment
// from 10.0.0.1:1000 to 10.0.0.2:80.
type frameSpec struct {
	v6, udp, icmp, arp bool
	src, dst           netip.Addr // zero: 10.0.0.1, 10.0.0.2 or fd::1, fd::2
	sport, dport       uint16     // zero: 1000, 80
	vlans              int        // VLAN tags
	frag               fragKind
	ipOpts             bool // IPv4 router alert, or an IPv6 hop-by-hop header
	n                  int  // payload bytes, each pair 0x0050
}

func (s frameSpec) addrs() (src, dst tcpip.Address) {
	if !s.src.IsValid() {
		s.src, s.dst = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
		if s.v6 {
			s.src, s.dst = netip.MustParseAddr("fd::1"), netip.MustParseAddr("fd::2")
		}
	}
	return tcpip.AddrFromSlice(s.src.AsSlice()), tcpip.AddrFromSlice(s.dst.AsSlice())
}

// frame encodes s with gVisor's header encoders (testutil.Frame).
func (s frameSpec) frame() []byte {
	if s.sport == 0 {
		s.sport = 1000
	}
	if s.dport == 0 {
		s.dport = 80
	}
	srcMAC, dstMAC := tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1}), tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2})
	var f []byte
	if s.arp {
		f = make([]byte, header.EthernetMinimumSize+header.ARPSize)
		header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: srcMAC, DstAddr: dstMAC, Type: header.ARPProtocolNumber})
		a := header.ARP(f[header.EthernetMinimumSize:])
		a.SetIPv4OverEthernet()
		a.SetOp(header.ARPRequest)
	} else {
		src, dst := s.addrs()
		fr := testutil.Frame{
			SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, ID: 7,
			Proto: header.TCPProtocolNumber, SrcPort: s.sport, DstPort: s.dport,
			Seq: 1, Ack: 1, Flags: header.TCPFlagAck, Window: 4096,
			NoL4Header: s.frag == fragLater, // the payload continues; no transport header
			Csum:       testutil.CsumZero,
		}
		var icmp []byte // gVisor's Frame writes no ICMP header: the payload starts with it
		switch {
		case s.icmp && s.v6:
			fr.Proto, icmp = header.ICMPv6ProtocolNumber, make([]byte, header.ICMPv6MinimumSize)
		case s.icmp:
			fr.Proto, icmp = header.ICMPv4ProtocolNumber, make([]byte, header.ICMPv4MinimumSize)
		case s.udp:
			fr.Proto = header.UDPProtocolNumber
		}
		if s.frag == fragLater {
			icmp = nil
		} else if icmp != nil {
			icmp[0] = 8 // echo request; the type does not matter here
		}
		if s.v6 {
			if s.ipOpts {
				fr.IPv6Ext = append(fr.IPv6Ext, header.IPv6SerializableHopByHopExtHdr{&header.IPv6RouterAlertOption{Value: header.IPv6RouterAlertMLD}})
			}
			switch s.frag {
			case fragFirst:
				fr.IPv6Ext = append(fr.IPv6Ext, &header.IPv6SerializableFragmentExtHdr{M: true, Identification: 7})
			case fragLater:
				fr.IPv6Ext = append(fr.IPv6Ext, &header.IPv6SerializableFragmentExtHdr{FragmentOffset: 1480 / 8, M: true, Identification: 7})
			}
		} else {
			if s.ipOpts {
				fr.IPv4Options = header.IPv4OptionsSerializer{&header.IPv4SerializableRouterAlertOption{}}
			}
			switch s.frag {
			case fragFirst:
				fr.IPFlags = header.IPv4FlagMoreFragments
			case fragLater:
				fr.IPFlags, fr.FragOff = header.IPv4FlagMoreFragments, 1480
			}
		}
		fr.Payload = make([]byte, len(icmp)+s.n)
		copy(fr.Payload, icmp)
		for i := len(icmp); i+1 < len(fr.Payload); i += 2 {
			// Payload that reads as port 80 wherever ports are
			// wrongly looked for in it.
			binary.BigEndian.PutUint16(fr.Payload[i:], 80)
		}
		f = fr.Build()
	}
	for range s.vlans {
		// An 802.1Q tag (TPID 0x8100, VID 5) between the MACs and the
		// type; gVisor has no VLAN encoder.
		t := make([]byte, 0, len(f)+4)
		t = append(t, f[:12]...)
		t = append(t, 0x81, 0x00, 0x00, 0x05)
		f = append(t, f[12:]...)
	}
	return f
}

// packetOf returns a packet whose linear part holds frame (up to
// bufpool.MaxLinear bytes), owned by the caller.
func packetOf(frame []byte) *bufpool.Packet {
	p := bufpool.NewPacket()
	p.Linear = append(p.Linear[:0], frame[:min(len(frame), bufpool.MaxLinear)]...)
	p.Len = len(p.Linear)
	return p
}

// run runs prog on frame and returns its verdict.
func run(prog Program, frame []byte) (Action, int) {
	p := packetOf(frame)
	defer p.Release()
	return prog.Run(p.Linear)
}

func mustProgram(t testing.TB, name string, ncpu int) Program {
	t.Helper()
	prog, err := ParseProgram(name, ncpu)
	if err != nil {
		t.Fatalf("ParseProgram(%q, %d): %v", name, ncpu, err)
	}
	return prog
}
