//go:build linux

package testbed

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestInjector writes frames onto a TAP from the kernel's side and reads
// them from the TAP's descriptor: they arrive unchanged, the device counts
// them, and the injector stops at its frame limit.
func TestInjector(t *testing.T) {
	needRoot(t)
	b, err := NewTAPBed(TAPConfig{Prefix: "tbinj"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	var fd int
	if err := b.Open(func() (err error) { fd, err = attachTAP(b.TAPName); return err }); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd) // before the bed's cleanup
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	in, err := b.NS.NewInjector(InjectorConfig{Dev: b.TAPName, MaxFrames: 3, Deadline: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	before, err := b.NS.LinkStats(b.TAPName)
	if err != nil {
		t.Fatal(err)
	}
	// A frame to a unicast address nobody has, of a made-up EtherType: the
	// kernel sends nothing like it on its own.
	frame := append([]byte{0x02, 0, 0, 0, 0, 0x42, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xb5}, bytes.Repeat([]byte{0xab}, 50)...)
	for range 3 {
		if err := in.Write(frame); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Write(frame); !errors.Is(err, ErrInjectLimit) {
		t.Errorf("fourth Write with MaxFrames 3: got %v, want ErrInjectLimit", err)
	}
	if in.Sent() != 3 {
		t.Errorf("Sent: got %d, want 3", in.Sent())
	}
	got := 0
	buf := make([]byte, 2048)
	for end := time.Now().Add(5 * time.Second); got < 3 && time.Now().Before(end); {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(pfd, 100)
		n, err := unix.Read(fd, buf)
		if err != nil {
			continue
		}
		if bytes.Equal(buf[:n], frame) {
			got++
		}
	}
	if got != 3 {
		t.Errorf("injected frames read from the TAP: got %d, want 3", got)
	}
	after, err := b.NS.LinkStats(b.TAPName)
	if err != nil {
		t.Fatal(err)
	}
	if after.TxPackets-before.TxPackets < 3 {
		t.Errorf("tx_packets of %s: grew by %d, want at least 3", b.TAPName, after.TxPackets-before.TxPackets)
	}
}
