//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// TestShutdownMidTransfer closes the stack while TCP flows of both
// families and a UDP flow are in full swing: Close must return promptly,
// every RX page must be back in the pool, the stack's readers must end
// with an error rather than hang, what arrived must be an intact prefix of
// each stream, and no goroutine may be left (goleak).
func TestShutdownMidTransfer(t *testing.T) {
	needRoot(t)
	hash, err := cpumap.ParseProgram("hash", 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name string
		sc   stack.Config
	}{
		{"lro", stack.Config{Driver: driver.Config{LRO: true}}},
		{"hw-gro", stack.Config{Driver: driver.Config{HWGRO: driver.HWGROOn}}},
		{"cpumap", stack.Config{XDP: hash, CPUMap: []int{0, 1}}},
		{"no-recycle/small-pool", stack.Config{Driver: driver.Config{}, Pool: bufpool.Config{NoRecycle: true, MaxPages: 512}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := record("TestShutdownMidTransfer")
			leaks := goleak.IgnoreCurrent()
			r := newRigConfig(t, fmt.Sprintf("usit-shut%d", i), 1500, tc.sc)
			deadline := time.Now().Add(2 * time.Minute)
			var flows []*bulkFlow
			for j, v6 := range []bool{false, true, false} {
				flows = append(flows, startBulk(t, r, v6, uint16(7000+j), 256<<20, uint64(800+10*i+j), deadline))
			}
			// A UDP flow into a socket nobody closes before the stack.
			u, err := r.st.ListenUDP(r.stackAP(false, 5353))
			if err != nil {
				t.Fatal(err)
			}
			k, err := r.bed.NS.DialUDP(r.stackAP(false, 5353))
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			udpStop := make(chan struct{})
			udpDone := make(chan struct{})
			go func() {
				defer close(udpDone)
				msg := make([]byte, 1000)
				for seq := uint32(0); seq < 1e6 && time.Now().Before(deadline); seq++ {
					select {
					case <-udpStop:
						return
					default:
					}
					fillDatagram(msg, seq)
					k.Write(msg) // the stack may be gone: errors do not matter
					if seq%16 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			}()
			udpRead := make(chan error, 1)
			go func() {
				buf := make([]byte, 2048)
				for {
					m, _, err := u.ReadFrom(buf)
					if err != nil {
						udpRead <- nil
						return
					}
					if _, err := parseDatagram(buf[:m]); err != nil {
						udpRead <- err
						return
					}
				}
			}()

			// Close once every flow has moved a few MB.
			if !waitUntil(time.Minute, func() bool {
				for _, f := range flows {
					if f.got.Load() < 4<<20 {
						return false
					}
				}
				return true
			}) {
				diagnose(t, r)
				t.Fatal("flows did not reach 4 MB each within a minute")
			}
			start := time.Now()
			closed := make(chan struct{})
			go func() { r.close(t); close(closed) }()
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				t.Fatal("stack Close did not return within 30s of a mid-transfer close")
			}
			tl.faults.Add(1)
			t.Logf("Close mid-transfer took %v", time.Since(start).Round(time.Millisecond))
			// Close returns with every page back (r.close checked it).
			var moved int64
			for _, f := range flows {
				moved += f.abort(t, tl)
			}
			close(udpStop)
			<-udpDone
			select {
			case err := <-udpRead:
				if err != nil {
					t.Errorf("udp reader: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("udp reader did not end within 10s of Close")
			}
			u.Close()
			t.Logf("%d MB arrived intact before the close", moved>>20)
			goleak.VerifyNone(t, leaks)
		})
	}
}

// finalCounter matches one counter line of `ustack run`'s counters block.
func finalCounter(out, name string) (uint64, bool) {
	re := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(name) + `: (\d+)$`)
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0, false
	}
	v, err := strconv.ParseUint(m[len(m)-1][1], 10, 64)
	return v, err == nil
}

