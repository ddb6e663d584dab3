package serve

import (
	"crypto/sha256"
	"math/rand/v2"
	"net"

	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/stacktest"
)

// counterMap returns the counters of s and, if st is not nil, those of the
// servers that count into st, as `ustack run` prints them together.
func counterMap(s *stack.Stack, st *Stats) map[string]uint64 {
	if st == nil {
		return stacktest.Counters(s.EachCounter)
	}
	return stacktest.Counters(s.EachCounter, st.EachCounter)
}

// sendAndHash writes n pseudo-random bytes to c in writes of wsize and
// returns their SHA-256.
func sendAndHash(c net.Conn, n, wsize int, seed uint64) ([32]byte, error) {
	h := sha256.New()
	r := rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, wsize)
	for sent := 0; sent < n; {
		m := min(wsize, n-sent)
		for i := 0; i < m; i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < m; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := c.Write(buf[:m]); err != nil {
			return [32]byte{}, err
		}
		h.Write(buf[:m])
		sent += m
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}
