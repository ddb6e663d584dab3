//go:build linux

package integration

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
)

// TestWrongMACDoesNotStopReader sends UDP from the kernel to a neighbour
// in the stack's subnet whose static neighbour entry points to another MAC,
// so that those frames leave through the TAP addressed to a station ustack
// is not, interleaved with a good TCP transfer to the stack. The driver
// must drop the foreign frames (rx_drop_other_host) and keep receiving.
func TestWrongMACDoesNotStopReader(t *testing.T) {
	needRoot(t)
	const (
		n        = 16 << 20
		otherMAC = "02:00:00:00:00:99"
		maxUDP   = 20000 // bound of the foreign sender
		before   = 100   // foreign datagrams sent before the transfer starts
	)
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-mac%d", i), 1500, driver.Config{LRO: true})
			// .99 (::99): inside the stack's subnet, not the stack's.
			subnet := r.bed.StackAddr4
			if v6 {
				subnet = r.bed.StackAddr6
			}
			other := subnet.Masked().Addr()
			for range 0x99 {
				other = other.Next()
			}
			if err := r.bed.NS.IP("neigh", "add", other.String(), "lladdr", otherMAC, "dev", r.bed.TAPName, "nud", "permanent"); err != nil {
				t.Fatal(err)
			}
			k, err := r.bed.NS.DialUDP(netip.AddrPortFrom(other, 9))
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()

			stop := make(chan struct{})
			started := make(chan struct{})
			finished := make(chan struct{})
			var (
				sent    int
				sendErr error
			)
			go func() {
				defer close(finished)
				deadline := time.Now().Add(transferTimeout(n))
				k.SetWriteDeadline(deadline)
				msg := make([]byte, 200)
				for sent < maxUDP && time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					default:
					}
					fillDatagram(msg, uint32(sent))
					if _, err := k.Write(msg); err != nil {
						sendErr = err
						return
					}
					sent++
					if sent == before {
						close(started)
					}
					if sent%10 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			}()
			stopSender := sync.OnceFunc(func() { close(stop); <-finished })
			defer stopSender()
			select {
			case <-started:
			case <-finished:
				if sent >= before {
					break
				}
				t.Fatalf("foreign sender: stopped after %d datagrams (error %v), want at least %d", sent, sendErr, before)
			case <-time.After(30 * time.Second):
				stopSender()
				t.Fatalf("foreign sender: %d datagrams sent in 30s (error %v), want %d", sent, sendErr, before)
			}

			elapsed := kernelToStack(t, r, v6, 9, n, uint64(300+i))
			stopSender()
			logRate(t, "kernel -> ustack amid foreign frames", n, elapsed)
			if sendErr != nil {
				t.Errorf("foreign sender: %v", sendErr)
			}
			c := counters(r.st)
			dropped := c["rx_drop_other_host"]
			t.Logf("foreign datagrams sent %d, rx_drop_other_host %d", sent, dropped)
			if dropped == 0 {
				t.Errorf("rx_drop_other_host: got 0, want > 0 (%d datagrams sent to %s)", sent, otherMAC)
			}
			if dropped > uint64(sent) {
				t.Errorf("rx_drop_other_host: got %d, want at most the %d datagrams sent", dropped, sent)
			}
			// Nothing else may have been dropped but the kernel's multicast
			// chatter (see checkFlowDrops).
			if got := c["rx_dropped"] - c["rx_drop_other_host"] - c["rx_drop_multicast"]; got != 0 {
				t.Errorf("rx_dropped (not counting rx_drop_other_host and rx_drop_multicast): got %d, want 0; drop counters: %s", got, dropReasons(r.st))
			}
		})
	}
}
