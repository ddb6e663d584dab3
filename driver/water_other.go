//go:build !linux && !darwin && !windows

package driver

import (
	"io"

	"github.com/songgao/water"
)

// waterParams: water has no parameters here (and no TAP support: New
// reports that it is not implemented on this platform).
func waterParams(string) water.PlatformSpecificParams { return water.PlatformSpecificParams{} }

func waterSetup(io.ReadWriteCloser) error { return nil }
