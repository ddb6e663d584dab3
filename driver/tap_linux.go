//go:build linux

package driver

// The TAP is driven with golang.org/x/sys/unix rather than
// github.com/songgao/water, for both the VnetHdr and the plain case:
//
//   - water cannot set IFF_VNET_HDR, TUNSETVNETHDRSZ or TUNSETOFFLOAD, which
//     ustack needs to exchange checksum-offloaded and GSO frames;
//   - water.New always issues TUNSETPERSIST with the Persist flag, so
//     attaching it to a device made by `ip tuntap add` clears the device's
//     persist flag and the device vanishes when the descriptor is closed;
//   - it wraps the descriptor in an *os.File on Go's poller, so a
//     non-blocking Read (ErrNoFrame) needs deadline games, File.Fd switches
//     the descriptor back to blocking mode, and the descriptor is opened
//     without O_CLOEXEC.
//
// The plain (VnetHdr false) case therefore uses the same code with one flag
// fewer, which also keeps comparisons between the two fair.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// TUNSETOFFLOAD flags from <linux/if_tun.h>; x/sys/unix does not define
// them.
const (
	tunFCSUM   = 0x01 // TUN_F_CSUM: the reader accepts partial checksums
	tunFTSO4   = 0x02 // TUN_F_TSO4
	tunFTSO6   = 0x04 // TUN_F_TSO6
	tunFTSOECN = 0x08 // TUN_F_TSO_ECN
	tunFUSO4   = 0x20 // TUN_F_USO4 (Linux 6.2)
	tunFUSO6   = 0x40 // TUN_F_USO6 (Linux 6.2)

	tunFUDPTunnelGSO     = 0x080 // TUN_F_UDP_TUNNEL_GSO: the reader takes UDP tunnel GSO super-frames
	tunFUDPTunnelGSOCsum = 0x100 // TUN_F_UDP_TUNNEL_GSO_CSUM: ... with an outer UDP checksum
)

// tapWritePollTimeout bounds how long Write waits for a TAP that reports
// EAGAIN (its socket send buffer is full) before giving up on the frame.
const tapWritePollTimeout = 100 * time.Millisecond

// TAPConfig configures OpenTAP.
type TAPConfig struct {
	// Name is the interface name. If no such interface exists in the
	// calling thread's network namespace a non-persistent TAP is created,
	// which disappears when the TAP is closed; an existing (persistent)
	// TAP, such as one made by `ip tuntap add`, is attached to and left in
	// place on Close. Empty lets the kernel choose a name (tapN).
	Name string
	// VnetHdr sets IFF_VNET_HDR: every frame read or written is preceded
	// by a 10-byte virtio-net header. Always true for ustack's driver;
	// false exists for comparisons.
	VnetHdr bool
	// Offloads enables TUNSETOFFLOAD with TUN_F_CSUM, TSO4, TSO6 and
	// TSO_ECN, plus USO4 and USO6 where the kernel accepts them: the
	// kernel may then hand over frames with partial checksums and TCP or
	// UDP GSO super-frames. Requires VnetHdr.
	Offloads bool
	// TUN opens a layer 3 device (IFF_TUN) instead of a TAP: frames start
	// at the IP header, with no Ethernet header (the driver's Config.L3),
	// as wireguard-go's tun_linux.go opens one (IFF_TUN|IFF_NO_PI|
	// IFF_VNET_HDR, TUNSETOFFLOAD with CSUM, TSO4/6 and USO4/6).
	TUN bool
	// MultiQueue sets IFF_MULTI_QUEUE: the descriptor is one queue of a
	// multi-queue device (`ip tuntap add ... multi_queue`, or one
	// OpenTAPQueues creates); the kernel spreads flows over the queues
	// (tun_select_queue) and a flow's packets follow the queue ustack last
	// sent it on (tun_flow_update).
	MultiQueue bool
	// UDPTunnel makes the device carry UDP tunnel GSO: a 24-byte
	// virtio-net header (TUNSETVNETHDRSZ, struct
	// virtio_net_hdr_v1_hash_tunnel) and TUN_F_UDP_TUNNEL_GSO with
	// TUN_F_UDP_TUNNEL_GSO_CSUM added to the offloads, so that what a
	// vxlan device in the peer's namespace sends (a TCP super-frame inside
	// VXLAN) arrives whole rather than cut into segments before the TAP.
	// Requires Offloads and a kernel that has the flags (Linux 6.17 on).
	UDPTunnel bool
}

