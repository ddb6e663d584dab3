package driver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"os"
	"sync"
	"testing"
	"time"
)

var _ Wire = (*MemWire)(nil)

func TestMemWireOrder(t *testing.T) {
	a, b := NewMemPair(8, 64)
	defer a.Close()
	buf := make([]byte, 64)
	for _, tt := range []struct {
		name    string
		from    *MemWire
		to      *MemWire
		payload []string
	}{
		{"a to b", a, b, []string{"one", "two", "three"}},
		{"b to a", b, a, []string{"x", "yy", "zzz", "", "a-much-longer-frame"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range tt.payload {
				if err := tt.from.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			// Nothing leaks back to the writer's own end.
			if _, err := tt.from.Read(buf, false); err != ErrNoFrame {
				t.Errorf("writer's end Read: %v, want ErrNoFrame", err)
			}
			for _, want := range tt.payload {
				n, err := tt.to.Read(buf, false)
				if err != nil {
					t.Fatal(err)
				}
				if string(buf[:n]) != want {
					t.Errorf("read %q, want %q", buf[:n], want)
				}
			}
			if _, err := tt.to.Read(buf, false); err != ErrNoFrame {
				t.Errorf("Read of empty queue: %v, want ErrNoFrame", err)
			}
		})
	}
}

func TestMemWireDrop(t *testing.T) {
	tests := []struct {
		name        string
		depth, max  int
		frames      []int // lengths
		wantRead    []int
		wantDropped uint64
	}{
		{"full queue", 2, 100, []int{10, 20, 30, 40}, []int{10, 20}, 2},
		{"too long", 4, 100, []int{100, 101, 50}, []int{100, 50}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := NewMemPair(tt.depth, tt.max)
			defer a.Close()
			for i, n := range tt.frames {
				f := bytes.Repeat([]byte{byte(i)}, n)
				if err := a.Write(f); err != nil {
					t.Fatalf("Write: %v (drops are not errors)", err)
				}
			}
			if got := a.Dropped(); got != tt.wantDropped {
				t.Errorf("Dropped = %d, want %d", got, tt.wantDropped)
			}
			if got := b.Dropped(); got != 0 {
				t.Errorf("reader's Dropped = %d", got)
			}
			buf := make([]byte, 200)
			for _, want := range tt.wantRead {
				n, err := b.Read(buf, false)
				if err != nil || n != want {
					t.Fatalf("Read = %d, %v; want %d", n, err, want)
				}
			}
			if _, err := b.Read(buf, false); err != ErrNoFrame {
				t.Errorf("extra frame: %v", err)
			}
			// Reading frees space again.
			if err := a.Write([]byte("again")); err != nil || a.Dropped() != tt.wantDropped {
				t.Errorf("Write after drain: %v, dropped %d", err, a.Dropped())
			}
		})
	}
}

func TestMemWireTruncate(t *testing.T) {
	a, b := NewMemPair(2, 100)
	defer a.Close()
	a.Write([]byte("0123456789"))
	a.Write([]byte("abc"))
	buf := make([]byte, 4)
	if n, err := b.Read(buf, false); err != nil || string(buf[:n]) != "0123" {
		t.Errorf("truncated Read = %q, %v", buf[:n], err)
	}
	if n, err := b.Read(buf, false); err != nil || string(buf[:n]) != "abc" {
		t.Errorf("next Read = %q, %v", buf[:n], err)
	}
}

