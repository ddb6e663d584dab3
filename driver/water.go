package driver

import (
	"fmt"

	"github.com/songgao/water"
)

// OpenWater opens the TAP device name through github.com/songgao/water and
// returns it as a PlainWire, the portable wire: bare frames, no virtio-net
// header, no offloads, on every system water supports (Linux; macOS with
// the tuntaposx driver; Windows with tap-windows6, name being the
// interface's name). maxFrame bounds a frame read (without the virtio-net
// header). On other systems water's error is returned.
//
// On Linux ustack's own TAP code (OpenTAP) is the offload wire; water
// cannot set IFF_VNET_HDR or TUNSETOFFLOAD, so OpenWater there is the
// plain wire that `ustack run -wire plain` compares against it. water
// always sets or clears the device's persist flag (TUNSETPERSIST); on
// Linux OpenWater keeps a device that already existed persistent (as `ip
// tuntap add` made it) and lets one it creates vanish when it is closed,
// and it clears the offloads an earlier user left on the device
// (TUNSETOFFLOAD 0), which water does not.
func OpenWater(name string, maxFrame int) (*PlainWire, error) {
	ifce, err := water.New(water.Config{DeviceType: water.TAP, PlatformSpecificParams: waterParams(name)})
	if err != nil {
		return nil, fmt.Errorf("driver: open TAP %q with water: %w", name, err)
	}
	if err := waterSetup(ifce.ReadWriteCloser); err != nil {
		ifce.Close()
		return nil, fmt.Errorf("driver: open TAP %q with water: %w", name, err)
	}
	w := NewPlainWire(ifce.ReadWriteCloser, maxFrame)
	w.name = ifce.Name()
	return w, nil
}
