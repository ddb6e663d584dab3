//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/driver/xsk"
	"github.com/ustack/ustack/internal/bench"
	"github.com/ustack/ustack/internal/testbed"
)

// xskgen modes, after the TX metadata patch's xskgen: plain (a socket without TX
// metadata), fill (-M: metadata reserved and filled in, XDP_TX_METADATA
// not set) and request (-m: checksum offload and TX timestamp requested).
const (
	xskPlain = iota
	xskFill
	xskRequest
	numXSKModes
)

var xskModeNames = [numXSKModes]string{"plain", "-M fill", "-m request"}

const (
	xskgenPort      = 9000
	xskgenSrcPort   = 40000
	xskgenFrames    = 4096
	xskgenFrameSize = 2048
	xskgenRingSize  = 2048
	// xskgenRcvbuf is the kernel receiver's SO_RCVBUFFORCE: enough to
	// hold a burst while its goroutine catches up.
	xskgenRcvbuf = 64 << 20
)

// xskgenCmd is `ustack xskgen`: the TX metadata patch's xskgen over an XSK socket on a
// TAP. It sends COUNT UDP/IPv4 frames of SIZE payload bytes to a kernel
// UDP socket in the TAP's namespace and reports the send path's cost per
// packet (the application loop, Kick and the TAP writes; the kernel's
// receive processing up to the socket queue runs inside each TAP write,
// the receiving socket's reads run on another goroutine and are not
// timed).
func xskgenCmd(args []string) error {
	fs := flag.NewFlagSet("xskgen", flag.ContinueOnError)
	size := fs.Int("s", 1400, "UDP payload bytes per frame (1-1472)")
	count := fs.Int("n", 1_000_000, "frames to send (per mode when all three run)")
	fill := fs.Bool("M", false, "only mode -M: fill in the TX metadata, but do not set XDP_TX_METADATA")
	request := fs.Bool("m", false, "only mode -m: request checksum offload and a TX timestamp")
	rounds := fs.Int("rounds", 10, "without -M/-m: rounds the three modes are interleaved in")
	batch := fs.Int("b", 64, "descriptors submitted per Kick")
	plainCsum := fs.String("plain-csum", "zero", "UDP checksum of the frames plain and -M send: zero (IPv4's \"no checksum\": the kernel receiver verifies nothing, as for -m's offloaded checksums, which it trusts on local delivery) or full (it verifies them inside the TAP write)")
	maxTime := fs.Duration("t", 2*time.Minute, "stop sending after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *size < 1 || *size > 1472:
		return usageError{errors.New("want 1 <= -s <= 1472 (an MTU of 1500)")}
	case *count < 1 || *count > 100_000_000:
		return usageError{errors.New("want 1 <= -n <= 100000000")}
	case *rounds < 1 || *rounds > 1000:
		return usageError{errors.New("want 1 <= -rounds <= 1000")}
	case *batch < 1 || *batch > xskgenRingSize:
		return usageError{fmt.Errorf("want 1 <= -b <= %d", xskgenRingSize)}
	case *maxTime <= 0 || *maxTime > 30*time.Minute:
		return usageError{errors.New("want 0 < -t <= 30m")}
	case *plainCsum != "zero" && *plainCsum != "full":
		return usageError{fmt.Errorf("-plain-csum %q: want zero or full", *plainCsum)}
	}
	modes := []int{xskPlain, xskFill, xskRequest}
	switch {
	case *request:
		modes, *rounds = []int{xskRequest}, 1
	case *fill:
		modes, *rounds = []int{xskFill}, 1
	}

	var cl bench.Closers
	stop := testbed.CleanupOnSignal(&cl)
	defer stop()
	defer cl.Close()
	g, err := newXSKGen(&cl, *size, *batch)
	if err != nil {
		return err
	}
	if *plainCsum == "zero" {
		g.plain = 0
	}
	fmt.Printf("xskgen: %d-byte frames (%d of UDP payload) to %v on %s in %s, %s, %d per Kick; UDP checksum of plain and -M: %s\n",
		g.frameLen, *size, g.dst, g.bed.TAPName, g.bed.NS.Name, plural(len(modes), "mode"), *batch, *plainCsum)
	snmpBefore, err := g.udpSNMP()
	if err != nil {
		return err
	}

	// Rounds: each sends its share of count in every mode, in an order
	// rotated by round so that no mode always runs first.
	var res [numXSKModes]xskResult
	deadline := time.Now().Add(*maxTime)
	for r := 0; r < *rounds && time.Now().Before(deadline); r++ {
		n := *count / *rounds
		if r < *count%*rounds {
			n++
		}
		for i := range modes {
			m := modes[(r+i)%len(modes)]
			rr, err := g.round(m, n, deadline)
			res[m].add(rr)
			if err != nil {
				return fmt.Errorf("%s: %w", xskModeNames[m], err)
			}
		}
	}

	var total uint64
	for _, m := range modes {
		r := &res[m]
		total += r.packets
		bits := r.packets * uint64(g.frameLen) * 8
		sec := r.loop.Seconds()
		fmt.Printf("%-10s  sent %d packets %d bits, took %f sec, %f gbps %f mpps\n",
			xskModeNames[m], r.packets, bits, sec, float64(bits)/sec/1e9, float64(r.packets)/sec/1e6)
	}
	got := g.waitReceived(total)
	snmpAfter, err := g.udpSNMP()
	if err != nil {
		return err
	}
	d := func(name string) int64 { return int64(snmpAfter[name]) - int64(snmpBefore[name]) }
	fmt.Printf("kernel UDP socket received %d of %d datagrams (UdpInDatagrams +%d, RcvbufErrors +%d, InCsumErrors +%d, NoPorts +%d)\n",
		got, total, d("InDatagrams"), d("RcvbufErrors"), d("InCsumErrors"), d("NoPorts"))
	for _, m := range modes {
		fmt.Printf("%-10s  counters: %s\n", xskModeNames[m], g.socks[m].Stats().String())
	}
	if len(modes) > 1 {
		printXSKComparison(res[:], *rounds)
	}
	if d("InCsumErrors") != 0 {
		return fmt.Errorf("the kernel counted %d UDP checksum errors", d("InCsumErrors"))
	}
	if d("InDatagrams")+d("RcvbufErrors") < int64(total) {
		return fmt.Errorf("the kernel took %d of %d datagrams (InDatagrams+RcvbufErrors)", d("InDatagrams")+d("RcvbufErrors"), total)
	}
	return nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// xskResult sums a mode's rounds.
type xskResult struct {
	packets uint64
	loop    time.Duration // submit, Kick and reap, first submission to last completion
	kick    time.Duration // inside Kick
	sock    time.Duration // inside Kick but outside the TAP's Write: the socket's own work
	perPkt  []float64     // each round's loop ns/packet
	sockPkt []float64     // each round's socket ns/packet
}

func (r *xskResult) add(o xskResult) {
	r.packets += o.packets
	r.loop += o.loop
	r.kick += o.kick
	r.sock += o.sock
	r.perPkt = append(r.perPkt, o.perPkt...)
	r.sockPkt = append(r.sockPkt, o.sockPkt...)
}

func (r *xskResult) nsPerPacket() float64 {
	return float64(r.loop.Nanoseconds()) / float64(max(r.packets, 1))
}

func (r *xskResult) kickNsPerPacket() float64 {
	return float64(r.kick.Nanoseconds()) / float64(max(r.packets, 1))
}

func (r *xskResult) sockNsPerPacket() float64 {
	return float64(r.sock.Nanoseconds()) / float64(max(r.packets, 1))
}

// spread formats the minimum, median and maximum of per-round figures.
func spread(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return fmt.Sprintf("%.1f/%.1f/%.1f", s[0], s[len(s)/2], s[len(s)-1])
}

// printXSKComparison prints every mode's cost per packet and its
// difference against plain, as the patch's reviewer worked it out from
// mpps: (1/mpps(plain) - 1/mpps(mode)) * 1e3 ns is the negated difference.
// The loop and Kick figures carry the TAP writes, microseconds each with
// the kernel's receive processing, whose noise hides nanoseconds; the
// socket column leaves them out (Kick minus the time inside the TAP's
// Write, two clock reads per packet included, the same in every mode):
// its differences are the metadata's cost. The paired column is the
// median of each round's difference against plain in the same round (the
// modes of a round run back to back), with the rounds' range: the
// machine's drift between rounds cancels out of it.
func printXSKComparison(res []xskResult, rounds int) {
	base := &res[xskPlain]
	fmt.Printf("per packet over %d interleaved rounds (loop = application + Kick + TAP write, the patch's mpps; kick = inside Kick; socket = kick - TAP write):\n", rounds)
	fmt.Printf("  %-10s  %11s  %26s  %11s  %11s  %26s  %22s  %22s\n", "mode", "loop ns", "paired vs plain (min..max)", "kick ns", "socket ns",
		"paired vs plain (min..max)", "loop rounds min/med/max", "socket rounds min/med/max")
	paired := func(a, b []float64) string {
		d := pairedDiff(a, b)
		if len(d) == 0 {
			return "-"
		}
		med, lo, hi := bench.Median(d)
		return fmt.Sprintf("%+.1f ns (%+.1f..%+.1f)", med, lo, hi)
	}
	for m := range res {
		r := &res[m]
		ldiff, sdiff := "-", "-"
		if m != xskPlain {
			ldiff, sdiff = paired(r.perPkt, base.perPkt), paired(r.sockPkt, base.sockPkt)
		}
		fmt.Printf("  %-10s  %11.1f  %26s  %11.1f  %11.1f  %26s  %22s  %22s\n", xskModeNames[m], r.nsPerPacket(), ldiff, r.kickNsPerPacket(),
			r.sockNsPerPacket(), sdiff, spread(r.perPkt), spread(r.sockPkt))
	}
}

// pairedDiff returns a[i]-b[i] for the rounds both have.
func pairedDiff(a, b []float64) []float64 {
	d := make([]float64, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return d
}

// timedWire is the TAP with the time spent in its Writes summed, so that
// xskgen can tell the socket's own work from the kernel's. Kick serialises
// a socket's Writes, and each mode has its socket and its timedWire.
type timedWire struct {
	w  xsk.Wire
	ns time.Duration
}

func (t *timedWire) Write(b []byte) error {
	t0 := time.Now()
	err := t.w.Write(b)
	t.ns += time.Since(t0)
	return err
}

// xskGen is the generator's state: the bed, the TAP, one socket per mode
// with every UMEM frame holding the frame to send, and the kernel receiver.
type xskGen struct {
	bed      *testbed.TAPBed
	tap      *driver.TAP
	conn     *net.UDPConn
	dst      netip.AddrPort
	frameLen int
	batch    uint32
	plain    uint16 // UDP checksum field of plain and -M frames: the full checksum, or 0 (none)
	pseudo   uint16 // the pseudo-header sum, for -m
	socks    [numXSKModes]*xsk.Socket
	wires    [numXSKModes]*timedWire
	free     [numXSKModes][]uint64 // addresses of frames not in flight

	received atomic.Uint64 // datagrams the kernel socket delivered
}

// csumStart and csumOffset locate the UDP checksum: after the Ethernet and
// IPv4 headers, 6 bytes into the UDP header.
const (
	xskCsumStart  = header.EthernetMinimumSize + header.IPv4MinimumSize
	xskCsumOffset = 6
)

func newXSKGen(cl *bench.Closers, size, batch int) (*xskGen, error) {
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "usxskgen", TAPName: "xskgen0"})
	if err != nil {
		return nil, err
	}
	cl.Add(bed)
	g := &xskGen{bed: bed, batch: uint32(batch)}
	if err := bed.Open(func() error {
		tap, err := driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
		if err != nil {
			return err
		}
		g.tap = tap
		cl.Add(tap) // closed before the bed
		return nil
	}); err != nil {
		return nil, err
	}
	mac, err := g.tap.HardwareAddr()
	if err != nil {
		return nil, err
	}
	g.dst = netip.AddrPortFrom(bed.KernelAddr4.Addr(), xskgenPort)
	g.conn, err = bed.NS.ListenUDP(g.dst)
	if err != nil {
		return nil, err
	}
	cl.Add(g.conn)
	if rc, err := g.conn.SyscallConn(); err == nil {
		var serr error
		rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, xskgenRcvbuf)
		})
		if serr != nil {
			return nil, fmt.Errorf("SO_RCVBUFFORCE: %w", serr)
		}
	}
	go g.receive()

	frame := g.buildFrame(mac, netip.AddrPortFrom(bed.StackAddr4.Addr(), xskgenSrcPort), size)
	g.frameLen = len(frame)
	for m := range numXSKModes {
		cfg := xsk.Config{NumFrames: xskgenFrames, FrameSize: xskgenFrameSize, CsumOffload: true,
			TxSize: xskgenRingSize, CompSize: xskgenRingSize}
		if m != xskPlain {
			cfg.TxMetadata = true
		}
		g.wires[m] = &timedWire{w: g.tap}
		s, err := xsk.New(cfg, g.wires[m])
		if err != nil {
			return nil, err
		}
		g.socks[m] = s
		u := s.UMEM()
		for i := range u.NumFrames() {
			addr := u.DataAddr(i)
			copy(u.Data(addr, len(frame)), frame)
			g.free[m] = append(g.free[m], addr)
		}
	}
	return g, nil
}

