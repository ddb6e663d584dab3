package stack

import (
	"fmt"

	"github.com/ustack/ustack/driver"
)

// maxIPPacket is the longest IP packet the stack sends or takes with
// offloads: a GSO super-frame (TSO, or the peer's GRO'd TCP or USO) is at
// most what an IPv4 total length holds, 64 KB, as the kernel's
// GSO_MAX_SIZE; gVisor's TCP keeps its super-frames under GSOMaxSize less
// the largest headers.
const maxIPPacket = 65535

// wireFrameLen is the longest frame a wire carries between the stack and
// its peer, the virtio-net header included: with offloads a 64 KB
// super-frame (or an MTU's frame if that is longer), without them a frame
// of the MTU; behind an Ethernet header, or none on a TUN (l3).
func wireFrameLen(mtu int, l3, offloads bool) int {
	ip := mtu
	if offloads {
		ip = max(ip, maxIPPacket)
	}
	return driver.VirtioNetHdrLen + linkLen(l3) + ip
}

// checkMaxFrame refuses a wire (Config.Wire and Config.Queues) that says
// it carries shorter frames (a method MaxFrame() int, as driver.MemWire's)
// than the stack sends and its peer may send at MTU mtu (0:
// driver.DefaultMTU): such a wire would drop every longer frame, a TCP
// super-frame and its retransmissions, and throttle the stack silently.
func checkMaxFrame(cfg *Config, mtu int, l3 bool) error {
	if mtu == 0 {
		mtu = driver.DefaultMTU
	}
	for i, w := range append([]driver.Wire{cfg.Wire}, cfg.Queues...) {
		mf, ok := w.(interface{ MaxFrame() int })
		if !ok {
			continue
		}
		offloads := true
		if o, ok := w.(interface{ Offloads() bool }); ok {
			offloads = o.Offloads()
		}
		want := wireFrameLen(mtu, l3, offloads)
		if got := mf.MaxFrame(); got < want {
			what := fmt.Sprintf("a %d-byte GSO super-frame", maxIPPacket)
			if !offloads {
				what = fmt.Sprintf("an MTU of %d", mtu)
			}
			name := "wire"
			if i > 0 {
				name = fmt.Sprintf("queue %d", i)
			}
			return fmt.Errorf("stack: %s carries frames of at most %d bytes, want %d (%s, its link header and the %d-byte virtio-net header; driver.NewMemPair(0, 0) makes a wire that fits)",
				name, got, want, what, driver.VirtioNetHdrLen)
		}
	}
	return nil
}
