package stack

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
)

// TestTakeTrain: trains taken without a copy carry every byte sent, with
// their segment size and sender; a train a ReadBatch read in part is taken
// from where it stopped; a Train not released cannot be filled again.
func TestTakeTrain(t *testing.T) {
	rx, peer := pair(t, driver.Config{})
	dst := netip.MustParseAddrPort("192.0.2.1:9985")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 64, 1000
	sent := udpBurst(t, peer, dst, count, size)
	queuedDatagrams(t, c, count)
	deadline := time.Now().Add(30 * time.Second)
	one := batchMsgs(3, size)
	if n, err := c.ReadBatch(one, deadline); n != 3 || err != nil {
		t.Fatalf("ReadBatch: got %d, %v, want 3, nil", n, err)
	}
	var got []byte
	var tr Train
	var slices [][]byte
	trains, multi := 0, 0
	for len(got) < (count-3)*size {
		if err := c.TakeTrain(&tr, deadline); err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		if err := c.TakeTrain(&tr, deadline); !errors.Is(err, errTrainHeld) {
			t.Fatalf("TakeTrain into a held Train: %v, want errTrainHeld", err)
		}
		if tr.SegSize() != size || tr.From() != netip.MustParseAddrPort("192.0.2.2:5555") {
			t.Fatalf("train: segment size %d from %v, want %d from 192.0.2.2:5555", tr.SegSize(), tr.From(), size)
		}
		slices = tr.Slices(slices[:0])
		n := 0
		for _, s := range slices {
			got = append(got, s...)
			n += len(s)
		}
		if n != tr.Len() {
			t.Fatalf("slices hold %d bytes, Len %d", n, tr.Len())
		}
		if tr.Len() > size {
			multi++
		}
		trains++
		tr.Release()
		tr.Release() // a second Release does nothing
	}
	if want := bytes.Join(sent[3:], nil); !bytes.Equal(got, want) {
		t.Errorf("taken trains differ from the datagrams sent")
	}
	if multi == 0 {
		t.Errorf("%d trains of one datagram each: want GRO trains", trains)
	}
	if r := c.rmem.Load(); r != 0 {
		t.Errorf("receive buffer charge after every train released: %d, want 0", r)
	}
	c.Close()
	if err := c.TakeTrain(&tr, deadline); err != net.ErrClosed {
		t.Errorf("TakeTrain after Close: %v, want net.ErrClosed", err)
	}
}

// TestTakeTrainCharged: trains taken and held still count against the
// receive buffer, so a socket whose reader holds a buffer's worth drops
// what comes next; released, they make room again.
func TestTakeTrainCharged(t *testing.T) {
	rx, peer := pairConfig(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9984")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	const count, size = 256, 64
	burst := func() {
		d0 := c.Drops()
		udpBurst(t, peer, dst, count, size)
		testutil.WaitFor(t, "every datagram queued or dropped", func() bool {
			return len(c.ready)+int(c.Drops()-d0) >= count
		})
	}
	burst()
	queued := len(c.ready)
	if queued == 0 || queued == count {
		t.Fatalf("%d of %d datagrams queued under a 32 KB buffer: want some, not all", queued, count)
	}
	held := make([]Train, queued)
	for i := range held {
		if err := c.TakeTrain(&held[i], time.Now().Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	d0 := c.Drops()
	burst()
	if n := len(c.ready); n != 0 || c.Drops()-d0 != count {
		t.Errorf("with %d trains held: %d queued, %d dropped; want none queued, all %d dropped", queued, n, c.Drops()-d0, count)
	}
	for i := range held {
		held[i].Release()
	}
	if r := c.rmem.Load(); r != 0 {
		t.Errorf("charge after release: %d, want 0", r)
	}
	burst()
	if n := len(c.ready); n != queued {
		t.Errorf("after release: %d queued, want %d again", n, queued)
	}
}

// TestTakeTrainAllocs: taking a train, walking it and releasing it
// allocates nothing.
func TestTakeTrainAllocs(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	rx, peer := pairConfig(t, Config{NoGRO: true})
	dst := netip.MustParseAddrPort("192.0.2.1:9983")
	c, err := rx.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const runs = 100
	udpBurst(t, peer, dst, runs+1, 64)
	queuedDatagrams(t, c, runs+1)
	var tr Train
	slices := make([][]byte, 0, 16)
	deadline := time.Now().Add(30 * time.Second)
	allocs := testing.AllocsPerRun(runs, func() {
		if err := c.TakeTrain(&tr, deadline); err != nil {
			t.Fatal(err)
		}
		slices = tr.Slices(slices[:0])
		tr.Release()
	})
	if allocs != 0 {
		t.Errorf("allocations per TakeTrain: got %v, want 0", allocs)
	}
}

// TestTakeTrainUSO: a USO super-frame taken up whole (rx-uso) is one
// contiguous run of datagrams in its page; after a ReadBatch has read the
// first three, TakeTrain hands over the rest, from the middle of that run.
func TestTakeTrainUSO(t *testing.T) {
	st, w := usoStack(t, true)
	dst := netip.MustParseAddrPort("192.0.2.1:9982")
	c, err := st.ListenUDPTrains(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const segs, seg = 46, 1400
	payload := make([]byte, segs*seg)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	if err := w.Write(usoFrame(payload, seg, dst)); err != nil {
		t.Fatal(err)
	}
	queuedDatagrams(t, c, segs)
	deadline := time.Now().Add(30 * time.Second)
	if n, err := c.ReadBatch(batchMsgs(3, seg), deadline); n != 3 || err != nil {
		t.Fatalf("ReadBatch: got %d, %v, want 3, nil", n, err)
	}
	var tr Train
	if err := c.TakeTrain(&tr, deadline); err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	slices := tr.Slices(nil)
	if got := bytes.Join(slices, nil); !bytes.Equal(got, payload[3*seg:]) || tr.SegSize() != seg {
		t.Errorf("taken rest of the super-frame: %d bytes in %d slices, segment size %d; want the %d bytes after the first 3 datagrams, %d", len(got), len(slices), tr.SegSize(), len(payload)-3*seg, seg)
	}
}
