//go:build linux

package driver

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/ustack/ustack/internal/testutil"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// seqpacketPair returns the ends of a SOCK_SEQPACKET pair: a device that
// moves whole frames, as a TAP does.
func seqpacketPair(t *testing.T) (dev, peer *os.File) { return testutil.SeqpacketPair(t, 0) }

// hidden hides an *os.File's descriptor, as water's Windows device has
// none: the wire reads it on a goroutine.
type hidden struct{ io.ReadWriteCloser }

// TestPlainWire: a PlainWire reads each bare frame after a zeroed
// virtio-net header, non-blocking reads say ErrNoFrame, a frame written with
// a plain header leaves as it is, one with NEEDS_CSUM leaves with its
// checksum filled in and a GSO frame as segments with full checksums whose
// payloads are the frame's; Close wakes a blocked Read. Through the
// descriptor and through the reading goroutine.
func TestPlainWire(t *testing.T) {
	for _, kind := range []string{"fd", "goroutine"} {
		t.Run(kind, func(t *testing.T) {
			dev, peer := seqpacketPair(t)
			var rw io.ReadWriteCloser = dev
			if kind == "goroutine" {
				rw = hidden{dev}
			}
			w := NewPlainWire(rw, 9216)
			defer w.Close()
			buf := make([]byte, VirtioNetHdrLen+9216)
			if _, err := w.Read(buf, false); !errors.Is(err, ErrNoFrame) {
				t.Fatalf("Read with nothing queued: got %v, want ErrNoFrame", err)
			}
			spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(300)}
			frame := spec.build()
			if _, err := peer.Write(frame); err != nil {
				t.Fatal(err)
			}
			n, err := w.Read(buf, true)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:VirtioNetHdrLen], make([]byte, VirtioNetHdrLen)) || !bytes.Equal(buf[VirtioNetHdrLen:n], frame) {
				t.Fatalf("Read: got %d bytes, want a zeroed header and the %d-byte frame", n, len(frame))
			}

			got := make([]byte, 9216)
			recv := func() []byte {
				t.Helper()
				peer.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, err := peer.Read(got)
				if err != nil {
					t.Fatal(err)
				}
				return got[:n]
			}
			// A plain header: the frame as it is.
			if err := w.Write(wireFrame(VirtioNetHdr{}, frame)); err != nil {
				t.Fatal(err)
			}
			if b := recv(); !bytes.Equal(b, frame) {
				t.Fatalf("plain Write: the peer got %d bytes, not the frame", len(b))
			}
			// NEEDS_CSUM: the checksum filled in.
			h, part, fi := pkSuperFrame(t, pkSpec{l3: L3IPv4, proto: protoTCP, tcpFlags: header.TCPFlagAck, payload: pkPayload(500)}, VirtioNetHdrGSONone, 0)
			h.GSOType = VirtioNetHdrGSONone
			if err := w.Write(wireFrame(h, part)); err != nil {
				t.Fatal(err)
			}
			b := recv()
			if d := VerifyChecksums(b, &fi, true); d != DropNone || !bytes.Equal(b[fi.HeaderLen():], part[fi.HeaderLen():]) {
				t.Fatalf("NEEDS_CSUM Write: %v, or the payload differs", d)
			}
			// GSO: segments with full checksums.
			const mss = 1448
			h, super, _ := pkSuperFrame(t, pkSpec{l3: L3IPv6, proto: protoTCP, tcpFlags: header.TCPFlagAck | header.TCPFlagPsh, seq: 7, payload: pkPayload(10000)}, VirtioNetHdrGSOTCPv6, mss)
			if err := w.Write(wireFrame(h, super)); err != nil {
				t.Fatal(err)
			}
			var payload []byte
			segs := (10000 + mss - 1) / mss
			for i := range segs {
				b := recv()
				var sfi FrameInfo
				if d := ParseFrame(b, &sfi); d != DropNone {
					t.Fatalf("segment %d: %v", i, d)
				}
				if d := VerifyChecksums(b, &sfi, true); d != DropNone {
					t.Fatalf("segment %d: %v", i, d)
				}
				payload = append(payload, b[sfi.HeaderLen():]...)
			}
			if !bytes.Equal(payload, pkPayload(10000)) {
				t.Errorf("the segments' payloads differ from the frame's")
			}
			if c, s := w.TxSWCsum.Load(), w.TxSWSegments.Load(); c != 1 || s != uint64(segs) {
				t.Errorf("tx_sw_csum %d, tx_sw_segments %d: want 1 and %d", c, s, segs)
			}
			if err := w.Write(wireFrame(VirtioNetHdr{GSOType: VirtioNetHdrGSOTCPv4, GSOSize: mss}, frame)); err == nil {
				t.Errorf("GSO TCPv4 header on a UDP frame: Write sent it")
			}

			// Close wakes a blocked Read.
			done := make(chan error, 1)
			go func() {
				_, err := w.Read(buf, true)
				done <- err
			}()
			time.Sleep(10 * time.Millisecond) // let it block; it must return either way
			w.Close()
			select {
			case err := <-done:
				if !errors.Is(err, os.ErrClosed) {
					t.Errorf("Read after Close: got %v, want os.ErrClosed", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not wake a blocked Read")
			}
			if err := w.Write(wireFrame(VirtioNetHdr{}, frame)); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Write after Close: got %v, want os.ErrClosed", err)
			}
		})
	}
}

// TestPlainWireNoAllocs: reading and writing plain frames through the
// descriptor does not allocate.
func TestPlainWireNoAllocs(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	dev, peer := seqpacketPair(t)
	w := NewPlainWire(dev, 2048)
	defer w.Close()
	spec := pkSpec{l3: L3IPv4, proto: protoUDP, payload: pkPayload(64)}
	frame := spec.build()
	out := wireFrame(VirtioNetHdr{}, frame)
	buf := make([]byte, 2048+VirtioNetHdrLen)
	got := make([]byte, 2048)
	allocs := testing.AllocsPerRun(200, func() {
		if err := w.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Read(got); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(frame); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Read(buf, true); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("got %v allocs per write and read, want 0", allocs)
	}
}
