package bench

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/ustack/ustack/internal/testbed"
)

// floorBed makes a TAP bed for a floor test, removed at the test's end.
func floorBed(t *testing.T) *testbed.TAPBed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns; run go test -exec sudo ./internal/bench/...")
	}
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustack-floor-test", TAPName: "uflr0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Close() })
	return bed
}

// startTestFloor starts a floor on bed, stopped at the test's end (or
// earlier by the test, which then reads its stats).
func startTestFloor(t *testing.T, bed *testbed.TAPBed, cfg floorConfig) *floor {
	t.Helper()
	f, err := startFloor(bed, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.stop() }) // a second stop finds the loop gone
	return f
}

// TestFloorReflectorEchoes has a kernel TCP client and a kernel UDP
// socket in the bed's namespace talk to the reflector across the TAP: the
// TCP bytes come back byte for byte, in messages of many sizes up to one
// MSS (the reflector's echo takes its sequence number from the peer's
// ack, so it is right for one segment in flight, as in request/response),
// and so do the datagrams.
func TestFloorReflectorEchoes(t *testing.T) {
	for _, busy := range []bool{false, true} {
		name := "blocking"
		if busy {
			name = "busy"
		}
		t.Run(name, func(t *testing.T) {
			bed := floorBed(t)
			f := startTestFloor(t, bed, floorConfig{busy: busy})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := bed.NS.DialTCP(ctx, netip.AddrPortFrom(bed.StackAddr4.Addr(), 7), "")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			var sent int
			for i, size := range []int{1, 64, 1459, 1460, 999, 65} {
				msg := make([]byte, size)
				for j := range msg {
					msg[j] = byte(i*31 + j*7)
				}
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, size)
				if _, err := io.ReadFull(c, got); err != nil {
					t.Fatalf("message %d (%d B): %v", i, size, err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("message %d (%d B): echo differs at byte %d", i, size, firstDiffAt(got, msg))
				}
				sent += size
			}
			u, err := bed.NS.DialUDP(netip.AddrPortFrom(bed.StackAddr4.Addr(), 7))
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			u.SetDeadline(time.Now().Add(10 * time.Second))
			for i, size := range []int{1, 64, 1472} {
				msg := bytes.Repeat([]byte{byte(i + 1)}, size)
				if _, err := u.Write(msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 2048)
				n, err := u.Read(got)
				if err != nil {
					t.Fatalf("datagram %d (%d B): %v", i, size, err)
				}
				if !bytes.Equal(got[:n], msg) {
					t.Fatalf("datagram %d: got %d bytes back, want the %d sent", i, n, size)
				}
			}
			c.Close()
			u.Close()
			if err := f.stop(); err != nil {
				t.Fatal(err)
			}
			if f.stats.writeErrs != 0 || f.stats.writes < 3 {
				t.Errorf("got %d writes, %d failed; want every answer written", f.stats.writes, f.stats.writeErrs)
			}
		})
	}
}

// TestFloorSinkCountsStream has a kernel TCP sender in the bed's namespace
// send a stream to the sink across the TAP (GSO super-frames with the
// offloads on) and close it: the sink ACKs it to the end, the sender sees
// the sink's FIN, and the sink counted every byte once.
func TestFloorSinkCountsStream(t *testing.T) {
	bed := floorBed(t)
	f := startTestFloor(t, bed, floorConfig{sink: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := bed.NS.DialTCP(ctx, netip.AddrPortFrom(bed.StackAddr4.Addr(), benchPort), "cubic")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 64<<10+3) // odd, so the last segment is short
	var sent int64
	for range 1000 { // about 64 MB
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The sink's FIN comes after it has ACKed everything before it.
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("got %d bytes, %v after our FIN; want the sink's FIN (EOF)", n, err)
	}
	if err := waitFloorBytes(f, uint64(sent)); err != nil {
		t.Fatal(err)
	}
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	st := f.stats
	if st.sink.bytes != uint64(sent) || st.sink.gaps != 0 || st.truncated != 0 || st.writeErrs != 0 {
		t.Errorf("sink: got %d bytes, %d gaps, %d truncated, %d write errors; want %d bytes and no gap, truncation or error",
			st.sink.bytes, st.sink.gaps, st.truncated, st.writeErrs, sent)
	}
	// With the offloads on, the kernel hands over super-frames: fewer
	// reads than MSS-sized segments.
	if segs := uint64(sent) / 1460; st.sink.segs*2 > segs {
		t.Errorf("got %d data reads for %d bytes, want super-frames (under %d)", st.sink.segs, sent, segs/2)
	}
	t.Logf("sink: %d bytes in %d data reads, %d ACKs, %d retransmitted segments", st.sink.bytes, st.sink.segs, st.sink.acks, st.sink.retrans)
}

func firstDiffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
