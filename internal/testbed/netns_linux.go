//go:build linux

package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netns is a network namespace this process created (unshare(2) with
// CLONE_NEWNET) and holds by a file descriptor only: it is not bind-mounted
// under /run/netns and has no name in the kernel, so `ip netns list` does
// not show it. When the process exits, for whatever reason (SIGKILL too),
// the kernel closes the descriptor, and the namespace and every device in
// it go once nothing else refers to them. It starts with only the loopback
// interface, which NewNetns brings up, and no routes beyond those of lo.
// Its methods are safe for concurrent use.
type Netns struct {
	// Name labels the namespace in messages: prefix-PID-N, unique among
	// the namespaces of all processes using testbed. The kernel does not
	// know it; neither `ip netns exec` nor `ip -n` take it.
	Name string

	id uint64 // N in Name, for OpenNetns
	fd int    // the namespace (an nsfs file), O_CLOEXEC

	mu sync.RWMutex
	// h is a netlink handle whose sockets live in the namespace; nil
	// once closed. Read-locked while in use, so that Close never closes
	// it under a caller (a closed handle falls back to sockets of the
	// calling thread's namespace).
	// +checklocks:mu
	h *netlink.Handle

	closeOnce sync.Once
	closeErr  error
}

// NewNetns creates a network namespace labelled prefix-PID-N, where PID is
// this process's id and N a per-process counter, and brings its loopback
// interface up. No default route is added. The namespace is made by an OS
// thread that unshares its network namespace, opens it and then exits:
// the thread is never switched back, so no thread of the process stays in
// the namespace. If anything fails the namespace is released again.
func NewNetns(prefix string) (*Netns, error) {
	if prefix == "" {
		prefix = "ustack"
	}
	id := netnsCounter.Add(1)
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), id)
	fd, err := unshareNetns()
	if err != nil {
		return nil, fmt.Errorf("create netns %q: %w", name, err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(fd), unix.NETLINK_ROUTE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create netns %q: netlink: %w", name, err)
	}
	n := &Netns{Name: name, id: id, fd: fd, h: h}
	trackOpen(id, name)
	err = n.netlink(func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("create netns %q: set lo up: %w", name, err)
	}
	return n, nil
}

// unshareNetns makes a new network namespace and returns a descriptor of
// it. A goroutine locked to its thread unshares the thread's network
// namespace (unshare(2) moves only the calling thread), opens it through
// /proc/thread-self and switches the thread back (setns(2)), so that no
// thread of the process stays in the namespace. The thread is not left to
// die in it instead: the runtime does not end the main thread when a
// goroutine exits locked to it, it parks it for good, which would hold the
// namespace until the process exits. If the switch back fails the
// goroutine exits locked and the runtime discards the thread.
func unshareNetns() (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("open current netns: %w", err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in the process's namespace
			ch <- result{-1, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			err = fmt.Errorf("open new netns: %w", err)
		}
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

// netlink runs fn with the namespace's netlink handle; os.ErrClosed once
// the namespace is closed.
func (n *Netns) netlink(fn func(h *netlink.Handle) error) error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.h == nil {
		return os.ErrClosed
	}
	return fn(n.h)
}

// Close releases the namespace: it closes the descriptor and the netlink
// sockets that hold it. The kernel then destroys it, with every device in
// it, once nothing else refers to it; an open TAP descriptor, a socket
// created inside (Do, DialTCP, ...) or a process started there (Exec) keeps
// it alive, unseen, until they are closed or exit. Close is idempotent:
// later calls return the first call's result.
func (n *Netns) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.h.Close()
		n.h = nil
		n.closeErr = unix.Close(n.fd)
		n.mu.Unlock()
		untrackOpen(n.id)
		if n.closeErr != nil {
			n.closeErr = fmt.Errorf("close netns %q: %w", n.Name, n.closeErr)
		}
	})
	return n.closeErr
}

// Path returns a path that opens the namespace, for setns(2) or a tool's
// --net= option: the descriptor's entry in /proc/PID/fd of this process,
// usable by this process and its children until Close.
func (n *Netns) Path() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), n.fd) }

// Do runs fn on an OS thread switched into the namespace and switches the
// thread back afterwards. Sockets and file descriptors fn creates stay in
// the namespace for their whole life (a socket belongs to the namespace it
// was created in; a /dev/net/tun descriptor to the one it was opened in).
// A process fn starts (os/exec) starts in the namespace too: fork copies
// the calling thread's namespaces.
//
// Only fn's own goroutine runs in the namespace: goroutines fn starts run
// on other threads, in the process's namespace. If the thread cannot be
// switched back it is left locked, so that the Go runtime discards it when
// Do returns rather than reusing a thread in the wrong namespace.
func (n *Netns) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: open current netns: %w", n.Name, err)
	}
	defer unix.Close(orig)
	// The read lock keeps Close from closing the descriptor (and its
	// number from being reused) between the check and setns.
	n.mu.RLock()
	if n.h == nil {
		n.mu.RUnlock()
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: %w", n.Name, os.ErrClosed)
	}
	err = unix.Setns(n.fd, unix.CLONE_NEWNET)
	n.mu.RUnlock()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: setns: %w", n.Name, err)
	}
	// Deferred so that the thread is switched back even if fn panics.
	defer func() {
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		// Otherwise the thread stays locked and exits with the goroutine.
	}()
	return fn()
}

