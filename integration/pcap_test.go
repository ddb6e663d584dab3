//go:build linux

package integration

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestPcapAfterGRO records what a stack with LRO off and GRO on hands to
// gVisor while the kernel sends a bulk flow, and checks the capture: GRO'd
// packets appear as single frames far larger than the MTU, with their IP
// total length set to the merged size, and the wire capture has the
// super-frames the TAP delivered.
func TestPcapAfterGRO(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	gvisorPcap, err := stack.CreatePcap(filepath.Join(dir, "gvisor.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	wirePcap, err := stack.CreatePcap(filepath.Join(dir, "wire.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	r := newRigConfig(t, "usit-pcap", 1500, stack.Config{Driver: driver.Config{}, Pcap: gvisorPcap, PcapWire: wirePcap})
	kernelToStack(t, r, false, 5001, 8<<20, 7)
	r.close(t)
	if err := gvisorPcap.Close(); err != nil {
		t.Fatal(err)
	}
	if err := wirePcap.Close(); err != nil {
		t.Fatal(err)
	}

	big, frames := 0, 0
	for _, rec := range readPcap(t, filepath.Join(dir, "gvisor.pcap")) {
		frames++
		if len(rec) < 14+20 || binary.BigEndian.Uint16(rec[12:]) != 0x0800 {
			continue
		}
		ipLen := int(binary.BigEndian.Uint16(rec[14+2:]))
		if ipLen != len(rec)-14 {
			t.Fatalf("frame %d: IP total length %d, want the captured %d bytes less the Ethernet header", frames, ipLen, len(rec)-14)
		}
		if ipLen > 1500 {
			big++
		}
	}
	if big == 0 {
		t.Errorf("GRO'd frames larger than the MTU in the capture: got 0 of %d, want some", frames)
	}
	wireBig := 0
	for _, rec := range readPcap(t, filepath.Join(dir, "wire.pcap")) {
		if len(rec) > 1514 {
			wireBig++
		}
	}
	if wireBig == 0 {
		t.Errorf("super-frames in the wire capture: got 0, want some")
	}
	t.Logf("gVisor capture: %d frames, %d above the MTU; wire capture: %d super-frames", frames, big, wireBig)
}

// readPcap returns the records of a pcap file written by stack.PcapWriter.
func readPcap(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 {
		t.Fatalf("%s: %d bytes, shorter than a pcap header", path, len(b))
	}
	var recs [][]byte
	for b = b[24:]; len(b) >= 16; {
		n := int(binary.LittleEndian.Uint32(b[8:]))
		if len(b) < 16+n {
			t.Fatalf("%s: record cut short", path)
		}
		recs = append(recs, b[16:16+n])
		b = b[16+n:]
	}
	if len(b) != 0 {
		t.Fatalf("%s: %d trailing bytes", path, len(b))
	}
	return recs
}
