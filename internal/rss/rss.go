// Package rss is the Toeplitz hash of Microsoft's RSS specification
// ("Verifying the RSS Hash Calculation"), which a NIC computes over a
// received frame's addresses and ports to pick a receive queue and hands up
// with the frame (mlx5's CQE rss_hash_result, which mlx5e_skb_set_hash
// stores as skb->hash). The NIC model (package driver) hashes every IP
// frame with it; cpumap's hash program spreads flows with it.
//
// For each set bit of the input, most significant first, the hash is XORed
// with the 32 bits of the key that start at that bit's position. A Table
// holds, for each input position, the contribution of each byte value
// there, so that hashing costs one lookup per input byte. Tables are
// read-only once built: safe for concurrent use. Nothing here allocates
// after Default's first call.
package rss

import "sync"

// Key is the specification's example key, the default of many drivers
// (netdev_rss_key is random, but the verification suite and the NIC
// vendors' defaults use this one); the tests pin the specification's
// results for it.
var Key = [40]byte{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2,
	0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4,
	0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// MaxInput is the longest input a Table hashes: the IPv6 4-tuple (two
// 16-byte addresses, two ports) and one byte more, which cpumap's hash
// program appends (the protocol). A byte at position i needs key bytes
// i..i+4, so the 37th byte needs 41: the key is read cyclically past its
// 40 bytes.
const MaxInput = 2*16 + 4 + 1

// Table is the Toeplitz hash of one key, as per-position lookup tables.
type Table [MaxInput][256]uint32

// Default returns the table of Key, built on first use and shared.
var Default = sync.OnceValue(func() *Table { return New(Key[:]) })

// New returns the table for key, read cyclically.
func New(key []byte) *Table {
	t := new(Table)
	for i := range t {
		// The 40 key bits starting at byte i: bit j of the input
		// byte (MSB first) selects the 32 of them starting at bit j.
		var w uint64
		for k := range 5 {
			w = w<<8 | uint64(key[(i+k)%len(key)])
		}
		for v := range 256 {
			var h uint32
			for j := range 8 {
				if v&(0x80>>j) != 0 {
					h ^= uint32(w >> (8 - j))
				}
			}
			t[i][v] = h
		}
	}
	return t
}

// Bytes hashes b as input starting at position pos and returns the
// contribution, to be XORed with the other parts'. pos+len(b) must not
// exceed MaxInput.
func (t *Table) Bytes(pos int, b []byte) uint32 {
	var h uint32
	for i, v := range b {
		h ^= t[pos+i][v]
	}
	return h
}

// Byte is Bytes of the one byte v at position pos.
func (t *Table) Byte(pos int, v byte) uint32 { return t[pos][v] }

// Hash returns the RSS hash of an IP packet from src to dst (4 bytes each
// for IPv4, 16 for IPv6, as the header holds them): the specification's
// 2-tuple hash over the addresses, and with ports (the first 4 bytes of a
// TCP or UDP header: source and destination port) its 4-tuple hash. A
// NIC's RSS hashes a fragment, which has no ports (or, the first, has them
// but its flow's other fragments do not), on the addresses only, as
// mlx5's RSS traffic types for IP fragments do.
//
//	IPv4: src(4) dst(4) [sport(2) dport(2)]   8 or 12 bytes
//	IPv6: src(16) dst(16) [sport(2) dport(2)] 32 or 36 bytes
func (t *Table) Hash(src, dst, ports []byte) uint32 {
	n := len(src)
	h := t.Bytes(0, src) ^ t.Bytes(n, dst)
	if len(ports) >= 4 {
		h ^= t.Bytes(2*n, ports[:4])
	}
	return h
}

// SpecVector is one row of the RSS specification's verification suite
// ("Verifying the RSS Hash Calculation", for Key): the hash of the
// addresses alone (Addrs) and of the addresses and TCP ports (TCP). The
// tests of every package that hashes with Toeplitz check against them.
type SpecVector struct {
	Src, Dst     string
	SPort, DPort uint16
	Addrs, TCP   uint32
}

// SpecVectors are the specification's IPv4 and IPv6 rows.
var SpecVectors = []SpecVector{
	{"66.9.149.187", "161.142.100.80", 2794, 1766, 0x323e8fc2, 0x51ccc178},
	{"199.92.111.2", "65.69.140.83", 14230, 4739, 0xd718262a, 0xc626b0ea},
	{"24.19.198.95", "12.22.207.184", 12898, 38024, 0xd2d0a5de, 0x5c2b394a},
	{"38.27.205.30", "209.142.163.6", 48228, 2217, 0x82989176, 0xafc7327f},
	{"153.39.163.191", "202.188.127.2", 44251, 1303, 0x5d1809c5, 0x10e828a2},
	{"3ffe:2501:200:1fff::7", "3ffe:2501:200:3::1", 2794, 1766, 0x2cc18cd5, 0x40207d3d},
	{"3ffe:501:8::260:97ff:fe40:efab", "ff02::1", 14230, 4739, 0x0f0c461c, 0xdde51bbf},
	{"3ffe:1900:4545:3:200:f8ff:fe21:67cf", "fe80::200:f8ff:fe21:67cf", 44251, 38024, 0x4b61e985, 0x02d1feef},
}
