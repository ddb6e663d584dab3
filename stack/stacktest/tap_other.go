//go:build !linux

package stacktest

import (
	"context"
	"errors"
	"os/exec"
	"testing"
)

// NewTAP skips the test: TAP devices in network namespaces are Linux's.
func NewTAP(t testing.TB, cfg TAPConfig) *TAPRig {
	t.Helper()
	t.Skip("stacktest.NewTAP needs Linux (TAP devices in network namespaces)")
	return nil
}

// Do returns an error: there is no peer namespace outside Linux.
func (r *TAPRig) Do(fn func() error) error {
	return errors.New("stacktest: no namespaces outside Linux")
}

// Command returns a command that fails: there is no peer namespace outside
// Linux.
func (r *TAPRig) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, args...)
}