// TAP is a Wire over a Linux TAP device (or a TUN device, TAPConfig.TUN).
// Read must be called by one
// goroutine at a time; Write may be called from several concurrently;
// Close from any goroutine at any time.
type TAP struct {
	fd      int
	efd     int // eventfd that Close signals to wake a blocked Read
	kfd     int // eventfd that Wake signals to end a Wait
	name    string
	vnetHdr bool
	hdrLen  int // the virtio-net header's length: 10, or 24 with TAPConfig.UDPTunnel
	uso     bool
	tun     bool // IFF_TUN: frames are IP packets

	// state counts the Read and Write calls inside a system call on fd
	// (low bits) and has tapClosedBit set once Close starts. Close releases
	// the descriptors only when the count drops to zero, so a concurrent
	// Read or Write never operates on a closed (or reused) descriptor.
	state atomic.Int64
	// idle receives a token when the count drops to zero after tapClosedBit
	// was set.
	idle chan struct{}

	closeOnce sync.Once
	closeErr  error

	pfd  [2]unix.PollFd // Read's poll set: fd and efd
	wpfd [3]unix.PollFd // Wait's: fd, efd and kfd
	wts  unix.Timespec  // Wait's timeout, kept here so that Wait does not allocate
	iov  []unix.Iovec   // ReadVec's, reused (one reader at a time)
}

const tapClosedBit = int64(1) << 62

// OpenTAP opens the TAP device cfg.Name, creating it if it does not exist,
// in the network namespace of the calling thread (see testbed's
// TAPBed.Open for opening one inside a namespace). The descriptor is
// non-blocking and close-on-exec.
func OpenTAP(cfg TAPConfig) (*TAP, error) {
	if cfg.Offloads && !cfg.VnetHdr {
		return nil, fmt.Errorf("open tap %q: offloads need VnetHdr", cfg.Name)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open tap %q: %w", cfg.Name, err)
	}
	if cfg.UDPTunnel && (!cfg.Offloads || cfg.TUN) {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap %q: a UDP tunnel needs Offloads on a TAP", cfg.Name)
	}
	t := &TAP{fd: fd, efd: -1, kfd: -1, vnetHdr: cfg.VnetHdr, tun: cfg.TUN, idle: make(chan struct{}, 1)}
	t.hdrLen = VirtioNetHdrLen
	if cfg.UDPTunnel {
		t.hdrLen = VirtioNetHdrTunnelLen
	}
	if err := t.setup(cfg); err != nil {
		unix.Close(fd)
		if t.efd >= 0 {
			unix.Close(t.efd)
		}
		if t.kfd >= 0 {
			unix.Close(t.kfd)
		}
		return nil, fmt.Errorf("open tap %q: %w", cfg.Name, err)
	}
	t.pfd = [2]unix.PollFd{
		{Fd: int32(t.fd), Events: unix.POLLIN},
		{Fd: int32(t.efd), Events: unix.POLLIN},
	}
	t.wpfd = [3]unix.PollFd{t.pfd[0], t.pfd[1], {Fd: int32(t.kfd), Events: unix.POLLIN}}
	return t, nil
}

