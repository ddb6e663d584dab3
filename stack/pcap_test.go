package stack

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPcapWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.pcap")
	p, err := CreatePcap(path)
	if err != nil {
		t.Fatal(err)
	}
	frame := testUDPFrame()
	at := time.Unix(1700000000, 123456789)
	p.WriteFrame(at, frame[:20], frame[20:])
	p.WriteFrame(at.Add(time.Second), frame)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(b); got != pcapMagic {
		t.Fatalf("magic: got %#x, want %#x", got, pcapMagic)
	}
	if got := binary.LittleEndian.Uint32(b[20:]); got != pcapEthernet {
		t.Errorf("link type: got %d, want %d", got, pcapEthernet)
	}
	rec := b[24:]
	for i := 0; i < 2; i++ {
		if len(rec) < 16 {
			t.Fatalf("record %d: file ends early", i)
		}
		sec, nsec := binary.LittleEndian.Uint32(rec), binary.LittleEndian.Uint32(rec[4:])
		capLen, origLen := binary.LittleEndian.Uint32(rec[8:]), binary.LittleEndian.Uint32(rec[12:])
		if sec != uint32(1700000000+i) || nsec != 123456789 {
			t.Errorf("record %d time: got %d.%09d", i, sec, nsec)
		}
		if int(capLen) != len(frame) || int(origLen) != len(frame) {
			t.Errorf("record %d lengths: got %d/%d, want %d", i, capLen, origLen, len(frame))
		}
		if !bytes.Equal(rec[16:16+capLen], frame) {
			t.Errorf("record %d bytes differ from the frame", i)
		}
		rec = rec[16+capLen:]
	}
	if len(rec) != 0 {
		t.Errorf("trailing bytes: got %d, want 0", len(rec))
	}
	// Where tcpdump is installed, it must read the file too.
	if tcpdump, err := exec.LookPath("tcpdump"); err == nil {
		out, err := exec.Command(tcpdump, "-n", "-r", path).CombinedOutput()
		if err != nil || strings.Count(string(out), "UDP") != 2 {
			t.Errorf("tcpdump -r: %v\n%s", err, out)
		}
	}
}

// testUDPFrame is an Ethernet/IPv4/UDP frame with 8 bytes of payload.
func testUDPFrame() []byte {
	f := make([]byte, 14+20+8+8)
	copy(f[0:], []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00})
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 36)
	ip[8], ip[9] = 64, 17
	copy(ip[12:], []byte{192, 0, 2, 2, 192, 0, 2, 1})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], 16)
	copy(udp[8:], "payload!")
	return f
}
