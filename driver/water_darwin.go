package driver

import (
	"io"

	"github.com/songgao/water"
)

// waterParams opens a tuntaposx TAP: macOS's own utun devices are TUN
// only, and ustack's NIC model needs Ethernet frames.
func waterParams(name string) water.PlatformSpecificParams {
	return water.PlatformSpecificParams{Name: name, Driver: water.MacOSDriverTunTapOSX}
}

func waterSetup(io.ReadWriteCloser) error { return nil }
