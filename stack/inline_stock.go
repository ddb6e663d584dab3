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
