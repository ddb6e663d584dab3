package bench

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// The TAP floor: the most a peer on the bench's TAP can do, as rows of the
// bench beside ustack's and the kernel's. It is a loop on the TAP's
// descriptor that reads a frame with one read(2) and answers it with at
// most one write(2), keeping no connection state (floorframe.go builds the
// answers): the stateless reflector for request/response (`ustack bench
// -rr`), and the bulk sink for TCP bulk (`ustack bench`), which reads GSO
// super-frames behind a virtio-net header with the TAP's offloads on and
// ACKs each. A stack on the same TAP must do at least this much work per
// frame, so no stack on it can beat these rows.

// floorMaxFrame is the largest frame the floor reads: a GSO super-frame
// of 64 KB (tun_get_user's limit without BIG TCP) behind its virtio-net
// header; a longer read is truncated and counted.
const floorMaxFrame = 1 << 18

// floorMaxRun bounds a floor's life whatever its caller does.
const floorMaxRun = 15 * time.Minute

// floorConfig is one floor on a bed's TAP.
type floorConfig struct {
	sink bool // the bulk sink (virtio-net header, offloads) rather than the reflector
	busy bool // spin on non-blocking reads instead of blocking in read(2)
}

// floorStats are a floor's counters, final once it has stopped.
type floorStats struct {
	reads, writes, writeErrs, ignored, truncated, emptyPolls uint64
	sink                                                     floorSink // the sink's counters (bytes, segs, gaps, ...)
}

// floor is a running TAP floor: a goroutine that owns the TAP descriptor
// until stop returns.
type floor struct {
	bed   *testbed.TAPBed
	tap   *driver.TAP
	busy  bool
	quit  atomic.Bool
	bytes atomic.Uint64 // the sink's in-order payload bytes so far
	done  chan struct{}
	err   error      // the loop's read error; valid after done
	stats floorStats // valid after done
}

// startFloor opens the bed's TAP as bench rows do (from inside its
// namespace, waiting for the link) and starts the floor on it: the
// reflector with frames as they are (no virtio-net header, the TAP's
// offloads off, so the kernel completes checksums), or the sink with
// ustack's virtio-net header and offloads (TUN_F_CSUM, TSO4/6). It
// answers as the bed's stack address with ustack's MAC. stop ends it and
// closes the TAP.
func startFloor(bed *testbed.TAPBed, cfg floorConfig) (*floor, error) {
	if bed.TUN {
		return nil, errors.New("TAP floor: the bed is a TUN device")
	}
	if !bed.StackAddr4.Addr().Is4() || bed.MTU < 576 {
		return nil, fmt.Errorf("TAP floor: want an IPv4 stack address and MTU >= 576, got %s, %d", bed.StackAddr4, bed.MTU)
	}
	var tap *driver.TAP
	err := bed.Open(func() (err error) {
		tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: cfg.sink, Offloads: cfg.sink})
		return err
	})
	if err == nil && !cfg.busy {
		// The loop blocks in read(2) as a stack's reader thread would.
		err = unix.SetNonblock(tap.FD(), false)
	}
	if err != nil {
		if tap != nil {
			tap.Close()
		}
		return nil, fmt.Errorf("TAP floor: %w", err)
	}
	f := &floor{bed: bed, tap: tap, busy: cfg.busy, done: make(chan struct{})}
	ip := bed.StackAddr4.Addr().As4()
	mss := uint16(bed.MTU - floorIPLen - floorTCPLen)
	go func() {
		defer close(f.done)
		// One thread for the loop's life, as a stack's reader thread: the
		// goroutine comes back from read(2) on the thread it blocked on
		// rather than queueing for another (exitsyscall).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if cfg.sink {
			f.err = f.runSink(ip, mss)
		} else {
			f.err = f.runReflector(ip, mss)
		}
	}()
	return f, nil
}

// read reads one frame into b with read(2), returning 0 and no error for
// nothing to do (EAGAIN in busy mode, EINTR).
func (f *floor) read(fd int, b []byte) (int, error) {
	n, err := unix.Read(fd, b)
	switch {
	case err == nil:
		f.stats.reads++
		if n >= len(b) {
			f.stats.truncated++
		}
		return n, nil
	case err == unix.EAGAIN:
		f.stats.emptyPolls++
		return 0, nil
	case err == unix.EINTR:
		return 0, nil
	}
	return 0, fmt.Errorf("TAP floor: read: %w", err)
}

// write writes one frame with write(2), counting a failure (EAGAIN with
// the TAP's queue full, say) as the kernel's tun_get_user would drop it.
func (f *floor) write(fd int, b []byte) {
	if _, err := unix.Write(fd, b); err != nil {
		f.stats.writeErrs++
		return
	}
	f.stats.writes++
}

// runReflector is the reflector's loop: one read, at most one write per
// frame, until stop or floorMaxRun. It does not allocate per frame.
func (f *floor) runReflector(ip [4]byte, mss uint16) error {
	fd := f.tap.FD()
	in := make([]byte, floorMaxFrame)
	out := make([]byte, floorMaxFrame+8)
	deadline := time.Now().Add(floorMaxRun)
	for i := uint64(0); !f.quit.Load(); i++ {
		if i%4096 == 0 && time.Now().After(deadline) {
			return errors.New("TAP floor: ran past its time limit")
		}
		n, err := f.read(fd, in)
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		m := floorReflect(in[:n], out, ip, stack.DefaultMAC, mss)
		if m == 0 {
			f.stats.ignored++
			continue
		}
		f.write(fd, out[:m])
	}
	return nil
}

