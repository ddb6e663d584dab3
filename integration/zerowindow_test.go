//go:build linux

package integration

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// TestTCPCopyEcho runs the simplest Go echo handler, io.Copy(c, c), on
// ustack against a kernel client that writes 64 MiB as fast as it can while
// it reads the echo back slowly. Both directions fill: ustack's receive
// window closes while its own send waits for the kernel's ACKs, which come
// piggybacked on data segments that meet that closed window. gVisor drops
// such a segment before its sender sees the ACK (Linux's tcp_sequence takes
// it); the link endpoint hands gVisor the ACK first (zerowindow.go). Without
// that the transfer stalls in RTO backoff. The echo must come back
// byte-exact; a stall fails it after stallTimeout without progress. The
// last case is the check: serve.Echo in the configuration
// where it stalled once in eleven runs, with a client that reads at once.
func TestTCPCopyEcho(t *testing.T) {
	needRoot(t)
	const n = 64 << 20
	hash, err := cpumap.ParseProgram("hash", 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name  string
		v6    bool
		cfg   stack.Config
		serve bool // serve.Echo and a fast reader instead
	}{
		{"ipv4/lro-on", false, stack.Config{Driver: driver.Config{LRO: true}}, false},
		{"ipv6/lro-off", true, stack.Config{}, false},
		// The configuration: -lro off -xdp hash -cpumap 0,1 -cpumap-gro off.
		{"ipv4/cpumap", false, stack.Config{XDP: hash, CPUMap: []int{0, 1}, NoCPUMapGRO: true}, false},
		{"ipv4/cpumap/serve.Echo", false, stack.Config{XDP: hash, CPUMap: []int{0, 1}, NoCPUMapGRO: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRigConfig(t, fmt.Sprintf("usit-zw%d", i), 1500, tc.cfg)
			ap := r.stackAP(tc.v6, 7)
			l, err := r.st.ListenTCP(ap)
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			if tc.serve {
				go func() { served <- serve.Echo(l) }()
			} else {
				go func() {
					c, err := l.Accept()
					if err != nil {
						served <- err
						return
					}
					defer c.Close()
					_, err = io.Copy(c, c)
					served <- err
				}()
			}
			defer func() {
				l.Close()
				if err := <-served; err != nil && !errTimeout(err) {
					t.Errorf("io.Copy echo: %v", err)
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
			pc := progressConn{c, deadline}
			res := make(chan hashResult, 1)
			var rd io.Reader = &slowReader{r: pc}
			if tc.serve {
				rd = pc
			}
			go func() { res <- recvHashed(io.LimitReader(rd, n)) }()
			want, err := sendHashed(pc, n, writeSize, uint64(300+i))
			if err != nil {
				diagnose(t, r)
				c.Close()
				<-res
				t.Fatalf("kernel sender: %v", err)
			}
			c.CloseWrite()
			got := waitHash(t, r, res, deadline)
			if !checkHash(t, got, n, want) {
				diagnose(t, r)
			}
			cs := counters(r.st)
			t.Logf("rx_tcp_zero_window_acks %d tcp_retransmits %d", cs["rx_tcp_zero_window_acks"], cs["tcp_retransmits"])
		})
	}
}

// slowReader reads at most 16 KiB at a time and pauses a millisecond after
// every MiB, so that the kernel's receive buffer, and behind it the echo's
// send and ustack's receive window, fill and stay full.
type slowReader struct {
	r    io.Reader
	read int
}

func (s *slowReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b[:min(len(b), 16<<10)])
	if s.read/(1<<20) != (s.read+n)/(1<<20) {
		time.Sleep(time.Millisecond)
	}
	s.read += n
	return n, err
}
