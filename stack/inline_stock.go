//go:build stockgvisor

package stack

import (
	"errors"

	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// setInlineTCP fails: Config.InlineTCP needs the patched gVisor of
// internal/gvisor, and this build (tag stockgvisor, with
// -modfile=internal/gvisor/stock.mod) has the stock module.
func setInlineTCP(*gstack.Stack) error {
	return errors.New("stack: InlineTCP needs the patched gVisor (internal/gvisor); this build has the stock module (tag stockgvisor)")
}

// inlineTCPAvailable: the stock module has no TCPInlineProcessingOption.
const inlineTCPAvailable = false

// inlineBatch is empty with the stock module: TCP is never processed
// inline, so there is nothing to defer.
type inlineBatch struct{}

func (*inlineBatch) Len() int                           { return 0 }
func (*inlineBatch) Run()                               {}
func setInlineBatch(*gstack.PacketBuffer, *inlineBatch) {}