// runSink is the sink's loop: one read per frame (a GSO super-frame is
// one), one pure ACK per segment read, until stop or floorMaxRun. The ACK
// goes out behind a zeroed virtio-net header (no GSO, checksums complete).
// It does not allocate per frame.
func (f *floor) runSink(ip [4]byte, mss uint16) error {
	fd := f.tap.FD()
	s := &f.stats.sink
	s.ip, s.mac, s.mss = ip, stack.DefaultMAC, mss
	in := make([]byte, floorMaxFrame)
	out := make([]byte, driver.VirtioNetHdrLen+128)
	deadline := time.Now().Add(floorMaxRun)
	for i := uint64(0); !f.quit.Load(); i++ {
		if i%4096 == 0 && time.Now().After(deadline) {
			return errors.New("TAP floor: ran past its time limit")
		}
		n, err := f.read(fd, in)
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		if n < driver.VirtioNetHdrLen {
			f.stats.ignored++
			continue
		}
		m := s.step(in[driver.VirtioNetHdrLen:n], out[driver.VirtioNetHdrLen:])
		f.bytes.Store(s.bytes)
		if m == 0 {
			continue
		}
		f.write(fd, out[:driver.VirtioNetHdrLen+m])
		s.acks++
	}
	return nil
}

// stop ends the floor and closes its TAP, returning the loop's error. A
// blocked read(2) only returns with a frame, so stop has the kernel send
// one: a UDP datagram from the bed's namespace to the floor's address
// (or the ARP request before it), every 20 ms until the loop is gone.
func (f *floor) stop() error {
	f.quit.Store(true)
	var wakeErr error
	if !f.busy {
		dst := netip.AddrPortFrom(f.bed.StackAddr4.Addr(), 9) // discard
		c, err := f.bed.NS.DialUDP(dst)
		if err == nil {
			defer c.Close()
		}
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
	wake:
		for range 250 { // 5 s
			if err == nil {
				c.Write([]byte{0})
			}
			select {
			case <-f.done:
				break wake
			case <-t.C:
			}
		}
		wakeErr = err
	}
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		// The loop is still in read(2): leave the descriptor open
		// rather than close it under the loop.
		return fmt.Errorf("TAP floor: did not stop (wake-up datagram: %v)", wakeErr)
	}
	return errors.Join(f.err, f.tap.Close())
}

// rrFloor measures RR's floor row: the reflector on the bed's TAP,
// blocking or busy, answering the same client as the ustack rows.
func rrFloor(bed *testbed.TAPBed, exe string, size int, dur time.Duration, busy bool) (rrSample, error) {
	f, err := startFloor(bed, floorConfig{busy: busy})
	if err != nil {
		return rrSample{}, err
	}
	s, err := rrClient(bed.NS, exe, netip.AddrPortFrom(bed.StackAddr4.Addr(), rrPort), size, dur)
	if serr := f.stop(); err == nil {
		err = serr
	}
	if err == nil && f.stats.writeErrs > 0 {
		err = fmt.Errorf("TAP floor: %d writes failed", f.stats.writeErrs)
	}
	return s, err
}

// MeasureFloorSink measures the bulk bench's floor row (FloorSinkRow):
// the sink on the bed's TAP, the same sender as Measure's ustack rows
// (`exe send` with row's streams, congestion control cc, writes of wsize
// bytes), and the bytes the sink counted in order, which must be what the
// sender wrote. The receiver's CPU is the sink's loop (this process).
func MeasureFloorSink(bed *testbed.TAPBed, exe string, row Row, dur time.Duration, cc string, wsize int) (Sample, error) {
	var s Sample
	f, err := startFloor(bed, floorConfig{sink: true})
	if err != nil {
		return s, err
	}
	ap := netip.AddrPortFrom(bed.StackAddr4.Addr(), benchPort)
	ru0, sys0 := rusage(), machineCPU()
	res, err := sendBuiltin(bed, exe, ap, row, dur, cc, wsize)
	if err == nil {
		err = waitFloorBytes(f, uint64(res.Bytes))
	}
	ru1, sys1 := rusage(), machineCPU()
	if serr := f.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return s, err
	}
	s.fill(res, ru1-ru0, sys1-sys0)
	st := &f.stats
	s.counters = map[string]uint64{"floor_reads": st.reads, "floor_acks": st.sink.acks, "floor_segments": st.sink.segs,
		"floor_gaps": st.sink.gaps, "floor_retrans": st.sink.retrans, "floor_truncated": st.truncated, "floor_write_errors": st.writeErrs}
	return s, nil
}

// waitFloorBytes waits until f's sink has counted want bytes, what the
// sender wrote, for at most 10 s.
func waitFloorBytes(f *floor, want uint64) error {
	deadline := time.Now().Add(10 * time.Second)
	for f.bytes.Load() < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := f.bytes.Load(); got != want {
		return fmt.Errorf("TAP floor: sink counted %d bytes, sender wrote %d", got, want)
	}
	return nil
}
