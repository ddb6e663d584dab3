//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// TestUDPPaddingEchoed: UDP frames with bytes after their IP packet
// (Ethernet padding, or what a sender appends), written onto the TAP by
// the kernel side's AF_PACKET socket with PACKET_VNET_HDR, are echoed by a
// UDP echo on ustack (-rx-uso on) without those bytes, every byte
// compared: a plain datagram, and a UDP GSO super-frame
// (VIRTIO_NET_HDR_GSO_UDP_L4, passed whole by the TAP's USO offload and
// the NIC model, rx_uso_packets) that the stack splits into exactly its
// datagrams for the echo's socket, the padding making none. A datagram
// sent last must be the echo that follows them.
func TestUDPPaddingEchoed(t *testing.T) {
	needRoot(t)
	for i, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			r := newRig(t, fmt.Sprintf("usit-pad%d", i), 1500, driver.Config{RxUSO: true})
			const port = 5355
			u, err := r.st.ListenUDP(r.stackAP(v6, port))
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			go serve.UDPEcho(u)
			kap, sap := r.kernelAP(v6, 40000), r.stackAP(v6, port)
			k, err := r.bed.NS.ListenUDP(kap)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			deadline := time.Now().Add(60 * time.Second)
			k.SetDeadline(deadline)
			buf := make([]byte, 65536)
			// A first exchange from the kernel's own socket: each side
			// resolves the other's link address before the frames come.
			if _, err := k.WriteToUDPAddrPort([]byte("warm-up"), sap); err != nil {
				t.Fatal(err)
			}
			if n, _, err := k.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != "warm-up" {
				t.Fatalf("warm-up echo: %q, %v", buf[:n], err)
			}
			inj, err := r.bed.NS.NewInjector(testbed.InjectorConfig{Dev: r.bed.TAPName, VnetHdr: true, MaxFrames: 3, Deadline: deadline})
			if err != nil {
				t.Fatal(err)
			}
			defer inj.Close()

			const seg = 100
			train := make([]byte, 3*seg)
			for j := range train {
				train[j] = byte(j*7 + j>>8)
			}
			pad := bytes.Repeat([]byte{'X'}, 200)
			for _, f := range [][]byte{
				vnetFrame(driver.VirtioNetHdr{}, append(udpFrame(stack.DefaultMAC, hostileSrcMAC, kap, sap, []byte("hello")), pad...)),
				usoPaddedFrame(kap, sap, train, seg, pad[:25]),
				vnetFrame(driver.VirtioNetHdr{}, udpFrame(stack.DefaultMAC, hostileSrcMAC, kap, sap, []byte("end"))),
			} {
				if err := inj.Write(f); err != nil {
					t.Fatalf("inject: %v", err)
				}
			}
			want := [][]byte{[]byte("hello"), train[:seg], train[seg : 2*seg], train[2*seg:], []byte("end")}
			var got [][]byte
			for len(got) == 0 || string(got[len(got)-1]) != "end" {
				n, _, err := k.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("after %d echoes: %v", len(got), err)
				}
				got = append(got, bytes.Clone(buf[:n]))
			}
			if len(got) != len(want) {
				var lens []int
				for _, g := range got {
					lens = append(lens, len(g))
				}
				t.Fatalf("echoes: got %d of %v bytes (the last but one %q), want %d of 5, 100, 100, 100, 3", len(got), lens, got[max(len(got)-2, 0)], len(want))
			}
			for j := range want {
				if !bytes.Equal(got[j], want[j]) {
					t.Errorf("echo %d: got %d bytes %q, want %d bytes %q", j, len(got[j]), got[j], len(want[j]), want[j])
				}
			}
			if n := counter(t, r.st, "rx_uso_packets"); n != 1 {
				t.Errorf("rx_uso_packets: got %d, want the super-frame handed up whole once", n)
			}
		})
	}
}

// usoPaddedFrame returns a virtio-net header and an Ethernet frame holding a UDP
// GSO super-frame of payload in datagrams of seg bytes from src to dst,
// its checksum partial (the pseudo-header's sum over the whole length, as
// udp_send_skb leaves it), followed by pad.
func usoPaddedFrame(src, dst netip.AddrPort, payload []byte, seg int, pad []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(payload))
	header.UDP(u).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(u))})
	copy(u[header.UDPMinimumSize:], payload)
	header.UDP(u).SetChecksum(header.PseudoHeaderChecksum(header.UDPProtocolNumber,
		tcpip.AddrFromSlice(src.Addr().AsSlice()), tcpip.AddrFromSlice(dst.Addr().AsSlice()), uint16(len(u))))
	ip := ipPacket(src.Addr(), dst.Addr(), uint8(header.UDPProtocolNumber), u)
	frame := append(etherFrame(stack.DefaultMAC, hostileSrcMAC, etIP(src.Addr().Is6()), ip), pad...)
	l4 := header.EthernetMinimumSize + len(ip) - len(u)
	return vnetFrame(driver.VirtioNetHdr{
		Flags: driver.VirtioNetHdrFNeedsCsum, GSOType: driver.VirtioNetHdrGSOUDPL4,
		HdrLen: uint16(l4 + header.UDPMinimumSize), GSOSize: uint16(seg),
		CsumStart: uint16(l4), CsumOffset: 6,
	}, frame)
}