// TestShutdownSIGTERM sends SIGTERM to `ustack run` while kernel TCP
// flows pour into its discard server: it must exit 0 within seconds,
// print no panic, and its final counters must show every page back in the
// pool.
func TestShutdownSIGTERM(t *testing.T) {
	needRoot(t)
	tl := record("TestShutdownSIGTERM")
	r, cmd, stdout, stderr, exited := startRunBinary(t, "usit-sigterm", "-discard", ":9", "-pool-poison", "-lro", "off", "-hw-gro", "coalesce")
	deadline := time.Now().Add(2 * time.Minute)
	type sender struct {
		c    *net.TCPConn
		sent atomic.Int64
		done chan error
	}
	var senders []*sender
	for _, v6 := range []bool{false, true} {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c, err := r.bed.NS.DialTCP(ctx, r.stackAP(v6, 9), cc)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s := &sender{c: c, done: make(chan error, 1)}
		senders = append(senders, s)
		go func() {
			c.SetDeadline(deadline)
			buf := make([]byte, writeSize)
			for s.sent.Load() < 1<<30 {
				m, err := c.Write(buf)
				s.sent.Add(int64(m))
				if err != nil {
					s.done <- err
					return
				}
			}
			s.done <- nil
		}()
	}
	var written int64
	if !waitUntil(time.Minute, func() bool {
		tot := int64(0)
		for _, s := range senders {
			tot += s.sent.Load()
		}
		written = tot
		return tot >= 32<<20
	}) {
		t.Fatalf("senders wrote %d bytes in a minute, want 32 MB", written)
	}
	tl.faults.Add(1)
	if err := terminate(t, cmd, exited, stderr, 15*time.Second); err != nil {
		t.Errorf("ustack run after SIGTERM mid-transfer: got %v, want exit status 0; stderr:\n%s", err, stderr.String())
	}
	for _, s := range senders {
		s.c.SetLinger(0)
		s.c.Close()
		<-s.done
	}
	if e := stderr.String(); strings.Contains(e, "panic") || strings.Contains(e, "goroutine ") || strings.Contains(e, "DATA RACE") {
		t.Errorf("stderr after SIGTERM holds a panic or race report:\n%s", e)
	}
	out := stdout.String()
	inUse, ok := finalCounter(out, "rx_pp_pages_in_use")
	if !ok {
		t.Fatalf("final counters lack rx_pp_pages_in_use:\n%s", out)
	}
	if inUse != 0 {
		t.Errorf("final rx_pp_pages_in_use after SIGTERM: got %d, want 0", inUse)
	}
	rx, _ := finalCounter(out, "rx_bytes")
	t.Logf("kernel wrote %d MB, ustack received %d MB before SIGTERM; final rx_pp_pages_in_use %d", written>>20, rx>>20, inUse)
}

// startRunBinary starts `ustack run` on a fresh TAP bed (namespace prefix
// prefix) at the bed's stack addresses, with extra flags, and waits for its
// startup line. exited yields its Wait result. Cleanup kills it if it is
// still running, then removes the bed.
func startRunBinary(t *testing.T, prefix string, flags ...string) (r *rig, cmd *exec.Cmd, stdout, stderr *syncBuffer, exited <-chan error) {
	t.Helper()
	return startRunBinaryOn(t, testbed.TAPConfig{Prefix: prefix}, flags...)
}

// startRunBinaryOn is startRunBinary on a bed of cfg: with cfg.TUN, `ustack
// run -tun` on a TUN device.
func startRunBinaryOn(t *testing.T, cfg testbed.TAPConfig, flags ...string) (r *rig, cmd *exec.Cmd, stdout, stderr *syncBuffer, exited <-chan error) {
	t.Helper()
	bin := ustackBinary(t)
	bed, err := testbed.NewTAPBed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	dev := "-tap"
	if cfg.TUN {
		dev = "-tun"
	}
	args := append([]string{"run", dev, bed.TAPName, "-addr", bed.StackAddr4.String(), "-addr", bed.StackAddr6.String()}, flags...)
	cmd = bed.NS.Exec(ctx, bin, args...)
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(done)
		ch <- err
	}()
	// Registered after the bed's cleanup, so that it runs first.
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
	})
	for start := time.Now(); !strings.Contains(stderr.String(), "ustack: on "); {
		select {
		case err := <-ch:
			t.Fatalf("ustack run exited at startup: %v\nstderr:\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("ustack run did not start within 30s; stderr:\n%s", stderr.String())
		}
	}
	return &rig{bed: bed}, cmd, stdout, stderr, ch
}

// terminate sends SIGTERM to a process of startRunBinary and returns its
// exit's error; it fails the test if the process takes longer than d.
func terminate(t *testing.T, cmd *exec.Cmd, exited <-chan error, stderr *syncBuffer, d time.Duration) error {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		return err
	case <-time.After(d):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("ustack run did not exit within %v of SIGTERM; stderr:\n%s", d, stderr.String())
		return nil
	}
}

