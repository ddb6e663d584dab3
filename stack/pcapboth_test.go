package stack

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// pcapFrames parses a pcap file of Ethernet frames as PcapWriter writes
// it (nanosecond magic, link type Ethernet) and returns its frames.
func pcapFrames(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != pcapMagic || binary.LittleEndian.Uint32(b[20:]) != pcapEthernet {
		t.Fatalf("pcap file header: got % x, want the magic %#x and link type Ethernet", b[:min(len(b), 24)], pcapMagic)
	}
	var frames [][]byte
	for rec := b[24:]; len(rec) > 0; {
		if len(rec) < 16 {
			t.Fatalf("record %d: %d bytes left, want a 16-byte header", len(frames), len(rec))
		}
		capLen, origLen := int(binary.LittleEndian.Uint32(rec[8:])), int(binary.LittleEndian.Uint32(rec[12:]))
		if capLen != origLen || len(rec) < 16+capLen {
			t.Fatalf("record %d: caplen %d, len %d, %d bytes left", len(frames), capLen, origLen, len(rec)-16)
		}
		frames = append(frames, rec[16:16+capLen])
		rec = rec[16+capLen:]
	}
	return frames
}

// pcapFrame is what the pcap tests read from a recorded frame.
type pcapFrame struct {
	sent          bool // from the stack's MAC: transmitted
	proto         tcpip.TransportProtocolNumber
	src, dst      uint16 // ports
	flags         header.TCPFlags
	payload       int // TCP payload; UDP payload by the UDP length
	udpLen, frame int
}

// parsePcapFrame reads an Ethernet/IPv4 frame of TCP or UDP; ok is false
// for anything else (ARP). A frame that is not Ethernet (a virtio-net
// header in front, say) fails the test.
func parsePcapFrame(t *testing.T, f []byte, mac tcpip.LinkAddress) (pf pcapFrame, ok bool) {
	t.Helper()
	if len(f) < header.EthernetMinimumSize {
		t.Fatalf("frame of %d bytes", len(f))
	}
	eth := header.Ethernet(f)
	switch eth.Type() {
	case header.ARPProtocolNumber, header.IPv6ProtocolNumber:
		return pf, false
	case header.IPv4ProtocolNumber:
	default:
		t.Fatalf("frame % x...: EtherType %#x, want an Ethernet frame", f[:min(len(f), 24)], eth.Type())
	}
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) {
		t.Fatalf("frame % x...: bad IPv4 header", f[:min(len(f), 40)])
	}
	pf.sent, pf.frame = eth.SourceAddress() == mac, len(f)
	l4 := ip.Payload()
	switch pf.proto = ip.TransportProtocol(); pf.proto {
	case header.TCPProtocolNumber:
		tcp := header.TCP(l4)
		pf.src, pf.dst, pf.flags = tcp.SourcePort(), tcp.DestinationPort(), tcp.Flags()
		pf.payload = len(l4) - int(tcp.DataOffset())
	case header.UDPProtocolNumber:
		udp := header.UDP(l4)
		pf.src, pf.dst, pf.udpLen = udp.SourcePort(), udp.DestinationPort(), int(udp.Length())
		pf.payload = len(l4) - header.UDPMinimumSize
	default:
		return pf, false
	}
	return pf, true
}

var rxMAC = tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 1})

// TestPcapBothDirections: Config.Pcap records what the stack sends as
// well as what it receives, as tcpdump on an interface does: a TCP echo
// over the in-memory pair shows the peer's SYN and the stack's SYN-ACK,
// and the data both ways, each frame an Ethernet frame (no virtio-net
// header), whole.
func TestPcapBothDirections(t *testing.T) {
	var file bytes.Buffer
	pw, err := NewPcapWriter(&file)
	if err != nil {
		t.Fatal(err)
	}
	rx, peer := newPair(t, Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}, Pcap: pw},
		Config{Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}})
	const port, n = 9000, 200 << 10
	l, err := rx.ListenTCP(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.CopyN(c, c, n)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := peer.DialTCP(ctx, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	sent := bytes.Repeat([]byte("ustack pcap "), n/12+1)[:n]
	go c.Write(sent)
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, sent) {
		t.Fatalf("echo: %v, or the bytes differ", err)
	}
	c.Close()
	// Stop every writer before reading the file.
	rx.Close()
	peer.Close()
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	var syn, synAck, txSyn int
	var rxData, txData, bigTx int
	for _, f := range pcapFrames(t, file.Bytes()) {
		pf, ok := parsePcapFrame(t, f, rxMAC)
		if !ok || pf.proto != header.TCPProtocolNumber {
			continue
		}
		isSyn, isAck := pf.flags&header.TCPFlagSyn != 0, pf.flags&header.TCPFlagAck != 0
		switch {
		case !pf.sent && pf.dst == port:
			rxData += pf.payload
			if isSyn && !isAck {
				syn++
			}
		case pf.sent && pf.src == port:
			txData += pf.payload
			if isSyn {
				txSyn++
				if isAck {
					synAck++
				}
			}
			if pf.frame > header.EthernetMinimumSize+1500 {
				bigTx++ // a GSO super-frame, recorded as one
			}
		}
	}
	if syn == 0 || synAck == 0 {
		t.Errorf("SYNs: got %d from the peer and %d SYN-ACKs from the stack (%d SYNs sent), want one of each", syn, synAck, txSyn)
	}
	if rxData < n || txData < n {
		t.Errorf("TCP payload recorded: got %d received and %d sent, want at least %d each way", rxData, txData, n)
	}
	if bigTx == 0 {
		t.Errorf("frames sent longer than the MTU's: got none, want the stack's GSO super-frames whole")
	}
}