// IP runs `ip args...` inside the namespace, for callers that want ip(8)
// itself (testbed does not use it). The error includes ip's combined
// output.
func (n *Netns) IP(args ...string) error {
	cmd := exec.Command("ip", args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.run(cmd); err != nil {
		return fmt.Errorf("ip %s (netns %s): %w: %s", strings.Join(args, " "), n.Name, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Output runs `ip args...` inside the namespace and returns its standard
// output. The error includes ip's standard error.
func (n *Netns) Output(args ...string) (string, error) {
	cmd := exec.Command("ip", args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := n.run(cmd); err != nil {
		return stdout.String(), fmt.Errorf("ip %s (netns %s): %w: %s", strings.Join(args, " "), n.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// run starts cmd from a thread inside the namespace (Do: the child
// inherits the thread's network namespace) and waits for it. It is the
// cheap way in for a command testbed starts and waits for itself; Exec,
// whose caller starts the command, re-executes the binary instead.
func (n *Netns) run(cmd *exec.Cmd) error {
	if err := n.Do(cmd.Start); err != nil {
		return err
	}
	return cmd.Wait()
}

// DialTCP connects a TCP socket created inside the namespace to raddr. If
// cc is not empty the socket's congestion control is set to it
// (TCP_CONGESTION) before connecting; an algorithm the kernel does not have
// (ENOENT) or does not allow (EPERM) makes DialTCP fail.
func (n *Netns) DialTCP(ctx context.Context, raddr netip.AddrPort, cc string) (*net.TCPConn, error) {
	d := net.Dialer{}
	if cc != "" {
		d.Control = func(network, address string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
			}); err != nil {
				return err
			}
			if serr != nil {
				if errors.Is(serr, unix.ENOENT) {
					return fmt.Errorf("set TCP_CONGESTION %q: %w (algorithm not available: is its module loaded? see /proc/sys/net/ipv4/tcp_available_congestion_control)", cc, serr)
				}
				return fmt.Errorf("set TCP_CONGESTION %q: %w", cc, serr)
			}
			return nil
		}
	}
	var conn net.Conn
	err := n.Do(func() error {
		var err error
		conn, err = d.DialContext(ctx, "tcp", raddr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %q: dial tcp %s: %w", n.Name, raddr, err)
	}
	return conn.(*net.TCPConn), nil
}

// ListenTCP opens a TCP listener inside the namespace on laddr (port 0
// picks a free port; see the listener's Addr).
func (n *Netns) ListenTCP(laddr netip.AddrPort) (*net.TCPListener, error) {
	var l *net.TCPListener
	err := n.Do(func() error {
		var err error
		l, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(laddr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %q: listen tcp %s: %w", n.Name, laddr, err)
	}
	return l, nil
}

// ListenUDP opens a UDP socket inside the namespace bound to laddr.
func (n *Netns) ListenUDP(laddr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(laddr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %q: listen udp %s: %w", n.Name, laddr, err)
	}
	return c, nil
}

// DialUDP opens a UDP socket inside the namespace connected to raddr, with
// a local address and port chosen by the kernel.
func (n *Netns) DialUDP(raddr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(raddr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %q: dial udp %s: %w", n.Name, raddr, err)
	}
	return c, nil
}

// CongestionControl returns the congestion control algorithm c uses
// (TCP_CONGESTION), for recording what a measurement ran with.
func CongestionControl(c *net.TCPConn) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", fmt.Errorf("get TCP_CONGESTION: %w", err)
	}
	var cc string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cc, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		return "", fmt.Errorf("get TCP_CONGESTION: %w", err)
	}
	if gerr != nil {
		return "", fmt.Errorf("get TCP_CONGESTION: %w", gerr)
	}
	return cc, nil
}

// NewVethPair creates a veth pair with nameA in a and nameB in b, sets both
// ends' MTU to mtu (unless mtu is 0) and brings both up, over netlink (as
// `ip link add NAMEA mtu MTU type veth peer name NAMEB mtu MTU netns B`).
// Addresses are left to the caller. If any step fails the pair is deleted
// again. Releasing either namespace deletes the pair once the kernel
// destroys it.
func NewVethPair(a, b *Netns, nameA, nameB string, mtu int) error {
	// NewLinkAttrs and a PeerTxQLen of -1: no IFLA_TXQLEN, so both ends
	// keep the driver's default queue length, as with ip(8).
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = nameA, mtu
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: nameB, PeerMTU: uint32(mtu), PeerTxQLen: -1}
	bfd, err := b.dupFD()
	if err != nil {
		return fmt.Errorf("create veth %s/%s: %w", nameA, nameB, err)
	}
	veth.PeerNamespace = netlink.NsFd(bfd)
	err = a.netlink(func(h *netlink.Handle) error { return h.LinkAdd(veth) })
	unix.Close(bfd)
	if err != nil {
		return fmt.Errorf("create veth %s/%s: %w", nameA, nameB, err)
	}
	for _, step := range []struct {
		ns   *Netns
		name string
	}{{a, nameA}, {b, nameB}} {
		if err := step.ns.SetLinkUp(step.name); err != nil {
			a.netlink(func(h *netlink.Handle) error { return h.LinkDel(veth) }) // takes the peer with it
			return fmt.Errorf("create veth %s/%s: %w", nameA, nameB, err)
		}
	}
	return nil
}

// dupFD returns a new descriptor of the namespace (close-on-exec), for the
// caller to close; os.ErrClosed once the namespace is closed.
func (n *Netns) dupFD() (int, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.h == nil {
		return -1, os.ErrClosed
	}
	return unix.FcntlInt(uintptr(n.fd), unix.F_DUPFD_CLOEXEC, 0)
}

// link returns the device called name in the namespace.
func (n *Netns) link(name string) (netlink.Link, error) {
	var l netlink.Link
	err := n.netlink(func(h *netlink.Handle) error {
		var err error
		l, err = h.LinkByName(name)
		return err
	})
	return l, err
}

// SetLinkUp brings the device called name in the namespace up (`ip link
// set dev NAME up`).
func (n *Netns) SetLinkUp(name string) error {
	err := n.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		return h.LinkSetUp(l)
	})
	if err != nil {
		return fmt.Errorf("netns %q: set %s up: %w", n.Name, name, err)
	}
	return nil
}

// SetLinkMTU sets the MTU of the device called name in the namespace
// (`ip link set dev NAME mtu MTU`).
func (n *Netns) SetLinkMTU(name string, mtu int) error {
	err := n.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		return h.LinkSetMTU(l, mtu)
	})
	if err != nil {
		return fmt.Errorf("netns %q: set %s mtu %d: %w", n.Name, name, mtu, err)
	}
	return nil
}

// AddAddr gives the device called name in the namespace the address p
// (`ip addr add P dev NAME`, no broadcast address; IPv6 with nodad, so
// that it is usable at once rather than after duplicate address
// detection).
func (n *Netns) AddAddr(name string, p netip.Prefix) error {
	err := n.netlink(func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		return h.AddrAdd(l, nlAddr(p))
	})
	if err != nil {
		return fmt.Errorf("netns %q: add address %s to %s: %w", n.Name, p, name, err)
	}
	return nil
}

// nlAddr is p as AddrAdd and AddrDel take it: IPv4 without a broadcast
// address, IPv6 without duplicate address detection (IFA_F_NODAD).
func nlAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: prefixNet(p)}
	if p.Addr().Is4() {
		a.Broadcast = net.IPv4zero // none, as ip(8) without brd
	} else {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// prefixNet is p as a *net.IPNet, the address not masked.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// SNMP returns the counters of one protocol line of the namespace's
// /proc/net/snmp ("Udp", "Tcp", "Ip", ...), by name.
func (n *Netns) SNMP(proto string) (map[string]uint64, error) {
	var data []byte
	err := n.Do(func() error {
		var err error
		// thread-self: /proc/net follows the calling thread's namespace.
		data, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read snmp in %s: %w", n.Name, err)
	}
	var names []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		m := map[string]uint64{}
		for i := 1; i < len(f) && i < len(names); i++ {
			m[names[i]], _ = strconv.ParseUint(f[i], 10, 64)
		}
		return m, nil
	}
	return nil, fmt.Errorf("read snmp in %s: no %s counters", n.Name, proto)
}

// SetDevAttr writes value to /sys/class/net/DEV/ATTR as the namespace sees
// it, e.g. gro_flush_timeout or napi_defer_hard_irqs, as the kernel's
// tools/testing/selftests/net/setup_veth.sh does. The process's /sys shows
// the devices of the namespace that mounted it, so, as `ip netns exec`
// does, the write is made by a child (this binary re-executed, see
// writeSysfs) started inside the namespace with a mount namespace of its
// own (CLONE_NEWNS; os/exec then makes its mounts private), which mounts a
// sysfs over /sys (sysfs shows the mounting task's network namespace) and
// writes the file. A thread of this process could do the same only by
// leaving its file system context unshared for good.
func (n *Netns) SetDevAttr(dev, attr, value string) error {
	if dev == "" || attr == "" || strings.ContainsAny(dev+attr, "/ ") || dev == ".." || attr == ".." {
		return fmt.Errorf("netns %q: bad sysfs attribute %q/%q", n.Name, dev, attr)
	}
	path := "/sys/class/net/" + dev + "/" + attr
	cmd := exec.Command("/proc/self/exe", sysfsArg0, path, value)
	cmd.Args = cmd.Args[1:] // argv[0] is the mark
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.run(cmd); err != nil {
		return fmt.Errorf("netns %q: write %s: %w: %s", n.Name, path, err, strings.TrimSpace(out.String()))
	}
	return nil
}
