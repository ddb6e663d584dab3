package stack

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/driver"
)

// Busy reading (Config.BusyRead): a read that finds nothing spins before
// it parks, as a socket read with net.core.busy_read or SO_BUSY_POLL does
// (tcp_recvmsg and __skb_recv_udp call sk_busy_loop before they sleep).
// Each round it processes a batch of the ring itself if the poll loop
// sleeps (driver.Driver.BusyReadPoll: napi_busy_loop's napi->poll with
// BUSY_POLL_BUDGET), then tries the read again (sk_busy_loop_end: the
// receive queue not empty), yielding to other goroutines between rounds
// (gVisor's TCP processor, which the packets the reader delivered have
// readied, runs then); when BusyRead has passed, the socket is closed or
// its read deadline passed, it parks as a read without busy polling does,
// and that wait, registered before its last look, misses nothing.
//
// Which queue: every queue of the stack (Config.Queues). The kernel polls
// the one NAPI recorded on the socket (sk_mark_napi_id, from the last skb
// it received); here a flow's packets stay on the queue its hash picks,
// but a reader that polls every queue also takes other flows' packets,
// which only moves their work from a poll loop to the reader. A look at a
// queue whose ring is empty or whose poll loop runs is two atomic loads.

// checkBusyRead refuses a Config.BusyRead outside 0..driver.MaxBusyPoll.
func checkBusyRead(cfg *Config) error {
	if cfg.BusyRead < 0 || cfg.BusyRead > driver.MaxBusyPoll {
		return fmt.Errorf("stack: busy read %v: want 0..%v", cfg.BusyRead, driver.MaxBusyPoll)
	}
	return nil
}

// busyReadStats are the stack's busy-read counters.
type busyReadStats struct {
	reads   atomic.Uint64 // reads that spun
	hits    atomic.Uint64 // of those, satisfied while spinning
	loops   atomic.Uint64 // rounds spun
	polls   atomic.Uint64 // batches readers ran on a ring
	packets atomic.Uint64 // completions those batches processed
}

func (b *busyReadStats) each(fn func(string, uint64)) {
	fn("busy_reads", b.reads.Load())
	fn("busy_read_hits", b.hits.Load())
	fn("busy_read_loops", b.loops.Load())
	fn("busy_read_polls", b.polls.Load())
	fn("busy_read_packets", b.packets.Load())
}

// busySpin is one read's spin: start it with Stack.busySpin, call next
// before each look at the socket and end once after the last.
type busySpin struct {
	s     *Stack
	until time.Time
	loops uint64
	polls uint64
	pkts  uint64
}

// busySpin starts a read's spin of Config.BusyRead.
func (s *Stack) busySpin() busySpin {
	return busySpin{s: s, until: time.Now().Add(s.cfg.BusyRead)}
}

// busySpinCheck is how many rounds pass between looks at the clock and
// the read deadline (a time.Now and a mutex each).
const busySpinCheck = 8

// next runs one round: it polls the rings, then yields, and reports
// whether the read is to look at its socket again: false once the spin's
// time or the read deadline (rd, or at: nil and zero for none) has
// passed, or the socket is closed (done).
func (b *busySpin) next(done chan struct{}, rd *deadline, at time.Time) bool {
	if isClosed(done) {
		return false
	}
	if b.loops%busySpinCheck == busySpinCheck-1 {
		now := time.Now()
		if !now.Before(b.until) || rd != nil && rd.expired() || !at.IsZero() && !now.Before(at) {
			return false
		}
	}
	b.loops++
	b.pollRings()
	runtime.Gosched()
	return true
}

// pollRings runs a batch of every queue's ring whose poll loop sleeps.
func (b *busySpin) pollRings() {
	s := b.s
	if s.drv == nil {
		return
	}
	if n := s.drv.BusyReadPoll(); n > 0 {
		b.polls++
		b.pkts += uint64(n)
	}
	for _, q := range s.queues {
		if n := q.drv.BusyReadPoll(); n > 0 {
			b.polls++
			b.pkts += uint64(n)
		}
	}
}

// end counts the spin; hit says the read got data while spinning (an
// error, Close's or the peer's, is not a hit).
func (b *busySpin) end(hit bool) {
	st := &b.s.busy
	st.reads.Add(1)
	if hit {
		st.hits.Add(1)
	}
	st.loops.Add(b.loops)
	if b.polls > 0 {
		st.polls.Add(b.polls)
		st.packets.Add(b.pkts)
	}
}

// busyWait spins for a train before ReadTrain or TakeTrain waits for one
// (Config.BusyRead), as __skb_recv_udp calls sk_busy_loop before it
// sleeps; the wait that follows takes it, or finds the deadline passed
// or the socket closed. Called with the read lock held (lockRead).
func (c *TrainConn) busyWait(deadline time.Time) {
	if c.s.cfg.BusyRead <= 0 || c.b.cur != nil || len(c.ready) > 0 {
		return
	}
	sp := c.s.busySpin()
	for len(c.ready) == 0 && sp.next(c.done, nil, deadline) {
	}
	sp.end(len(c.ready) > 0)
}
