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

// TestLatencyHistMerge: a merged histogram is the histogram of both sets
// of latencies (the RR client's flows each keep one).
func TestLatencyHistMerge(t *testing.T) {
	var a, b, all LatencyHist
	for i := 1; i <= 90; i++ {
		a.Add(time.Duration(i) * time.Microsecond)
		all.Add(time.Duration(i) * time.Microsecond)
	}
	for i := 0; i < 10; i++ {
		b.Add(500 * time.Microsecond)
		all.Add(500 * time.Microsecond)
	}
	a.Merge(&b)
	if a.Count() != 100 || all.Count() != 100 {
		t.Fatalf("counts %d and %d, want 100", a.Count(), all.Count())
	}
	for _, q := range []float64{0.5, 0.9, 0.91, 0.99} {
		if got, want := a.Quantile(q), all.Quantile(q); got != want {
			t.Errorf("q %v: merged %v, want %v", q, got, want)
		}
	}
	if got := a.Quantile(0.99); got != 501 {
		t.Errorf("p99 %v, want 501 (b's latencies)", got)
	}
}