func TestMemWireBlockingRead(t *testing.T) {
	tests := []struct {
		name    string
		wake    func(a, b *MemWire)
		wantN   int
		wantErr error
	}{
		{"write", func(a, b *MemWire) { a.Write([]byte("wake")) }, 4, nil},
		{"close own end", func(a, b *MemWire) { b.Close() }, 0, os.ErrClosed},
		{"close peer", func(a, b *MemWire) { a.Close() }, 0, os.ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := NewMemPair(4, 64)
			defer a.Close()
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				buf := make([]byte, 64)
				n, err := b.Read(buf, true)
				done <- result{n, err}
			}()
			select {
			case r := <-done:
				t.Fatalf("Read returned early: %v", r)
			case <-time.After(50 * time.Millisecond):
			}
			tt.wake(a, b)
			select {
			case r := <-done:
				if r.n != tt.wantN || !errors.Is(r.err, tt.wantErr) && r.err != tt.wantErr {
					t.Errorf("Read = %d, %v; want %d, %v", r.n, r.err, tt.wantN, tt.wantErr)
				}
			case <-time.After(time.Second):
				t.Fatal("blocked Read not woken within a second")
			}
		})
	}
}

func TestMemWireClose(t *testing.T) {
	a, b := NewMemPair(4, 64)
	a.Write([]byte("queued"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("peer Close: %v", err)
	}
	buf := make([]byte, 64)
	for _, w := range []*MemWire{a, b} {
		if _, err := w.Read(buf, false); !errors.Is(err, os.ErrClosed) {
			t.Errorf("Read after Close: %v", err)
		}
		if _, err := w.Read(buf, true); !errors.Is(err, os.ErrClosed) {
			t.Errorf("blocking Read after Close: %v", err)
		}
		if err := w.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
			t.Errorf("Write after Close: %v", err)
		}
	}
}

// TestMemWireConcurrentWriters runs writers against one reader (for -race)
// and checks that nothing is lost or reordered per writer, then that
// frames written concurrently into a queue that overflows are each either
// delivered or counted as dropped.
func TestMemWireConcurrentWriters(t *testing.T) {
	const writers, perWriter = 4, 2000
	tests := []struct {
		name      string
		depth     int
		readAfter bool // read only once the writers are done
	}{
		{"no drops", writers * perWriter, false},
		{"overflow", 64, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := NewMemPair(tt.depth, 64)
			defer a.Close()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f := make([]byte, 8)
					for i := range perWriter {
						binary.LittleEndian.PutUint32(f, uint32(w))
						binary.LittleEndian.PutUint32(f[4:], uint32(i))
						if err := a.Write(f); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			if tt.readAfter {
				wg.Wait()
			}
			next := make([]int64, writers) // next frame number at least expected
			buf := make([]byte, 64)
			got := 0
			deadline := time.Now().Add(20 * time.Second)
			for uint64(got)+a.Dropped() < writers*perWriter {
				if time.Now().After(deadline) {
					t.Fatalf("received %d and dropped %d of %d frames", got, a.Dropped(), writers*perWriter)
				}
				n, err := b.Read(buf, false)
				if err == ErrNoFrame {
					time.Sleep(10 * time.Microsecond)
					continue
				}
				if err != nil || n != 8 {
					t.Fatalf("Read = %d, %v", n, err)
				}
				w, i := binary.LittleEndian.Uint32(buf), int64(binary.LittleEndian.Uint32(buf[4:]))
				if w >= writers || i < next[w] {
					t.Fatalf("writer %d: frame %d after %d", w, i, next[w]-1)
				}
				if !tt.readAfter && i != next[w] {
					t.Fatalf("writer %d: frame %d lost", w, next[w])
				}
				next[w] = i + 1
				got++
			}
			wg.Wait()
			if _, err := b.Read(buf, false); err != ErrNoFrame {
				t.Errorf("frames beyond those written: %v", err)
			}
			if tt.readAfter {
				if got != tt.depth || a.Dropped() != writers*perWriter-uint64(tt.depth) {
					t.Errorf("received %d, dropped %d; want %d and %d", got, a.Dropped(), tt.depth, writers*perWriter-tt.depth)
				}
			} else if a.Dropped() != 0 {
				t.Errorf("dropped %d", a.Dropped())
			}
		})
	}
}

