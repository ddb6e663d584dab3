package gro

import (
	"math/bits"
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
	// maxSKBFrags is MAX_SKB_FRAGS (CONFIG_MAX_SKB_FRAGS, 17 by default
	// and on the machine this models): the frags one packet of a merged
	// chain holds before skb_gro_receive goes on in the frag_list.
	maxSKBFrags = 17
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
	// L3 says packets start at their IP header, with no Ethernet header:
	// a TUN device's (driver.Config.L3). The flow key then has no MAC
	// addresses.
	L3 bool
	// VXLANPorts are the UDP destination ports of VXLAN tunnels (RFC
	// 7348; VXLANPort, 4789, is IANA's), as a vxlan device's socket binds
	// one in the kernel: over IPv4 and IPv6 outer headers alike, a UDP
	// datagram to one of them goes to vxlan_gro_receive instead of UDP
	// GRO, and the TCP segments it carries are merged before the tunnel is
	// terminated (see the package documentation, Tunnels). Empty: no
	// tunnel GRO, and UDP to any port is merged as UDP.
	VXLANPorts []uint16
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
	mss     int    // the head's payload length, or its gso_size if it is a GSO packet
	segs    int    // wire frames merged, head included
	nextSeq uint32 // TCP: sequence number the next segment must carry
	id      uint16 // IPv4: the head's identification
	// fixedID is IPv4's ip_fixedid: the ID stays fixed, as the second
	// segment decides; bit 0 for the packet's own header (a VXLAN
	// packet's outer one), bit 1 for a VXLAN packet's inner one.
	fixedID uint8
	flags   uint8 // TCP: FIN and PSH of merged segments, set in the head at flush
	v6      bool
	proto   uint8

	// tun is the outer layer of a VXLAN packet, in one of its bucket's
	// tunnel slots; nil for any other packet. The fields above are then
	// its inner packet's (l4 its inner TCP header, id its inner IPv4 ID,
	// v6 its inner version), but ipLen is the outer IP length. Kept out
	// of line so that a plain packet's entry is no bigger than it was
	// before tunnels.
	tun *tunEnt
}

// tunEnt is the outer layer of a held VXLAN packet.
type tunEnt struct {
	tunnel
	slot uint8 // its index in the bucket's tuns
}

// bucket holds the entries of one hash bucket, oldest first.
type bucket struct {
	n    int
	ents [bucketCap]entry
	// tuns are the slots of the tunnel layers of the bucket's VXLAN
	// entries (entry.tun), tused the slots taken; nil without
	// Config.VXLANPorts. A slot stays put while its entry moves up the
	// bucket.
	tuns  *[bucketCap]tunEnt
	tused uint8
}

// find returns the index of the entry of flow k, a packet's key that is
// not a VXLAN packet's, or -1.
func (b *bucket) find(k *flowKey) int {
	for i := 0; i < b.n; i++ {
		if b.ents[i].key.eq(k) {
			return i
		}
	}
	return -1
}