// OpenTAPQueues opens n queues of the multi-queue device cfg.Name
// (cfg.MultiQueue is implied), creating it if it does not exist: one
// descriptor per queue, each a Wire of its own. On error it closes what it
// opened. A device that exists without multi_queue cannot take them
// (TUNSETIFF fails with EINVAL).
func OpenTAPQueues(cfg TAPConfig, n int) ([]*TAP, error) {
	if n < 1 || n > MaxQueues {
		return nil, fmt.Errorf("open tap %q: %d queues: want 1 to %d", cfg.Name, n, MaxQueues)
	}
	cfg.MultiQueue = true
	var qs []*TAP
	for i := range n {
		t, err := OpenTAP(cfg)
		if err != nil {
			for _, q := range qs {
				q.Close()
			}
			return nil, fmt.Errorf("queue %d: %w", i, err)
		}
		qs = append(qs, t)
		cfg.Name = t.Name() // a name the kernel chose, for the next queues
	}
	return qs, nil
}

func (t *TAP) setup(cfg TAPConfig) error {
	ifr, err := unix.NewIfreq(cfg.Name)
	if err != nil {
		return err
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if cfg.TUN {
		flags = unix.IFF_TUN | unix.IFF_NO_PI
	}
	if cfg.MultiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	if cfg.VnetHdr {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(t.fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF: %w", err)
	}
	t.name = ifr.Name()
	if cfg.VnetHdr {
		// The header size belongs to the device, not the descriptor: set
		// it even though 10 is the default, in case an earlier user of a
		// persistent device changed it.
		if err := unix.IoctlSetPointerInt(t.fd, unix.TUNSETVNETHDRSZ, t.hdrLen); err != nil {
			return fmt.Errorf("TUNSETVNETHDRSZ: %w", err)
		}
	}
	// The header's byte order belongs to the device too: an earlier user
	// of a persistent device (a legacy virtio guest's VMM, say) may have
	// set it to little or big endian. Back to the default, the host's
	// order for a modern (VIRTIO 1.0) header: tun_set_vnet_le and
	// tun_set_vnet_be clear TUN_VNET_LE and TUN_VNET_BE. A kernel
	// without CONFIG_TUN_VNET_CROSS_LE rejects TUNSETVNETBE with EINVAL;
	// it then has no big-endian mode to leave either.
	if err := unix.IoctlSetPointerInt(t.fd, unix.TUNSETVNETLE, 0); err != nil {
		return fmt.Errorf("TUNSETVNETLE: %w", err)
	}
	if err := unix.IoctlSetPointerInt(t.fd, unix.TUNSETVNETBE, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("TUNSETVNETBE: %w", err)
	}
	if cfg.Offloads {
		base := tunFCSUM | tunFTSO4 | tunFTSO6 | tunFTSOECN
		if cfg.UDPTunnel {
			// tun_vnet_parse_size: the tunnel header layout once the
			// device has NETIF_F_GSO_UDP_TUNNEL; a kernel without the
			// flags refuses them (EINVAL), and then there is no tunnel
			// GSO to read.
			tnl := tunFUDPTunnelGSO | tunFUDPTunnelGSOCsum
			if err := unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, base|tnl); err != nil {
				return fmt.Errorf("TUNSETOFFLOAD with UDP tunnel GSO: %w", err)
			}
			base |= tnl
		}
		err := unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, base|tunFUSO4|tunFUSO6)
		if err == nil {
			t.uso = true
		} else if errors.Is(err, unix.EINVAL) {
			// Kernels before 6.2 reject the USO flags.
			err = unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, base)
		}
		if err != nil {
			return fmt.Errorf("TUNSETOFFLOAD: %w", err)
		}
	} else {
		// Clear whatever an earlier user of a persistent device enabled:
		// without TUN_F_CSUM the kernel completes checksums itself.
		if err := unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, 0); err != nil {
			return fmt.Errorf("TUNSETOFFLOAD: %w", err)
		}
	}
	t.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	t.kfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	return nil
}

// acquire registers a system call on t.fd; it reports false (and registers
// nothing) once Close has started.
func (t *TAP) acquire() bool {
	if t.state.Add(1)&tapClosedBit != 0 {
		t.release()
		return false
	}
	return true
}

