//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// bulkFlow is a kernel -> stack TCP transfer of the pseudo-random stream
// of seed, with its own listener, that the exhaustion, shutdown and soak
// tests run several of at once and may cut short.
type bulkFlow struct {
	n    int64
	seed uint64
	l    net.Listener
	kc   *net.TCPConn

	sent, got atomic.Int64 // bytes the kernel wrote; bytes the stack's reader read
	// pause, while set, makes the stack's reader stop reading.
	pause atomic.Bool

	res     chan hashResult // the receiver's result: what it read, to EOF or error
	sendErr chan error      // the sender's result (nil: all n bytes written and closed)
}

// startBulk starts a flow of n bytes from a kernel socket to a listener
// of the stack at port, bounded by deadline. The flow runs on its own;
// wait for it with wait, or cut it short with abort.
func startBulk(t *testing.T, r *rig, v6 bool, port uint16, n int64, seed uint64, deadline time.Time) *bulkFlow {
	t.Helper()
	f := &bulkFlow{n: n, seed: seed, res: make(chan hashResult, 1), sendErr: make(chan error, 1)}
	l, err := r.st.ListenTCP(r.stackAP(v6, port))
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	go func() {
		c, err := l.Accept()
		if err != nil {
			f.res <- hashResult{err: fmt.Errorf("accept: %w", err)}
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		pc := progressConn{c, deadline}
		f.res <- recvHashed(readerFunc(func(b []byte) (int, error) {
			for f.pause.Load() {
				if time.Now().After(deadline) {
					return 0, fmt.Errorf("paused past the deadline")
				}
				time.Sleep(time.Millisecond)
			}
			m, err := pc.Read(b)
			f.got.Add(int64(m))
			return m, err
		}))
	}()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	kc, err := r.bed.NS.DialTCP(ctx, r.stackAP(v6, port), cc)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	f.kc = kc
	go func() {
		kc.SetDeadline(deadline)
		_, err := sendHashed(writerFunc(func(b []byte) (int, error) {
			m, err := progressConn{kc, deadline}.Write(b)
			f.sent.Add(int64(m))
			return m, err
		}), n, writeSize, seed)
		if err == nil {
			err = kc.Close()
		}
		f.sendErr <- err
	}()
	return f
}

// wait waits for the flow to end, checks every byte and books it in tl.
func (f *bulkFlow) wait(t *testing.T, r *rig, tl *tally, deadline time.Time) bool {
	t.Helper()
	defer f.l.Close()
	var got hashResult
	select {
	case got = <-f.res:
	case <-time.After(time.Until(deadline) + 5*time.Second):
		diagnose(t, r)
		f.kc.Close()
		got = <-f.res
	}
	if err := <-f.sendErr; err != nil {
		t.Errorf("kernel sender (seed %d): %v", f.seed, err)
	}
	ok := checkHash(t, got, f.n, streamSum(f.seed, f.n))
	if !ok {
		diagnose(t, r)
	}
	recordTransfer(tl, f.n, ok)
	return ok
}

// abort ends a flow cut short (its stack closed, say): it closes the
// kernel's socket and the listener, waits for both ends, and checks that
// what arrived is an intact prefix of the stream. It returns the bytes
// that arrived.
func (f *bulkFlow) abort(t *testing.T, tl *tally) int64 {
	t.Helper()
	f.l.Close()
	f.kc.SetLinger(0)
	f.kc.Close()
	<-f.sendErr
	var got hashResult
	select {
	case got = <-f.res:
	case <-time.After(30 * time.Second):
		t.Fatalf("flow %d: the stack's reader did not end within 30s of the abort", f.seed)
	}
	if got.sum != streamSum(f.seed, got.n) {
		t.Errorf("flow %d: the %d bytes that arrived are not the stream's first %d bytes", f.seed, got.n, got.n)
		tl.lost.Add(got.n)
	} else {
		tl.checked.Add(got.n)
	}
	return got.n
}

// streamSum returns the SHA-256 of the first n bytes of seed's stream.
func streamSum(seed uint64, n int64) [32]byte {
	h := sha256.New()
	io.CopyN(h, randReader(seed), n)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// waitUntil polls cond every 10 ms until it holds or timeout passes, and
// reports whether it held.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	for end := time.Now().Add(timeout); !cond(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
