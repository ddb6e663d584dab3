package stack

import (
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/ustack/ustack/driver"
)

// delackSeg is one TCP segment a flow sends, from 192.0.2.1:80 to
// 192.0.2.2:4000: its flags, acknowledgment number, window and payload
// length.
type delackSeg struct {
	flags   header.TCPFlags
	ack     uint32
	wnd     uint16
	payload int
}

// packet builds the segment's outgoing packet with gVisor's encoders.
func (s delackSeg) packet() *gstack.PacketBuffer {
	pkt := gstack.NewPacketBuffer(gstack.PacketBufferOptions{
		ReserveHeaderBytes: header.IPv4MinimumSize + header.TCPMinimumSize,
		Payload:            buffer.MakeWithData(make([]byte, s.payload)),
	})
	tcp := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	tcp.Encode(&header.TCPFields{SrcPort: 80, DstPort: 4000, SeqNum: 1000, AckNum: s.ack,
		DataOffset: header.TCPMinimumSize, Flags: s.flags, WindowSize: s.wnd})
	ip := header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize))
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + header.TCPMinimumSize + s.payload),
		Protocol: uint8(header.TCPProtocolNumber), TTL: 64,
		SrcAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 1}), DstAddr: tcpip.AddrFrom4([4]byte{192, 0, 2, 2})})
	return pkt
}

// TestDelayedACKHoldsOnlyNewData drives the delayed-ACK table with the
// segments gVisor sends on a flow that has just sent data (so in pingpong
// mode) and checks which pure ACKs it holds. Linux delays only the ACK of
// newly received data (inet_csk_schedule_ack from tcp_event_data_recv): a
// window update after the reader drained a closed window goes at once
// (tcp_cleanup_rbuf), and so do a duplicate ACK (__tcp_ack_snd_check's
// out-of-order rule) and any ACK after the flow's own FIN (tcp_fin in
// FIN_WAIT1/2: tcp_send_ack). Held, a window update leaves a peer facing
// a zero window waiting for its next probe.
func TestDelayedACKHoldsOnlyNewData(t *testing.T) {
	const (
		data = header.TCPFlagAck | header.TCPFlagPsh
		ack  = header.TCPFlagAck
		fin  = header.TCPFlagAck | header.TCPFlagFin
	)
	for _, tc := range []struct {
		name string
		segs []delackSeg
		held []bool // per segment: held
	}{
		{"ack of new data", []delackSeg{{data, 100, 512, 64}, {ack, 164, 512, 0}}, []bool{false, true}},
		{"window update after a zero window", []delackSeg{
			{data, 100, 512, 64}, {ack, 164, 0, 0}, {data, 164, 0, 64}, {ack, 164, 512, 0},
		}, []bool{false, true, false, false}},
		{"window update", []delackSeg{{data, 100, 512, 64}, {ack, 100, 1024, 0}}, []bool{false, false}},
		{"duplicate acks", []delackSeg{{data, 100, 512, 64}, {ack, 100, 512, 0}, {ack, 100, 512, 0}}, []bool{false, false, false}},
		{"after the flow's fin", []delackSeg{{data, 100, 512, 64}, {fin, 100, 512, 0}, {ack, 164, 512, 0}}, []bool{false, false, false}},
		{"data and fin", []delackSeg{{data | header.TCPFlagFin, 100, 512, 64}, {ack, 101, 512, 0}}, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &delayedACK{hold: time.Hour, timer: time.AfterFunc(time.Hour, func() {})}
			defer d.timer.Stop()
			var sent []uint32 // acknowledgment numbers that went out, in order
			for i, s := range tc.segs {
				pkt := s.packet()
				var first *delackFlow
				held := d.onTx(pkt, &driver.VirtioNetHdr{}, int64(i+1)*int64(time.Microsecond), &first)
				if first != nil {
					sent = append(sent, header.TCP(first.pkt.TransportHeader().Slice()).AckNumber())
					first.pkt.DecRef()
				}
				if !held {
					sent = append(sent, s.ack)
				}
				pkt.DecRef()
				if held != tc.held[i] {
					t.Errorf("segment %d (flags %v, ack %d, window %d, %d bytes): held %v, want %v",
						i, s.flags, s.ack, s.wnd, s.payload, held, tc.held[i])
				}
			}
			d.drop(func(p *gstack.PacketBuffer, _ *driver.VirtioNetHdr) {
				sent = append(sent, header.TCP(p.TransportHeader().Slice()).AckNumber())
			})
			// What was held and not made redundant goes out by Close at
			// the latest: the last acknowledgment number always leaves.
			if last := tc.segs[len(tc.segs)-1].ack; len(sent) == 0 || sent[len(sent)-1] != last {
				t.Errorf("acknowledgment numbers sent %v: want the last, %d, among them, last", sent, last)
			}
		})
	}
}

// TestDelayedACKCloseSends: the stack's Close sends an ACK still held
// (gVisor sent it; dropped, a peer whose FIN it acknowledges stays in
// LAST_ACK) and holds none after it.
func TestDelayedACKCloseSends(t *testing.T) {
	d := &delayedACK{hold: time.Hour, timer: time.AfterFunc(time.Hour, func() {})}
	var first *delackFlow
	for i, s := range []delackSeg{{header.TCPFlagAck | header.TCPFlagPsh, 100, 512, 64}, {header.TCPFlagAck, 164, 512, 0}} {
		pkt := s.packet()
		if held := d.onTx(pkt, &driver.VirtioNetHdr{}, int64(i+1), &first); held != (i == 1) {
			t.Fatalf("segment %d: held %v, want %v", i, held, i == 1)
		}
		pkt.DecRef()
	}
	var sent int
	d.drop(func(p *gstack.PacketBuffer, _ *driver.VirtioNetHdr) {
		if got := header.TCP(p.TransportHeader().Slice()).AckNumber(); got != 164 {
			t.Errorf("Close sent ack %d, want 164", got)
		}
		sent++
	})
	if sent != 1 {
		t.Errorf("Close sent %d held ACKs, want 1", sent)
	}
	pkt := delackSeg{header.TCPFlagAck, 228, 512, 0}.packet()
	defer pkt.DecRef()
	if d.onTx(pkt, &driver.VirtioNetHdr{}, 3, &first) {
		t.Error("an ACK held after Close")
	}
}
