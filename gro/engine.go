package gro

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/internal/hdr"
)

// Table dimensions and limits, the kernel's.
const (
	numBucketsLog2 = 3
	numBuckets     = 1 << numBucketsLog2 // GRO_HASH_BUCKETS
	bucketCap      = 8                   // MAX_GRO_SKBS: held packets per bucket
	maxUDPSegs     = 64                  // UDP_GRO_CNT_MAX: bounds a UDP train's truesize
	// maxIPLen bounds a merged packet's IP length: the IPv4 total length
	// field, and GRO_LEGACY_MAX_SIZE (65536, exclusive) for IPv6, which
	// the kernel only exceeds with BIG TCP jumbograms.
	maxIPLen = 65535
)

// Sink receives what the engine hands up.
type Sink interface {
	// Deliver takes ownership of p. It is called from the engine's
	// goroutine, from inside Receive, EndBatch, Flush or FlushOlderThan,
	// and must not call back into the Engine.
	Deliver(p *bufpool.Packet)
}

// Config configures an Engine.
type Config struct {
	// FlushTimeout is gro_flush_timeout: 0 flushes everything held at each
	// batch end (EndBatch); > 0 keeps packets across batches until they
	// are that old.
	FlushTimeout time.Duration
	// MaxSize bounds a merged packet's IP length, header included (IPv4
	// total length; IPv6 40 plus payload length). 0 or more than 65535
	// means 65535.
	MaxSize int
}

// entry is one held packet: the head of a merged packet, its chain's tail,
// and what the next segment is checked against. The head's headers are left
// as they came until the entry is flushed.
type entry struct {
	head *bufpool.Packet // owned by the entry; its headers are the flow's
	tail *bufpool.Packet // head, or the last packet chained on head.Next
	key  flowKey
	born int64 // monotonic ns when the head came

	l4      int    // offset of the L4 header
	ipLen   int    // IP length of the merged packet so far
	mss     int    // the head's payload length: the gso_size
	segs    int    // wire frames merged, head included
	nextSeq uint32 // TCP: sequence number the next segment must carry
	id      uint16 // IPv4: the head's identification
	fixedID bool   // IPv4: the ID stays fixed (DF set), decided by the second segment
	flags   uint8  // TCP: FIN and PSH of merged segments, set in the head at flush
	v6      bool
	proto   uint8
}

// bucket holds the entries of one hash bucket, oldest first.
type bucket struct {
	n    int
	ents [bucketCap]entry
}

// find returns the index of the entry of flow k, or -1.
func (b *bucket) find(k *flowKey) int {
	for i := 0; i < b.n; i++ {
		if o := &b.ents[i].key; o.e == k.e && o.a == k.a && o.b == k.b && o.c == k.c && o.d == k.d {
			return i
		}
	}
	return -1
}

// Engine is a standalone GRO instance. It is not safe for concurrent use:
// one goroutine (a poll loop or a cpumap worker) owns it and makes every
// call; only Stats may be read elsewhere. The zero value is not usable; call
// New.
type Engine struct {
	sink    Sink
	timeout int64 // FlushTimeout in ns; 0 flushes at each batch end
	maxSize int

	held    int
	heldMax int
	buckets [numBuckets]bucket

	stats Stats
}

// New returns an engine that hands packets up to sink.
func New(cfg Config, sink Sink) *Engine {
	e := &Engine{sink: sink, timeout: int64(max(cfg.FlushTimeout, 0)), maxSize: cfg.MaxSize}
	if e.maxSize <= 0 || e.maxSize > maxIPLen {
		e.maxSize = maxIPLen
	}
	return e
}

// Stats returns the engine's counters, which may be read from any goroutine.
func (e *Engine) Stats() *Stats { return &e.stats }

// Held returns the number of packets held (merged packets count once).
func (e *Engine) Held() int { return e.held }

