package cpumap_test

import (
	"fmt"
	"sync/atomic"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
)

// counter is a Receiver that counts frames and batch ends; ustack puts a
// gro.Engine here.
type counter struct {
	frames atomic.Int64
}

func (c *counter) Receive(p *bufpool.Packet, now int64) {
	c.frames.Add(1)
	p.Release()
}

func (c *counter) EndBatch(now int64) {}

// A poll loop redirects frames to two entries in bulks; each entry's worker
// hands them to its own Receiver. Close stops the workers once the rings
// are drained.
func Example() {
	recv := []*counter{{}, {}}
	m, err := cpumap.New(cpumap.Config{
		CPUs:        []int{0, 0}, // a CPU may serve two entries
		NewReceiver: func(entry int) cpumap.Receiver { return recv[entry] },
	})
	if err != nil {
		panic(err)
	}
	pr := m.NewProducer() // one per poll loop
	for i := range 20 {
		p := bufpool.NewPacket()
		p.Linear = append(p.Linear[:0], make([]byte, 60)...)
		p.Len = 60
		pr.Enqueue(i%2, p) // what a Program's Redirect(i%2) leads to
	}
	pr.Flush() // the poll loop's batch end
	if err := m.Close(); err != nil {
		panic(err)
	}
	fmt.Println("entry 0:", recv[0].frames.Load(), "entry 1:", recv[1].frames.Load())
	// Output: entry 0: 10 entry 1: 10
}
