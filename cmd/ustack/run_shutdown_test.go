package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testutil"
	"github.com/ustack/ustack/stack"
)

// lockedBuffer is a bytes.Buffer safe for run's goroutine and the test.
type lockedBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRunSignalShutsDownGracefully runs `run -echo :7` on an in-memory
// wire with a peer stack on the other end: after its echo, the peer's
// connection must end with EOF (the FIN Stack.Shutdown sends) once run got
// a signal, not with a reset, and run must return nil.
func TestRunSignalShutsDownGracefully(t *testing.T) {
	o, err := parseRun([]string{"-tap", "mem0", "-addr", "10.0.0.2/24", "-echo", ":7"})
	if err != nil {
		t.Fatal(err)
	}
	if o.grace != defaultShutdownGrace {
		t.Errorf("-shutdown-grace default: got %v, want %v", o.grace, defaultShutdownGrace)
	}
	var stderr lockedBuffer
	r := newRunner(o, io.Discard, &stderr)
	w, pw := driver.NewMemPair(1024, driver.VirtioNetHdrLen+65535+18)
	peer, err := stack.New(stack.Config{Wire: pw, Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 9}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	sig := make(chan os.Signal, 2)
	ran := make(chan error, 1)
	go func() { ran <- r.run(func(string) (driver.Wire, error) { return w, nil }, sig) }()
	testutil.WaitFor(t, "run's startup line", func() bool { return strings.Contains(stderr.String(), "ustack: on ") })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := peer.DialTCP(ctx, netip.MustParseAddrPort("10.0.0.2:7"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello" {
		t.Fatalf("echo: got %q, %v; want \"hello\"", got, err)
	}
	sig <- syscall.SIGTERM
	if n, err := c.Read(got); !errors.Is(err, io.EOF) {
		t.Errorf("peer read after the signal: got %d bytes, %v; want EOF (the FIN)", n, err)
	}
	if err := <-ran; err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
	if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 {
		t.Errorf("stderr: got %q, want the startup line only", lines)
	}
}

// TestRunShutdownGraceFlag: -shutdown-grace takes 0 and durations, not a
// negative one.
func TestRunShutdownGraceFlag(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"30s", 30 * time.Second, true},
		{"-1s", 0, false},
	} {
		o, err := parseRun([]string{"-tap", "mem0", "-addr", "10.0.0.2/24", "-shutdown-grace", tc.v})
		var ue usageError
		switch {
		case tc.ok && err != nil:
			t.Errorf("-shutdown-grace %s: got %v, want no error", tc.v, err)
		case tc.ok && o.grace != tc.want:
			t.Errorf("-shutdown-grace %s: got %v, want %v", tc.v, o.grace, tc.want)
		case !tc.ok && !errors.As(err, &ue):
			t.Errorf("-shutdown-grace %s: got %v, want a usage error", tc.v, err)
		}
	}
}
