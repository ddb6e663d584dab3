package stack

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/gro"
)

// rxQueue is a receive queue beyond the first (Config.Queues): a driver of
// its own (NIC model, ring, page pool and poll loop) on one queue of a
// multi-queue TAP or TUN, delivering into the stack's one link endpoint
// with a GRO engine of its own, as each of mlx5's channels has its RQ, its
// NAPI and the NAPI's GRO. What it hands on runs the link endpoint's
// stages 3 to 10 (toGVisor), which the cpumap workers also run
// concurrently. Deliver and Flush are called by its poll loop only.
type rxQueue struct {
	ep         *linkEndpoint
	drv        *driver.Driver
	gro        *gro.Engine // nil with GRO off
	groTimeout time.Duration
	now        int64 // the current batch's clock (ns since ep.epoch), 0 between batches
	// The queue's XDP state (with Config.XDP): its scratch and its cpumap
	// producer (nil: no cpumap), as each CPU has its xdp_bulk_queue.
	xdpParts [][]byte
	cpuProd  *cpumap.Producer
	// inl is the poll loop's inline batch (Config.InlineTCP), run at
	// Flush; used by whoever holds the ring (the poll loop or a busy
	// reader), one at a time; inlPkts counts the packets since it ran.
	inl     inlineBatch
	inlPkts int
}

var _ driver.XDPHandler = (*rxQueue)(nil)

// XDP runs the stack's XDP program on this queue's frames
// (driver.XDPHandler; the driver offers frames only with Config.XDP).
func (q *rxQueue) XDP(f bufpool.Frame) bool {
	return q.ep.runXDP(&q.xdpParts, q.cpuProd, false, f)
}

// Deliver is the link endpoint's Deliver for this queue: GRO, then
// gVisor.
func (q *rxQueue) Deliver(p *driver.Packet) {
	q.inlPkts++
	if q.gro != nil {
		q.gro.Receive(p, q.nowNS())
		return
	}
	q.ep.toGVisor(p, &q.inl)
}

// Flush ends a poll batch as the link endpoint's Flush does.
func (q *rxQueue) Flush(more bool) time.Duration {
	if q.cpuProd != nil {
		q.cpuProd.Flush() // xdp_do_flush
	}
	var again time.Duration
	if q.gro != nil {
		again = flushGRO(q.gro, q.groTimeout, more, q.nowNS())
		q.now = 0
	}
	q.inlPkts = endRound(&q.inl, q.inlPkts, more)
	return again
}

func (q *rxQueue) nowNS() int64 {
	if q.now == 0 {
		q.now = time.Since(q.ep.epoch).Nanoseconds() + 1
	}
	return q.now
}

// flushGRO is napi_poll's end of a batch for engine g: with more work
// waiting only what is older than a jiffy (or the flush timeout) goes up,
// else the batch ends. It returns how soon to be called again while g
// still holds packets.
func flushGRO(g *gro.Engine, timeout time.Duration, more bool, now int64) time.Duration {
	if more {
		g.FlushOlderThan(max(jiffy, timeout), now)
	} else {
		g.EndBatch(now)
	}
	if g.Held() > 0 {
		return timeout
	}
	return 0
}

// checkQueues checks the further queues' wires.
func checkQueues(cfg *Config) error {
	if len(cfg.Queues) == 0 {
		return nil
	}
	if 1+len(cfg.Queues) > driver.MaxQueues {
		return fmt.Errorf("stack: %d queues: at most %d", 1+len(cfg.Queues), driver.MaxQueues)
	}
	for _, w := range cfg.Queues {
		if w == nil {
			return errors.New("stack: a nil queue wire")
		}
	}
	return nil
}

// queuePin returns the CPUs that pin queue i of n: with one queue the
// whole list (the thread may run on any of them), with several the list's
// i-th CPU (round robin), so that -nic-cpu and -poll-cpu lists spread the
// queues.
func queuePin(cpus []int, i, n int) []int {
	if n == 1 || len(cpus) == 0 {
		return cpus
	}
	return []int{cpus[i%len(cpus)]}
}

