package stack

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/ustack/ustack/bufpool"
)

// PcapWriter writes frames to a pcap file (link type Ethernet, or raw IP
// for a TUN's packets: CreateRawPcap), readable by
// tcpdump and Wireshark. It is safe for concurrent use (the poll loop,
// cpumap workers and every sender write to one writer): each frame's
// record is written whole under its lock, given as the parts it is made
// of so that callers need not flatten it. The classic pcap format has no
// direction: as with tcpdump on an Ethernet interface, the MAC addresses
// (a TUN's: the IP addresses) tell a received frame from a sent one.
type PcapWriter struct {
	mu sync.Mutex
	f  *os.File // nil when writing to a plain io.Writer
	// +checklocks:mu
	w *bufio.Writer
	// +checklocks:mu
	err error
	// +checklocks:mu
	hdr [16]byte
	raw bool // LINKTYPE_RAW: the frames are IP packets
}

const (
	pcapMagic    = 0xa1b23c4d // nanosecond timestamps
	pcapSnapLen  = 262144
	pcapEthernet = 1   // LINKTYPE_ETHERNET
	pcapRaw      = 101 // LINKTYPE_RAW: IP packets, a TUN's
)

// CreatePcap creates (or truncates) the file at path and writes the pcap
// file header.
func CreatePcap(path string) (*PcapWriter, error) { return createPcap(path, false) }

// CreateRawPcap is CreatePcap for a TUN's packets (link type raw IP).
func CreateRawPcap(path string) (*PcapWriter, error) { return createPcap(path, true) }

func createPcap(path string, raw bool) (*PcapWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("pcap: %w", err)
	}
	p, err := newPcapWriter(f, raw)
	if err != nil {
		f.Close()
		return nil, err
	}
	p.f = f
	return p, nil
}

// NewPcapWriter writes the pcap file header to w and returns a writer of
// frames to it.
func NewPcapWriter(w io.Writer) (*PcapWriter, error) { return newPcapWriter(w, false) }

// NewRawPcapWriter is NewPcapWriter for a TUN's packets (link type raw IP).
func NewRawPcapWriter(w io.Writer) (*PcapWriter, error) { return newPcapWriter(w, true) }

func newPcapWriter(w io.Writer, raw bool) (*PcapWriter, error) {
	p := &PcapWriter{w: bufio.NewWriterSize(w, 1<<20), raw: raw}
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], pcapMagic)
	binary.LittleEndian.PutUint16(h[4:], 2) // version 2.4
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], pcapSnapLen)
	lt := uint32(pcapEthernet)
	if raw {
		lt = pcapRaw
	}
	binary.LittleEndian.PutUint32(h[20:], lt)
	if _, err := p.w.Write(h[:]); err != nil {
		return nil, fmt.Errorf("pcap: %w", err)
	}
	return p, nil
}

// WriteFrame appends one frame made of parts, captured at time t. Errors
// are kept and returned by Close; a failed writer drops further frames.
// It does not retain parts.
func (p *PcapWriter) WriteFrame(t time.Time, parts ...[]byte) {
	n := 0
	for _, b := range parts {
		n += len(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	capLen := p.recordLocked(t, n)
	for _, b := range parts {
		if capLen = p.writeLocked(b, capLen); capLen == 0 {
			return
		}
	}
}

// writeTrain appends the frame of a UDP train as splitUDP records one:
// pkt's first hdrLen bytes (its headers), then the n payload bytes after
// them (bufpool.Packet.Walk: its frags and chained packets), without
// flattening it. pkt stays the caller's.
func (p *PcapWriter) writeTrain(t time.Time, pkt *bufpool.Packet, hdrLen, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	capLen := p.recordLocked(t, hdrLen+n)
	capLen = p.writeLocked(pkt.Linear[:hdrLen], capLen)
	for w := pkt.Walk(hdrLen); n > 0 && capLen > 0 && w.Next(); {
		b := w.Bytes()
		b = b[:min(len(b), n)]
		n -= len(b)
		capLen = p.writeLocked(b, capLen)
	}
}

// recordLocked writes the record header of an n-byte frame captured at t
// and returns the bytes of it to write (the snap length's), 0 once the
// writer failed.
//
// +checklocks:p.mu
func (p *PcapWriter) recordLocked(t time.Time, n int) (capLen int) {
	if p.err != nil {
		return 0
	}
	capLen = min(n, pcapSnapLen)
	ns := t.UnixNano()
	binary.LittleEndian.PutUint32(p.hdr[0:], uint32(ns/1e9))
	binary.LittleEndian.PutUint32(p.hdr[4:], uint32(ns%1e9))
	binary.LittleEndian.PutUint32(p.hdr[8:], uint32(capLen))
	binary.LittleEndian.PutUint32(p.hdr[12:], uint32(n))
	if _, err := p.w.Write(p.hdr[:]); err != nil {
		p.err = err
		return 0
	}
	return capLen
}

// writeLocked writes what of b the record's capLen bytes left to write
// take, and returns what is left of them (0 once the writer failed).
//
// +checklocks:p.mu
func (p *PcapWriter) writeLocked(b []byte, capLen int) int {
	if capLen == 0 || p.err != nil {
		return 0
	}
	b = b[:min(len(b), capLen)]
	if _, err := p.w.Write(b); err != nil {
		p.err = err
		return 0
	}
	return capLen - len(b)
}

// Close flushes what is buffered and closes the file it created, if any.
// It returns the first error the writer met.
func (p *PcapWriter) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.w.Flush(); err != nil && p.err == nil {
		p.err = err
	}
	if p.f != nil {
		if err := p.f.Close(); err != nil && p.err == nil {
			p.err = err
		}
		p.f = nil
	}
	if p.err != nil {
		return fmt.Errorf("pcap: %w", p.err)
	}
	return nil
}
