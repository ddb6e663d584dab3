package cpumap

import "sync"

// The Toeplitz hash of Microsoft's RSS specification ("Verifying the RSS
// Hash Calculation"), which NICs compute over a frame's addresses and ports
// to pick a receive queue. For each set bit of the input, most significant
// first, the result is XORed with the 32 bits of the key that start at
// that bit's position. rssKey is the specification's example key, the
// default of many drivers; the tests pin the specification's results.
var rssKey = [40]byte{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2,
	0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4,
	0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// Toeplitz input layout of the hash program, after RSS's:
//
//	IPv4: src(4) dst(4) sport(2) dport(2) proto(1)       13 bytes
//	IPv6: src(16) dst(16) sport(2) dport(2) proto(1)     37 bytes
//
// The protocol byte, which RSS does not hash, comes last so that the hash is
// RSS's 4-tuple hash XORed with a constant per protocol. A byte at position
// i needs key bytes i..i+4, so the 37-byte IPv6 input needs 41: the key is
// read cyclically past its 40 bytes.
const toeplitzMaxInput = 2*16 + 4 + 1

// toeplitz holds, for each input position, the hash contribution of each
// byte value there, so that hashing costs one lookup per input byte.
type toeplitz [toeplitzMaxInput][256]uint32

// rssTable returns the tables of rssKey, built on first use and shared
// (read-only) by every hash program.
var rssTable = sync.OnceValue(func() *toeplitz { return newToeplitz(rssKey[:]) })

// newToeplitz returns the tables for key, read cyclically.
func newToeplitz(key []byte) *toeplitz {
	t := new(toeplitz)
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

// bytes hashes b as input starting at position pos and returns the
// contribution, to be XORed with the other parts'. pos+len(b) must not
// exceed toeplitzMaxInput.
func (t *toeplitz) bytes(pos int, b []byte) uint32 {
	var h uint32
	for i, v := range b {
		h ^= t[pos+i][v]
	}
	return h
}
