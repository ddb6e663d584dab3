package cpumap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/ustack/ustack/bufpool"
)

// Defaults and limits, the kernel's.
const (
	// DefaultQueueSize is the ring size of an entry, the qsize that
	// samples/bpf/xdp_redirect_cpu and most users give a cpumap entry.
	DefaultQueueSize = 2048
	// MaxQueueSize is cpu_map_update_elem's sanity limit on qsize.
	MaxQueueSize = 16384
	// DefaultBulkSize is CPU_MAP_BULK_SIZE: 8 pointers, one cache line
	// on 64-bit machines.
	DefaultBulkSize = 8
	// DefaultBatch is CPUMAP_BATCH: frames a kthread takes per round.
	DefaultBatch = 8
	// flushFrames is how many frames a worker hands its Receiver under
	// continuous load before it ends a batch anyway: NAPI_POLL_WEIGHT,
	// as cpu_map_kthread_run flushes its GRO "either every 64 packets
	// or in case of empty ring".
	flushFrames = 64
	// jiffy is how old a held packet must be for the flush a worker makes
	// while its ring still holds frames: gro_flush(gro, flush_old) skips
	// the packets of the current jiffy, one tick of a HZ=1000 kernel
	// (cpu_map_gro_flush passes flush_old = !empty && HZ >= 1000).
	jiffy = time.Millisecond
)

// Receiver is what a worker feeds: in ustack a GRO engine whose sink
// delivers to gVisor (or, with cpumap GRO off, something that delivers each
// packet at once). Both methods are called only from the entry's worker
// goroutine; a *gro.Engine is a Receiver.
type Receiver interface {
	// Receive takes ownership of p. now is the worker's monotonic clock
	// in ns (Config.Now), read once per round.
	Receive(p *bufpool.Packet, now int64)
	// EndBatch ends a batch: it is called after each round that left the
	// ring empty, after every 64 frames under continuous load, and once
	// when the worker stops. A GRO engine flushes there.
	EndBatch(now int64)
}

// Flusher is implemented by Receivers that may keep packets across
// EndBatch (a GRO engine with a flush timeout). When its ring ran empty a
// worker calls Flush after EndBatch, so that nothing is held while it
// sleeps: cpu_map_gro_flush's full gro_flush on an empty ring. A
// *gro.Engine is a Flusher.
type Flusher interface {
	Flush()
}

// OldFlusher is implemented by Receivers that can hand up just the packets
// they have held at least age at now (a *gro.Engine). Every 64 frames under
// load, while the ring still holds frames, a worker calls
// FlushOlderThan(1ms, now) instead of EndBatch: cpu_map_gro_flush's
// gro_flush(gro, flush_old = !empty && HZ >= 1000), which leaves the
// packets of the current jiffy held, as napi_complete_done's does.
type OldFlusher interface {
	FlushOlderThan(age time.Duration, now int64)
}

// ListReceiver is implemented by Receivers that take a round's frames as
// one list (netif_receive_skb_list, what cpu_map_kthread_run handed the
// stack before it had a GRO instance): the worker calls ReceiveList once
// per round instead of Receive per frame. ReceiveList takes ownership of
// every packet in ps and borrows ps itself for the call only.
type ListReceiver interface {
	ReceiveList(ps []*bufpool.Packet, now int64)
}

// Config configures a Map.
type Config struct {
	// CPUs is the OS CPU of each entry (at least one). Entry i's worker
	// is pinned to CPUs[i] through Pin. A CPU may appear twice.
	CPUs []int
	// QueueSize is the ring size of each entry, a power of two up to
	// MaxQueueSize (0: DefaultQueueSize).
	QueueSize int
	// BulkSize is the size of a producer's bulk queue per entry, up to
	// QueueSize (0: DefaultBulkSize, or QueueSize if smaller).
	BulkSize int
	// Batch is the most frames a worker takes from its ring per round
	// (0: DefaultBatch); more than QueueSize means QueueSize.
	Batch int
	// Pin is called first thing on each worker goroutine with that
	// entry's CPU, and returns the CPU the thread then runs on (ustack
	// passes driver.PinThread, which calls runtime.LockOSThread and
	// sched_setaffinity). An error fails New. nil: runtime.LockOSThread
	// only. The worker never unlocks its thread, so that a thread whose
	// affinity was changed ends with the worker instead of going back to
	// the runtime.
	Pin func(cpus []int) (int, error)
	// NewReceiver returns entry's Receiver. New calls it once per entry,
	// in order, before the workers start.
	NewReceiver func(entry int) Receiver
	// Now is a monotonic clock in ns for Receive and EndBatch (nil: the
	// time since New).
	Now func() int64
}