func TestMemWireAllocs(t *testing.T) {
	a, b := NewMemPair(4, 1600)
	defer a.Close()
	frame := make([]byte, 1514)
	buf := make([]byte, 1600)
	var err error
	allocs := testing.AllocsPerRun(1000, func() {
		if e := a.Write(frame); e != nil {
			err = e
		}
		if _, e := b.Read(buf, true); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per Write+Read, want 0", allocs)
	}
}

func BenchmarkMemWire(b *testing.B) {
	x, y := NewMemPair(64, 2048)
	defer x.Close()
	frame := make([]byte, 1514)
	buf := make([]byte, 2048)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		x.Write(frame)
		y.Read(buf, false)
	}
}

// TestMemPairDefaults: a depth or maxFrame of 0 or less takes the default,
// 4096 frames of a 64 KB GSO super-frame behind an Ethernet header, a VLAN
// tag and the virtio-net header, instead of panicking; MaxFrame says the
// limit, and a frame of it goes through whole.
func TestMemPairDefaults(t *testing.T) {
	const wantFrame = VirtioNetHdrLen + 65535 + 14 + 4
	for _, tc := range []struct {
		name               string
		depth, maxFrame    int
		wantDepth, wantMax int
	}{
		{"zero", 0, 0, 4096, wantFrame},
		{"negative", -1, -5, 4096, wantFrame},
		{"depth only", 0, 100, 4096, 100},
		{"maxFrame only", 3, 0, 3, wantFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := NewMemPair(tc.depth, tc.maxFrame)
			defer a.Close()
			if got := a.MaxFrame(); got != tc.wantMax || b.MaxFrame() != tc.wantMax {
				t.Fatalf("MaxFrame: got %d and %d, want %d", got, b.MaxFrame(), tc.wantMax)
			}
			frame := bytes.Repeat([]byte{0x5a}, tc.wantMax)
			for range tc.wantDepth {
				a.Write(frame)
			}
			if d := a.Dropped(); d != 0 {
				t.Fatalf("%d frames of %d bytes: %d dropped, want none", tc.wantDepth, tc.wantMax, d)
			}
			a.Write(frame)
			if d := a.Dropped(); d != 1 {
				t.Errorf("a frame past the depth: got %d dropped, want 1", d)
			}
			buf := make([]byte, tc.wantMax+1)
			if n, err := b.Read(buf, false); err != nil || !bytes.Equal(buf[:n], frame) {
				t.Errorf("Read: got %d bytes, %v, want the %d-byte frame", n, err, len(frame))
			}
		})
	}
}

// TestMemWireCounters: each end reports the frames the wire dropped on
// their way to it (rx_wire_dropped, the peer's Dropped) and from it
// (tx_wire_dropped, its own), as a stack on it lists them.
func TestMemWireCounters(t *testing.T) {
	a, b := NewMemPair(1, 64)
	defer a.Close()
	a.Write(make([]byte, 65)) // too long
	a.Write(make([]byte, 8))
	a.Write(make([]byte, 8)) // the queue is full
	b.Write(make([]byte, 65))
	counters := func(w *MemWire) map[string]uint64 {
		m := map[string]uint64{}
		w.EachCounter(func(name string, v uint64) { m[name] = v })
		return m
	}
	for _, tc := range []struct {
		end  string
		w    *MemWire
		want map[string]uint64
	}{
		{"a", a, map[string]uint64{"rx_wire_dropped": 1, "tx_wire_dropped": 2}},
		{"b", b, map[string]uint64{"rx_wire_dropped": 2, "tx_wire_dropped": 1}},
	} {
		if got := counters(tc.w); !maps.Equal(got, tc.want) {
			t.Errorf("end %s: got %v, want %v", tc.end, got, tc.want)
		}
	}
	if a.Dropped() != 2 || b.Dropped() != 1 {
		t.Errorf("Dropped: got %d and %d, want 2 and 1 (the writer's)", a.Dropped(), b.Dropped())
	}
}
