package xsk

import (
	"testing"

	"golang.org/x/sys/unix"
)

// clockTAI reads CLOCK_TAI with a system call, independently of the
// socket's clock.
func clockTAI(t *testing.T) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &ts); err != nil {
		t.Skipf("CLOCK_TAI: %v", err)
	}
	return uint64(ts.Nano())
}

// TestTimestampTAI sends with the default clock: the timestamp is on the
// TAI clock, as xsk_destruct_skb's ktime_get_tai_fast_ns, between
// CLOCK_TAI read before the submission and after the reap. The slack
// covers the width of the socket's single CLOCK_TAI reading at New (a
// system call, microseconds at most) and a clock step by NTP, none of which
// comes near a monotonic clock's distance from TAI (decades).
func TestTimestampTAI(t *testing.T) {
	const slack = 50_000_000 // 50 ms
	for _, zc := range []bool{false, true} {
		s := newTestSocket(t, Config{NumFrames: 4, FrameSize: 2048, TxMetadata: true, MultiBuffer: true, ZeroCopy: zc}, new(discardWire))
		frame := buildFrame(udp4, 64, 0, true).b
		single := place(s, 0, frame)
		single.Options = OptTxMetadata
		first := place(s, 1, frame[:30])
		first.Options = OptTxMetadata | OptPktContd
		last := place(s, 2, frame[30:])
		for _, d := range []Desc{single, first} {
			s.UMEM().Metadata(d.Addr).SetFlags(TxmdTimestamp)
		}
		before := clockTAI(t)
		submit(t, s, single, first, last)
		if n, err := s.Kick(); n != 3 || err != nil {
			t.Fatalf("zc %v: Kick consumed %d, %v; want 3", zc, n, err)
		}
		if got := reap(s); len(got) != 3 {
			t.Fatalf("zc %v: %d completions, want 3", zc, len(got))
		}
		after := clockTAI(t)
		for _, d := range []Desc{single, first} {
			if ts := s.UMEM().Metadata(d.Addr).TxTimestamp(); ts+slack < before || ts > after+slack {
				t.Errorf("zc %v: timestamp %d outside CLOCK_TAI's [%d, %d] (slack %d ns)", zc, ts, before, after, slack)
			}
		}
		if now := s.Now(); now+slack < before || now > clockTAI(t)+slack {
			t.Errorf("zc %v: Now() %d is not CLOCK_TAI (%d)", zc, now, before)
		}
	}
}