// Receive takes ownership of p: one frame, or an LRO super-frame. It merges
// p into a held packet of its flow, holds it as the head of a new one, or
// hands it up at once (not TCP or UDP, not mergeable); it never reorders the
// packets of one flow. now is a monotonic clock in ns, the same clock that
// EndBatch and FlushOlderThan are given.
func (e *Engine) Receive(p *bufpool.Packet, now int64) {
	var s segInfo
	switch parse(p, &s) {
	case passOther:
		e.pass(p)
		return
	case passAddrs:
		e.flushAddrs(&s.key)
		e.pass(p)
		return
	case passFlow:
		b := &e.buckets[s.key.bucket()]
		if i := b.find(&s.key); i >= 0 {
			e.flush(b, i, flushMismatch)
		}
		e.pass(p)
		return
	}
	b := &e.buckets[s.key.bucket()]
	if i := b.find(&s.key); i >= 0 {
		ent := &b.ents[i]
		var merged, done bool
		var why flushReason
		if s.proto == protoTCP {
			merged, done, why = e.mergeTCP(ent, p, &s)
		} else {
			merged, done, why = e.mergeUDP(ent, p, &s)
		}
		if done {
			e.flush(b, i, why)
		}
		if merged {
			return
		}
	}
	if s.payload == 0 || s.flags&(tcpURG|tcpPSH|tcpRST|tcpSYN|tcpFIN) != 0 {
		// tcp_gro_receive with no held packet: an empty segment, or one
		// whose flags end a train, goes up on its own.
		e.pass(p)
		return
	}
	e.hold(b, p, &s, now)
}

// EndBatch ends a poll batch: with FlushTimeout 0 it hands up everything
// held; otherwise only packets held at least FlushTimeout (now is the
// clock Receive was given).
func (e *Engine) EndBatch(now int64) {
	if e.held == 0 {
		return
	}
	if e.timeout == 0 {
		e.flushAll(flushBatchEnd)
		return
	}
	e.flushOlder(e.timeout, now, flushTimeout)
}

// Flush hands up everything held (counted as a batch end).
func (e *Engine) Flush() {
	if e.held > 0 {
		e.flushAll(flushBatchEnd)
	}
}

// FlushOlderThan hands up the packets held at least age at now (counted as
// timeouts).
func (e *Engine) FlushOlderThan(age time.Duration, now int64) {
	if e.held > 0 {
		e.flushOlder(int64(age), now, flushTimeout)
	}
}

// pass hands p up untouched.
func (e *Engine) pass(p *bufpool.Packet) {
	e.stats.Passthrough.Add(1)
	e.sink.Deliver(p)
}

// hold makes p the head of a new entry in b, evicting b's oldest entry if b
// is full. The entry owns p.
func (e *Engine) hold(b *bucket, p *bufpool.Packet, s *segInfo, now int64) {
	if b.n == bucketCap {
		e.flush(b, 0, flushEvict)
	}
	b.ents[b.n] = entry{
		head:    p,
		tail:    p,
		key:     s.key,
		born:    now,
		l4:      s.l4,
		ipLen:   s.hlen - header.EthernetMinimumSize + s.payload,
		mss:     s.payload,
		segs:    1,
		nextSeq: s.seq + uint32(s.payload),
		id:      s.id,
		v6:      s.v6,
		proto:   s.proto,
	}
	b.n++
	e.held++
	if e.held > e.heldMax {
		e.heldMax = e.held
		e.stats.HeldMax.Store(uint64(e.heldMax))
	}
}

// mergeTCP is tcp_gro_receive for a segment of ent's flow. merged reports
// that p now belongs to ent; done that ent must be flushed (after the merge
// when merged, else before p is handled as a new packet), for reason why.
func (e *Engine) mergeTCP(ent *entry, p *bufpool.Packet, s *segInfo) (merged, done bool, why flushReason) {
	h, n := ent.head.Linear, p.Linear
	l4 := s.l4
	if s.flags&tcpCWR != 0 {
		return false, true, flushFlags
	}
	if diff := (be32(n[l4+12:]) ^ be32(h[l4+12:])) &^ flagWordMergeable; diff != 0 {
		// Flags (SYN, RST, URG, ECE, ACK, AE) differ, or the data
		// offset or the window does.
		if diff&flagWordFlags != 0 {
			return false, true, flushFlags
		}
		return false, true, flushMismatch
	}
	if be32(n[l4+8:]) != be32(h[l4+8:]) || // ACK number
		s.payload == 0 || s.payload > ent.mss || s.seq != ent.nextSeq ||
		!e.sameNet(ent, h, n, s) {
		return false, true, flushMismatch
	}
	for i := l4 + tcpMinHdrLen; i < s.hlen; i += 4 {
		// Options, byte for byte (the data offset is equal, and a
		// multiple of 4).
		if be32(n[i:]) != be32(h[i:]) {
			return false, true, flushMismatch
		}
	}
	if ent.ipLen+s.payload > e.maxSize || !e.append(ent, p, s) {
		return false, true, flushFull
	}
	ent.nextSeq += uint32(s.payload)
	ent.flags |= s.flags & (tcpFIN | tcpPSH)
	switch {
	case s.flags&(tcpFIN|tcpPSH) != 0:
		return true, true, flushFlags
	case s.payload < ent.mss:
		return true, true, flushShort
	}
	return true, false, 0
}

