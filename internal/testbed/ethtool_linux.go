//go:build linux

package testbed

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value from <linux/ethtool.h>, the
// argument of the single-flag ETHTOOL_G* and ETHTOOL_S* commands.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with ifr_data, a user pointer: the request
// SIOCETHTOOL takes (dev_ethtool reads the command through it).
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte // the rest of the ifr_ifru union
}

// ethtool issues one ethtool_value command on dev, from a socket created
// inside the namespace, and returns the value the kernel wrote back.
func (n *Netns) ethtool(dev string, cmd, data uint32) (uint32, error) {
	if len(dev) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", dev)
	}
	v := ethtoolValue{cmd: cmd, data: data}
	var ifr ifreqData
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(&v)
	err := n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
			return errno
		}
		return nil
	})
	runtime.KeepAlive(&v)
	return v.data, err
}

// SetTxChecksum turns TX checksum offload of dev in the namespace on or
// off, as `ethtool -K dev tx on|off` does, with the SIOCETHTOOL ioctl's
// ETHTOOL_STXCSUM (the kernel's ethtool_set_one_feature on
// NETIF_F_CSUM_MASK), so that no ethtool binary is needed. With it off the
// kernel completes a partial checksum in software (skb_checksum_help)
// before the device.
func (n *Netns) SetTxChecksum(dev string, on bool) error {
	return n.setOne(dev, unix.ETHTOOL_STXCSUM, "ETHTOOL_STXCSUM", on)
}

// TxChecksum reports whether TX checksum offload of dev in the namespace
// is on (ETHTOOL_GTXCSUM: any of NETIF_F_CSUM_MASK in its features), as
// `ethtool -k dev` shows tx-checksumming.
func (n *Netns) TxChecksum(dev string) (bool, error) {
	return n.getOne(dev, unix.ETHTOOL_GTXCSUM, "ETHTOOL_GTXCSUM")
}

// SetGRO turns generic receive offload of dev in the namespace on or off,
// as `ethtool -K dev gro on|off` does, with the SIOCETHTOOL ioctl's
// ETHTOOL_SGRO (the kernel's ethtool_set_one_feature on NETIF_F_GRO). On a
// veth device without XDP, GRO on also gives the device its NAPI instance
// (drivers/net/veth.c veth_set_features), so that received frames go
// through napi_gro_receive.
func (n *Netns) SetGRO(dev string, on bool) error {
	return n.setOne(dev, unix.ETHTOOL_SGRO, "ETHTOOL_SGRO", on)
}

// GRO reports whether GRO is on for dev in the namespace (ETHTOOL_GGRO).
func (n *Netns) GRO(dev string) (bool, error) {
	return n.getOne(dev, unix.ETHTOOL_GGRO, "ETHTOOL_GGRO")
}

// SetTSO turns TCP segmentation offload of dev in the namespace on or off
// (`ethtool -K dev tso on|off`, ETHTOOL_STSO). A veth hands a frame to its
// peer's NAPI (and so to the peer's GRO) only while the sending end has no
// TSO (drivers/net/veth.c veth_skb_is_eligible_for_gro).
func (n *Netns) SetTSO(dev string, on bool) error {
	return n.setOne(dev, unix.ETHTOOL_STSO, "ETHTOOL_STSO", on)
}

// setOne sets one of dev's ethtool_value features (cmd, named name in
// errors) on or off.
func (n *Netns) setOne(dev string, cmd uint32, name string, on bool) error {
	var data uint32
	if on {
		data = 1
	}
	if _, err := n.ethtool(dev, cmd, data); err != nil {
		return fmt.Errorf("netns %q: %s: %s %d: %w", n.Name, dev, name, data, err)
	}
	return nil
}

// getOne reports whether one of dev's ethtool_value features (cmd, named
// name in errors) is on.
func (n *Netns) getOne(dev string, cmd uint32, name string) (bool, error) {
	v, err := n.ethtool(dev, cmd, 0)
	if err != nil {
		return false, fmt.Errorf("netns %q: %s: %s: %w", n.Name, dev, name, err)
	}
	return v != 0, nil
}
