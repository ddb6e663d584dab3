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

// inlineTCPAvailable: this build's gVisor has TCPInlineProcessingOption.
const inlineTCPAvailable = true

// inlineBatch is a delivering goroutine's batch of the TCP endpoints its
// segments reached, processed at its batch's end (the patched gVisor's
// InlineBatch; runInline).
type inlineBatch = gstack.InlineBatch

// setInlineBatch has pb's TCP endpoint processed at the end of inl's batch
// rather than as pb is delivered (nil: as it is delivered).
func setInlineBatch(pb *gstack.PacketBuffer, inl *inlineBatch) { pb.InlineBatch = inl }
