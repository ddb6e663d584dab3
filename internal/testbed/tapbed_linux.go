//go:build linux

package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TAPConfig configures NewTAPBed. The zero value is usable.
type TAPConfig struct {
	// Prefix is the namespace name prefix (see NewNetns); default "ustap".
	Prefix string
	// TAPName is the TAP device's name; default "ustap0".
	TAPName string
	// MTU is the TAP device's MTU; default 1500.
	MTU int
	// Subnet4 is the IPv4 subnet on the TAP link; default 10.77.0.0/24.
	// The kernel gets its first address (.1), the stack the second (.2).
	Subnet4 netip.Prefix
	// Subnet6 is the IPv6 subnet on the TAP link; default fd77::/64. The
	// kernel gets ::1, the stack ::2.
	Subnet6 netip.Prefix
	// TUN makes the device a TUN (`ip tuntap add mode tun`): a layer 3
	// link, IP packets without an Ethernet header, no ARP or NDP.
	TUN bool
	// MultiQueue makes the device multi-queue (`ip tuntap add ...
	// multi_queue`): every descriptor attached to it (IFF_MULTI_QUEUE)
	// is a queue.
	MultiQueue bool
	// TxQueueLen is the device's transmit queue length in frames (`ip
	// link set txqueuelen`): how many frames the kernel queues for the
	// reader of the TAP before it drops (tun_net_xmit); 0 keeps the
	// default, 500.
	TxQueueLen int
}

// TAPBed is a fresh namespace holding a persistent TAP device that is
// configured on the kernel side: the kernel's end of the link has
// KernelAddr4 and KernelAddr6, and the userspace stack that opens the TAP
// (see Open) is expected at StackAddr4 and StackAddr6 on the same subnets.
// The namespace has no other interface than lo and no default route.
//
// The TAP is created as `ip tuntap add` does and so carries no vnet_hdr or
// offload flags of its own; whoever opens it sets the flags it wants on
// its descriptor. Until a descriptor is attached the link is up but has no
// carrier.
type TAPBed struct {
	// NS is the namespace holding the TAP.
	NS *Netns
	// TAPName is the TAP device's name inside NS.
	TAPName string
	// MTU is the TAP device's MTU.
	MTU int
	// TUN: the device is a TUN (TAPConfig.TUN).
	TUN bool
	// MultiQueue: the device is multi-queue (TAPConfig.MultiQueue).
	MultiQueue bool
	// KernelAddr4 and KernelAddr6 are the kernel side's addresses, with
	// the subnet's prefix length.
	KernelAddr4, KernelAddr6 netip.Prefix
	// StackAddr4 and StackAddr6 are the addresses reserved for the
	// userspace stack, with the subnet's prefix length. Nothing in the
	// kernel has them.
	StackAddr4, StackAddr6 netip.Prefix
}

// NewTAPBed creates a namespace, a TAP device in it with the configured MTU,
// gives the kernel side its IPv4 and IPv6 addresses (IPv6 without duplicate
// address detection, so that it is usable at once) and sets the link up.
// On any error it removes what it made.
func NewTAPBed(cfg TAPConfig) (*TAPBed, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "ustap"
	}
	if cfg.TAPName == "" {
		cfg.TAPName = "ustap0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if !cfg.Subnet4.IsValid() {
		cfg.Subnet4 = netip.MustParsePrefix("10.77.0.0/24")
	}
	if !cfg.Subnet6.IsValid() {
		cfg.Subnet6 = netip.MustParsePrefix("fd77::/64")
	}
	if !cfg.Subnet4.Addr().Is4() || cfg.Subnet4.Bits() > 30 {
		return nil, fmt.Errorf("tap bed: Subnet4 %s: want an IPv4 prefix of at most /30", cfg.Subnet4)
	}
	if !cfg.Subnet6.Addr().Is6() || cfg.Subnet6.Addr().Is4In6() || cfg.Subnet6.Bits() > 126 {
		return nil, fmt.Errorf("tap bed: Subnet6 %s: want an IPv6 prefix of at most /126", cfg.Subnet6)
	}
	k4, s4 := firstTwo(cfg.Subnet4)
	k6, s6 := firstTwo(cfg.Subnet6)

	ns, err := NewNetns(cfg.Prefix)
	if err != nil {
		return nil, fmt.Errorf("tap bed: %w", err)
	}
	b := &TAPBed{
		NS:          ns,
		TAPName:     cfg.TAPName,
		MTU:         cfg.MTU,
		TUN:         cfg.TUN,
		MultiQueue:  cfg.MultiQueue,
		KernelAddr4: k4, StackAddr4: s4,
		KernelAddr6: k6, StackAddr6: s6,
	}
	if err := b.addTAP(cfg.TUN, cfg.MultiQueue); err != nil {
		ns.Close()
		return nil, fmt.Errorf("tap bed: %w", err)
	}
	err = ns.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(b.TAPName)
		if err != nil {
			return err
		}
		if err := h.LinkSetMTU(l, b.MTU); err != nil {
			return fmt.Errorf("set mtu %d: %w", b.MTU, err)
		}
		if cfg.TxQueueLen > 0 {
			if err := h.LinkSetTxQLen(l, cfg.TxQueueLen); err != nil {
				return fmt.Errorf("set txqueuelen %d: %w", cfg.TxQueueLen, err)
			}
		}
		for _, p := range []netip.Prefix{k4, k6} {
			if err := h.AddrAdd(l, nlAddr(p)); err != nil {
				return fmt.Errorf("add address %s: %w", p, err)
			}
		}
		return h.LinkSetUp(l)
	})
	if err != nil {
		ns.Close() // takes the device with it
		return nil, fmt.Errorf("tap bed: %s: %w", b.TAPName, err)
	}
	return b, nil
}

