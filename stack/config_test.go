package stack

import (
	"net/netip"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
)

// TestNewNoRecycleIsPagePerFrame checks New's rule that joins the pool and
// the driver: recycling off (Pool.NoRecycle) also starts every frame on a
// fresh page (Driver.PagePerFrame), for a Go user as for ustack run
// -pool-recycle off.
func TestNewNoRecycleIsPagePerFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"recycle", Config{}, false},
		{"no-recycle", Config{Pool: bufpool.Config{NoRecycle: true}}, true},
		{"page-per-frame", Config{Driver: driver.Config{PagePerFrame: true}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := driver.NewMemPair(64, 1<<17)
			tc.cfg.Wire = w
			tc.cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}
			s, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Driver().Config().PagePerFrame; got != tc.want {
				t.Errorf("PagePerFrame: got %v, want %v", got, tc.want)
			}
		})
	}
}
