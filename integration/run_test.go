//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/internal/testutil"
)

// The ustack binary, built once for the tests that need it (see
// ustackBinary) into binDir, which TestMain (main_test.go) removes.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// ustackBinary builds cmd/ustack (with -race when the tests run under the
// race detector) the first time it is called and returns its path.
func ustackBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "ustack-integration-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "ustack")
		args := []string{"build", "-o", binPath}
		if testutil.RaceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "github.com/ustack/ustack/cmd/ustack")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		out, err := exec.CommandContext(ctx, gobin, args...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%s %s: %v\n%s", gobin, strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// syncBuffer is a bytes.Buffer that a command may write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// rxPacketsLine matches the rx_packets line of a counters block.
var rxPacketsLine = regexp.MustCompile(`(?m)^\s+rx_packets: (\d+)$`)

// TestRunBinary runs `ustack run` on a TAP in a namespace and talks to it
// from the kernel's side: ping (ARP and NDP), TCP and UDP echo, TCP
// discard; then stops it with SIGTERM and checks its exit and its final
// counters. Over ustack's TAP with offloads, over water's plain wire
// (-wire plain) and over a TUN device (-tun).
func TestRunBinary(t *testing.T) {
	needRoot(t)
	t.Run("wire-offload", func(t *testing.T) { testRunBinary(t, testbed.TAPConfig{Prefix: "usit-run"}) })
	t.Run("wire-plain", func(t *testing.T) { testRunBinary(t, testbed.TAPConfig{Prefix: "usit-runp"}, "-wire", "plain") })
	t.Run("tun", func(t *testing.T) { testRunBinary(t, testbed.TAPConfig{Prefix: "usit-runt", TUN: true}) })
}

func testRunBinary(t *testing.T, cfg testbed.TAPConfig, args ...string) {
	r, cmd, stdout, stderr, exited := startRunBinaryOn(t, cfg, append([]string{"-discard", ":9", "-echo", ":7", "-stats", "1s"}, args...)...)
	bed := r.bed // the stack is the binary's
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	families := []bool{false, true}
	for _, v6 := range families {
		t.Run("ping/"+family(v6), func(t *testing.T) {
			if err := ping(bed.NS, r.stackAP(v6, 0).Addr(), 3, 2*time.Second); err != nil {
				t.Error(err)
			}
		})
	}
	for i, v6 := range families {
		t.Run("tcp-echo/"+family(v6), func(t *testing.T) {
			const n = 1 << 20
			ap := r.stackAP(v6, 7)
			deadline := time.Now().Add(transferTimeout(2 * n))
			dctx, dcancel := context.WithDeadline(ctx, deadline)
			defer dcancel()
			c, err := bed.NS.DialTCP(dctx, ap, cc)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(deadline)
			pc := progressConn{c, deadline}
			res := make(chan hashResult, 1)
			go func() { res <- recvHashed(io.LimitReader(pc, n)) }()
			start := time.Now()
			want, err := sendHashed(pc, n, writeSize, uint64(400+i))
			if err != nil {
				diagnose(t, r)
				c.Close()
				<-res
				t.Fatalf("kernel sender: %v", err)
			}
			if !checkHash(t, waitHash(t, r, res, deadline), n, want) {
				diagnose(t, r)
			}
			logRate(t, "kernel -> ustack run echo -> kernel", n, time.Since(start))
		})
	}
	for _, v6 := range families {
		t.Run("udp-echo/"+family(v6), func(t *testing.T) {
			k, err := bed.NS.ListenUDP(r.kernelAP(v6, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			udpEcho(t, k, r.stackAP(v6, 7), 20, 3)
		})
	}
	t.Run("tcp-discard/ipv4", func(t *testing.T) {
		const n = 16 << 20
		ap := r.stackAP(false, 9)
		deadline := time.Now().Add(transferTimeout(n))
		dctx, dcancel := context.WithDeadline(ctx, deadline)
		defer dcancel()
		c, err := bed.NS.DialTCP(dctx, ap, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(deadline)
		start := time.Now()
		if _, err := sendHashed(progressConn{c, deadline}, n, writeSize, 500); err != nil {
			diagnose(t, r)
			t.Fatalf("kernel sender: %v", err)
		}
		// The server closes once it has read everything up to our FIN:
		// our read then ends with EOF and nothing read.
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		m, err := io.Copy(io.Discard, progressConn{c, deadline})
		if err != nil {
			diagnose(t, r)
			t.Fatalf("waiting for the discard server's FIN: %v", err)
		}
		if m != 0 {
			t.Errorf("discard server sent %d bytes, want 0", m)
		}
		logRate(t, "kernel -> ustack run discard", n, time.Since(start))
	})

	t.Run("sigterm", func(t *testing.T) {
		if err := terminate(t, cmd, exited, stderr, 5*time.Second); err != nil {
			t.Errorf("ustack run after SIGTERM: got %v, want exit status 0; stderr:\n%s", err, stderr.String())
		}
		out := stdout.String()
		if !strings.Contains(out, "NIC statistics:\n") {
			t.Fatalf("stdout lacks %q:\n%s", "NIC statistics:", out)
		}
		m := rxPacketsLine.FindAllStringSubmatch(out, -1)
		if len(m) == 0 {
			t.Fatalf("stdout lacks an rx_packets line:\n%s", out)
		}
		// The last block is the one printed at exit.
		if n, _ := strconv.ParseUint(m[len(m)-1][1], 10, 64); n == 0 {
			t.Errorf("final rx_packets: got %s, want > 0", m[len(m)-1][1])
		}
		// A clean shutdown prints nothing on stderr but the startup line:
		// servers whose listener was closed must end quietly.
		errLines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(errLines) > 1 {
			t.Errorf("stderr after SIGTERM: got %d lines after the startup line, want none:\n%s", len(errLines)-1, strings.Join(errLines[1:], "\n"))
		}
		last := out[strings.LastIndex(out, "NIC statistics:"):]
		t.Logf("final counters (excerpt):\n%s", excerpt(last, "rx_packets", "rx_bytes", "rx_dropped", "rx_drop_multicast", "tx_packets", "tx_gso_packets", "tcp_segments_received"))
	})
}

// excerpt returns the lines of a counters block for the named counters.
func excerpt(block string, names ...string) string {
	var out []string
	for _, line := range strings.Split(block, "\n") {
		for _, n := range names {
			if strings.HasPrefix(strings.TrimSpace(line), n+":") {
				out = append(out, line)
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestRunBadFlags checks that `ustack` rejects bad command lines as usage
// errors: exit status 2 and one line on stderr, no stack trace. The
// commands run inside a namespace of their own, so that a ustack that
// wrongly went ahead could only create its TAP there.
func TestRunBadFlags(t *testing.T) {
	needRoot(t)
	bin := ustackBinary(t)
	ns, err := testbed.NewNetns("usit-flags")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	tests := []struct {
		name string
		args []string
	}{
		{"bad-addr", []string{"run", "-tap", "x", "-addr", "nonsense"}},
		{"bad-lro", []string{"run", "-lro", "maybe", "-tap", "x", "-addr", "10.0.0.2/24"}},
		{"unknown-command", []string{"bogus"}},
		{"tap-and-tun", []string{"run", "-tap", "x", "-tun", "y", "-addr", "10.0.0.2/24"}},
		{"no-device", []string{"run", "-addr", "10.0.0.2/24"}},
		{"tun-plain", []string{"run", "-tun", "y", "-wire", "plain", "-addr", "10.0.0.2/24"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := ns.Exec(ctx, bin, tt.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("ustack %s: got %v, want exit status 2; stderr:\n%s", strings.Join(tt.args, " "), err, stderr.String())
			}
			if got := ee.ExitCode(); got != 2 {
				t.Errorf("ustack %s: exit status: got %d, want 2", strings.Join(tt.args, " "), got)
			}
			errOut := stderr.String()
			if lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"); len(lines) != 1 || lines[0] == "" || !strings.HasSuffix(errOut, "\n") {
				t.Errorf("ustack %s: stderr: got %d lines %q, want exactly one line", strings.Join(tt.args, " "), len(lines), errOut)
			}
			if strings.Contains(errOut, "goroutine") {
				t.Errorf("ustack %s: stderr holds a stack trace:\n%s", strings.Join(tt.args, " "), errOut)
			}
			t.Logf("stderr: %s", strings.TrimSpace(errOut))
		})
	}
}