// Map is a cpumap: per entry, a ring and a worker goroutine that feeds the
// entry's Receiver. Producers (NewProducer) fill the rings.
type Map struct {
	cpus  []int
	bulk  int
	batch int
	now   func() int64
	pin   func([]int) (int, error)

	entries []entry
	stats   *Stats
	wg      sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	producers []*Producer
}

// entry is one destination: its ring and its worker's state.
type entry struct {
	ring    ring
	recv    Receiver
	flusher Flusher      // recv, when it is one; else nil
	old     OldFlusher   // recv, when it is one; else nil
	list    ListReceiver // recv, when it is one; else nil
	cpu     int          // what Pin returned; set before New returns
}

// New validates cfg, creates each entry's Receiver and starts the workers.
// It returns once every worker is pinned; if Pin fails for any, it stops
// them all and returns the error.
func New(cfg Config) (*Map, error) {
	if len(cfg.CPUs) == 0 {
		return nil, errors.New("cpumap: no CPUs")
	}
	if cfg.NewReceiver == nil {
		return nil, errors.New("cpumap: no NewReceiver")
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.QueueSize < 1 || cfg.QueueSize > MaxQueueSize || cfg.QueueSize&(cfg.QueueSize-1) != 0 {
		return nil, fmt.Errorf("cpumap: queue size %d: want a power of two from 1 to %d", cfg.QueueSize, MaxQueueSize)
	}
	if cfg.BulkSize == 0 {
		cfg.BulkSize = min(DefaultBulkSize, cfg.QueueSize)
	}
	if cfg.BulkSize < 1 || cfg.BulkSize > cfg.QueueSize {
		return nil, fmt.Errorf("cpumap: bulk size %d: want 1 to the queue size %d", cfg.BulkSize, cfg.QueueSize)
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Batch < 1 {
		return nil, fmt.Errorf("cpumap: batch %d: want 1 or more", cfg.Batch)
	}
	cfg.Batch = min(cfg.Batch, cfg.QueueSize) // a round never takes more
	m := &Map{
		cpus:    append([]int(nil), cfg.CPUs...),
		bulk:    cfg.BulkSize,
		batch:   cfg.Batch,
		now:     cfg.Now,
		pin:     cfg.Pin,
		entries: make([]entry, len(cfg.CPUs)),
		stats:   newStats(len(cfg.CPUs)),
	}
	if m.now == nil {
		start := time.Now()
		m.now = func() int64 { return int64(time.Since(start)) }
	}
	for i := range m.entries {
		e := &m.entries[i]
		e.ring.init(cfg.QueueSize)
		e.recv = cfg.NewReceiver(i)
		if e.recv == nil {
			return nil, fmt.Errorf("cpumap: NewReceiver(%d) returned nil", i)
		}
		e.flusher, _ = e.recv.(Flusher)
		e.old, _ = e.recv.(OldFlusher)
		e.list, _ = e.recv.(ListReceiver)
	}
	errs := make([]error, len(m.entries))
	var ready sync.WaitGroup
	for i := range m.entries {
		m.wg.Add(1)
		ready.Add(1)
		go m.run(i, &errs[i], &ready)
	}
	ready.Wait()
	if err := errors.Join(errs...); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Len returns the number of entries.
func (m *Map) Len() int { return len(m.entries) }

// WorkerCPU returns the CPU that Pin reported for entry's worker, or -1
// without Pin.
func (m *Map) WorkerCPU(entry int) int { return m.entries[entry].cpu }

// Stats returns the map's counters, which may be read from any goroutine.
func (m *Map) Stats() *Stats { return m.stats }

// NewProducer returns a producer for one poll loop. After Close it returns
// a producer that drops everything.
func (m *Map) NewProducer() *Producer {
	pr := &Producer{m: m, bulks: make([]bulkQueue, len(m.entries))}
	for i := range pr.bulks {
		pr.bulks[i].q = make([]bufpool.Frame, m.bulk)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		pr.closed = true
	} else {
		m.producers = append(m.producers, pr)
	}
	return pr
}

// Close stops the map: frames in producers' bulk queues are released and
// counted as dropped, and later Enqueues drop their frames; each worker
// hands every frame left in its ring to its Receiver, calls EndBatch (and
// Flush, for a Flusher) one last time, and exits. Close returns when all
// workers have exited, and os.ErrClosed when called again. It may be
// called from any goroutine but a worker's (a Receiver must not call it);
// it waits for a Receiver that blocks.
func (m *Map) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return os.ErrClosed
	}
	m.closed = true
	prods := m.producers
	m.producers = nil
	m.mu.Unlock()
	for _, pr := range prods {
		pr.close()
	}
	for i := range m.entries {
		m.entries[i].ring.close()
	}
	m.wg.Wait()
	return nil
}

// run is entry i's worker, after cpu_map_kthread_run: take up to Batch
// frames, hand them to the Receiver (as a list to a ListReceiver), flush when the ring ran empty or every flushFrames
// frames (endBatch), sleep while the ring is empty, and once the map
// closes, drain the ring and stop.
func (m *Map) run(i int, pinErr *error, ready *sync.WaitGroup) {
	defer m.wg.Done()
	e := &m.entries[i]
	if m.pin != nil {
		cpu, err := m.pin([]int{m.cpus[i]})
		e.cpu = cpu
		if err != nil {
			*pinErr = fmt.Errorf("cpumap: pin worker %d to cpu %d: %w", i, m.cpus[i], err)
		}
	} else {
		runtime.LockOSThread()
		e.cpu = -1
	}
	ready.Done()

	st := &m.stats.entries[i]
	frames := make([]bufpool.Frame, m.batch)
	pkts := make([]*bufpool.Packet, m.batch)
	bulk := make([]*bufpool.Packet, m.batch) // the worker's packet cache
	r := &e.ring
	var packets int
	for {
		if r.empty() {
			// closing is set after the last push, so a ring seen
			// empty after it stays empty.
			if r.closing.Load() && r.empty() {
				break
			}
			r.wait(&st.EmptyWaits)
			continue
		}
		n := r.pop(frames)
		ps := build(st, frames[:n], pkts, bulk)
		now := m.now()
		if e.list != nil {
			e.list.ReceiveList(ps, now)
			st.Lists.Add(1)
		} else {
			for _, p := range ps {
				e.recv.Receive(p, now)
			}
		}
		clear(ps)
		st.Rounds.Add(1)
		st.Frames.Add(uint64(n))
		packets += n
		if empty := r.empty(); empty || packets >= flushFrames {
			m.endBatch(e, st, now, empty)
			packets = 0
		}
	}
	m.endBatch(e, st, m.now(), true)
}

// build turns a round's frames into packets in out, as cpu_map_kthread_run
// does before it hands them on: the packet structs for the frames that
// have none come in one bulk from the worker's cache (bulk, as
// napi_skb_cache_get_bulk fills its skbs array), and each is built around
// its frame (__xdp_build_skb_from_frame, Frame.Build); a frame that carries
// a packet the poll loop built (a multi-buffer frame) hands that one on.
// fs is cleared; out and bulk are at least len(fs) long.
func build(st *EntryStats, fs []bufpool.Frame, out, bulk []*bufpool.Packet) []*bufpool.Packet {
	need := 0
	for i := range fs {
		if fs[i].Pkt == nil {
			need++
		}
	}
	if need > 0 {
		bufpool.NewPackets(bulk[:need])
		st.BulkAllocs.Add(1)
	}
	j := 0
	for i := range fs {
		if fs[i].Pkt != nil {
			out[i] = fs[i].Pkt
			continue
		}
		out[i] = fs[i].Build(bulk[j])
		bulk[j] = nil
		j++
	}
	clear(fs)
	st.Built.Add(uint64(need))
	st.Prebuilt.Add(uint64(len(fs) - need))
	return out[:len(fs)]
}

// endBatch is cpu_map_gro_flush: with the ring empty (full) it ends the
// Receiver's batch and flushes a Flusher in full; while the ring still
// holds frames it flushes an OldFlusher's packets older than a jiffy
// (flush_old), or ends the batch of a Receiver that is none.
func (m *Map) endBatch(e *entry, st *EntryStats, now int64, full bool) {
	if !full && e.old != nil {
		e.old.FlushOlderThan(jiffy, now)
		st.FlushOld.Add(1)
		return
	}
	e.recv.EndBatch(now)
	st.EndBatches.Add(1)
	if full && e.flusher != nil {
		e.flusher.Flush()
	}
}
