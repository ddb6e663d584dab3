package bench

import "time"

// latencyMax is the largest latency a LatencyHist resolves; longer ones
// count in its last bucket.
const latencyMax = 100 * time.Millisecond

// LatencyHist counts latencies in 1 us buckets up to latencyMax, in fixed
// memory (800 KB) however long the run: the RR client's record of every
// transaction.
type LatencyHist struct {
	n       int64
	buckets [latencyMax / time.Microsecond]uint64
}

// Add counts one latency.
func (h *LatencyHist) Add(d time.Duration) {
	i := int(d / time.Microsecond)
	if i < 0 {
		i = 0
	}
	if i >= len(h.buckets) {
		i = len(h.buckets) - 1
	}
	h.buckets[i]++
	h.n++
}

// Merge adds o's latencies to h's.
func (h *LatencyHist) Merge(o *LatencyHist) {
	for i, c := range o.buckets {
		h.buckets[i] += c
	}
	h.n += o.n
}

// Count is how many latencies were added.
func (h *LatencyHist) Count() int64 { return h.n }

// Quantile returns the q-quantile (0 < q <= 1) in microseconds: the upper
// edge of the bucket holding the ceil(q*n)-th smallest latency; 0 if
// nothing was added.
func (h *LatencyHist) Quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.buckets {
		seen += c
		if seen >= rank {
			return float64(i + 1)
		}
	}
	return float64(len(h.buckets))
}
