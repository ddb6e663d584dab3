package stack

import (
	"time"

	"github.com/ustack/ustack/bufpool"
)

// groSink hands the GRO engine's output to gVisor.
type groSink linkEndpoint

func (s *groSink) Deliver(p *bufpool.Packet) { (*linkEndpoint)(s).toGVisor(p) }

// nowNS returns the poll batch's clock, read once per batch.
func (e *linkEndpoint) nowNS() int64 {
	if e.now == 0 {
		e.now = time.Since(e.epoch).Nanoseconds() + 1
	}
	return e.now
}