// findTun is find for a VXLAN packet: k (with keyTunnel) names its inner
// flow, t its outer one.
func (b *bucket) findTun(k *flowKey, t *tunSeg) int {
	for i := 0; i < b.n; i++ {
		if ent := &b.ents[i]; ent.key.eq(k) && ent.tun.key.vx == t.key.vx && ent.tun.key.k.eq(&t.key.k) {
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
	l2      int   // the IP header's offset: the Ethernet header's length, 0 with Config.L3
	timeout int64 // FlushTimeout in ns; 0 flushes at each batch end
	maxSize int
	vxPorts []uint16 // Config.VXLANPorts; read only, so Encap may read it anywhere
	vx      *vxState // nil without Config.VXLANPorts; the engine's goroutine's only

	held    int
	heldMax int
	buckets [numBuckets]bucket

	stats Stats
}

// New returns an engine that hands packets up to sink.
func New(cfg Config, sink Sink) *Engine {
	e := &Engine{sink: sink, timeout: int64(max(cfg.FlushTimeout, 0)), maxSize: cfg.MaxSize, l2: header.EthernetMinimumSize}
	if cfg.L3 {
		e.l2 = 0
	}
	if len(cfg.VXLANPorts) > 0 {
		e.vxPorts = append([]uint16(nil), cfg.VXLANPorts...)
		e.vx = newVXState(e.vxPorts)
		for i := range e.buckets {
			e.buckets[i].tuns = &e.vx.tuns[i]
		}
	}
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
// hands it up at once (not TCP or UDP, not mergeable), as dev_gro_receive
// does. A packet of a held flow that the kernel's GRO hands up without
// looking the flow up (IP options, a fragment, a bad checksum) goes up ahead
// of the held packet, as in the kernel; any other flushes the held packet
// first. now is a monotonic clock in ns, the same clock that EndBatch and
// FlushOlderThan are given.
func (e *Engine) Receive(p *bufpool.Packet, now int64) {
	s := segInfo{l2: e.l2, vx: e.vx}
	switch parse(p, &s) {
	case passOther:
		// Up at once, ahead of whatever is held, as dev_gro_receive's
		// GRO_NORMAL for a packet no gro_receive looked up.
		if s.csum == csumBad {
			e.stats.CsumBad.Add(1)
		}
		e.pass(p, &s)
		return
	case passFlow:
		b := &e.buckets[bucketOf(p)]
		i := -1
		if s.t == nil {
			i = b.find(&s.key)
		} else {
			i = b.findTun(&s.key, s.t)
		}
		if i >= 0 {
			e.flush(b, i, flushMismatch)
		}
		e.pass(p, &s)
		return
	}
	if s.csum == csumGood {
		e.stats.CsumSoftware.Add(1)
	}
	b := &e.buckets[bucketOf(p)]
	i := -1
	if s.t == nil {
		i = b.find(&s.key)
	} else {
		i = b.findTun(&s.key, s.t)
	}
	if i >= 0 {
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
	if s.payload == 0 || s.flags&(tcpURG|tcpPSH|tcpRST|tcpSYN|tcpFIN) != 0 ||
		(s.gsoSize > 0 && s.payload != s.segs*s.gsoSize) {
		// tcp_gro_receive's out_check_final with no packet it merged
		// into: an empty segment, one whose flags end a train, or a GSO
		// packet whose last segment is short ("len !=
		// NAPI_GRO_CB(skb)->count * skb_shinfo(skb)->gso_size") goes up
		// on its own.
		e.pass(p, &s)
		return
	}
	e.hold(b, p, &s, now)
}

// bucketOf returns the hash bucket of p: the low bits of the NIC's RSS hash,
// as dev_gro_receive picks napi->gro_hash[skb_get_hash_raw(skb) &
// (GRO_HASH_BUCKETS - 1)]. skb_get_hash_raw reads skb->hash and computes
// none, so a packet that comes without a hash (skb->hash 0: a veth's, a
// TAP's, an XDP frame's) is in bucket 0, and every flow of a device that
// hashes nothing shares bucket 0's MAX_GRO_SKBS entries. The RSS hash is a
// function of the addresses and ports, so every packet of a flow lands in
// one bucket as long as the flow's packets all have a hash or all have
// none (a NIC hashes every TCP and UDP packet that is not a fragment, and
// GRO merges no fragment). A VXLAN packet's RSS hash is its outer headers'
// (whose UDP source port the sender set from the inner flow's hash).
func bucketOf(p *bufpool.Packet) int {
	if p.HashType == bufpool.HashNone {
		return 0
	}
	return int(p.Hash & (numBuckets - 1))
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

// pass hands p, parsed into s, up untouched.
func (e *Engine) pass(p *bufpool.Packet, s *segInfo) {
	e.stats.Passthrough.Add(1)
	if s.t != nil {
		e.stats.TunnelPassthrough.Add(1)
	}
	e.sink.Deliver(p)
}

// hold makes p the head of a new entry in b, evicting b's oldest entry if b
// is full. The entry owns p.
func (e *Engine) hold(b *bucket, p *bufpool.Packet, s *segInfo, now int64) {
	if b.n == bucketCap {
		e.flush(b, 0, flushEvict)
	}
	mss := s.payload // dev_gro_receive: "skb_shinfo(skb)->gso_size = skb_gro_len(skb)"
	if s.gsoSize > 0 {
		mss = s.gsoSize
	}
	b.ents[b.n] = entry{
		head:    p,
		tail:    p,
		key:     s.key,
		born:    now,
		l4:      s.l4,
		ipLen:   s.hlen - e.l2 + s.payload,
		mss:     mss,
		segs:    s.segs,
		nextSeq: s.seq + uint32(s.payload),
		id:      s.id,
		v6:      s.v6,
		proto:   s.proto,
	}
	if s.t != nil {
		b.holdTunnel(&b.ents[b.n], s.t)
	}
	b.n++
	e.held++
	if e.held > e.heldMax {
		e.heldMax = e.held
		e.stats.HeldMax.Store(uint64(e.heldMax))
	}
}

// holdTunnel gives ent, a new entry of b, a tunnel slot for the outer layer
// t of its head. A bucket has a slot for each of its entries.
func (b *bucket) holdTunnel(ent *entry, t *tunSeg) {
	i := bits.TrailingZeros8(^b.tused)
	b.tused |= 1 << i
	ent.tun = &b.tuns[i]
	*ent.tun = tunEnt{tunnel: t.tunnel, slot: uint8(i)}
}

// mergeTCP is tcp_gro_receive for a segment of ent's flow. merged reports
// that p now belongs to ent; done that ent must be flushed (after the merge
// when merged, else before p is handled as a new packet), for reason why.
// Each flush condition is one of tcp_gro_receive's "flush |=" lines.
func (e *Engine) mergeTCP(ent *entry, p *bufpool.Packet, s *segInfo) (merged, done bool, why flushReason) {
	h, n := ent.head.Linear, p.Linear
	l4 := s.l4
	if s.flags&tcpCWR != 0 {
		// "flush = (__force int)(flags & TCP_FLAG_CWR)".
		return false, true, flushFlags
	}
	if diff := (be32(n[l4+12:]) ^ be32(h[l4+12:])) &^ flagWordMergeable; diff != 0 {
		// "(flags ^ tcp_flag_word(th2)) & ~(TCP_FLAG_FIN |
		// TCP_FLAG_PSH)": flags (SYN, RST, URG, ECE, CWR, ACK, AE)
		// differ, or the data offset or the window does.
		if diff&flagWordFlags != 0 {
			return false, true, flushFlags
		}
		return false, true, flushMismatch
	}
	if be32(n[l4+8:]) != be32(h[l4+8:]) { // "th->ack_seq ^ th2->ack_seq"
		return false, true, flushMismatch
	}
	for i := l4 + tcpMinHdrLen; i < s.hlen; i += 4 {
		// The options, byte for byte (the data offset is equal, and a
		// multiple of 4).
		if be32(n[i:]) != be32(h[i:]) {
			return false, true, flushMismatch
		}
	}
	if !e.sameNet(ent, h, n, s) { // gro_receive_network_flush
		return false, true, flushMismatch
	}
	if s.gsoSize > 0 {
		// "flush |= (mss != skb_shinfo(skb)->gso_size)".
		if s.gsoSize != ent.mss {
			return false, true, flushMismatch
		}
	} else if s.payload == 0 || s.payload > ent.mss { // "(len - 1) >= mss"
		return false, true, flushMismatch
	}
	if s.seq != ent.nextSeq { // "(ntohl(th2->seq) + skb_gro_len(p)) ^ ntohl(th->seq)"
		return false, true, flushMismatch
	}
	if ent.ipLen+s.payload > e.maxSize {
		// skb_gro_receive: "p->len + len >= netif_get_gro_max_size()".
		return false, true, flushFull
	}
	e.append(ent, p, s)
	ent.nextSeq += uint32(s.payload)
	ent.flags |= s.flags & (tcpFIN | tcpPSH)
	// out_check_final.
	switch {
	case s.flags&(tcpFIN|tcpPSH) != 0:
		return true, true, flushFlags
	case s.gsoSize > 0 && s.payload != s.segs*s.gsoSize, s.gsoSize == 0 && s.payload < ent.mss:
		return true, true, flushShort
	}
	return true, false, 0
}

// mergeUDP is udp_gro_receive_segment for a datagram of ent's flow: a
// datagram as long as the first is merged; a shorter one is merged and ends
// the train; a longer one ends the train and starts the next.
func (e *Engine) mergeUDP(ent *entry, p *bufpool.Packet, s *segInfo) (merged, done bool, why flushReason) {
	// "if (ulen > ntohs(uh2->len) || flush)": gro_receive_network_flush.
	if s.payload > ent.mss || !e.sameNet(ent, ent.head.Linear, p.Linear, s) {
		return false, true, flushMismatch
	}
	if ent.ipLen+s.payload > e.maxSize { // skb_gro_receive's size limit
		return false, true, flushFull
	}
	e.append(ent, p, s)
	switch {
	case s.payload < ent.mss: // "ulen != ntohs(uh2->len)"
		return true, true, flushShort
	case ent.segs >= maxUDPSegs: // "NAPI_GRO_CB(p)->count >= UDP_GRO_CNT_MAX"
		return true, true, flushFull
	}
	return true, false, 0
}

// sameNet reports whether segment n (parsed into s) may join ent by its IP
// header: gro_receive_network_flush, which is inet_gro_flush for IPv4 (the
// same TTL, TOS and DF, and an ID that goes up by one per segment or stays
// fixed, as the second segment decides, DF or not) and ipv6_gro_flush for
// IPv6 (the same traffic class and hop limit; the flow label is part of the
// flow). It records the ID pattern when it is decided. For a VXLAN packet
// ("if (NAPI_GRO_CB(p)->encap_mark)") both the outer header
// (network_offsets[0]) and the inner one (network_offsets[1]) are checked,
// each with its own bit of ip_fixedid ("ip_fixedid |= 1 << inner"): an
// outer ID, too, must be fixed or go up by one per segment. The outer
// header is checked first, and a mismatch there returns at once: ent is
// flushed either way, so the inner header's fixed bit no longer matters.
//
// One loop checks both levels, so that a plain packet's header is checked
// without a call.
func (e *Engine) sameNet(ent *entry, h, n []byte, s *segInfo) bool {
	ip, v6, off, bit := e.l2, ent.v6, s.id-ent.id, uint8(1)
	t := ent.tun
	if t != nil {
		v6, off = t.ov6, s.t.oid-t.oid
	}
	for {
		if v6 {
			// "first_word & htonl(0x0FF00000)", "iph->hop_limit ^
			// iph2->hop_limit".
			if (be32(h[ip:])^be32(n[ip:]))&0x0ff00000 != 0 || h[ip+7] != n[ip+7] {
				return false
			}
		} else {
			const df = 0x40
			tos, flags, ttl := ip+1, ip+6, ip+8
			if h[tos] != n[tos] || h[ttl] != n[ttl] || (h[flags]^n[flags])&df != 0 {
				return false
			}
			// "if (count == 1 && !ipid_offset) NAPI_GRO_CB(p)->ip_fixedid
			// |= 1 << inner"; "return ipid_offset ^ (count *
			// !(NAPI_GRO_CB(p)->ip_fixedid & (1 << inner)))". count
			// counts the segments merged so far, a GSO packet's all of
			// them.
			if ent.segs == 1 && off == 0 {
				ent.fixedID |= bit
			}
			want := uint16(ent.segs)
			if ent.fixedID&bit != 0 {
				want = 0
			}
			if off != want {
				return false
			}
		}
		if t == nil {
			return true
		}
		// A VXLAN packet's inner header.
		ip, v6, off, bit, t = t.inner, ent.v6, s.id-ent.id, 2, nil
	}
}

// append moves p's payload to ent as skb_gro_receive does: by frags, onto
// the last packet of ent's chain (NAPI_GRO_CB(p)->last), when p's linear
// part holds only its headers and the frags fit in that packet's
// MAX_SKB_FRAGS; else by chaining p on the frag_list, where it becomes the
// last packet. p then belongs to ent (its shell is released when its frags
// moved) and ent's counts include it.
func (e *Engine) append(ent *entry, p *bufpool.Packet, s *segInfo) {
	t := ent.tail
	headFrag := p.Head != nil && len(p.Linear) > s.hlen &&
		len(t.Frags)+1+len(p.Frags) <= min(maxSKBFrags, cap(t.Frags))
	if len(p.Linear) == s.hlen && moveFrags(t, p, s) {
		// "if (headlen <= offset)": the frags moved.
	} else if headFrag {
		// "else if (skb->head_frag)": a linear part holding payload
		// that is a head frag (built over its RX buffer) gives its
		// payload, in its page, as a frag ahead of p's own frags
		// (NAPI_GRO_FREE_STOLEN_HEAD); they fit, checked above.
		t.Frags = append(t.Frags, p.TakeHead(s.hlen))
		moveFrags(t, p, s)
	} else {
		// The slow way (skb_gro_receive's merge: label, the frag_list):
		// p keeps its headers; the consumer skips HdrLen bytes of it.
		t.Next = p
		ent.tail = p
		e.stats.FragList.Add(1)
	}
	ent.segs += s.segs
	ent.ipLen += s.payload
}

// moveFrags moves p's frags onto t, coalescing the first into t's last if
// it continues it on the same page, and releases p's shell. It reports
// false, leaving both as they were, when t would hold more than
// MAX_SKB_FRAGS frags ("if (nr_frags > MAX_SKB_FRAGS) goto merge").
func moveFrags(t, p *bufpool.Packet, s *segInfo) bool {
	frags := p.Frags
	var last *bufpool.Frag
	if len(t.Frags) > 0 && len(frags) > 0 {
		l := &t.Frags[len(t.Frags)-1]
		if l.Page == frags[0].Page && l.Off+l.Len == frags[0].Off {
			last = l
		}
	}
	need := len(frags)
	if last != nil {
		need--
	}
	if len(t.Frags)+need > maxSKBFrags || len(t.Frags)+need > cap(t.Frags) {
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
	return true
}

// flush hands up entry i of b, for reason why, and removes it.
func (e *Engine) flush(b *bucket, i int, why flushReason) {
	e.complete(&b.ents[i], why)
	if t := b.ents[i].tun; t != nil {
		b.tused &^= 1 << t.slot
	}
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
		b.n, b.tused = 0, 0
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

// complete is napi_gro_complete: it fixes a merged packet's headers, counts
// it, and hands it to the sink. ent must be removed from its bucket after.
func (e *Engine) complete(ent *entry, why flushReason) {
	h := ent.head
	if ent.segs > 1 {
		l := h.Linear
		switch {
		case ent.tun != nil:
			e.completeTunnel(ent, l)
		case ent.v6:
			be16put(l[e.l2+4:], uint16(ent.ipLen-ipv6HdrLen))
		default:
			setIPv4Len(l[e.l2:e.l2+ipv4HdrLen], ent.ipLen)
		}
		if ent.proto == protoTCP {
			// The TCP checksum is left stale: the packet is
			// CsumVerified, as the kernel's CHECKSUM_UNNECESSARY.
			l[ent.l4+13] |= ent.flags
		} else {
			be16put(l[ent.l4+4:], uint16(ent.ipLen-(ent.l4-e.l2)))
		}
		h.Segs = uint16(ent.segs)
		h.GSOSize = uint16(ent.mss)
		e.stats.Packets.Add(uint64(ent.segs))
		e.stats.SKBs.Add(1)
		e.stats.Bytes.Add(uint64(e.l2 + ent.ipLen))
		if ent.tun != nil {
			e.stats.TunnelPackets.Add(uint64(ent.segs))
			e.stats.TunnelSKBs.Add(1)
			e.stats.TunnelBytes.Add(uint64(e.l2 + ent.ipLen))
		}
	}
	e.stats.SegsHist[segsBucket(ent.segs)].Add(1)
	e.stats.flushCounter(why).Add(1)
	e.sink.Deliver(h)
}

// completeTunnel fixes the lengths of a merged VXLAN packet, whose linear
// part is l, at both levels, outermost first as the gro_complete chain
// does: inet_gro_complete (the outer IPv4 total length and header
// checksum) or ipv6_gro_complete (the outer payload length);
// udp4_gro_complete or udp6_gro_complete and udp_gro_complete (the outer
// UDP length; skb->encapsulation and SKB_GSO_UDP_TUNNEL or _CSUM, which
// Encap reports); vxlan_gro_complete and eth_gro_complete (no field to
// fix); inet_gro_complete or ipv6_gro_complete for the inner header. The
// TCP flags are complete's, as tcp_gro_receive set them. Checksums are left
// as they came, as for a plain packet: the packet is CsumVerified (the
// kernel's CHECKSUM_UNNECESSARY), and a zero outer UDP checksum stays zero,
// no checksum.
func (e *Engine) completeTunnel(ent *entry, l []byte) {
	t := ent.tun
	if t.ov6 {
		be16put(l[e.l2+4:], uint16(ent.ipLen-ipv6HdrLen))
	} else {
		setIPv4Len(l[e.l2:e.l2+ipv4HdrLen], ent.ipLen)
	}
	be16put(l[t.ol4+4:], uint16(ent.ipLen-(t.ol4-e.l2)))
	innerLen := ent.ipLen - (t.inner - e.l2)
	if ent.v6 {
		be16put(l[t.inner+4:], uint16(innerLen-ipv6HdrLen))
	} else {
		setIPv4Len(l[t.inner:t.inner+ipv4HdrLen], innerLen)
	}
}

// setIPv4Len sets the total length of the IPv4 header ip to n and its
// header checksum (inet_gro_complete: "iph_set_totlen", "csum_replace2").
func setIPv4Len(ip []byte, n int) {
	be16put(ip[2:], uint16(n))
	be16put(ip[10:], 0)
	be16put(ip[10:], ^hdr.IPv4HeaderSum(ip))
}

func be16put(b []byte, v uint16) { b[0], b[1] = byte(v>>8), byte(v) }
