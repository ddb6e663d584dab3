// Package rrtrace times the stages of a request/response exchange through
// ustack, for finding where its latency goes. Built without the
// rrtrace tag, Mark is an empty function the compiler removes; with it
// (`go build -tags rrtrace ./cmd/ustack`), every Mark stores the time and
// adds the time since the previous stage's Mark to that stage's sum, and
// the averages go to standard error every two seconds:
//
//	go build -tags rrtrace -o /tmp/ustack-rrtrace ./cmd/ustack
//	/tmp/ustack-rrtrace bench -rr -t 4s -rounds 1
//
// The stages follow one exchange with one connection in flight (bench -rr,
// sockperf ping-pong): the stages of several flows at once would mix.
package rrtrace

// A Stage is a point on the receive-to-reply path, in the order an
// exchange passes them; each Mark's time is measured from the Mark of the
// stage before it (FrameRead's from TxEnd, the previous reply).
type Stage int

const (
	FrameRead Stage = iota // the NIC model has read the request's frame from the wire
	Received               // ... and placed it in the ring (nicState.receive)
	Published              // ... and made its completion visible, after the read that found the wire empty
	PollWoke               // the poll loop runs (after the NIC's interrupt)
	PollDone               // the poll loop's batch is done: GRO, the link endpoint, gVisor's IP and TCP dispatch
	AppRead                // the application's reader has the request (gVisor's TCP processor and the wake-ups between)
	AppWrite               // the application's writer starts the reply
	TxStart                // the driver starts writing the reply's frame to the wire (gVisor's TCP and IP output)
	TxEnd                  // the wire write returned (the TAP write, with the peer's receive in the kernel)
	NumStages
)

var names = [NumStages]string{"frame read (peer, wire)", "NIC receive", "NIC publish", "poll loop wakes",
	"poll batch", "app reads", "app writer", "TCP/IP output", "wire write"}

// String returns the stage's name in the printed table.
func (s Stage) String() string { return names[s] }
