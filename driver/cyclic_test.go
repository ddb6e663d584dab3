package driver

import (
	"bytes"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/testutil"
)

// cyclicModes are seed 001's four cells: recycling off (mlx4 before the
// patch) and on (the patch), at 4 KB and 64 KB pages.
var cyclicModes = []struct {
	name string
	pc   bufpool.Config
	// pages is how many pages the RQ of 8 slots cycles through: one per
	// slot before the patch, twice the pages 8 packed frames take with it.
	pages uint64
	per   int // frames per page
}{
	{"off/4k", bufpool.Config{NoRecycle: true}, 8, 1},
	{"on/4k", bufpool.Config{}, 8, 2},
	{"off/64k", bufpool.Config{PageSize: bufpool.PageSize64K, NoRecycle: true}, 8, 1},
	{"on/64k", bufpool.Config{PageSize: bufpool.PageSize64K}, 2, 42},
}

// TestCyclicRQBytes sends super-frames through the cyclic RQ of 8 slots
// in every mode, with poisoning on, and checks every payload byte, that
// the pages are written again once free (none allocated past the RQ's
// own), and the frag strides.
func TestCyclicRQBytes(t *testing.T) {
	const payload = 65000
	for _, tc := range cyclicModes {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{keep: true}
			pc := tc.pc
			pc.Poison = true
			d, w := startTestDriver(t, Config{RQ: RQCyclic, RQSize: 8}, pc, c, 64)
			h, frame, fi := tcpSuper(t, L3IPv4, payload)
			per := (payload + mss4 - 1) / mss4
			const supers = 4
			for i := range supers {
				if err := w.Write(wireFrame(h, frame)); err != nil {
					t.Fatal(err)
				}
				c.waitFor(t, int64((i+1)*per))
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			for s := range supers {
				var got []byte
				for _, f := range c.frames[s*per : (s+1)*per] {
					var pfi FrameInfo
					if drop := ParseFrame(f, &pfi); drop != DropNone {
						t.Fatalf("packet does not parse: %v", drop)
					}
					got = append(got, f[pfi.HeaderLen():pfi.L2Len+pfi.IPLen]...)
				}
				if !bytes.Equal(got, frame[fi.HeaderLen():]) {
					t.Errorf("super-frame %d: payload differs from the payload sent", s)
				}
			}
			st := d.Pool().Stats()
			if st.AllocPages != tc.pages {
				t.Errorf("rx_alloc_pages: got %d, want %d", st.AllocPages, tc.pages)
			}
			// Every page after the first round of the RQ's is a reused
			// one: the collector releases each packet at once.
			taken := uint64((supers*per + tc.per - 1) / tc.per)
			if want := taken - tc.pages; st.CacheReuse != want || st.CacheBusy != 0 {
				t.Errorf("rx_cache_reuse, rx_cache_busy: got %d, %d, want %d, 0", st.CacheReuse, st.CacheBusy, want)
			}
		})
	}
}

// TestCyclicRQNoAllocs pins the cyclic RQ's receive path at zero heap
// allocations per packet in steady state, in every mode: before the patch
// too, a slot's page is written again once the stack released it.
func TestCyclicRQNoAllocs(t *testing.T) {
	if testing.CoverMode() != "" || testutil.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	for _, tc := range cyclicModes {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{}
			d, w := startTestDriver(t, Config{RQ: RQCyclic}, tc.pc, c, 64)
			h, frame, _ := tcpSuper(t, L3IPv4, 64000)
			b := wireFrame(h, frame)
			per := int64(64000+mss4-1) / mss4
			var sent int64
			send := func() {
				if err := w.Write(b); err != nil {
					t.Fatal(err)
				}
				sent += per
				c.waitFor(t, sent)
			}
			for range 200 {
				send() // warm: the RQ's 1024 slots go round several times
			}
			if allocs := testing.AllocsPerRun(200, send); allocs != 0 {
				t.Errorf("allocations per super-frame (%d packets): got %v, want 0", per, allocs)
			}
			if st := d.Pool().Stats(); st.CacheReuse == 0 {
				t.Errorf("rx_cache_reuse: got 0, want pages written again")
			}
		})
	}
}
