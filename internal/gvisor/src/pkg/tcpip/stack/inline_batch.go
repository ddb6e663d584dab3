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

package stack

// InlineBatch is a delivering goroutine's batch of endpoints whose
// segments TCPInlineProcessingOption left to it: with a packet's
// InlineBatch set, the demuxer queues the segment on its endpoint and
// records the endpoint here instead of processing it at once, and Run,
// at the end of the batch, processes each recorded endpoint once. TCP
// then handles all the segments a batch brought to an endpoint in one
// pass and acknowledges them once, as Linux's socket backlog defers its
// ACK to release_sock (TCP_ACK_DEFERRED, tcp_release_cb) rather than
// sending one per segment. Not safe for concurrent use: one per
// delivering goroutine. (A ustack patch.)
type InlineBatch struct {
	eps []inlineBatchEntry
}

type inlineBatchEntry struct {
	proto queuedTransportProtocol
	ep    TransportEndpoint
	id    TransportEndpointID
}

// inlineBatchScan is how many of the latest entries add looks at for the
// endpoint before it appends one: a batch's segments come in runs per
// flow (GRO's output), so the last few catch nearly every repeat, and a
// repeat that is missed is only processed twice.
const inlineBatchScan = 8

func (b *InlineBatch) add(proto queuedTransportProtocol, ep TransportEndpoint, id TransportEndpointID) {
	for i := len(b.eps) - 1; i >= 0 && i >= len(b.eps)-inlineBatchScan; i-- {
		if b.eps[i].ep == ep {
			return
		}
	}
	b.eps = append(b.eps, inlineBatchEntry{proto: proto, ep: ep, id: id})
}

// Len returns how many endpoints wait for Run.
func (b *InlineBatch) Len() int { return len(b.eps) }

// Run processes the recorded endpoints in the order they were first
// recorded, and empties the batch. The caller must hold no lock of the
// stack's (processing may unregister an endpoint) and must call it before
// its goroutine waits for more packets: a recorded endpoint's segments
// wait for it.
func (b *InlineBatch) Run() {
	for i := range b.eps {
		e := &b.eps[i]
		e.proto.ProcessQueued(e.ep, e.id)
		*e = inlineBatchEntry{}
	}
	b.eps = b.eps[:0]
}
