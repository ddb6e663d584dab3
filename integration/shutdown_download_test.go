//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/stack"
)

const (
	downloadTotal   = 50 << 20 // the download's size
	downloadPauseAt = 4 << 20  // where the kernel's reader stops until told
	downloadPort    = 8080
)

// sent is what a writer's writes took: n bytes of the stream with SHA-256
// sum, then err.
type sent struct {
	n   int64
	sum [32]byte
	err error
}

// serveDownload accepts one connection on l and writes up to total bytes
// of seed's stream in writes of writeSize until a write fails; it hashes
// exactly what the writes took. The connection stays open (the test's end
// closes it), so that only the stack moves it on.
func serveDownload(t *testing.T, l net.Listener, total int64, seed uint64) <-chan sent {
	res := make(chan sent, 1)
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			res <- sent{err: err}
			return
		}
		conns <- c
		h := sha256.New()
		r := randReader(seed)
		buf := make([]byte, writeSize)
		var s sent
		for s.n < total {
			b := buf[:min(int64(len(buf)), total-s.n)]
			r.Read(b)
			m, err := c.Write(b)
			h.Write(b[:m])
			s.n += int64(m)
			if err != nil {
				s.err = err
				break
			}
		}
		h.Sum(s.sum[:0])
		res <- s
	}()
	t.Cleanup(func() {
		select {
		case c := <-conns:
			c.Close()
		default:
		}
	})
	return res
}

// pausedReader reads c: downloadPauseAt bytes, then, after closing
// paused, nothing until resume is closed, then the rest until an error.
// Every read is bounded by stallTimeout, which only a hang reaches.
func pausedReader(c *net.TCPConn, paused chan<- struct{}, resume <-chan struct{}) <-chan hashResult {
	out := make(chan hashResult, 1)
	go func() {
		h := sha256.New()
		var res hashResult
		buf := make([]byte, 16<<10)
		for pause := true; ; {
			c.SetReadDeadline(time.Now().Add(stallTimeout))
			b := buf
			if pause {
				b = buf[:min(int64(len(buf)), downloadPauseAt-res.n)]
			}
			m, err := c.Read(b)
			h.Write(b[:m])
			res.n += int64(m)
			if err != nil {
				res.err = err
				break
			}
			if pause && res.n == downloadPauseAt {
				close(paused)
				<-resume
				pause = false
			}
		}
		h.Sum(res.sum[:0])
		out <- res
	}()
	return out
}

