package stack

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/ustack/ustack/cpumap"
)

// TestCounterTotals: counterTotals sums counters and gauges and takes the
// largest value of a max, keeping the names' first order.
func TestCounterTotals(t *testing.T) {
	var tot counterTotals
	for _, q := range []map[string]uint64{
		{"rx_packets": 3, "rx_pp_pages_in_use": 5, "rx_pp_alloc_order": 2, "rx_gro_held_max": 3, "rx_pp_lent_current": 1},
		{"rx_packets": 4, "rx_pp_pages_in_use": 6, "rx_pp_alloc_order": 1, "rx_gro_held_max": 9, "rx_pp_lent_current": 2},
	} {
		for _, n := range []string{"rx_packets", "rx_pp_pages_in_use", "rx_pp_alloc_order", "rx_gro_held_max", "rx_pp_lent_current"} {
			tot.add(n, q[n])
		}
	}
	type nv struct {
		name string
		v    uint64
	}
	var got []nv
	tot.each("x_", func(n string, v uint64) { got = append(got, nv{n, v}) })
	want := []nv{{"x_rx_packets", 7}, {"x_rx_pp_pages_in_use", 11}, {"x_rx_pp_alloc_order", 2}, {"x_rx_gro_held_max", 9}, {"x_rx_pp_lent_current", 3}}
	if len(got) != len(want) {
		t.Fatalf("totals: got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("total %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

func TestKindOf(t *testing.T) {
	for name, want := range map[string]CounterKind{
		"rx_packets":               KindCounter,
		"rx1_packets":              KindCounter,
		"q1_poll_cpu_ns":           KindCounter,
		"rx_pp_order_fallbacks":    KindCounter,
		"rx_pp_pages_in_use":       KindGauge,
		"rx1_pp_bytes_held":        KindGauge,
		"rx_pp_lent_current":       KindGauge,
		"server_buf_bytes_current": KindGauge,
		"tcp_mem_pressure":         KindGauge,
		"rx_pp_alloc_order":        KindMax,
		"rx1_pp_alloc_order":       KindMax,
		"rx_gro_held_max":          KindMax,
		"rx0_gro_held_max":         KindMax,
		"cpumap_rx_gro_held_max":   KindMax,
	} {
		if got := KindOf(name); got != want {
			t.Errorf("KindOf(%q): got %v, want %v", name, got, want)
		}
	}
}

// TestQueuesCounterKinds: with two queues at page order 2, the totals take
// each counter's kind: rx_pp_alloc_order is 2 (the queues' order, not
// their sum), rx_gro_held_max the larger queue's, while rx_packets and
// rx_gro_skbs are the sums; a cpumap's workers' cpumap_rx_gro_held_max is
// the largest worker's too.
func TestQueuesCounterKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"queues", Config{}},
		{"queues+cpumap", Config{CPUMap: []int{0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.CPUMap != nil {
				prog, err := cpumap.ParseProgram("hash", len(cfg.CPUMap))
				if err != nil {
					t.Fatal(err)
				}
				cfg.XDP = prog
			}
			cfg.Pool.Order = 2
			rx, peer := newQueuePair(t, cfg)
			var wg sync.WaitGroup
			for i := range 16 {
				wg.Go(func() {
					bulkTo(t, rx, peer, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(5001+i)), 256<<10)
				})
			}
			wg.Wait()
			peer.Close()
			rx.Close() // the counters stop moving
			c := counterMap(rx)
			if c["rx0_pp_alloc_order"] != 2 || c["rx1_pp_alloc_order"] != 2 || c["rx_pp_alloc_order"] != 2 {
				t.Errorf("rx_pp_alloc_order %d (queues %d, %d): want 2", c["rx_pp_alloc_order"], c["rx0_pp_alloc_order"], c["rx1_pp_alloc_order"])
			}
			sums := []string{"rx_packets", "rx_bytes", "rx_pp_alloc_slow"}
			if tc.cfg.CPUMap == nil {
				sums = append(sums, "rx_gro_skbs")
			}
			for _, n := range sums {
				q0, q1 := c[queueCounterName(n, 0)], c[queueCounterName(n, 1)]
				if q0 == 0 || q1 == 0 || c[n] != q0+q1 {
					t.Errorf("%s %d (queues %d, %d): want both moved and their sum", n, c[n], q0, q1)
				}
			}
			if tc.cfg.CPUMap != nil {
				// The workers' engines, one per CPU: the largest held.
				var most uint64
				for _, g := range rx.ep.cpuGRO {
					most = max(most, g.Stats().HeldMax.Load())
				}
				if got := c["cpumap_rx_gro_held_max"]; most == 0 || got != most {
					t.Errorf("cpumap_rx_gro_held_max %d: want the largest worker's, %d", got, most)
				}
				return
			}
			q0, q1 := c["rx0_gro_held_max"], c["rx1_gro_held_max"]
			if q0 == 0 || q1 == 0 || c["rx_gro_held_max"] != max(q0, q1) {
				t.Errorf("rx_gro_held_max %d (queues %d, %d): want both moved and the larger", c["rx_gro_held_max"], q0, q1)
			}
		})
	}
}