// release ends what acquire registered and lets a waiting Close proceed
// when it was the last.
func (t *TAP) release() {
	if t.state.Add(-1) == tapClosedBit {
		select {
		case t.idle <- struct{}{}:
		default:
		}
	}
}

// Read reads one frame (with its virtio-net header when VnetHdr is set)
// into b, truncating a longer frame to len(b), and returns its length.
// With block false it returns ErrNoFrame if none is queued; otherwise it
// waits for one or for Close, after which it returns os.ErrClosed. Read
// does not allocate.
func (t *TAP) Read(b []byte, block bool) (int, error) {
	return t.read(b, nil, block)
}

// ReadVec is Read over the concatenation of iov's buffers, with one
// readv(2): the VecReader the NIC model reads super-frames into its ring
// with. At most maxReadIov buffers are used. It does not allocate.
func (t *TAP) ReadVec(iov [][]byte, block bool) (int, error) {
	return t.read(nil, iov, block)
}

// read is Read (iov nil) and ReadVec.
func (t *TAP) read(b []byte, iov [][]byte, block bool) (int, error) {
	if !t.acquire() {
		return 0, os.ErrClosed
	}
	defer t.release()
	for {
		var n int
		var err error
		if iov != nil {
			n, err = t.readv(iov)
		} else {
			n, err = unix.Read(t.fd, b)
		}
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if !block {
				return 0, ErrNoFrame
			}
		default:
			return 0, fmt.Errorf("read tap %q: %w", t.name, err)
		}
		for {
			if t.state.Load()&tapClosedBit != 0 {
				return 0, os.ErrClosed
			}
			_, err := unix.Poll(t.pfd[:], -1)
			if err == nil {
				break
			}
			if err != unix.EINTR {
				return 0, fmt.Errorf("poll tap %q: %w", t.name, err)
			}
		}
		if t.state.Load()&tapClosedBit != 0 {
			return 0, os.ErrClosed
		}
	}
}

// Wait sleeps until a frame is queued on the TAP, timeout passes (negative:
// no timeout), Wake is called or Close starts (then it returns
// os.ErrClosed): one ppoll(2) on the TAP and two eventfds (Waiter). It is
// for the reader only and does not allocate.
func (t *TAP) Wait(timeout time.Duration) error {
	if !t.acquire() {
		return os.ErrClosed
	}
	defer t.release()
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		var ts *unix.Timespec
		if timeout >= 0 {
			t.wts = unix.NsecToTimespec(int64(max(time.Until(deadline), 0)))
			ts = &t.wts
		}
		for i := range t.wpfd {
			t.wpfd[i].Revents = 0
		}
		_, err := unix.Ppoll(t.wpfd[:], ts, nil)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			return fmt.Errorf("poll tap %q: %w", t.name, err)
		}
		// A signal (the runtime's own, for preemption): wait on.
	}
	if t.state.Load()&tapClosedBit != 0 {
		return os.ErrClosed
	}
	if t.wpfd[2].Revents&unix.POLLIN != 0 {
		var b [8]byte
		unix.Read(t.kfd, b[:]) // reset the eventfd's counter; EAGAIN if a racing Wait took it
	}
	return nil
}

// Wake makes a Wait in progress, or the next one, return (Waiter): it
// adds one to an eventfd that Wait polls. Safe from any goroutine; after
// Close it does nothing.
func (t *TAP) Wake() {
	if !t.acquire() {
		return
	}
	defer t.release()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(t.kfd, one[:]) // EAGAIN only at a counter near 2^64: a wake is pending anyway
}