// TestShutdownDownload cuts a 50 MB download from a ustack server to a
// kernel client, whose reader (SO_RCVBUF 128 KiB) has stopped after 4 MB
// so that the server's writes are held by the window:
//
//   - by Shutdown: the client must then receive every byte the server's
//     writes took, and EOF (the FIN); a SYN to the listener meanwhile is
//     refused (RST); Shutdown returns nil.
//   - by Close: the client's read, once it drained its buffer, must end
//     with ECONNRESET (Close sends the RSTs before it stops the driver).
//   - by Shutdown while the client never reads again (zero window): the
//     FIN cannot go, so Shutdown returns context.DeadlineExceeded at its
//     deadline, having reset the connection: the client gets ECONNRESET.
//
// In each, every page is back in the pool and no goroutine is left.
func TestShutdownDownload(t *testing.T) {
	needRoot(t)
	for i, tc := range []struct {
		name string
		v6   bool
		// cut cuts the download once the client paused, and returns what
		// the server's writes took; done, called once the client's read
		// ended, returns what went wrong in the cut.
		cut func(r *rig, v6 bool, wrote <-chan sent) (w sent, done func() error)
		// want is how the client's read must end.
		want error
	}{
		{"shutdown/ipv4", false, shutdownCut(2 * time.Minute), io.EOF},
		{"shutdown/ipv6", true, shutdownCut(2 * time.Minute), io.EOF},
		{"close", false, func(r *rig, _ bool, wrote <-chan sent) (sent, func() error) {
			err := r.st.Close()
			return <-wrote, func() error { return err }
		}, syscall.ECONNRESET},
		{"zero-window", false, func(r *rig, _ bool, wrote <-chan sent) (sent, func() error) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := r.st.Shutdown(ctx)
			return <-wrote, func() error {
				if !errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("Shutdown with the client's window closed: got %v, want context.DeadlineExceeded", err)
				}
				return nil
			}
		}, syscall.ECONNRESET},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := record("TestShutdownDownload")
			leaks := goleak.IgnoreCurrent()
			r := newRigConfig(t, fmt.Sprintf("usit-sdl%d", i), 1500, stack.Config{})
			ap := r.stackAP(tc.v6, downloadPort)
			l, err := r.st.ListenTCP(ap)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			seed := uint64(900 + i)
			wrote := serveDownload(t, l, downloadTotal, seed)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := r.bed.NS.DialTCP(ctx, ap, cc)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.SetReadBuffer(128 << 10); err != nil {
				t.Fatal(err)
			}
			paused, resume := make(chan struct{}), make(chan struct{})
			got := pausedReader(c, paused, resume)
			select {
			case <-paused:
			case res := <-got:
				diagnose(t, r)
				t.Fatalf("client read %d bytes, then %v, before it paused", res.n, res.err)
			}
			waitRecvStill(t, c)

			w, done := tc.cut(r, tc.v6, wrote)
			close(resume)
			res := <-got
			if err := done(); err != nil {
				t.Error(err)
			}
			if w.err == nil || w.n >= downloadTotal {
				t.Errorf("server wrote %d of %d bytes, err %v: want cut mid-transfer", w.n, downloadTotal, w.err)
			}
			if !errors.Is(res.err, tc.want) {
				t.Errorf("client read after %d bytes: got %v, want %v", res.n, res.err, tc.want)
			}
			if tc.want == io.EOF {
				ok := res.n == w.n && res.sum == w.sum
				if res.n != w.n {
					t.Errorf("client received %d bytes, want the %d the server's writes took", res.n, w.n)
				} else if res.sum != w.sum {
					t.Errorf("sha256 of what the client received: got %x, want %x", res.sum, w.sum)
				}
				recordTransfer(tl, res.n, ok)
			} else if res.n > w.n {
				t.Errorf("client received %d bytes, more than the %d written", res.n, w.n)
			}
			t.Logf("server wrote %d of %d bytes; the client read %d, then %v", w.n, downloadTotal, res.n, res.err)
			tl.faults.Add(1)
			r.close(t) // a no-op after Shutdown or Close: checks the pages
			goleak.VerifyNone(t, leaks)
		})
	}
}

// shutdownCut cuts a download with Shutdown(ctx of timeout): it waits for
// the server's writes to fail (the FIN is queued, after the listener was
// shut down) and dials the listener, which must refuse (RST). done waits
// for Shutdown, which must return nil once the resumed client has
// acknowledged everything.
func shutdownCut(timeout time.Duration) func(r *rig, v6 bool, wrote <-chan sent) (sent, func() error) {
	return func(r *rig, v6 bool, wrote <-chan sent) (sent, func() error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		shut := make(chan error, 1)
		go func() {
			defer cancel()
			shut <- r.st.Shutdown(ctx)
		}()
		w := <-wrote
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		var dialErr error
		if c, err := r.bed.NS.DialTCP(dctx, r.stackAP(v6, downloadPort), ""); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			dialErr = fmt.Errorf("dial during Shutdown: got %v, want ECONNREFUSED", err)
		}
		return w, func() error {
			if err := <-shut; err != nil {
				return errors.Join(dialErr, fmt.Errorf("Shutdown: got %v, want nil", err))
			}
			return dialErr
		}
	}
}

// waitRecvStill waits until c's receive queue (SIOCINQ) has stopped
// growing, for ten looks 20 ms apart: with its reader paused, its window
// is then closed. Under -race the queue can still be filling long after
// the reader paused, and a cut then meets an open window.
func waitRecvStill(t *testing.T, c *net.TCPConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	last, still := -1, 0
	if !waitUntil(time.Minute, func() bool {
		q := 0
		rc.Control(func(fd uintptr) { q, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if q != last || q == 0 {
			last, still = q, 0
		} else {
			still++
		}
		time.Sleep(20 * time.Millisecond)
		return still >= 10
	}) {
		t.Fatalf("the client's receive queue kept changing (%d bytes) for a minute", last)
	}
}
