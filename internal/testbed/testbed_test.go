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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns; run go test as root")
	}
}

// waitFor polls cond until it holds, failing t (naming what) after 30 s.
// (testutil.WaitFor cannot be used here: testutil imports testbed.)
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func newNetns(t *testing.T) *Netns {
	t.Helper()
	ns, err := NewNetns("tbtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	return ns
}

// isOpen reports whether OpenNetns lists name.
func isOpen(name string) bool { return slices.Contains(OpenNetns(), name) }

// netnsMounted reports whether a namespace called name is bind-mounted in
// /run/netns, where `ip netns add` puts them.
func netnsMounted(name string) bool {
	_, err := os.Lstat(filepath.Join("/run/netns", name))
	return err == nil
}

func TestNetnsLifecycle(t *testing.T) {
	needRoot(t)
	a, err := NewNetns("tbtest")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewNetns("tbtest")
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	defer b.Close()
	if a.Name == b.Name {
		t.Errorf("two namespaces named %q", a.Name)
	}
	if !strings.HasPrefix(a.Name, "tbtest-") {
		t.Errorf("name %q lacks prefix", a.Name)
	}
	if !isOpen(a.Name) || !isOpen(b.Name) {
		t.Fatalf("OpenNetns: got %v, want %s and %s in it", OpenNetns(), a.Name, b.Name)
	}
	if netnsMounted(a.Name) {
		t.Errorf("%s is mounted in /run/netns: want it held by a descriptor only", a.Name)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if isOpen(a.Name) {
		t.Errorf("%s still in OpenNetns after Close", a.Name)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := a.Do(func() error { return nil }); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Do after Close: got %v, want os.ErrClosed", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// netnsIno returns the inode of the namespace at path (an nsfs file).
func netnsIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// netnsRefs returns where this process refers to the network namespace
// with inode ino: its descriptors (/proc/self/fd) and its threads
// (/proc/self/task/*/ns/net).
func netnsRefs(t *testing.T, ino uint64) []string {
	t.Helper()
	want := fmt.Sprintf("net:[%d]", ino)
	var refs []string
	paths, _ := filepath.Glob("/proc/self/task/*/ns/net")
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, p := range append(paths, fds...) {
		if l, err := os.Readlink(p); err == nil && l == want {
			refs = append(refs, p)
		}
	}
	return refs
}

// TestNetnsClose checks that Close lets go of the namespace: no descriptor
// or thread of the process refers to it any more, its Path no longer opens
// it, and a veth whose peer is in it disappears with it.
func TestNetnsClose(t *testing.T) {
	needRoot(t)
	a := newNetns(t)
	b, err := NewNetns("tbtest")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := NewVethPair(a, b, "tbxa", "tbxb", 0); err != nil {
		t.Fatal(err)
	}
	path := b.Path()
	ino := netnsIno(t, path)
	if refs := netnsRefs(t, ino); len(refs) == 0 {
		t.Fatalf("no descriptor of net:[%d] (%s) before Close", ino, path)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if refs := netnsRefs(t, ino); len(refs) != 0 {
		t.Errorf("net:[%d] still referred to after Close: %v", ino, refs)
	}
	// The descriptor's number may be reused: then it must name something else.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil && st.Ino == ino {
		t.Errorf("%s still opens net:[%d] after Close", path, ino)
	}
	// The kernel destroys the namespace, and the veth with it,
	// asynchronously (cleanup_net).
	waitFor(t, "tbxa to go with its peer's namespace", func() bool {
		_, err := a.link("tbxa")
		return err != nil
	})
}

func TestNetnsDo(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	nsIno := func() uint64 {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	var want unix.Stat_t
	if err := unix.Stat(ns.Path(), &want); err != nil {
		t.Fatal(err)
	}
	err := ns.Do(func() error {
		if got := nsIno(); got != want.Ino {
			t.Errorf("inside Do: netns inode %d, want %d", got, want.Ino)
		}
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		if len(ifs) != 1 || ifs[0].Name != "lo" {
			t.Errorf("interfaces inside: %v, want only lo", ifs)
		} else if ifs[0].Flags&net.FlagUp == 0 {
			t.Errorf("lo is down inside the namespace")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// fn's error comes back unchanged.
	sentinel := errors.New("sentinel")
	if err := ns.Do(func() error { return sentinel }); err != sentinel {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	// No default route.
	out, err := ns.Output("route", "show", "default")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("default route in new namespace: %q %v", out, err)
	}
}

func TestNetnsIPError(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	err := ns.IP("link", "set", "dev", "nonexistent0", "up")
	if err == nil || !strings.Contains(err.Error(), "nonexistent0") {
		t.Errorf("IP on a missing device: %v, want an error with ip's output", err)
	}
}

func TestNetnsExec(t *testing.T) {
	needRoot(t)
	b := newTAPBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// /proc/net follows the reading process's network namespace.
	out, err := b.NS.Exec(ctx, "cat", "/proc/net/dev").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var devs []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			devs = append(devs, strings.TrimSpace(name))
		}
	}
	slices.Sort(devs)
	if want := []string{"lo", b.TAPName}; !slices.Equal(devs, want) {
		t.Errorf("devices the command sees: got %v, want %v", devs, want)
	}
	// Args, the environment and the exit status reach the program.
	cmd := b.NS.Exec(ctx, "sh", "-c", `echo "$0 $TBVAR"; exit 7`, "arg0")
	cmd.Env = append(os.Environ(), "TBVAR=set")
	out, err = cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || string(out) != "arg0 set\n" {
		t.Errorf("sh: got %q, %v; want \"arg0 set\\n\" and exit status 7", out, err)
	}
	// A missing program fails Start, as with exec.Command.
	if err := b.NS.Exec(ctx, "testbed-no-such-program").Run(); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing program: got %v, want exec.ErrNotFound", err)
	}
}

// TestNetnsExecCancel checks exec.CommandContext's semantics through the
// re-execution: cancelling ctx kills the program itself (it has the pid
// Start returned), and Wait works from another goroutine.
func TestNetnsExecCancel(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := ns.Exec(ctx, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// The process becomes sleep itself, in the namespace.
	waitFor(t, "the child to exec sleep", func() bool {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return err == nil && string(comm) == "sleep\n"
	})
	if got, want := netnsIno(t, fmt.Sprintf("/proc/%d/ns/net", pid)), netnsIno(t, ns.Path()); got != want {
		t.Errorf("sleep's netns: got inode %d, want %d", got, want)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("Wait after cancel: got %v, want killed by SIGKILL", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("sleep still running %v after cancel", time.Since(start))
	}
}

func TestTAPBed(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name           string
		cfg            TAPConfig
		wantTAP        string
		wantMTU        int
		wantK4, wantS4 string
		wantK6, wantS6 string
	}{
		{"defaults", TAPConfig{}, "ustap0", 1500, "10.77.0.1/24", "10.77.0.2/24", "fd77::1/64", "fd77::2/64"},
		{"custom", TAPConfig{
			Prefix:  "tbtap",
			TAPName: "tbtap7",
			MTU:     9000,
			Subnet4: netip.MustParsePrefix("10.78.5.0/24"),
			Subnet6: netip.MustParsePrefix("fd78:5::/64"),
		}, "tbtap7", 9000, "10.78.5.1/24", "10.78.5.2/24", "fd78:5::1/64", "fd78:5::2/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewTAPBed(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					b.Close()
				}
			})
			if b.TAPName != tt.wantTAP || b.MTU != tt.wantMTU {
				t.Errorf("bed %s mtu %d, want %s mtu %d", b.TAPName, b.MTU, tt.wantTAP, tt.wantMTU)
			}
			for _, c := range []struct {
				got  netip.Prefix
				want string
			}{{b.KernelAddr4, tt.wantK4}, {b.StackAddr4, tt.wantS4}, {b.KernelAddr6, tt.wantK6}, {b.StackAddr6, tt.wantS6}} {
				if c.got.String() != c.want {
					t.Errorf("address %s, want %s", c.got, c.want)
				}
			}
			out, err := b.NS.Output("addr", "show", "dev", b.TAPName)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"mtu " + strconv.Itoa(tt.wantMTU),
				"link/ether",
				"inet " + tt.wantK4,
				"inet6 " + tt.wantK6,
				",UP",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("ip addr show lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, tt.wantS4) {
				t.Errorf("kernel has the stack's address:\n%s", out)
			}
			out, err = b.NS.Output("-d", "link", "show", "dev", b.TAPName)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "tun type tap") || !strings.Contains(out, "persist on") {
				t.Errorf("not a persistent TAP:\n%s", out)
			}
			out, err = b.NS.Output("route", "show", "default")
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("default route: %q %v", out, err)
			}
			// Do runs inside the namespace.
			var names []string
			if err := b.NS.Do(func() error {
				ifs, err := net.Interfaces()
				for _, i := range ifs {
					names = append(names, i.Name)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if len(names) != 2 || names[1] != tt.wantTAP {
				t.Errorf("interfaces in bed: %v", names)
			}

			// Without a descriptor attached the link never comes up.
			if err := b.WaitReady(50 * time.Millisecond); err == nil {
				t.Error("WaitReady succeeded with no descriptor attached")
			}
			// Open attaches one from inside the namespace and waits.
			fd := -1
			if err := b.Open(func() (err error) {
				fd, err = attachTAP(b.TAPName)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			out, err = b.NS.Output("-o", "link", "show", "dev", b.TAPName)
			unix.Close(fd)
			if err != nil || !strings.Contains(out, "state UP") {
				t.Errorf("after Open: %q %v", out, err)
			}

			closed = true
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if isOpen(b.NS.Name) {
				t.Errorf("%s still open after Close", b.NS.Name)
			}
			if err := b.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

func TestTAPBedBadConfig(t *testing.T) {
	needRoot(t)
	before := len(OpenNetns())
	tests := []struct {
		name string
		cfg  TAPConfig
	}{
		{"v6 subnet as Subnet4", TAPConfig{Subnet4: netip.MustParsePrefix("fd00::/64")}},
		{"v4 subnet as Subnet6", TAPConfig{Subnet6: netip.MustParsePrefix("10.0.0.0/24")}},
		{"too long a name", TAPConfig{TAPName: "a-name-far-too-long-for-linux"}},
		{"bad mtu", TAPConfig{MTU: 40}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewTAPBed(tt.cfg)
			if err == nil {
				b.Close()
				t.Fatal("NewTAPBed succeeded")
			}
			t.Log(err)
		})
	}
	if after := len(OpenNetns()); after != before {
		t.Errorf("%d namespaces before, %d after failed NewTAPBed calls", before, after)
	}
}

func TestDialTCPCongestion(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	l, err := ns.ListenTCP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raddr := l.Addr().(*net.TCPAddr).AddrPort()
	tests := []struct {
		cc, want string
		wantErr  error
	}{
		{"", "", nil}, // kernel default; whatever it is
		{"cubic", "cubic", nil},
		{"reno", "reno", nil},
		{"no-such-cc", "", unix.ENOENT},
	}
	for _, tt := range tests {
		name := tt.cc
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := ns.DialTCP(ctx, raddr, tt.cc)
			if tt.wantErr != nil {
				if err == nil {
					c.Close()
					t.Fatalf("DialTCP with cc %q succeeded", tt.cc)
				}
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("DialTCP: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					t.Fatalf("congestion control %q is not available in this kernel (build tcp_%s in or modprobe it): %v", tt.cc, tt.cc, err)
				}
				t.Fatal(err)
			}
			defer c.Close()
			got, err := CongestionControl(c)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != "" && got != tt.want {
				t.Errorf("CongestionControl = %q, want %q", got, tt.want)
			}
			t.Logf("cc %q", got)
			// The connection is real: the listener accepts it.
			s, err := l.AcceptTCP()
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
		})
	}
}

func TestUDPInNetns(t *testing.T) {
	needRoot(t)
	ns := newNetns(t)
	srv, err := ns.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := ns.DialUDP(srv.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 16)
	n, _, err := srv.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

func TestVethPair(t *testing.T) {
	needRoot(t)
	a, b := newNetns(t), newNetns(t)
	if err := NewVethPair(a, b, "tbva", "tbvb", 4000); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		ns   *Netns
		dev  string
		addr string
	}{{a, "tbva", "10.79.0.1/24"}, {b, "tbvb", "10.79.0.2/24"}} {
		if err := s.ns.AddAddr(s.dev, netip.MustParsePrefix(s.addr)); err != nil {
			t.Fatal(err)
		}
		out, err := s.ns.Output("link", "show", "dev", s.dev)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "mtu 4000") || !strings.Contains(out, "UP") {
			t.Errorf("%s: %s", s.dev, out)
		}
	}
	srv, err := b.ListenUDP(netip.MustParseAddrPort("10.79.0.2:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := a.DialUDP(srv.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// ARP may take a moment on a fresh link; a few bounded tries.
	buf := make([]byte, 16)
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; ; i++ {
		if i == 10 || time.Now().After(deadline) {
			t.Fatal("no datagram crossed the veth pair")
		}
		if _, err := cli.Write([]byte("veth")); err != nil {
			t.Fatal(err)
		}
		srv.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, from, err := srv.ReadFromUDPAddrPort(buf)
		if err == nil {
			if string(buf[:n]) != "veth" || from.Addr() != netip.MustParseAddr("10.79.0.1") {
				t.Fatalf("got %q from %v", buf[:n], from)
			}
			break
		}
	}
	// Deleting a namespace removes the pair from the other, once the
	// kernel's asynchronous namespace cleanup has run. The socket opened in
	// a holds a reference to it, so close that first.
	cli.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for b.IP("link", "show", "dev", "tbvb") == nil {
		if time.Now().After(deadline) {
			t.Fatal("tbvb survived deleting its peer's namespace")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCleanupOnSignal runs the test binary again as a child that arranges
// cleanup and then signals itself.
func TestCleanupOnSignal(t *testing.T) {
	if mark := os.Getenv("TESTBED_SIGNAL_CHILD"); mark != "" {
		stop := CleanupOnSignal(closerFunc(func() error {
			return os.WriteFile(mark, []byte("closed"), 0o600)
		}))
		defer stop()
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		time.Sleep(10 * time.Second) // killed before this ends
		os.Exit(0)
	}
	t.Run("signal", func(t *testing.T) {
		mark := t.TempDir() + "/closed"
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCleanupOnSignal$")
		cmd.Env = append(os.Environ(), "TESTBED_SIGNAL_CHILD="+mark)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
			t.Fatalf("child: %v, want exit status %d; output:\n%s", err, 128+int(syscall.SIGTERM), out)
		}
		if b, err := os.ReadFile(mark); err != nil || string(b) != "closed" {
			t.Errorf("closer did not run: %q %v", b, err)
		}
	})
	t.Run("stop", func(t *testing.T) {
		closed := false
		stop := CleanupOnSignal(closerFunc(func() error { closed = true; return nil }))
		stop()
		stop()
		if closed {
			t.Error("stop closed the closers")
		}
	})
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// attachTAP opens /dev/net/tun and attaches it to the TAP device name in
// the calling thread's namespace.
func attachTAP(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// TestSetDevAttr writes a veth's sysfs attributes as its namespace sees
// them: the write reaches the device in the namespace (its MTU changes),
// and the process's own /sys, which shows the host's devices, is left as
// it was.
func TestSetDevAttr(t *testing.T) {
	needRoot(t)
	a, b := newNetns(t), newNetns(t)
	if err := NewVethPair(a, b, "tbsa", "tbsb", 0); err != nil {
		t.Fatal(err)
	}
	if err := a.SetDevAttr("tbsa", "mtu", "1400"); err != nil {
		t.Fatal(err)
	}
	l, err := a.link("tbsa")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Attrs().MTU; got != 1400 {
		t.Errorf("tbsa's MTU after writing its sysfs mtu: got %d, want 1400", got)
	}
	if err := a.SetDevAttr("tbsa", "gro_flush_timeout", "20000"); err != nil {
		t.Fatal(err)
	}
	// The device is looked up in the namespace, not the caller's.
	if err := b.SetDevAttr("tbsa", "mtu", "1300"); err == nil {
		t.Error("SetDevAttr of a device in another namespace succeeded")
	}
	if _, err := os.Stat("/sys/class/net/tbsa"); err == nil {
		t.Error("tbsa shows in the process's /sys")
	}
	if err := a.SetDevAttr("../tbsa", "mtu", "1300"); err == nil {
		t.Error("SetDevAttr took a path as the device's name")
	}
}