// TestShutdownSIGTERMGrace sends SIGTERM to `ustack run -echo` with a
// kernel client connected, and checks how the connection ends and when
// the process exits (0 every time):
//
//   - fin: the client has its echo; with the default -shutdown-grace the
//     stack shuts down gracefully and the client's next read gets EOF (the
//     FIN), stderr has nothing but the startup line.
//   - grace-0: the client stopped reading (zero window), so the FIN cannot
//     go; -shutdown-grace 0 resets at once: the read gets ECONNRESET.
//   - grace-over: as grace-0 with -shutdown-grace 1s: the connection is
//     reset after it, and ustack says so.
//   - second-signal: as grace-over with a grace of ten minutes, but a
//     second signal (SIGINT) resets at once.
func TestShutdownSIGTERMGrace(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		name       string
		flags      []string
		zeroWindow bool
		second     bool   // send SIGINT after SIGTERM
		want       error  // how the client's read ends
		log        string // what stderr must say ("": only the startup line)
	}{
		{"fin", nil, false, false, io.EOF, ""},
		{"grace-0", []string{"-shutdown-grace", "0"}, true, false, syscall.ECONNRESET, ""},
		{"grace-over", []string{"-shutdown-grace", "1s"}, true, false, syscall.ECONNRESET, "-shutdown-grace 1s over: connections reset"},
		{"second-signal", []string{"-shutdown-grace", "10m"}, true, true, syscall.ECONNRESET, "second signal: connections reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := append([]string{"-echo", ":7"}, tc.flags...)
			if tc.zeroWindow {
				flags = append(flags, "-stats", "50ms")
			}
			r, cmd, stdout, stderr, exited := startRunBinary(t, fmt.Sprintf("usit-sgr%d", i), flags...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := r.bed.NS.DialTCP(ctx, r.stackAP(false, 7), cc)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			if tc.zeroWindow {
				// The client sends 512 KiB and reads nothing back: its
				// window closes while the echo holds the rest, having read
				// everything (so that closing it sends a FIN, not the RST
				// of a close with unread data). Wait until the client's
				// bytes are all acknowledged and its window is zero, then
				// for a counters block after that showing no unread byte.
				if err := c.SetReadBuffer(64 << 10); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Write(make([]byte, 512<<10)); err != nil {
					t.Fatal(err)
				}
				mark := -1
				if !waitUntil(30*time.Second, func() bool {
					if mark < 0 {
						if sockIoctl(t, c, unix.SIOCOUTQ) == 0 && rcvWnd(t, c) == 0 {
							mark = len(stdout.String())
						}
						return false
					}
					v, ok := finalCounter(stdout.String()[mark:], "tcp_rcv_queued_bytes_current")
					return ok && v == 0
				}) {
					t.Fatalf("within 30s: client's unacknowledged bytes %d, rcv_wnd %d, ustack's unread bytes after: %v", sockIoctl(t, c, unix.SIOCOUTQ), rcvWnd(t, c), mark >= 0)
				}
			} else {
				msg := make([]byte, 1<<20)
				randReader(uint64(950 + i)).Read(msg)
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				echo := make([]byte, len(msg))
				if _, err := io.ReadFull(c, echo); err != nil || !bytes.Equal(echo, msg) {
					t.Fatalf("echo: err %v, equal %v", err, bytes.Equal(echo, msg))
				}
			}

			start := time.Now()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if tc.second {
				if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("ustack run after SIGTERM: got %v, want exit status 0; stderr:\n%s", err, stderr.String())
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("ustack run did not exit within 30s of SIGTERM; stderr:\n%s", stderr.String())
			}
			took := time.Since(start)
			_, err = io.Copy(io.Discard, c)
			if tc.want == io.EOF {
				if err != nil {
					t.Errorf("client read after SIGTERM: got %v, want EOF (the FIN)", err)
				}
			} else if !errors.Is(err, tc.want) {
				t.Errorf("client read after SIGTERM: got %v, want %v", err, tc.want)
			}
			errLines := strings.Split(strings.TrimSpace(stderr.String()), "\n")[1:]
			if tc.log == "" && len(errLines) > 0 {
				t.Errorf("stderr after SIGTERM: got %q after the startup line, want nothing", errLines)
			}
			if tc.log != "" && !strings.Contains(stderr.String(), tc.log) {
				t.Errorf("stderr after SIGTERM lacks %q:\n%s", tc.log, stderr.String())
			}
			t.Logf("exited %v after SIGTERM; the client's read ended with %v", took.Round(time.Millisecond), err)
		})
	}
}

// sockIoctl returns the int an ioctl of c's socket gives (SIOCOUTQ: bytes
// not yet acknowledged).
func sockIoctl(t *testing.T, c *net.TCPConn, req uint) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.IoctlGetInt(int(fd), req) }); err != nil || serr != nil {
		t.Fatal(errors.Join(err, serr))
	}
	return v
}

// rcvWnd returns the receive window c last advertised (tcpi_rcv_wnd).
func rcvWnd(t *testing.T, c *net.TCPConn) uint32 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) { info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || serr != nil {
		t.Fatal(errors.Join(err, serr))
	}
	return info.Rcv_wnd
}
