//go:build stockgvisor

package stack

import gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

// truesizeAvailable: stock gVisor charges a packet's bytes.
const truesizeAvailable = false

// setTruesize does nothing: stock gVisor has no PacketBuffer.Truesize.
func setTruesize(*gstack.PacketBuffer, int, int) {}