// addTAP creates the bed's persistent TAP (or TUN) device from inside its
// namespace, as `ip tuntap add dev NAME mode tap|tun [multi_queue]` does:
// /dev/net/tun opened in the namespace (the device is made in the
// namespace of the opener, tun_set_iff), TUNSETIFF with IFF_NO_PI,
// TUNSETPERSIST, and the descriptor closed again. The device keeps no
// vnet_hdr or offload flags: whoever attaches sets its own.
func (b *TAPBed) addTAP(tun, multiQueue bool) error {
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if tun {
		flags = unix.IFF_TUN | unix.IFF_NO_PI
	}
	if multiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	err := b.NS.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(b.TAPName)
		if err != nil {
			return err
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF: %w", err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return fmt.Errorf("TUNSETPERSIST: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create %s: %w", b.TAPName, err)
	}
	return nil
}

// firstTwo returns the first two host addresses of p (.1 and .2 of an IPv4
// subnet, ::1 and ::2 of an IPv6 one), with p's prefix length.
func firstTwo(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	base := p.Masked().Addr()
	a := base.Next()
	return netip.PrefixFrom(a, p.Bits()), netip.PrefixFrom(a.Next(), p.Bits())
}

// Close deletes the TAP device and releases the namespace (Netns.Close).
// Close descriptors opened on the TAP first: while one is open the
// namespace outlives Close invisibly. Close is idempotent.
func (b *TAPBed) Close() error {
	var errs []error
	// The device may already be gone (closed twice, or deleted by the
	// test); only the namespace's release decides the result then.
	err := b.NS.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(b.TAPName)
		if err != nil {
			return nil
		}
		return h.LinkDel(l)
	})
	if err != nil && !errors.Is(err, os.ErrClosed) {
		errs = append(errs, fmt.Errorf("tap bed: delete %s: %w", b.TAPName, err))
	}
	if err := b.NS.Close(); err != nil {
		errs = append(errs, fmt.Errorf("tap bed: %w", err))
	}
	return errors.Join(errs...)
}

// Open runs open inside the bed's namespace (b.NS.Do(open)), since a TAP
// must be opened (/dev/net/tun and TUNSETIFF) from the namespace its device
// is in, and then, if open succeeded, waits up to ReadyTimeout for the link
// to come up (see WaitReady). If the link does not come up Open returns an
// error; whatever open opened stays open for the caller to close. Use
// b.NS.Do to run something in the namespace without waiting.
func (b *TAPBed) Open(open func() error) error {
	if err := b.NS.Do(open); err != nil {
		return err
	}
	return b.WaitReady(ReadyTimeout)
}

// ReadyTimeout is how long Open waits for the link to come up.
const ReadyTimeout = 2 * time.Second

// WaitReady waits until the kernel's side of the TAP can transmit: until
// its operational state is UP. Attaching a descriptor turns the carrier on,
// but the kernel only moves the link to UP and attaches its transmit queue
// discipline later, from its link-watch worker; until then it silently
// drops what it sends on the TAP. WaitReady polls the operational state
// and then makes a no-op configuration change, which the kernel serialises
// after the worker's whole update.
func (b *TAPBed) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := b.NS.link(b.TAPName)
		if err != nil {
			return fmt.Errorf("tap bed: wait for %s: %w", b.TAPName, err)
		}
		state := l.Attrs().OperState
		if state == netlink.OperUp {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tap bed: %s not up after %v (is a descriptor attached?): state %s", b.TAPName, timeout, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.NS.SetLinkUp(b.TAPName); err != nil {
		return fmt.Errorf("tap bed: %w", err)
	}
	return nil
}