// buildFrame returns the UDP/IPv4 frame to the kernel socket, with the
// full checksum in place, and records it and the pseudo-header sum.
func (g *xskGen) buildFrame(dstMAC net.HardwareAddr, src netip.AddrPort, size int) []byte {
	const l2, l3, l4 = header.EthernetMinimumSize, header.IPv4MinimumSize, header.UDPMinimumSize
	b := make([]byte, l2+l3+l4+size)
	header.Ethernet(b).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02"),
		DstAddr: tcpip.LinkAddress(dstMAC),
		Type:    header.IPv4ProtocolNumber,
	})
	srcA, dstA := tcpip.AddrFrom4(src.Addr().As4()), tcpip.AddrFrom4(g.dst.Addr().As4())
	ip := header.IPv4(b[l2:])
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b) - l2), TTL: 64, Protocol: uint8(header.UDPProtocolNumber), SrcAddr: srcA, DstAddr: dstA})
	ip.SetChecksum(^ip.CalculateChecksum())
	seg := b[l2+l3:]
	header.UDP(seg).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: g.dst.Port(), Length: uint16(len(seg))})
	for i := range seg[l4:] {
		seg[l4+i] = byte(i)
	}
	g.pseudo = header.PseudoHeaderChecksum(header.UDPProtocolNumber, srcA, dstA, uint16(len(seg)))
	header.UDP(seg).SetChecksum(g.pseudo)
	g.plain = ^checksum.Checksum(seg, 0)
	if g.plain == 0 {
		g.plain = 0xffff
	}
	header.UDP(seg).SetChecksum(g.plain)
	return b
}

