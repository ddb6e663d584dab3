package stack

import (
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
)

// TestNewWithEndpointCounters: a stack on another link endpoint (the
// bench's stock row) lists its counters without the ustack endpoint's own
// (the checksum drops of csum.go), instead of dereferencing it.
func TestNewWithEndpointCounters(t *testing.T) {
	ep := channel.New(16, 1500, "")
	st, err := NewWithEndpoint(ep, Config{Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := map[string]uint64{}
	st.EachCounter(func(name string, v uint64) { got[name] = v })
	for _, name := range []string{"ip_checksum_errors", "tcp_checksum_errors", "udp_checksum_errors", "ip_packets_received"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no counter %s", name)
		}
	}
}
