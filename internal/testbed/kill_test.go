//go:build linux

package testbed

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// killChildEnv names the TAP device a re-executed TestKilledLeavesNothing
// child makes.
const killChildEnv = "TESTBED_KILL_CHILD_TAP"

// TestKilledLeavesNothing runs the test binary again as a child that builds
// a TAP bed, attaches a descriptor to the TAP, reports its namespace and
// device, and waits to be killed. After a SIGKILL, which runs no cleanup,
// no namespace that this process can reach (through any process's threads
// or descriptors, or a mount in /run/netns) holds the device, nor does this
// process's own namespace, where a device of a dying namespace would land
// if the kernel handed it back (default_device_exit_net) rather than
// deleting it.
func TestKilledLeavesNothing(t *testing.T) {
	if tap := os.Getenv(killChildEnv); tap != "" {
		killChild(tap)
		return
	}
	needRoot(t)
	tap := fmt.Sprintf("tbk%d", os.Getpid())
	if len(tap) >= unix.IFNAMSIZ {
		tap = tap[:unix.IFNAMSIZ-1]
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledLeavesNothing$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+tap)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	var report string
	select {
	case report = <-line:
	case <-time.After(60 * time.Second):
		t.Fatal("child did not report its bed within 60 s")
	}
	var name, dev string
	var ifindex int
	var ino uint64
	if n, err := fmt.Sscanf(report, "bed %s %s %d %d", &name, &dev, &ifindex, &ino); n != 4 {
		t.Fatalf("child reported %q: %v", report, err)
	}
	if dev != tap {
		t.Fatalf("child's TAP: got %s, want %s", dev, tap)
	}
	// While the child lives its namespace is reachable and has the TAP.
	if got := netnsHolding(t, tap); len(got) != 1 || !strings.Contains(got[0], fmt.Sprintf("net:[%d]", ino)) {
		t.Fatalf("namespaces with %s while the child runs: got %v, want net:[%d]", tap, got, ino)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true

	if netnsMounted(name) {
		t.Errorf("%s left mounted in /run/netns", name)
	}
	if got := netnsHolding(t, tap); len(got) != 0 {
		t.Errorf("%s (ifindex %d, child's net:[%d]) survives its SIGKILLed creator in %v", tap, ifindex, ino, got)
	}
	if _, err := netlink.LinkByName(tap); err == nil {
		t.Errorf("%s found in this process's namespace after its creator's SIGKILL", tap)
	}
}

// killChild is the child of TestKilledLeavesNothing: it makes a bed with
// the TAP device tap, attaches a descriptor, prints "bed NAME TAP IFINDEX
// NETNS-INODE" and waits for its SIGKILL.
func killChild(tap string) {
	b, err := NewTAPBed(TAPConfig{Prefix: "tbkill", TAPName: tap})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := b.Open(func() error { _, err := attachTAP(tap); return err }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	l, err := b.NS.link(tap)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var st unix.Stat_t
	if err := unix.Stat(b.NS.Path(), &st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("bed %s %s %d %d\n", b.NS.Name, tap, l.Attrs().Index, st.Ino)
	time.Sleep(5 * time.Minute) // killed long before
	os.Exit(3)
}

// netnsHolding returns the network namespaces this process can reach that
// have a device called dev, each as "net:[INODE] via PATH". It looks at
// every process's threads (/proc/*/task/*/ns/net) and descriptors
// (/proc/*/fd/*) and at /run/netns.
func netnsHolding(t *testing.T, dev string) []string {
	t.Helper()
	seen := map[string]string{} // net:[INODE] -> a path that opens it
	add := func(p string) {
		l, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(l, "net:[") {
			return
		}
		if _, ok := seen[l]; !ok {
			seen[l] = p
		}
	}
	for _, pattern := range []string{"/proc/[0-9]*/task/[0-9]*/ns/net", "/proc/[0-9]*/fd/[0-9]*"} {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			add(p)
		}
	}
	mounted, _ := filepath.Glob("/run/netns/*")
	for _, p := range mounted {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			l := fmt.Sprintf("net:[%d]", st.Ino)
			if _, ok := seen[l]; !ok {
				seen[l] = p
			}
		}
	}
	var found []string
	for l, p := range seen {
		ns, err := netns.GetFromPath(p)
		if err != nil {
			continue // gone meanwhile
		}
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		ns.Close()
		if err != nil {
			continue
		}
		if _, err := h.LinkByName(dev); err == nil {
			found = append(found, l+" via "+p)
		}
		h.Close()
	}
	return found
}
