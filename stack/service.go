package stack

import "time"

// ServiceConfig returns the configuration for a Go service that embeds
// the stack: Config's zero value, which is the NIC model and its driver
// as mlx5 ships them (what the kernel patches' A/B comparisons start
// from), with the receive policies that measured fastest and are safe for
// any peer and any application. Set Wire and Addrs (and Routes,
// DNSServers) on what it returns. `ustack run` starts from it (-config
// service, its default) and the first row of `ustack bench` measures it
// beside the mlx5 rows.
//
// What it changes from the zero value, and why:
//   - Driver.LRO on: the TAP's GSO super-frames are handed up whole, as
//     hardware LRO hands up what it merged (mlx5 ships with LRO off); the
//     kernel validated them, and cutting them into MTU-sized frames only
//     for GRO to merge them again costs a third of the throughput.
//   - Driver.CoalesceBytes 256 KiB: interrupt moderation by bytes (mlx5's
//     adaptive moderation raises the completion count per interrupt under
//     load, net_dim). A sleeping poll loop is woken once the completions
//     since the last interrupt hold 256 KiB (or Budget frames, whichever
//     comes first), so one poll batch takes a whole window of LRO
//     super-frames; a running poll loop sees every completion at once, so
//     request/response is not held.
//   - Driver.RunToCompletion on: the NIC model and the poll loop on one
//     goroutine per queue, as a NIC's interrupt runs NAPI on the CPU that
//     took it, until a backlog moves the NIC model to a goroutine of its
//     own (as softirq work moves to ksoftirqd): a request's frame reaches
//     the socket without a hand-off between goroutines. `ustack bench -rr`
//     measured 0.78x the kernel against 0.45x without it in one window,
//     and bulk within the runs' spread of two goroutines.
//   - DelayedACK 1 ms: as Linux in pingpong mode (tcp_send_delayed_ack),
//     the ACK of a request waits for the reply that carries it, on flows
//     that send data (a bulk receiver's ACKs are never held): one TAP
//     write per exchange instead of two. tcprr against `ustack run -echo`
//     measured 13.2-13.9k transactions/s against 11.0-13.0k without, in
//     one window. Shorter than Linux's 40 ms (TCP_DELACK_MIN): enough for
//     a reply written at once, and a sender waiting on the ACK (Nagle)
//     loses at most 1 ms.
//   - InlineTCP on (with the patched gVisor of internal/gvisor; a build
//     against the stock module leaves it off): gVisor's TCP runs in the
//     goroutine that delivers a segment, as Linux's in softirq, and each
//     connection a poll batch reached is processed once at the batch's
//     end, so that it is acknowledged once per batch (the socket
//     backlog's deferred ACK). No hand-off to a processor goroutine per
//     segment: bulk within the runs' spread in four TCP cells, request/
//     response the same or up to 10% faster.
//
// What it leaves as shipped, and why (docs/embedding.md has the figures):
//   - Pool.Order 0: order-4 pages were faster in some bulk cells and
//     slower in another, and a frame then pins a 64 KB page while sockets
//     charge what the frame used (TrainConn, zero copy), so an
//     application that holds data pins up to 16 times what the memory
//     bounds count.
//   - ZeroCopy off: lending pages to gVisor is no faster than one copy
//     for an application that reads with Read.
//   - Driver.BusyPoll and BusyRead 0: a spinning core is a cost any peer
//     can trigger; Linux leaves busy polling off too.
func ServiceConfig() Config {
	var c Config
	c.Driver.LRO = true
	c.Driver.CoalesceBytes = 256 << 10
	c.Driver.RunToCompletion = true
	c.DelayedACK = time.Millisecond
	c.InlineTCP = inlineTCPAvailable
	return c
}
