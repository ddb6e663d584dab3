// Package cpumap holds ustack's XDP-style verdicts and its cpumap: frames a
// Program redirects to another CPU are moved, in bulks, through a ring to a
// worker goroutine pinned to that CPU, which hands them to its own Receiver
// (in ustack a standalone GRO engine), as the kernel's BPF_MAP_TYPE_CPUMAP
// does with its kthreads (kernel/bpf/cpumap.c; the cpumap GRO patch gives each kthread
// its own GRO instance).
//
// # Programs
//
// A Program runs on the poll loop for each frame, before a packet is built
// for it, and returns an Action: Pass, Drop, TX or Redirect with an entry
// index. The built-in programs (ParseProgram) pass or drop everything, send
// everything to one entry, spread flows over the entries with an RSS-like
// Toeplitz hash, or drop one destination port. They read only the frame's
// bytes, never allocate, and treat any bytes as input, never panicking.
//
// # Data path
//
//	poll loop (one per RX queue)           worker i (pinned to CPUs[i])
//	  Program.Run -> Redirect(i)
//	  Producer.EnqueueFrame(i, f) -> bulk queue of entry i (BulkSize, 8)
//	    full: flushed into ring i            ring i (QueueSize, MPSC)
//	  Producer.Flush at batch end ------->     takes up to Batch frames,
//	    (drops what does not fit)              builds their packets in bulk,
//	                                           ReceiveList, or Receive each
//	                                           flush old packets every 64,
//	                                           all when the ring ran empty
//
// What moves through the ring is a bufpool.Frame, the kernel's xdp_frame:
// on the linear RQ the frame's bytes in their RX stride, with no packet
// built, so that the worker builds the packet on its own CPU as
// cpu_map_kthread_run does (the structs in one bulk from its cache,
// napi_skb_cache_get_bulk, each around its frame,
// __xdp_build_skb_from_frame; counted in cpumap_worker_built and
// cpumap_worker_bulk_allocs). A frame the poll loop had to build a packet
// for (a multi-buffer frame of the nonlinear RQ) carries it, and Enqueue
// takes such packets (cpumap_worker_prebuilt).
//
// A Producer belongs to one poll loop, as the kernel's per-CPU
// xdp_bulk_queue belongs to one CPU: it keeps one bulk queue per entry and
// takes a ring's lock once per bulk, never per frame. A producer never
// blocks: frames that do not fit in a full ring are released and counted
// (cpumap_dropped). A worker sleeps when its ring is empty and is woken by
// the flush that makes it non-empty, once per bulk.
//
// # Workers and GRO
//
// Each entry's worker is a goroutine that calls Config.Pin first (in ustack
// LockOSThread and sched_setaffinity to the entry's CPU; New fails if that
// fails) and never unlocks its thread. Like cpu_map_kthread_run, it takes up
// to Batch (8) frames per round and hands them to its Receiver: as one list
// to a ListReceiver (netif_receive_skb_list, one call per round), else one
// by one (gro_receive_skb). Every 64 frames (NAPI_POLL_WEIGHT), and when a
// round leaves the ring empty, it flushes as cpu_map_gro_flush does:
// gro_flush(gro, !empty && HZ >= 1000). While the ring still holds frames
// an OldFlusher (a *gro.Engine) hands up only the packets older than a
// jiffy (FlushOlderThan(1ms)); when the ring is empty the worker ends the
// batch (EndBatch) and flushes a Flusher in full before it sleeps. A
// Receiver that is neither gets EndBatch both times.
//
// # Threading and ownership
//
// Producer methods are called from the producer's goroutine; several
// producers may feed one ring. Receiver methods are called only from the
// entry's worker goroutine. Map.Stats may be read from any goroutine, and
// Map.Close called from any goroutine but a worker's.
//
// EnqueueFrame takes ownership of the frame (Enqueue, of the packet). From
// then on the map owns it until the entry's worker hands its packet to
// Receiver.Receive, which takes ownership; or until the map releases it
// (ring full, invalid entry, Close). Every frame given to EnqueueFrame or
// Enqueue ends up in exactly one of those two places.
//
// # Ordering
//
// Frames one producer enqueues to one entry reach that entry's Receiver in
// the order they were enqueued (or are dropped). Frames of different
// producers, or to different entries, have no order between them; the
// built-in hash keeps each flow on one entry so a flow is not reordered
// unless two producers carry it.
package cpumap
