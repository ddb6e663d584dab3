package stack

import (
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/ustack/ustack/driver"
)

// TestTCPReceiveBufferMax checks that the stack hands gVisor the receive
// buffer range Config asks for (by default DefaultTCPReceiveBufferMax, not
// gVisor's own 4 MiB) and refuses a maximum below the default size.
func TestTCPReceiveBufferMax(t *testing.T) {
	for _, tc := range []struct {
		max, want int
	}{
		{0, DefaultTCPReceiveBufferMax},
		{64 << 20, 64 << 20},
		{tcp.DefaultReceiveBufferSize, tcp.DefaultReceiveBufferSize},
	} {
		rx, _ := pairConfig(t, Config{TCPReceiveBufferMax: tc.max})
		var got tcpip.TCPReceiveBufferSizeRangeOption
		if e := rx.ip.TransportProtocolOption(tcp.ProtocolNumber, &got); e != nil {
			t.Fatal(e)
		}
		if got.Max != tc.want || got.Default != tcp.DefaultReceiveBufferSize {
			t.Errorf("TCPReceiveBufferMax %d: gVisor's range %+v, want max %d, default %d", tc.max, got, tc.want, tcp.DefaultReceiveBufferSize)
		}
	}
	a, b := driver.NewMemPair(4, 0)
	defer b.Close()
	if s, err := New(Config{Wire: a, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}, TCPReceiveBufferMax: tcp.DefaultReceiveBufferSize - 1}); err == nil {
		s.Close()
		t.Error("TCPReceiveBufferMax below the default size: New succeeded, want an error")
	}
}
