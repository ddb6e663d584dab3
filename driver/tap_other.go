//go:build !linux

package driver

import "net"

// TAPConfig configures OpenTAP. TAP devices are supported on Linux only.
type TAPConfig struct {
	// Name is the interface name.
	Name string
	// VnetHdr selects frames preceded by a virtio-net header.
	VnetHdr bool
	// Offloads enables checksum and segmentation offloads.
	Offloads bool
	// TUN opens a layer 3 device instead of a TAP.
	TUN bool
	// MultiQueue opens one queue of a multi-queue device.
	MultiQueue bool
	// UDPTunnel makes the device carry UDP tunnel GSO.
	UDPTunnel bool
}

// OpenTAPQueues returns ErrNotSupported outside Linux.
func OpenTAPQueues(cfg TAPConfig, n int) ([]*TAP, error) { return nil, ErrNotSupported }

// TAP is a Wire over a Linux TAP device; elsewhere every method returns
// ErrNotSupported.
type TAP struct{}

// OpenTAP returns ErrNotSupported outside Linux.
func OpenTAP(cfg TAPConfig) (*TAP, error) { return nil, ErrNotSupported }

// Read returns ErrNotSupported outside Linux.
func (t *TAP) Read(b []byte, block bool) (int, error) { return 0, ErrNotSupported }

// Write returns ErrNotSupported outside Linux.
func (t *TAP) Write(b []byte) error { return ErrNotSupported }

// Close returns ErrNotSupported outside Linux.
func (t *TAP) Close() error { return ErrNotSupported }

// Name returns "" outside Linux.
func (t *TAP) Name() string { return "" }

// FD returns -1 outside Linux.
func (t *TAP) FD() int { return -1 }

// USO reports false outside Linux.
func (t *TAP) USO() bool { return false }

// L3 reports false outside Linux.
func (t *TAP) L3() bool { return false }

// VnetHdr reports false outside Linux.
func (t *TAP) VnetHdr() bool { return false }

// HardwareAddr returns ErrNotSupported outside Linux.
func (t *TAP) HardwareAddr() (net.HardwareAddr, error) { return nil, ErrNotSupported }
