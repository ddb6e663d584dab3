package xsk

import "time"

// newTAIClock returns the socket's default clock: TAI nanoseconds, as the
// kernel's ktime_get_tai_fast_ns (the monotonic clock plus the TAI offset)
// which xsk_destruct_skb writes as a copy-mode TX timestamp. CLOCK_TAI is
// read once, between two monotonic readings whose midpoint it is taken
// for; each call then adds the monotonic time since, which costs one vDSO
// clock read (time.Since) instead of a system call.
func newTAIClock() func() uint64 {
	m0 := time.Now()
	base := taiNow()
	m1 := time.Now()
	start := m0.Add(m1.Sub(m0) / 2)
	return func() uint64 { return base + uint64(time.Since(start)) }
}
