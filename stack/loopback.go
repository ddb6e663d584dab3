package stack

import (
	"fmt"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/link/loopback"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// loopbackNICID is the loopback interface's gVisor NIC (the wire's is
// nicID, the tunnel's tunnelNICID).
const loopbackNICID = tunnelNICID + 1

// loopbackAddrs are the loopback interface's addresses, as Linux gives lo.
var loopbackAddrs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128")}

// addLoopback adds the loopback interface to ip: gVisor's loopback link
// endpoint, which hands every packet written to it back to gVisor in the
// writer's goroutine (no goroutine of its own; ip.Close removes it). With
// it, gVisor sends a socket's packets to any of the stack's own addresses
// (127.0.0.1, ::1, the wire's addresses) through it (Stack.FindRoute's
// local route), so that they never reach the wire's link endpoint nor its
// counters. It needs no route: gVisor finds local routes before the table.
func addLoopback(ip *gstack.Stack) error {
	if e := ip.CreateNICWithOptions(loopbackNICID, loopback.New(), gstack.NICOptions{Name: "lo"}); e != nil {
		return fmt.Errorf("stack: create loopback NIC: %s", e)
	}
	for _, p := range loopbackAddrs {
		if e := ip.AddProtocolAddress(loopbackNICID, protocolAddress(p), gstack.AddressProperties{}); e != nil {
			return fmt.Errorf("stack: add loopback address %s: %s", p, e)
		}
	}
	return nil
}