// usoMemWire is a MemWire that says it takes UDP segmentation offload,
// as a TAP with USO does, so that WriteBatch sends a message of several
// segments as one UDP GSO super-frame.
type usoMemWire struct{ *driver.MemWire }

func (usoMemWire) USO() bool { return true }

// TestPcapTrains: Config.Pcap records the trains a TrainConn receives,
// once each and whole (they bypass gVisor), and what WriteBatch sends:
// a message of segments as the one super-frame written to the wire, a
// single datagram as gVisor sends it.
func TestPcapTrains(t *testing.T) {
	var file bytes.Buffer
	pw, err := NewPcapWriter(&file)
	if err != nil {
		t.Fatal(err)
	}
	a, w := driver.NewMemPair(0, 0)
	defer w.Close()
	pool := testutil.NewPool(t, bufpool.Config{RingSize: 1 << 15, Poison: true})
	st, err := New(Config{Wire: usoMemWire{a}, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")},
		MAC: [6]byte{2, 0, 0, 0, 0, 1}, Driver: driver.Config{RxUSO: true, Pool: pool}, Pcap: pw})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The peer is w itself: give the stack its MAC, as ARP would have.
	if e := st.ip.AddStaticNeighbor(nicID, header.IPv4ProtocolNumber, tcpip.AddrFrom4([4]byte{192, 0, 2, 2}), tcpip.LinkAddress([]byte{2, 0, 0, 0, 0, 2})); e != nil {
		t.Fatal(e)
	}
	const port = 7000
	c, err := st.ListenUDPTrains(netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A train of 3 datagrams of 500 bytes and one of 100 (rx-uso).
	const seg, total = 500, 3*500 + 100
	payload := bytes.Repeat([]byte{0xab}, total)
	if err := w.Write(usoFrame(payload, seg, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port))); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, segSize, _, err := c.ReadTrain(buf, time.Now().Add(30*time.Second)); err != nil || n != total || segSize != seg {
		t.Fatalf("ReadTrain: got %d bytes of %d, %v, want %d of %d", n, segSize, err, total, seg)
	}
	to := netip.MustParseAddrPort("192.0.2.2:5000")
	ms := []Message{
		{Buffers: [][]byte{payload[:700], payload[700:]}, Addr: to, SegSize: seg}, // one super-frame
		{Buffers: [][]byte{payload[:300]}, Addr: to},                              // through gVisor
	}
	if n, err := c.WriteBatch(ms); n != len(ms) || err != nil {
		t.Fatalf("WriteBatch: got %d, %v, want %d, nil", n, err, len(ms))
	}
	// Both went out on the wire: the super-frame whole, then the datagram.
	for i, want := range []int{total, 300} {
		got := 0
		testutil.WaitFor(t, "a frame on the wire", func() bool {
			var err error
			for got == 0 && err == nil {
				var n int
				if n, err = w.Read(buf, false); err == nil && n > driver.VirtioNetHdrLen+14+20+8 {
					if header.UDP(buf[driver.VirtioNetHdrLen+14+20:]).SourcePort() == port {
						got = n - (driver.VirtioNetHdrLen + 14 + 20 + 8)
					}
				}
			}
			return got != 0
		})
		if got != want {
			t.Errorf("frame %d on the wire: got %d bytes of UDP payload, want %d", i, got, want)
		}
	}
	st.Close()
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	var rxTrains, txFrames []pcapFrame
	for _, f := range pcapFrames(t, file.Bytes()) {
		pf, ok := parsePcapFrame(t, f, rxMAC)
		if !ok || pf.proto != header.UDPProtocolNumber {
			continue
		}
		switch {
		case !pf.sent && pf.dst == port:
			rxTrains = append(rxTrains, pf)
		case pf.sent && pf.src == port:
			txFrames = append(txFrames, pf)
		}
	}
	if len(rxTrains) != 1 || rxTrains[0].payload != total || rxTrains[0].udpLen != 8+total {
		t.Errorf("received trains recorded: got %+v, want one of %d payload bytes (UDP length %d)", rxTrains, total, 8+total)
	}
	if len(txFrames) != 2 || txFrames[0].payload != total || txFrames[0].udpLen != 8+total || txFrames[1].payload != 300 {
		t.Errorf("frames sent recorded: got %+v, want the super-frame of %d payload bytes (UDP length %d), then a datagram of 300", txFrames, total, 8+total)
	}
}
