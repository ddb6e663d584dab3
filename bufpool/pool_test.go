package bufpool

import (
	"errors"
	"sync"
	"testing"
)

func TestRefcountRecycle(t *testing.T) {
	p, err := New(Config{Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := p.Get()
	if err != nil {
		t.Fatal(err)
	}
	if got := p.InUse(); got != 1 {
		t.Fatalf("in use: got %d, want 1", got)
	}
	pg.IncRef() // a frag
	pg.DecRef() // the owner lets go
	if got := p.InUse(); got != 1 {
		t.Fatalf("in use with a frag still held: got %d, want 1", got)
	}
	if got := p.Stats().Recycled; got != 0 {
		t.Fatalf("recycled while referenced: got %d, want 0", got)
	}
	pg.DecRef() // the frag
	if got := p.InUse(); got != 0 {
		t.Fatalf("in use after the last reference: got %d, want 0", got)
	}
	again, err := p.Get()
	if err != nil {
		t.Fatal(err)
	}
	if again != pg {
		t.Errorf("Get after recycling: got a new page, want the recycled one")
	}
	st := p.Stats()
	if st.AllocSlow != 1 || st.AllocFast != 1 || st.Recycled != 1 {
		t.Errorf("stats: got slow %d fast %d recycled %d, want 1 1 1", st.AllocSlow, st.AllocFast, st.Recycled)
	}
	again.DecRef()
}

func TestPoisonCatchesStaleWrite(t *testing.T) {
	p, _ := New(Config{Poison: true})
	pg, _ := p.Get()
	stale := pg.Bytes()
	pg.DecRef()
	stale[100] = 1 // a write through a reference that was given up
	defer func() {
		if recover() == nil {
			t.Error("Get of a page written while free: got no panic, want one")
		}
	}()
	p.Get()
}

func TestExhaustion(t *testing.T) {
	p, _ := New(Config{MaxPages: 2})
	a, _ := p.Get()
	b, _ := p.Get()
	if _, err := p.Get(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("third Get with MaxPages 2: got %v, want ErrExhausted", err)
	}
	if got := p.Stats().AllocEmpty; got != 1 {
		t.Errorf("rx_pp_alloc_empty: got %d, want 1", got)
	}
	a.DecRef()
	if _, err := p.Get(); err != nil {
		t.Errorf("Get after a page came back: got %v, want nil", err)
	}
	b.DecRef()
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		size int
		ok   bool
	}{
		{Config{}, 4096, true},
		{Config{PageSize: PageSize64K}, 65536, true},
		{Config{Order: 4}, 65536, true},
		{Config{Order: 5}, 0, false},
		{Config{PageSize: 8192}, 0, false},
		{Config{MaxPages: -1}, 0, false},
	} {
		p, err := New(tc.cfg)
		if (err == nil) != tc.ok {
			t.Errorf("New(%+v): got error %v, want ok=%v", tc.cfg, err, tc.ok)
			continue
		}
		if err == nil && p.PageBytes() != tc.size {
			t.Errorf("New(%+v).PageBytes(): got %d, want %d", tc.cfg, p.PageBytes(), tc.size)
		}
	}
}

func TestConcurrentRelease(t *testing.T) {
	p, _ := New(Config{Poison: true})
	var wg sync.WaitGroup
	pages := make(chan *Page, 64)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pg := range pages {
				pg.DecRef()
			}
		}()
	}
	for range 10000 {
		pg, err := p.Get()
		if err != nil {
			t.Fatal(err)
		}
		pg.IncRef()
		pages <- pg
		pg.DecRef()
	}
	close(pages)
	wg.Wait()
	if got := p.InUse(); got != 0 {
		t.Errorf("in use after all releases: got %d, want 0", got)
	}
}

func BenchmarkGetRelease(b *testing.B) {
	p, _ := New(Config{})
	b.ReportAllocs()
	for b.Loop() {
		pg, _ := p.Get()
		pg.DecRef()
	}
}
