//go:build linux

package testbed

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The TAP's UDP tunnel offloads (<linux/if_tun.h>, Linux 6.16; the system
// headers here predate them) and the 24-byte virtio-net header that
// carries a tunnel super-frame's offsets (struct
// virtio_net_hdr_v1_hash_tunnel: outer_th_offset and inner_nh_offset at
// bytes 20 and 22).
const (
	tunFUDPTunnelGSO     = 0x80
	tunFUDPTunnelGSOCsum = 0x100
	vnetTunnelHdrLen     = 24
	gsoUDPTunnelIPv6     = 0x40 // VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6
)

// TestVXLANTunnelGSO: bulk TCP that the kernel sends through its vxlan
// device over IPv6 reaches a TAP that offers the UDP tunnel offloads as
// whole GSO super-frames (gso_type TCPV4 | UDP_TUNNEL_IPV6, NEEDS_CSUM,
// the outer UDP and inner IP offsets in the 24-byte header), not cut into
// one TAP read per segment as an ip6tnl tunnel's are. A minimal responder
// on the TAP answers the kernel's TCP inside the tunnel (a SYN-ACK, then an
// ACK of what came in order), and every byte the kernel sent must arrive:
// SHA-256 of both sides. It skips on a kernel whose TAP has no UDP tunnel
// offloads.
func TestVXLANTunnelGSO(t *testing.T) {
	bed, err := NewTAPBed(TAPConfig{Prefix: "usvxl"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Close() })
	stackMAC := net.HardwareAddr{0x02, 0, 0, 0, 0x79, 0x02}
	outerMAC := net.HardwareAddr{0x02, 0, 0, 0, 0x79, 0x03}
	vx, err := bed.AddVXLAN(VXLANConfig{StaticNeighbours: true, StackMAC: stackMAC, StackOuterMAC: outerMAC})
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	err = bed.Open(func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(bed.TAPName)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return err
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetTunnelHdrLen); err != nil {
			return err
		}
		off := unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6 | tunFUDPTunnelGSO | tunFUDPTunnelGSOCsum
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, off); err != nil {
			return errors.Join(errors.ErrUnsupported, err)
		}
		return nil
	})
	if fd >= 0 {
		defer unix.Close(fd)
	}
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("this kernel's TAP has no UDP tunnel offloads: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}

	const total = 8 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		r   tunnelResponder
		err error
	}
	done := make(chan result, 1)
	go func() {
		r := tunnelResponder{fd: fd, port: 5001}
		err := r.run(ctx, total)
		done <- result{r, err}
	}()

	c, err := bed.NS.DialTCP(ctx, netip.AddrPortFrom(vx.StackInner4.Addr(), 5001), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(15 * time.Second))
	h := sha256.New()
	chunk := make([]byte, 64<<10)
	for sent := 0; sent < total; sent += len(chunk) {
		for i := range chunk {
			chunk[i] = byte(sent/len(chunk)*31 + i*7)
		}
		h.Write(chunk)
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("write at %d: %v", sent, err)
		}
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("responder: %v (%d bytes in order)", res.err, res.r.bytes)
	}
	r := res.r
	if !bytes.Equal(r.sum, h.Sum(nil)) {
		t.Fatalf("SHA-256 of the %d bytes received differs from what was sent", r.bytes)
	}
	t.Logf("%d reads, %d GSO super-frames (largest %d payload bytes, gso_size %d), %d bytes in order",
		r.reads, r.super, r.maxPayload, r.gsoSize, r.bytes)
	if r.super == 0 || r.maxPayload <= r.gsoSize {
		t.Fatalf("no UDP tunnel super-frame among %d reads: the kernel segmented before the TAP", r.reads)
	}
	if r.badHdr != "" {
		t.Fatal(r.badHdr)
	}
}

// tunnelResponder answers, on a TAP with the 24-byte virtio-net header,
// the kernel's TCP inside VXLAN over IPv6 (Ethernet, IPv6, UDP, VXLAN,
// inner Ethernet, IPv4, TCP): a SYN with a SYN-ACK, data with an ACK of
// what came in order, and hashes the in-order payload. Replies swap
// every address and carry full checksums and no offloads.
type tunnelResponder struct {
	fd    int
	port  uint16
	sum   []byte
	bytes int
	// What the reads looked like.
	reads, super, maxPayload, gsoSize int
	badHdr                            string
}