// mergeUDP is udp_gro_receive_segment for a datagram of ent's flow: a
// datagram as long as the first is merged; a shorter one is merged and ends
// the train; a longer one ends the train and starts the next.
func (e *Engine) mergeUDP(ent *entry, p *bufpool.Packet, s *segInfo) (merged, done bool, why flushReason) {
	if s.payload > ent.mss || !e.sameNet(ent, ent.head.Linear, p.Linear, s) {
		return false, true, flushMismatch
	}
	if ent.ipLen+s.payload > e.maxSize || !e.append(ent, p, s) {
		return false, true, flushFull
	}
	switch {
	case s.payload < ent.mss:
		return true, true, flushShort
	case ent.segs >= maxUDPSegs:
		return true, true, flushFull
	}
	return true, false, 0
}

// sameNet reports whether segment n (parsed into s) may join ent by its
// Ethernet and IP headers (inet_gro_flush, ipv6_gro_flush): same Ethernet
// header; IPv4: same TTL, TOS and DF, and an ID that goes up by one per
// segment, or stays fixed with DF set as decided by the second segment;
// IPv6: same traffic class, flow label and hop limit. It records the
// ID pattern when it is decided.
func (e *Engine) sameNet(ent *entry, h, n []byte, s *segInfo) bool {
	if be64(h) != be64(n) || be32(h[8:]) != be32(n[8:]) || be16(h[12:]) != be16(n[12:]) {
		// The Ethernet header (compare_ether_header).
		return false
	}
	if ent.v6 {
		// Version, traffic class and flow label; hop limit.
		return (be32(h[header.EthernetMinimumSize:])^be32(n[header.EthernetMinimumSize:]))&0x0fffffff == 0 && h[header.EthernetMinimumSize+7] == n[header.EthernetMinimumSize+7]
	}
	const tos, flags, ttl, df = header.EthernetMinimumSize + 1, header.EthernetMinimumSize + 6, header.EthernetMinimumSize + 8, 0x40
	if h[tos] != n[tos] || h[ttl] != n[ttl] || (h[flags]^n[flags])&df != 0 {
		return false
	}
	off := s.id - ent.id
	if ent.segs == 1 && n[flags]&df != 0 && off == 0 {
		ent.fixedID = true
	}
	if ent.fixedID {
		return off == 0
	}
	return off == uint16(ent.segs)
}