// Write sends one frame: b is the virtio-net header followed by the
// Ethernet frame when VnetHdr is set, the bare Ethernet frame otherwise. If
// the device cannot take the frame within a short bound it returns an
// error. After Close it returns os.ErrClosed. Write does not allocate on
// success.
func (t *TAP) Write(b []byte) error {
	if !t.acquire() {
		return os.ErrClosed
	}
	defer t.release()
	var deadline time.Time
	for {
		n, err := unix.Write(t.fd, b)
		switch err {
		case nil:
			if n != len(b) {
				return fmt.Errorf("write tap %q: %w", t.name, io.ErrShortWrite)
			}
			return nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return fmt.Errorf("write tap %q: %w", t.name, err)
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(tapWritePollTimeout)
		} else if !now.Before(deadline) {
			return fmt.Errorf("write tap %q: device busy for %v: %w", t.name, tapWritePollTimeout, unix.EAGAIN)
		}
		// A local poll set: Write may run on several goroutines at once.
		pfd := [2]unix.PollFd{
			{Fd: int32(t.fd), Events: unix.POLLOUT},
			{Fd: int32(t.efd), Events: unix.POLLIN},
		}
		if _, err := unix.Poll(pfd[:], int(deadline.Sub(now)/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return fmt.Errorf("poll tap %q: %w", t.name, err)
		}
		if t.state.Load()&tapClosedBit != 0 {
			return os.ErrClosed
		}
	}
}

// Close wakes a blocked Read (which then returns os.ErrClosed), waits for
// Reads and Writes in progress to leave their system calls and closes the
// descriptor. A TAP that OpenTAP created disappears; a persistent one stays
// (without carrier). Close is idempotent: later calls return the first
// call's result.
func (t *TAP) Close() error {
	t.closeOnce.Do(func() {
		old := t.state.Or(tapClosedBit)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1) // eventfd counter increment
		if _, err := unix.Write(t.efd, one[:]); err != nil && err != unix.EAGAIN {
			t.closeErr = fmt.Errorf("close tap %q: wake reader: %w", t.name, err)
		}
		if old&^tapClosedBit != 0 {
			<-t.idle
		}
		if err := unix.Close(t.fd); err != nil && t.closeErr == nil {
			t.closeErr = fmt.Errorf("close tap %q: %w", t.name, err)
		}
		unix.Close(t.efd)
		unix.Close(t.kfd)
	})
	return t.closeErr
}

// Name returns the interface's name (the kernel's choice if
// TAPConfig.Name was empty).
func (t *TAP) Name() string { return t.name }

// FD returns the TAP's descriptor, for handing to other link endpoints in
// comparisons. It stays owned by the TAP and is invalid after Close.
func (t *TAP) FD() int { return t.fd }

// USO reports whether the kernel accepted UDP segmentation offload
// (TUN_F_USO4 and TUN_F_USO6), so that UDP GSO frames (gso_type
// VIRTIO_NET_HDR_GSO_UDP_L4) may be read from and written to the TAP.
func (t *TAP) USO() bool { return t.uso }

// L3 reports whether the device is a TUN (TAPConfig.TUN): its frames are IP
// packets with no Ethernet header, and the driver runs with Config.L3.
func (t *TAP) L3() bool { return t.tun }

// VnetHdr reports whether frames carry a virtio-net header.
func (t *TAP) VnetHdr() bool { return t.vnetHdr }

// VnetHdrLen returns the length of the virtio-net header before each frame:
// VirtioNetHdrTunnelLen with TAPConfig.UDPTunnel, else VirtioNetHdrLen.
func (t *TAP) VnetHdrLen() int { return t.hdrLen }

// HardwareAddr returns the MAC address of the kernel's side of the TAP
// (SIOCGIFHWADDR on the TAP descriptor, so it works from any namespace).
func (t *TAP) HardwareAddr() (net.HardwareAddr, error) {
	if !t.acquire() {
		return nil, os.ErrClosed
	}
	defer t.release()
	mac, err := ioctlHWAddr(t.fd, t.name)
	if err != nil {
		return nil, fmt.Errorf("tap %q: SIOCGIFHWADDR: %w", t.name, err)
	}
	return mac, nil
}