// txQueue picks the queue a packet leaves on: one per flow, by a hash of
// its addresses and ports, so that a flow's packets keep their order and
// the kernel's tun_flow_update steers the flow's replies to the same queue
// (tun_automq_select_queue). Packets that are not TCP or UDP over IP leave
// on queue 0.
func txQueue(pkt *gstack.PacketBuffer, n int) int {
	if n == 1 {
		return 0
	}
	nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
	if len(nh) == 0 || len(th) < 4 {
		return 0
	}
	src, dst := ipAddrs(nh)
	h := uint32(2166136261) // FNV-1a over the addresses and ports
	for _, b := range [][]byte{src, dst, th[:4]} {
		for _, c := range b {
			h = (h ^ uint32(c)) * 16777619
		}
	}
	// FNV-1a's low bits follow the inputs' (bit 0 is the XOR of the
	// bytes' bit 0), and Linux gives connect() ports of one parity
	// (__inet_hash_connect): finish with murmur3's fmix32 and take the
	// high bits, as the kernel's reciprocal_scale does, so that flows that
	// differ only there still spread.
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return int(uint64(h) * uint64(n) >> 32)
}

// queueCounterName is a driver counter's name for queue q, as ethtool -S
// names mlx5's per-queue counters: rx_packets -> rx3_packets, tx_packets ->
// tx3_packets, anything else (nic_cpu_ns) -> q3_nic_cpu_ns.
func queueCounterName(name string, q int) string {
	n := strconv.Itoa(q)
	switch {
	case strings.HasPrefix(name, "rx_"):
		return "rx" + n + name[2:]
	case strings.HasPrefix(name, "tx_"):
		return "tx" + n + name[2:]
	}
	return "q" + n + "_" + name
}

// SplitQueueCounter undoes queueCounterName: for a per-queue counter
// (rx3_packets) it returns the total's name (rx_packets), the queue and
// true. Prometheus labels per-queue counters with it.
func SplitQueueCounter(name string) (base string, queue int, ok bool) {
	var prefix string
	switch {
	case strings.HasPrefix(name, "rx"):
		prefix = "rx"
	case strings.HasPrefix(name, "tx"):
		prefix = "tx"
	case strings.HasPrefix(name, "q"):
		prefix = "q"
	default:
		return "", 0, false
	}
	rest := name[len(prefix):]
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || i >= len(rest) || rest[i] != '_' {
		return "", 0, false
	}
	q, err := strconv.Atoi(rest[:i])
	if err != nil {
		return "", 0, false
	}
	if prefix == "q" {
		return rest[i+1:], q, true
	}
	return prefix + rest[i:], q, true
}

// eachQueued yields the counters of every queue's driver, pool and GRO:
// first their totals under the single-queue names (so that rx_packets is
// the device's), each made by its kind (KindOf: sums, but the largest
// queue's rx_pp_alloc_order and rx_gro_held_max), then, with several
// queues, each queue's under queueCounterName. With one queue it is the
// driver's own counters.
func (s *Stack) eachQueued(fn func(name string, v uint64)) {
	one := func(drv *driver.Driver, g *gro.Engine, fn func(string, uint64)) {
		drv.Stats().Each(fn)
		drv.EachHWGRO(fn)
		drv.Pool().Stats().Each(fn)
		if g != nil {
			g.Stats().Each(fn)
		}
	}
	if len(s.queues) == 0 {
		one(s.drv, s.ep.gro, fn)
		return
	}
	var tot counterTotals
	one(s.drv, s.ep.gro, tot.add)
	for _, q := range s.queues {
		one(q.drv, q.gro, tot.add)
	}
	tot.each("", fn)
	one(s.drv, s.ep.gro, func(name string, v uint64) { fn(queueCounterName(name, 0), v) })
	for i, q := range s.queues {
		one(q.drv, q.gro, func(name string, v uint64) { fn(queueCounterName(name, i+1), v) })
	}
}

// Queues returns the number of receive queues (1 + len(Config.Queues)).
func (s *Stack) Queues() int { return 1 + len(s.queues) }

// QueueDriver returns queue i's driver (0 is Driver's).
func (s *Stack) QueueDriver(i int) *driver.Driver {
	if i == 0 {
		return s.drv
	}
	return s.queues[i-1].drv
}
