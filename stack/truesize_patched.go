//go:build !stockgvisor

package stack

import gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

// truesizeAvailable: this build's gVisor charges a packet's truesize
// (PacketBuffer.Truesize, internal/gvisor's patch 0004).
const truesizeAvailable = true

// setTruesize sets pb's truesize and received segment size.
func setTruesize(pb *gstack.PacketBuffer, truesize, gsoSize int) {
	pb.Truesize = truesize
	pb.RXGSOSize = gsoSize
}