// append moves p's payload to ent: by frags when p's linear part holds only
// its headers, else by chaining p. It reports false, leaving p and ent as
// they were, when the frags do not fit. On success p belongs to ent (its
// shell is released when its frags moved) and ent's counts include it.
func (e *Engine) append(ent *entry, p *bufpool.Packet, s *segInfo) bool {
	t := ent.tail
	// skb_gro_receive's head_frag branch: a linear part holding payload
	// that is a head frag (built over its RX buffer) gives its payload,
	// in its page, as a frag ahead of p's own frags, if they all fit;
	// else p goes to the frag_list.
	headFrag := p.Head != nil && len(p.Linear) > s.hlen && len(t.Frags)+1+len(p.Frags) <= cap(t.Frags)
	if len(p.Linear) == s.hlen || headFrag {
		frags := p.Frags
		var last *bufpool.Frag
		if headFrag {
			t.Frags = append(t.Frags, p.TakeHead(s.hlen))
		} else if len(t.Frags) > 0 && len(frags) > 0 {
			l := &t.Frags[len(t.Frags)-1]
			if l.Page == frags[0].Page && l.Off+l.Len == frags[0].Off {
				last = l
			}
		}
		need := len(frags)
		if last != nil {
			need--
		}
		if len(t.Frags)+need > cap(t.Frags) {
			return false
		}
		if last != nil {
			// Both frags hold a reference on the page: keep one.
			last.Len += frags[0].Len
			frags[0].Page.DecRef()
			frags = frags[1:]
		}
		t.Frags = append(t.Frags, frags...)
		t.Len += s.payload
		// The references moved to t: release p's shell without them.
		clear(p.Frags)
		p.Frags = p.Frags[:0]
		p.Release()
	} else {
		// The slow way (skb_gro_receive's frag_list): p keeps its
		// headers; the consumer skips HdrLen bytes of it.
		t.Next = p
		ent.tail = p
		e.stats.FragList.Add(1)
	}
	ent.segs++
	ent.ipLen += s.payload
	return true
}

// flush hands up entry i of b, for reason why, and removes it.
func (e *Engine) flush(b *bucket, i int, why flushReason) {
	e.complete(&b.ents[i], why)
	copy(b.ents[i:b.n-1], b.ents[i+1:b.n])
	b.n--
	b.ents[b.n] = entry{}
	e.held--
}

// flushAll hands up every held packet, oldest first in each bucket.
func (e *Engine) flushAll(why flushReason) {
	for bi := range e.buckets {
		b := &e.buckets[bi]
		for i := 0; i < b.n; i++ {
			e.complete(&b.ents[i], why)
			b.ents[i] = entry{}
		}
		e.held -= b.n
		b.n = 0
	}
}

// flushOlder hands up the packets held at least age at now.
func (e *Engine) flushOlder(age, now int64, why flushReason) {
	for bi := range e.buckets {
		b := &e.buckets[bi]
		for i := 0; i < b.n; {
			if now-b.ents[i].born >= age {
				e.flush(b, i, why)
			} else {
				i++
			}
		}
	}
}

// flushAddrs hands up the held packets of k's address pair (and protocol,
// if k names one), for a packet whose ports are unknown.
func (e *Engine) flushAddrs(k *flowKey) {
	for bi := range e.buckets {
		b := &e.buckets[bi]
		for i := 0; i < b.n; {
			if k.sameAddrs(&b.ents[i].key) {
				e.flush(b, i, flushMismatch)
			} else {
				i++
			}
		}
	}
}

// complete is napi_gro_complete: it fixes a merged packet's headers, counts
// it, and hands it to the sink. ent must be removed from its bucket after.
func (e *Engine) complete(ent *entry, why flushReason) {
	h := ent.head
	if ent.segs > 1 {
		l := h.Linear
		if ent.v6 {
			be16put(l[header.EthernetMinimumSize+4:], uint16(ent.ipLen-ipv6HdrLen))
		} else {
			ip := l[header.EthernetMinimumSize : header.EthernetMinimumSize+ipv4HdrLen]
			be16put(ip[2:], uint16(ent.ipLen))
			be16put(ip[10:], 0)
			be16put(ip[10:], ^hdr.IPv4HeaderSum(ip))
		}
		if ent.proto == protoTCP {
			// The TCP checksum is left stale: the packet is
			// CsumVerified, as the kernel's CHECKSUM_UNNECESSARY.
			l[ent.l4+13] |= ent.flags
		} else {
			be16put(l[ent.l4+4:], uint16(ent.ipLen-(ent.l4-header.EthernetMinimumSize)))
		}
		h.Segs = uint16(ent.segs)
		h.GSOSize = uint16(ent.mss)
		e.stats.Packets.Add(uint64(ent.segs))
		e.stats.SKBs.Add(1)
		e.stats.Bytes.Add(uint64(header.EthernetMinimumSize + ent.ipLen))
	}
	e.stats.SegsHist[segsBucket(ent.segs)].Add(1)
	e.stats.flushCounter(why).Add(1)
	e.sink.Deliver(h)
}

func be16put(b []byte, v uint16) { b[0], b[1] = byte(v>>8), byte(v) }
