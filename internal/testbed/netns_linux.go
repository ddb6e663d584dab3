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
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// netnsDir is where ip-netns(8) bind-mounts the namespaces it creates.
const netnsDir = "/run/netns"

// netnsCounter makes namespace names unique within this process.
var netnsCounter atomic.Uint64

// Netns is a network namespace this process created with `ip netns add`.
// It starts with only the loopback interface, which NewNetns brings up, and
// no routes beyond those of lo. Its methods are safe for concurrent use.
type Netns struct {
	// Name is the namespace's name, as given to `ip netns` and shown by
	// `ip netns list`.
	Name string

	closeOnce sync.Once
	closeErr  error
}

// NewNetns creates a network namespace named prefix-PID-N, where PID is this
// process's id and N a per-process counter, and brings its loopback
// interface up. No default route is added. If bringing lo up fails the
// namespace is deleted again.
func NewNetns(prefix string) (*Netns, error) {
	if prefix == "" {
		prefix = "ustack"
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), netnsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create netns %q: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	n := &Netns{Name: name}
	if err := n.IP("link", "set", "dev", "lo", "up"); err != nil {
		n.Close()
		return nil, fmt.Errorf("create netns %q: %w", name, err)
	}
	return n, nil
}

// Close deletes the namespace (`ip netns del`). Devices in it that no
// process holds open are destroyed with it; a namespace some descriptor
// still refers to (an open TAP, a socket) disappears from `ip netns list`
// at once but lives on until that descriptor is closed. Close is
// idempotent: later calls return the first call's result.
func (n *Netns) Close() error {
	n.closeOnce.Do(func() {
		out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput()
		if err != nil {
			n.closeErr = fmt.Errorf("delete netns %q: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
		}
	})
	return n.closeErr
}

// Path returns the namespace's bind-mount, a file that can be opened and
// passed to setns(2).
func (n *Netns) Path() string { return filepath.Join(netnsDir, n.Name) }

// Do runs fn on an OS thread switched into the namespace and switches the
// thread back afterwards. Sockets and file descriptors fn creates stay in
// the namespace for their whole life (a socket belongs to the namespace it
// was created in; a /dev/net/tun descriptor to the one it was opened in).
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
	target, err := unix.Open(n.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: open %s: %w", n.Name, n.Path(), err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
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

// IP runs `ip -n NAME args...`. The error includes ip's combined output.
func (n *Netns) IP(args ...string) error {
	full := append([]string{"-n", n.Name}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(full, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Output runs `ip -n NAME args...` and returns its standard output. The
// error includes ip's standard error.
func (n *Netns) Output(args ...string) (string, error) {
	full := append([]string{"-n", n.Name}, args...)
	cmd := exec.Command("ip", full...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %w: %s", strings.Join(full, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Exec returns a command that runs name with args inside the namespace
// (`ip netns exec NAME name args...`). ctx bounds its life as in
// exec.CommandContext; the caller starts and waits for it.
func (n *Netns) Exec(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
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
// ends' MTU to mtu (unless mtu is 0) and brings both up. Addresses are left
// to the caller (a.IP("addr", "add", ...)). If any step fails the pair is
// deleted again. Deleting either namespace deletes the pair.
func NewVethPair(a, b *Netns, nameA, nameB string, mtu int) error {
	args := []string{"link", "add", "dev", nameA}
	if mtu > 0 {
		args = append(args, "mtu", strconv.Itoa(mtu))
	}
	args = append(args, "type", "veth", "peer", "name", nameB)
	if mtu > 0 {
		args = append(args, "mtu", strconv.Itoa(mtu))
	}
	args = append(args, "netns", b.Name)
	if err := a.IP(args...); err != nil {
		return fmt.Errorf("create veth %s/%s: %w", nameA, nameB, err)
	}
	for _, step := range []struct {
		ns   *Netns
		name string
	}{{a, nameA}, {b, nameB}} {
		if err := step.ns.IP("link", "set", "dev", step.name, "up"); err != nil {
			a.IP("link", "del", "dev", nameA) // takes the peer with it
			return fmt.Errorf("create veth %s/%s: %w", nameA, nameB, err)
		}
	}
	return nil
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
// it (`ip netns exec` mounts the namespace's own sysfs), e.g.
// gro_flush_timeout or napi_defer_hard_irqs, as the kernel's
// tools/testing/selftests/net/setup_veth.sh does.
func (n *Netns) SetDevAttr(dev, attr, value string) error {
	if strings.ContainsAny(dev+attr, "/ ") || strings.ContainsAny(value, "'\n") {
		return fmt.Errorf("netns %q: bad sysfs attribute %q/%q", n.Name, dev, attr)
	}
	path := "/sys/class/net/" + dev + "/" + attr
	out, err := n.Exec(context.Background(), "sh", "-c", "echo '"+value+"' > "+path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns %q: write %s: %w: %s", n.Name, path, err, strings.TrimSpace(string(out)))
	}
	return nil
}