func (r *tunnelResponder) run(ctx context.Context, total int) error {
	h := sha256.New()
	buf := make([]byte, 1<<17)
	var next uint32
	for r.bytes < total {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fds := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		} else if n <= 0 {
			continue
		}
		m, err := unix.Read(r.fd, buf)
		if err != nil {
			return err
		}
		r.reads++
		if m < vnetTunnelHdrLen+14+40+8+8+14+20+20 {
			continue
		}
		vh, f := buf[:vnetTunnelHdrLen], buf[vnetTunnelHdrLen:m]
		if binary.BigEndian.Uint16(f[12:]) != 0x86dd || f[14+6] != unix.IPPROTO_UDP {
			continue
		}
		udp := f[14+40:]
		if binary.BigEndian.Uint16(udp[2:]) != VXLANPort {
			continue
		}
		inner := udp[16:]
		ip := inner[14:]
		if binary.BigEndian.Uint16(inner[12:]) != 0x0800 || ip[9] != unix.IPPROTO_TCP {
			continue
		}
		ihl := int(ip[0]&15) * 4
		tcp := ip[ihl:]
		doff := int(tcp[12]>>4) * 4
		plen := int(binary.BigEndian.Uint16(ip[2:])) - ihl - doff
		if gt := vh[1]; gt&gsoUDPTunnelIPv6 != 0 {
			gso := int(binary.NativeEndian.Uint16(vh[4:]))
			oth, inh := binary.NativeEndian.Uint16(vh[20:]), binary.NativeEndian.Uint16(vh[22:])
			switch {
			case gt&^gsoUDPTunnelIPv6 != unix.VIRTIO_NET_HDR_GSO_TCPV4 || vh[0]&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM == 0:
				r.badHdr = fmt.Sprintf("tunnel super-frame: flags %#x, gso_type %#x; want NEEDS_CSUM and TCPV4|UDP_TUNNEL_IPV6", vh[0], gt)
			case oth != 14+40 || inh != 14+40+8+8+14:
				r.badHdr = fmt.Sprintf("tunnel super-frame: outer_th_offset %d, inner_nh_offset %d; want 54 and 84", oth, inh)
			}
			r.super++
			r.gsoSize = gso
			r.maxPayload = max(r.maxPayload, plen)
		}
		seq := binary.BigEndian.Uint32(tcp[4:])
		flags := tcp[13]
		switch {
		case flags&0x02 != 0: // SYN
			next = seq + 1
		case plen > 0:
			if seq == next {
				h.Write(tcp[doff : doff+plen])
				next += uint32(plen)
				r.bytes += plen
			}
		default:
			continue
		}
		if _, err := unix.Write(r.fd, tunnelReply(f, udp, inner, ip, tcp, next, flags&0x02 != 0)); err != nil {
			return err
		}
	}
	r.sum = h.Sum(nil)
	return nil
}

// tunnelReply builds the reply to a tunnelled TCP segment: the outer and
// inner headers with their addresses and ports swapped, an ACK of ack
// (with syn, a SYN-ACK with MSS 1360 and window scale 10), a zero
// virtio-net header and full checksums.
func tunnelReply(f, udp, inner, ip, tcp []byte, ack uint32, syn bool) []byte {
	o := make([]byte, vnetTunnelHdrLen, 256)
	o = append(o, f[6:12]...) // to the kernel's TAP MAC
	o = append(o, f[0:6]...)
	o = append(o, 0x86, 0xdd)
	ip6 := len(o)
	o = append(o, f[14:14+8]...)
	o = append(o, f[14+24:14+40]...)
	o = append(o, f[14+8:14+24]...)
	u := len(o)
	o = append(o, udp[0], udp[1], udp[2], udp[3], 0, 0, 0, 0) // from the flow's source port to 4789, as the kernel does
	o = append(o, udp[8:16]...)                               // the VXLAN header: flags and VNI
	o = append(o, inner[6:12]...)
	o = append(o, inner[0:6]...)
	o = append(o, 0x08, 0x00)
	i4 := len(o)
	o = append(o, 0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, unix.IPPROTO_TCP, 0, 0)
	o = append(o, ip[16:20]...)
	o = append(o, ip[12:16]...)
	t := len(o)
	o = append(o, tcp[2], tcp[3], tcp[0], tcp[1], 0, 0, 0x03, 0xe9, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(o[t+8:], ack)
	if syn {
		o[t+7] = 0xe8 // ISN 1000, then 1001
		o[t+12], o[t+13] = 0x70, 0x12
		o = append(o, 2, 4, 0x05, 0x50, 3, 3, 10, 1)
	}
	tl := len(o) - t
	binary.BigEndian.PutUint16(o[i4+2:], uint16(20+tl))
	binary.BigEndian.PutUint16(o[i4+10:], ^sum16(o[i4:i4+20], 0))
	binary.BigEndian.PutUint16(o[t+16:], ^sum16(o[t:], sum32(o[i4+12:i4+20], unix.IPPROTO_TCP+uint32(tl))))
	ul := len(o) - u
	binary.BigEndian.PutUint16(o[u+4:], uint16(ul))
	binary.BigEndian.PutUint16(o[ip6+4:], uint16(ul))
	us := ^sum16(o[u:], sum32(o[ip6+8:ip6+40], unix.IPPROTO_UDP+uint32(ul)))
	if us == 0 {
		us = 0xffff // RFC 8200 section 8.1: zero is no checksum, not allowed over IPv6
	}
	binary.BigEndian.PutUint16(o[u+6:], us)
	return o
}

// sum32 adds b's 16-bit words to s; sum16 folds that into 16 bits.
func sum32(b []byte, s uint32) uint32 {
	for ; len(b) >= 2; b = b[2:] {
		s += uint32(b[0])<<8 | uint32(b[1])
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func sum16(b []byte, s uint32) uint16 {
	s = sum32(b, s)
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
