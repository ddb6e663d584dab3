//go:build rrtrace

package rrtrace

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

var (
	last [NumStages]atomic.Int64 // each stage's last Mark, Unix ns
	sum  [NumStages]atomic.Int64 // time from the stage before, summed
	cnt  [NumStages]atomic.Int64
)

// gap bounds a stage's time: a longer one is the pause between runs, not
// an exchange.
const gap = 10 * time.Millisecond

// Mark records that an exchange reached stage s.
func Mark(s Stage) {
	now := time.Now().UnixNano()
	last[s].Store(now)
	prev := TxEnd
	if s != FrameRead {
		prev = s - 1
	}
	if p := last[prev].Load(); p > 0 && now-p < int64(gap) {
		sum[s].Add(now - p)
		cnt[s].Add(1)
	}
}

func init() {
	go func() {
		for range time.Tick(2 * time.Second) {
			var b strings.Builder
			var total float64
			for s := range NumStages {
				n, v := cnt[s].Swap(0), sum[s].Swap(0)
				if n == 0 {
					continue
				}
				us := float64(v) / float64(n) / 1e3
				total += us
				fmt.Fprintf(&b, "  %s %.1f us (%d)", s, us, n)
			}
			if b.Len() > 0 {
				fmt.Fprintf(os.Stderr, "rrtrace: %.1f us:%s\n", total, b.String())
			}
		}
	}()
}
