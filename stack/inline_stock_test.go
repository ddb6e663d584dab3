//go:build stockgvisor

package stack

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ustack/ustack/driver"
)

// TestInlineTCPNeedsPatch: built against the stock gVisor (tag
// stockgvisor), New refuses Config.InlineTCP and says why.
func TestInlineTCPNeedsPatch(t *testing.T) {
	a, b := driver.NewMemPair(4, 0)
	defer b.Close()
	s, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}, InlineTCP: true})
	if err == nil {
		s.Close()
		t.Fatal("InlineTCP on the stock gVisor: New succeeded, want an error")
	}
	if !strings.Contains(err.Error(), "patched gVisor") {
		t.Errorf("New: %v, want it to name the patched gVisor", err)
	}
}
