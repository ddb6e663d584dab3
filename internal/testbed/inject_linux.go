//go:build linux

package testbed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInjectLimit is returned by Injector.Write once the injector has sent
// its MaxFrames frames or its Deadline has passed.
var ErrInjectLimit = errors.New("injector: frame count or time limit reached")

// InjectorConfig configures NewInjector.
type InjectorConfig struct {
	// Dev is the device to write to (and read from), inside the namespace.
	Dev string
	// VnetHdr sets PACKET_VNET_HDR: every frame written starts with a
	// struct virtio_net_hdr (10 bytes) that the kernel turns into the
	// skb's checksum and GSO state, which a TAP device hands to its reader
	// in the virtio-net header it writes. The kernel checks the header and
	// rejects some bad ones itself (Write returns EINVAL).
	VnetHdr bool
	// Receive makes the socket receive every frame the device sends and
	// receives (ETH_P_ALL), for ReadFrame. Without it the socket receives
	// nothing.
	Receive bool
	// RcvBuf, if > 0, sets the socket's receive buffer (SO_RCVBUFFORCE,
	// past net.core.rmem_max), for a reader that lets frames queue.
	RcvBuf int
	// SndBuf, if > 0, sets the socket's send buffer (SO_SNDBUFFORCE): a
	// frame a veth hands to its peer's NAPI stays charged to the socket
	// until the peer's GRO lets go of it, so a writer whose frames GRO
	// holds blocks once they fill the default buffer.
	SndBuf int
	// MaxFrames bounds the frames Write sends (required, > 0).
	MaxFrames int
	// Deadline bounds the time Write sends until (required).
	Deadline time.Time
}

// Injector is an AF_PACKET raw socket bound to a device inside a namespace:
// it writes whole Ethernet frames onto the device from the kernel's side,
// as if the kernel transmitted them (on a TAP, the process holding the TAP
// reads them), and can read what the device carries. Every Injector is
// bounded: Write refuses to send more than MaxFrames frames or after
// Deadline. Its methods are safe for concurrent use.
type Injector struct {
	fd      int
	ifindex int
	cfg     InjectorConfig

	mu sync.Mutex
	// +checklocks:mu
	sent int
	// +checklocks:mu
	closed bool
}

// NewInjector opens the socket inside n and binds it to cfg.Dev.
func (n *Netns) NewInjector(cfg InjectorConfig) (*Injector, error) {
	if cfg.MaxFrames <= 0 || cfg.Deadline.IsZero() {
		return nil, fmt.Errorf("injector on %s: MaxFrames and Deadline are required", cfg.Dev)
	}
	var in *Injector
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(cfg.Dev)
		if err != nil {
			return err
		}
		proto := 0 // receive nothing
		if cfg.Receive {
			proto = int(htons(unix.ETH_P_ALL))
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("socket(AF_PACKET): %w", err)
		}
		if cfg.VnetHdr {
			if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
				unix.Close(fd)
				return fmt.Errorf("PACKET_VNET_HDR: %w", err)
			}
		}
		if cfg.RcvBuf > 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RcvBuf); err != nil {
				unix.Close(fd)
				return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
			}
		}
		if cfg.SndBuf > 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, cfg.SndBuf); err != nil {
				unix.Close(fd)
				return fmt.Errorf("SO_SNDBUFFORCE: %w", err)
			}
		}
		sa := &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind to %s: %w", cfg.Dev, err)
		}
		in = &Injector{fd: fd, ifindex: ifi.Index, cfg: cfg}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns %q: injector on %s: %w", n.Name, cfg.Dev, err)
	}
	return in, nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// Write sends one frame (after its virtio-net header with VnetHdr). It
// returns ErrInjectLimit once the count or time limit is reached, and the
// kernel's error for a frame it refuses. A frame the device's queue drops
// is not an error: see the device's tx_dropped (LinkStats).
func (in *Injector) Write(frame []byte) error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return net.ErrClosed
	}
	if in.sent >= in.cfg.MaxFrames || time.Now().After(in.cfg.Deadline) {
		in.mu.Unlock()
		return ErrInjectLimit
	}
	in.sent++
	in.mu.Unlock()
	for {
		err := unix.Send(in.fd, frame, 0)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ENOBUFS || err == unix.EAGAIN {
			// The device queue is full: back off and retry, within the
			// deadline.
			if time.Now().After(in.cfg.Deadline) {
				return ErrInjectLimit
			}
			time.Sleep(100 * time.Microsecond)
			continue
		}
		return err
	}
}

// Sent returns the number of frames Write accepted to send.
func (in *Injector) Sent() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.sent
}

// ReadFrame reads the next frame the device sent or received into b (only
// with Receive), waiting up to timeout. It returns the frame's length and
// whether the device sent it (PACKET_OUTGOING) rather than received it.
func (in *Injector) ReadFrame(b []byte, timeout time.Duration) (n int, outgoing bool, err error) {
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(in.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, false, err
	}
	for {
		n, from, err := unix.Recvfrom(in.fd, b, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		return n, ll != nil && ll.Pkttype == unix.PACKET_OUTGOING, nil
	}
}

// Close closes the socket. It is idempotent.
func (in *Injector) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil
	}
	in.closed = true
	return unix.Close(in.fd)
}

// LinkStats are a device's packet counters (ip -s link).
type LinkStats struct {
	RxPackets, RxDropped, TxPackets, TxDropped uint64
}

// LinkStats returns the counters of dev inside n, from the device's
// IFLA_STATS64 over netlink.
func (n *Netns) LinkStats(dev string) (LinkStats, error) {
	l, err := n.link(dev)
	if err != nil {
		return LinkStats{}, fmt.Errorf("link stats of %s in %s: %w", dev, n.Name, err)
	}
	s := l.Attrs().Statistics
	if s == nil {
		return LinkStats{}, fmt.Errorf("link stats of %s in %s: the kernel sent none", dev, n.Name)
	}
	return LinkStats{RxPackets: s.RxPackets, RxDropped: s.RxDropped, TxPackets: s.TxPackets, TxDropped: s.TxDropped}, nil
}
