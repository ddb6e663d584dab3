package bench

import (
	"testing"
	"time"
)

func TestLatencyHist(t *testing.T) {
	var h LatencyHist
	if h.Quantile(0.5) != 0 {
		t.Fatal("empty histogram: want 0")
	}
	// 1..100 us, one each: the median is 50 us, p99 99 us (upper bucket
	// edges: a latency in [k, k+1) us reports k+1).
	for us := 1; us <= 100; us++ {
		h.Add(time.Duration(us)*time.Microsecond - time.Nanosecond)
	}
	if h.Count() != 100 {
		t.Fatalf("count %d", h.Count())
	}
	for q, want := range map[float64]float64{0.5: 50, 0.99: 99, 1: 100, 0.01: 1} {
		if got := h.Quantile(q); got != want {
			t.Errorf("q%.2f = %v, want %v", q, got, want)
		}
	}
	h.Add(time.Hour)
	h.Add(-time.Second)
	if got := h.Quantile(1); got != float64(latencyMax/time.Microsecond) {
		t.Errorf("overflow: max %v, want the last bucket", got)
	}
}
