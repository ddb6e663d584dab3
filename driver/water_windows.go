package driver

import (
	"io"

	"github.com/songgao/water"
)

// waterParams opens the tap-windows6 adapter whose interface is name.
func waterParams(name string) water.PlatformSpecificParams {
	return water.PlatformSpecificParams{ComponentID: "tap0901", InterfaceName: name}
}

func waterSetup(io.ReadWriteCloser) error { return nil }
