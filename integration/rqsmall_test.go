//go:build linux

package integration

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// rqStallsLine matches the rx_rq_stalls line of a counters block.
var rqStallsLine = regexp.MustCompile(`(?m)^\s+rx_rq_stalls: (\d+)$`)

// TestRunSmallRQ runs `ustack run -lro off -rq cyclic -rq-size 2`, the
// smallest RQ a new user may try: every frame takes a page of its own and
// the NIC model may fill two of them ahead of the poll loop. A bulk TCP
// transfer from the kernel through the echo server must come back
// byte-exact (SHA-256 of what was sent against what came back), over IPv4
// and IPv6, and the binary must exit on SIGTERM. Issue 13: the RQ's
// accounting held the page tails of retired buffers that no completion
// carried, and the NIC model waited for room with nothing outstanding; the
// stack never answered the first connection and Close hung.
func TestRunSmallRQ(t *testing.T) {
	needRoot(t)
	r, cmd, stdout, stderr, exited := startRunBinary(t, "usit-rqs", "-lro", "off", "-rq", "cyclic", "-rq-size", "2", "-echo", ":7", "-stats", "1s")
	bed := r.bed
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	for i, v6 := range []bool{false, true} {
		t.Run("tcp-echo/"+family(v6), func(t *testing.T) {
			const n = 4 << 20
			deadline := time.Now().Add(transferTimeout(2 * n))
			dctx, dcancel := context.WithDeadline(ctx, deadline)
			defer dcancel()
			c, err := bed.NS.DialTCP(dctx, r.stackAP(v6, 7), cc)
			if err != nil {
				t.Fatalf("dial the echo server of ustack run: %v; stderr:\n%s", err, stderr.String())
			}
			defer c.Close()
			c.SetDeadline(deadline)
			pc := progressConn{c, deadline}
			res := make(chan hashResult, 1)
			go func() { res <- recvHashed(io.LimitReader(pc, n)) }()
			start := time.Now()
			want, err := sendHashed(pc, n, writeSize, uint64(1300+i))
			if err != nil {
				c.Close()
				<-res
				t.Fatalf("kernel sender: %v; stdout:\n%s", err, stdout.String())
			}
			checkHash(t, waitHash(t, r, res, deadline), n, want)
			logRate(t, "kernel -> ustack run (rq cyclic, 2 WQEs) echo -> kernel", n, time.Since(start))
		})
	}
	t.Run("sigterm", func(t *testing.T) {
		if err := terminate(t, cmd, exited, stderr, 30*time.Second); err != nil {
			t.Errorf("ustack run after SIGTERM: got %v, want exit status 0; stderr:\n%s", err, stderr.String())
		}
		m := rqStallsLine.FindAllStringSubmatch(stdout.String(), -1)
		if len(m) == 0 {
			t.Fatalf("stdout lacks an rx_rq_stalls line:\n%s", stdout.String())
		}
		// The RQ of two frames really bounded the ring.
		if n, _ := strconv.ParseUint(m[len(m)-1][1], 10, 64); n == 0 {
			t.Errorf("final rx_rq_stalls: got 0, want > 0 (an RQ of 2 frames must stall a bulk transfer)")
		}
	})
}
