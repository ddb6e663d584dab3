package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// TestSetupTunnel follows setupTunnel's contract as the matrix does, for
// IPv4 and IPv6 inside, and sends a stream from a kernel socket in the
// bed's namespace through the tunnel, checking every byte and that the
// driver decapsulated.
func TestSetupTunnel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns; run go test as root")
	}
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustest-benchtnl"})
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v6=%v", v6), func(t *testing.T) {
			// What -tunnel ip6tnl -lro off gives: a tunnel without addresses.
			cfg := stack.Config{Driver: driver.Config{MTU: bed.MTU, LRO: false}, Tunnel: &stack.TunnelConfig{}}
			cfg.Addrs = []netip.Prefix{bed.StackAddr4, bed.StackAddr6}
			dst, cleanup, err := setupTunnel(bed, &cfg, v6)
			if errors.Is(err, testbed.ErrNoIP6Tunnel) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			if dst.Is6() != v6 {
				t.Fatalf("dst %s: want IPv6 %v", dst, v6)
			}
			var tap *driver.TAP
			if err := bed.Open(func() (err error) {
				tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			cfg.Wire = tap
			st, err := stack.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ap := netip.AddrPortFrom(dst, benchPort)
			l, err := st.ListenTCP(ap)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := make(chan [32]byte, 1)
			go func() {
				h := sha256.New()
				if c, err := l.Accept(); err == nil {
					c.SetDeadline(time.Now().Add(time.Minute))
					io.Copy(h, c)
					c.Close()
				}
				got <- [32]byte(h.Sum(nil))
			}()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := bed.NS.DialTCP(ctx, ap, "")
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(time.Minute))
			const n = 16 << 20
			buf := make([]byte, n)
			rand.NewChaCha8([32]byte{7}).Read(buf)
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
			c.Close()
			if sum := <-got; sum != sha256.Sum256(buf) {
				t.Errorf("sha256 of what the stack received: got %x, want %x", sum, sha256.Sum256(buf))
			}
			var decap uint64
			st.EachCounter(func(name string, v uint64) {
				if name == "rx_tunnel_decap" {
					decap = v
				}
			})
			if decap < n/1500 {
				t.Errorf("rx_tunnel_decap: got %d, want at least %d", decap, n/1500)
			}
		})
	}
}
