// Copyright 2026 The ustack Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

package tcp

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/waiter"
)

// TestRcvbufGrow: auto-tuning with truesizes follows Linux 6.18's
// tcp_rcvbuf_grow, values computed by hand (a ustack patch; the rest of
// the mechanism is tested through ustack's link endpoint, in its stack
// package).
func TestRcvbufGrow(t *testing.T) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{NewProtocol},
	})
	defer s.Close()
	rs := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: 1 << 20, Max: 8 << 20}
	if err := s.SetTransportProtocolOption(ProtocolNumber, &rs); err != nil {
		t.Fatal(err)
	}
	e := newEndpoint(s, s.TransportProtocolInstance(ProtocolNumber).(*protocol), ipv4.ProtocolNumber, &waiter.Queue{})
	defer e.Close()

	e.LockUser()
	defer e.UnlockUser()
	e.rcvQueueMu.Lock()
	defer e.rcvQueueMu.Unlock()
	e.RcvAutoParams.PrevCopiedBytes = 100000
	for _, c := range []struct {
		name            string
		ratio, inq      int
		copied          int
		rcvbuf, measure int
	}{
		// rcvwin = 2*200000, grown by 2*rcvwin*(200000-100000)/100000:
		// 1200000, as space at 50%: 2400000.
		{"slow start", 0, 0, 200000, 2400000, 200000},
		{"no more than last", 0, 0, 150000, 2400000, 200000},
		// 240000 read, 50000 still queued: 190000, below the last.
		{"inq", 0, 50000, 240000, 2400000, 200000},
		// rcvwin 600000 + 2*600000*100000/200000 = 1200000; at
		// 200/256: 1536000, below the buffer: never shrunk.
		{"ratio 200", 200, 0, 300000, 2400000, 300000},
		// 4000000 + 2*(4000000*1700000/300000) = 49333332, capped.
		{"tcp_rmem[2]", 200, 0, 2000000, 8 << 20, 2000000},
	} {
		e.scalingRatio.Store(uint32(c.ratio))
		e.RcvBufUsed = c.inq
		e.rcvbufGrowLocked(c.copied)
		if got := int(e.ops.GetReceiveBufferSize()); got != c.rcvbuf {
			t.Errorf("%s: buffer %d, want %d", c.name, got, c.rcvbuf)
		}
		if got := e.RcvAutoParams.PrevCopiedBytes; got != c.measure {
			t.Errorf("%s: rcvq_space.space %d, want %d", c.name, got, c.measure)
		}
	}
	e.RcvBufUsed = 0
}

// TestCollapsedTruesize: alloc_skb's truesize for a collapsed segment's
// bytes: SKB_TRUESIZE of the power-of-two head that holds them and the
// skb_shared_info.
func TestCollapsedTruesize(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{1, 256 + 512}, {192, 256 + 512}, {193, 256 + 1024}, {400, 256 + 1024},
		{2172, 256 + 4096}, {collapseMax, 256 + 4096},
	} {
		if got := collapsedTruesize(c.n); got != c.want {
			t.Errorf("collapsedTruesize(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}
