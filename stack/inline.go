//go:build !stockgvisor

package stack

import (
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// setInlineTCP turns on Config.InlineTCP: the patched gVisor's
// TCPInlineProcessingOption (internal/gvisor's patch 0001), with which
// tcp's dispatcher processes a connected endpoint's segment in the
// delivering goroutine, as tcp_v4_rcv does in softirq.
func setInlineTCP(ip *gstack.Stack) error {
	on := tcpip.TCPInlineProcessingOption(true)
	if e := ip.SetTransportProtocolOption(tcp.ProtocolNumber, &on); e != nil {
		return fmt.Errorf("stack: tcp inline processing: %s", e)
	}
	return nil
}
