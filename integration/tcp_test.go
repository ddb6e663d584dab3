//go:build linux

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// TestTCPBulk sends a bulk stream from the kernel to a hashing receiver on
// ustack over a covering set of receive-path configurations.
//
// The eight rows are a fractional factorial of the five dimensions (family,
// MTU, LRO, HDS, RQ type): every value of every dimension appears in four
// rows and every LRO x HDS pair in two. The first row, the base case
// (IPv4, MTU 1500, LRO on, hds auto, striding RQ: ustack run's defaults),
// moves 256 MiB; the others move 64 MiB each, to keep the suite within a
// few minutes under the race detector.
func TestTCPBulk(t *testing.T) {
	needRoot(t)
	const (
		base  = 256 << 20
		other = 64 << 20
	)
	tests := []struct {
		v6  bool
		mtu int
		lro bool
		hds int
		rq  driver.RQMode
		n   int64
	}{
		{false, 1500, true, driver.HDSAuto, driver.RQStriding, base},
		{false, 1500, false, 256, driver.RQCyclic, other},
		{false, 9000, true, 256, driver.RQCyclic, other},
		{false, 9000, false, driver.HDSAuto, driver.RQStriding, other},
		{true, 1500, true, 256, driver.RQStriding, other},
		{true, 1500, false, driver.HDSAuto, driver.RQCyclic, other},
		{true, 9000, true, driver.HDSAuto, driver.RQCyclic, other},
		{true, 9000, false, 256, driver.RQStriding, other},
	}
	for i, tt := range tests {
		lro := "off"
		if tt.lro {
			lro = "on"
		}
		name := fmt.Sprintf("%s/mtu-%d/lro-%s/hds-%s/%s", family(tt.v6), tt.mtu, lro, driver.FormatHDS(tt.hds), tt.rq)
		t.Run(name, func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-bulk%d", i), tt.mtu, driver.Config{LRO: tt.lro, HDS: tt.hds, RQ: tt.rq})
			elapsed := kernelToStack(t, r, tt.v6, 9, tt.n, uint64(i+1))
			logRate(t, "kernel -> ustack", tt.n, elapsed)

			c := counters(r.st)
			t.Logf("rx_packets %d rx_lro_packets %d rx_gso_frames %d rx_gso_segs %d rx_hds_payload_bytes %d tcp_retransmits %d",
				c["rx_packets"], c["rx_lro_packets"], c["rx_gso_frames"], c["rx_gso_segs"], c["rx_hds_payload_bytes"], c["tcp_retransmits"])
			if tt.lro && counter(t, r.st, "rx_lro_packets") == 0 {
				t.Errorf("rx_lro_packets with LRO on: got 0, want > 0")
			}
			if !tt.lro && counter(t, r.st, "rx_gso_segs") == 0 {
				t.Errorf("rx_gso_segs with LRO off: got 0, want > 0")
			}
			if tt.hds == driver.HDSAuto {
				if got := counter(t, r.st, "rx_hds_payload_bytes"); got != 0 {
					t.Errorf("rx_hds_payload_bytes with hds auto: got %d, want 0", got)
				}
			} else if counter(t, r.st, "rx_hds_payload_bytes") == 0 {
				t.Errorf("rx_hds_payload_bytes with hds %d: got 0, want > 0", tt.hds)
			}
			checkFlowDrops(t, r.st)
			r.close(t) // checks that every page is back in the pool
		})
	}
}

// TestTCPEcho has the kernel send a stream to ustack's echo server while
// reading the echo back concurrently: both ustack's receive path and its
// transmit path (TSO super-frames written to the TAP) carry it.
func TestTCPEcho(t *testing.T) {
	needRoot(t)
	const n = 32 << 20
	i := 0
	for _, v6 := range []bool{false, true} {
		for _, lro := range []bool{true, false} {
			i++
			name := fmt.Sprintf("%s/lro-%v", family(v6), map[bool]string{true: "on", false: "off"}[lro])
			seed := uint64(100 + i)
			t.Run(name, func(t *testing.T) {
				r := newRig(t, fmt.Sprintf("usit-echo%d", seed), 1500, driver.Config{LRO: lro})
				ap := r.stackAP(v6, 7)
				l, err := r.st.ListenTCP(ap)
				if err != nil {
					t.Fatal(err)
				}
				served := make(chan error, 1)
				go func() { served <- stack.ServeEcho(l) }()
				defer func() {
					l.Close()
					if err := <-served; err != nil {
						t.Errorf("ServeEcho: %v", err)
					}
				}()

				deadline := time.Now().Add(transferTimeout(2 * n))
				ctx, cancel := context.WithDeadline(context.Background(), deadline)
				defer cancel()
				c, err := r.bed.NS.DialTCP(ctx, ap, cc)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(deadline)
				res := make(chan hashResult, 1)
				go func() { res <- recvHashed(io.LimitReader(c, n)) }()
				start := time.Now()
				want, err := sendHashed(c, n, writeSize, seed)
				if err != nil {
					// Unblock the reader before failing.
					c.Close()
					<-res
					t.Fatalf("kernel sender: %v", err)
				}
				got := waitHash(t, res, deadline)
				elapsed := time.Since(start)
				checkHash(t, got, n, want)
				logRate(t, "kernel -> ustack echo -> kernel", n, elapsed)
				t.Logf("tx_packets %d tx_gso_packets %d tx_errors %d tcp_retransmits %d",
					counter(t, r.st, "tx_packets"), counter(t, r.st, "tx_gso_packets"), counter(t, r.st, "tx_errors"), counter(t, r.st, "tcp_retransmits"))
				checkFlowDrops(t, r.st)
			})
		}
	}
}

// TestTCPStackToKernel has ustack dial a kernel listener in the namespace
// and send a stream to it, which exercises ustack's transmit path with TSO
// (GSO super-frames written to the TAP, segmented by the kernel).
func TestTCPStackToKernel(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	for i, v6 := range []bool{false, true} {
		seed := uint64(200 + i)
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-tx%d", i), 1500, driver.Config{LRO: true})
			l, err := r.bed.NS.ListenTCP(r.kernelAP(v6, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			deadline := time.Now().Add(transferTimeout(n))
			l.SetDeadline(deadline)
			res := acceptOne(l, deadline)

			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			kap := l.Addr().(*net.TCPAddr).AddrPort()
			kap = netip.AddrPortFrom(kap.Addr().Unmap(), kap.Port())
			c, err := r.st.DialTCP(ctx, kap)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(deadline)
			start := time.Now()
			want, err := sendHashed(c, n, writeSize, seed)
			if err != nil {
				t.Fatalf("ustack sender: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("ustack sender close: %v", err)
			}
			got := waitHash(t, res, deadline)
			elapsed := time.Since(start)
			checkHash(t, got, n, want)
			logRate(t, "ustack -> kernel", n, elapsed)
			c2 := counters(r.st)
			t.Logf("tx_packets %d tx_bytes %d tx_gso_packets %d tx_errors %d tcp_retransmits %d",
				c2["tx_packets"], c2["tx_bytes"], c2["tx_gso_packets"], c2["tx_errors"], c2["tcp_retransmits"])
			if c2["tx_gso_packets"] == 0 {
				t.Errorf("tx_gso_packets: got 0, want > 0 (TSO through the TAP)")
			}
			checkFlowDrops(t, r.st)
		})
	}
}
