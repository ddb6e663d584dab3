package cpumap

import (
	"strconv"
	"sync/atomic"
)

// Stats are a Map's counters. They are written by producers and workers and
// may be read from any goroutine.
//
// Every frame given to Enqueue is counted once in Enqueued; once the map
// is closed and its workers are done, Enqueued == worker frames + Dropped.
type Stats struct {
	// Enqueued counts frames given to Producer.Enqueue: cpumap_enqueued.
	// Producers add their counts when they flush a bulk, so the count may
	// lag by what bulk queues hold.
	Enqueued atomic.Uint64
	// BulkFlushes counts bulk queues flushed into a ring, full or at a
	// Flush: cpumap_bulk_flushes.
	BulkFlushes atomic.Uint64
	// BulkFrames counts the frames those flushes carried, those the ring
	// had no room for included: cpumap_bulk_frames. BulkFrames /
	// BulkFlushes is the average bulk size.
	BulkFrames atomic.Uint64
	// Dropped counts frames released by the map: the ring was full, the
	// entry did not exist, or the map was closed: cpumap_dropped.
	Dropped atomic.Uint64
	// Invalid counts frames enqueued to an entry the map does not have
	// (also counted in Dropped): cpumap_redirect_invalid.
	Invalid atomic.Uint64

	entries []EntryStats
	names   []string // cpumap_entry_N_frames, cpumap_entry_N_dropped
}

// EntryStats are one entry's counters. Its worker writes all but Dropped,
// which producers write.
type EntryStats struct {
	// Frames counts frames the worker handed to its Receiver.
	Frames atomic.Uint64
	// Rounds counts rounds: takes of up to Batch frames from the ring.
	Rounds atomic.Uint64
	// EmptyWaits counts the times the worker slept on an empty ring.
	EmptyWaits atomic.Uint64
	// EndBatches counts Receiver.EndBatch calls.
	EndBatches atomic.Uint64
	// FlushOld counts the flushes of packets older than a jiffy made
	// under load (OldFlusher.FlushOlderThan).
	FlushOld atomic.Uint64
	// Lists counts rounds handed over as one list (ListReceiver).
	Lists atomic.Uint64
	// Built counts packets the worker built from frames (EnqueueFrame's
	// frames without a packet), Prebuilt the packets frames carried
	// (Enqueue's, a multi-buffer frame's), BulkAllocs the rounds that
	// took packet structs from the cache in one bulk.
	Built, Prebuilt, BulkAllocs atomic.Uint64

	// Dropped counts frames that did not fit in the entry's ring.
	Dropped atomic.Uint64
	_       [cacheLine]byte
}

// maxNamedEntries is the number of entries whose counters Each reports by
// name, bounding the list (Entry reads any).
const maxNamedEntries = 8

func newStats(n int) *Stats {
	s := &Stats{entries: make([]EntryStats, n)}
	for i := range min(n, maxNamedEntries) {
		p := "cpumap_entry_" + strconv.Itoa(i)
		s.names = append(s.names, p+"_frames", p+"_dropped")
	}
	return s
}

// NumEntries returns the number of entries.
func (s *Stats) NumEntries() int { return len(s.entries) }

// Entry returns entry i's counters.
func (s *Stats) Entry(i int) *EntryStats { return &s.entries[i] }

// WorkerRounds returns the rounds of all workers: cpumap_worker_rounds.
func (s *Stats) WorkerRounds() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.Rounds.Load() })
}

// WorkerFrames returns the frames all workers handed to their Receivers:
// cpumap_worker_frames.
func (s *Stats) WorkerFrames() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.Frames.Load() })
}

// WorkerEmptyWaits returns the times workers slept on an empty ring:
// cpumap_worker_empty_waits.
func (s *Stats) WorkerEmptyWaits() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.EmptyWaits.Load() })
}

// WorkerEndBatches returns the EndBatch calls of all workers:
// cpumap_worker_end_batches.
func (s *Stats) WorkerEndBatches() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.EndBatches.Load() })
}

// WorkerFlushOld returns the flushes of old packets under load of all
// workers: cpumap_worker_flush_old.
func (s *Stats) WorkerFlushOld() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.FlushOld.Load() })
}

// WorkerLists returns the rounds all workers handed over as lists:
// cpumap_worker_lists.
func (s *Stats) WorkerLists() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.Lists.Load() })
}

// WorkerBuilt returns the packets all workers built from frames:
// cpumap_worker_built.
func (s *Stats) WorkerBuilt() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.Built.Load() })
}

// WorkerPrebuilt returns the packets frames carried to all workers already
// built: cpumap_worker_prebuilt.
func (s *Stats) WorkerPrebuilt() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.Prebuilt.Load() })
}

// WorkerBulkAllocs returns the bulk takes of packet structs of all
// workers: cpumap_worker_bulk_allocs.
func (s *Stats) WorkerBulkAllocs() uint64 {
	return s.sum(func(e *EntryStats) uint64 { return e.BulkAllocs.Load() })
}

// BulkSizeAvg returns the average frames per bulk flush (0 before any).
func (s *Stats) BulkSizeAvg() float64 {
	n := s.BulkFlushes.Load()
	if n == 0 {
		return 0
	}
	return float64(s.BulkFrames.Load()) / float64(n)
}

func (s *Stats) sum(f func(*EntryStats) uint64) uint64 {
	var v uint64
	for i := range s.entries {
		v += f(&s.entries[i])
	}
	return v
}

// Each calls fn with every counter's name and current value, always in the
// same order: the map's, the workers' sums, then cpumap_entry_N_frames and
// cpumap_entry_N_dropped for the first 8 entries. It may be called from any
// goroutine.
func (s *Stats) Each(fn func(name string, v uint64)) {
	fn("cpumap_enqueued", s.Enqueued.Load())
	fn("cpumap_bulk_flushes", s.BulkFlushes.Load())
	fn("cpumap_bulk_frames", s.BulkFrames.Load())
	fn("cpumap_dropped", s.Dropped.Load())
	fn("cpumap_redirect_invalid", s.Invalid.Load())
	fn("cpumap_worker_rounds", s.WorkerRounds())
	fn("cpumap_worker_frames", s.WorkerFrames())
	fn("cpumap_worker_empty_waits", s.WorkerEmptyWaits())
	fn("cpumap_worker_end_batches", s.WorkerEndBatches())
	fn("cpumap_worker_flush_old", s.WorkerFlushOld())
	fn("cpumap_worker_lists", s.WorkerLists())
	fn("cpumap_worker_built", s.WorkerBuilt())
	fn("cpumap_worker_prebuilt", s.WorkerPrebuilt())
	fn("cpumap_worker_bulk_allocs", s.WorkerBulkAllocs())
	for i := range len(s.names) / 2 {
		e := &s.entries[i]
		fn(s.names[2*i], e.Frames.Load())
		fn(s.names[2*i+1], e.Dropped.Load())
	}
}
