package xsk

import "sync/atomic"

// cacheLine is the assumed cache line size: the producer and consumer
// indexes sit on lines of their own so that the two sides of a ring do not
// false-share, as the kernel's struct xdp_ring does with
// ____cacheline_aligned_in_smp.
const cacheLine = 64

// ring is the memory both sides of an AF_XDP ring share: a power-of-two
// array of entries and two free-running uint32 indexes. The producer owns
// producer and the entries in [consumer+size-?, ...) it reserved; the
// consumer owns consumer and the entries in [consumer, producer). Entry i
// lives in slot i&mask, so the indexes may wrap around 2^32 freely: every
// distance is computed in uint32 arithmetic.
type ring[T any] struct {
	producer atomic.Uint32
	_        [cacheLine - 4]byte
	consumer atomic.Uint32
	_        [cacheLine - 4]byte
	mask     uint32
	entries  []T
}

// newRing returns a ring of size entries (a power of two) whose indexes
// both start at start; tests start near 2^32 to exercise the wrap-around.
func newRing[T any](size, start uint32) *ring[T] {
	r := &ring[T]{mask: size - 1, entries: make([]T, size)}
	r.producer.Store(start)
	r.consumer.Store(start)
	return r
}

// Producer is the producing side of a ring, in the style of libxdp's
// struct xsk_ring_prod: Reserve slots, fill them through Entry, Submit.
// The application produces on the fill and TX rings, the socket on the RX
// and completion rings.
//
// A Producer is not safe for concurrent use: one goroutine at a time
// (or the caller's own lock) drives it. It may run concurrently with the
// ring's Consumer; entries become visible to the consumer at Submit
// (a release store of the producer index), and slots come back when the
// consumer Releases them.
type Producer[T any] struct {
	r          *ring[T]
	size       uint32
	cachedProd uint32 // next index to reserve; >= the published producer index
	cachedCons uint32 // last consumer index seen, plus size: the reservable limit
}

func newProducer[T any](r *ring[T]) Producer[T] {
	size := r.mask + 1
	return Producer[T]{r: r, size: size, cachedProd: r.producer.Load(), cachedCons: r.consumer.Load() + size}
}

// Size returns the ring's number of entries.
func (p *Producer[T]) Size() uint32 { return p.size }

// Free returns the number of free slots (possibly more than n): like
// libxdp's xsk_prod_nb_free it reads the consumer index only when the
// cached view shows fewer than n.
func (p *Producer[T]) Free(n uint32) uint32 {
	free := p.cachedCons - p.cachedProd
	if free >= n {
		return free
	}
	p.cachedCons = p.r.consumer.Load() + p.size
	return p.cachedCons - p.cachedProd
}

// Reserve reserves n consecutive slots, all or nothing as libxdp's
// xsk_ring_prod__reserve: it returns n and the index of the first slot, or
// 0 when fewer than n are free. Fill the slots through Entry(idx),
// Entry(idx+1), ... and publish them with Submit.
func (p *Producer[T]) Reserve(n uint32) (got, idx uint32) {
	if p.Free(n) < n {
		return 0, 0
	}
	idx = p.cachedProd
	p.cachedProd += n
	return n, idx
}

// Cancel gives back the last n slots reserved and not yet submitted.
func (p *Producer[T]) Cancel(n uint32) { p.cachedProd -= n }

// Entry returns the slot with index idx (any uint32: it is masked). The
// pointer is valid until the slot is submitted.
func (p *Producer[T]) Entry(idx uint32) *T { return &p.r.entries[idx&p.r.mask] }

// Submit publishes the next n reserved slots to the consumer. n must not
// exceed the slots reserved and not yet submitted.
func (p *Producer[T]) Submit(n uint32) {
	p.r.producer.Store(p.r.producer.Load() + n)
}

// Consumer is the consuming side of a ring, in the style of libxdp's struct
// xsk_ring_cons: Peek entries, read them through Entry, Release them. The
// application consumes on the RX and completion rings, the socket on the
// fill and TX rings.
//
// A Consumer is not safe for concurrent use: one goroutine at a time (or
// the caller's own lock) drives it. It may run concurrently with the ring's
// Producer; Peek's load of the producer index acquires the entries'
// contents, and Release hands the slots back.
type Consumer[T any] struct {
	r          *ring[T]
	cachedCons uint32 // next index to peek; >= the published consumer index
	cachedProd uint32 // last producer index seen
}

func newConsumer[T any](r *ring[T]) Consumer[T] {
	c := r.consumer.Load()
	return Consumer[T]{r: r, cachedCons: c, cachedProd: r.producer.Load()}
}

// Size returns the ring's number of entries.
func (c *Consumer[T]) Size() uint32 { return c.r.mask + 1 }

// Avail returns the number of entries ready to peek, up to n. It reads the
// producer index only when the cached view shows fewer than n (libxdp's
// xsk_cons_nb_avail reads it only when the view shows none; refreshing
// sooner lets Kick see the rest of a multi-buffer packet submitted after
// its first chunks).
func (c *Consumer[T]) Avail(n uint32) uint32 {
	avail := c.cachedProd - c.cachedCons
	if avail < n {
		c.cachedProd = c.r.producer.Load()
		avail = c.cachedProd - c.cachedCons
	}
	return min(avail, n)
}

// Peek returns up to n ready entries: their count and the index of the
// first, read through Entry(idx), Entry(idx+1), ... Release them when done.
func (c *Consumer[T]) Peek(n uint32) (got, idx uint32) {
	got = c.Avail(n)
	if got == 0 {
		return 0, 0
	}
	idx = c.cachedCons
	c.cachedCons += got
	return got, idx
}

// Cancel un-peeks the last n entries peeked and not yet released, as
// libxdp's xsk_ring_cons__cancel: the next Peek returns them again.
func (c *Consumer[T]) Cancel(n uint32) { c.cachedCons -= n }

// Entry returns the entry with index idx (any uint32: it is masked). The
// pointer is valid until the entry is released.
func (c *Consumer[T]) Entry(idx uint32) *T { return &c.r.entries[idx&c.r.mask] }

// Release hands the next n peeked entries' slots back to the producer. n
// must not exceed the entries peeked and not yet released.
func (c *Consumer[T]) Release(n uint32) {
	c.r.consumer.Store(c.r.consumer.Load() + n)
}