// receive counts the datagrams the kernel socket delivers until it is
// closed.
func (g *xskGen) receive() {
	buf := make([]byte, 2048)
	for {
		if _, err := g.conn.Read(buf); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		g.received.Add(1)
	}
}

// waitReceived waits, at most 3 s, until the receiver has counted want
// datagrams or stopped counting, and returns its count.
func (g *xskGen) waitReceived(want uint64) uint64 {
	deadline := time.Now().Add(3 * time.Second)
	last, lastChange := g.received.Load(), time.Now()
	for last < want && time.Now().Before(deadline) && time.Since(lastChange) < 300*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
		if n := g.received.Load(); n != last {
			last, lastChange = n, time.Now()
		}
	}
	return g.received.Load()
}

// udpSNMP returns the Udp counters of the bed's namespace.
func (g *xskGen) udpSNMP() (map[string]uint64, error) { return g.bed.NS.SNMP("Udp") }

// round sends n frames in mode m, in batches of g.batch per Kick, and
// returns the time it took, from the first submission to the last
// completion reaped. It stops early at deadline.
func (g *xskGen) round(m, n int, deadline time.Time) (xskResult, error) {
	s := g.socks[m]
	u := s.UMEM()
	free := g.free[m]
	// Outside the timing: the checksum field the mode needs.
	for _, addr := range free {
		csum := g.plain
		if m == xskRequest {
			csum = g.pseudo
		}
		checksum.Put(u.Data(addr+xskCsumStart+xskCsumOffset, 2), csum)
	}
	if len(free) != u.NumFrames() {
		return xskResult{}, fmt.Errorf("%d of %d frames in flight before the round", u.NumFrames()-len(free), u.NumFrames())
	}
	before := s.Stats().TxPackets.Load()
	var kick time.Duration
	wire0 := g.wires[m].ns
	var lastAddr uint64
	submitted, completed := 0, 0
	start := time.Now()
	for completed < submitted || submitted < n {
		if submitted < n && time.Now().After(deadline) {
			n = submitted // out of time: finish what is in flight
		}
		c, cidx := s.Completion().Peek(xskgenRingSize)
		for i := range c {
			lastAddr = *s.Completion().Entry(cidx + i)
			free = append(free, lastAddr)
		}
		s.Completion().Release(c)
		completed += int(c)

		k := min(g.batch, uint32(len(free)), uint32(n-submitted))
		if k > 0 {
			got, idx := s.TX().Reserve(k)
			for i := range got {
				addr := free[len(free)-1]
				free = free[:len(free)-1]
				d := xsk.Desc{Addr: addr, Len: uint32(g.frameLen)}
				if m != xskPlain {
					// Per packet in -M and -m alike, as the patch's
					// xskgen does (and -m must: a timestamp overwrites
					// the offsets), so that -m against -M is the
					// socket's cost of the request alone.
					md := u.Metadata(addr)
					md.SetFlags(xsk.TxmdChecksum | xsk.TxmdTimestamp)
					md.SetChecksumRequest(xskCsumStart, xskCsumOffset)
				}
				if m == xskRequest {
					d.Options = xsk.OptTxMetadata
				}
				*s.TX().Entry(idx + i) = d
			}
			s.TX().Submit(got)
			submitted += int(got)
		}
		t0 := time.Now()
		_, err := s.Kick()
		kick += time.Since(t0)
		if err != nil {
			g.free[m] = free
			return xskResult{}, err
		}
	}
	el := time.Since(start)
	g.free[m] = free
	sent := s.Stats().TxPackets.Load() - before
	if sent != uint64(n) {
		return xskResult{}, fmt.Errorf("sent %d of %d frames; counters %s", sent, n, s.Stats().String())
	}
	if m == xskRequest && n > 0 {
		if ts := u.Metadata(lastAddr).TxTimestamp(); ts == 0 || ts > s.Now() {
			return xskResult{}, fmt.Errorf("TX timestamp %d of the last frame not in (0, %d]", ts, s.Now())
		}
	}
	r := xskResult{packets: sent, loop: el, kick: kick, sock: kick - (g.wires[m].ns - wire0)}
	if n > 0 {
		r.perPkt = []float64{float64(el.Nanoseconds()) / float64(n)}
		r.sockPkt = []float64{float64(r.sock.Nanoseconds()) / float64(n)}
	}
	return r, nil
}
