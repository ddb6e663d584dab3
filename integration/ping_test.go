//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/ustack/ustack/internal/testbed"
)

// ping sends count ICMP (or ICMPv6) echo requests from a raw socket in ns
// to dst, one at a time, and requires an echo reply from dst to each within
// timeout. Before the first reply can come the kernel must resolve dst's
// MAC, so an answered ping also shows that ARP (NDP) is answered.
//
// It does what `ping -c COUNT -W TIMEOUT DST` in the namespace would, with
// stricter checks, without depending on iputils being installed.
func ping(ns *testbed.Netns, dst netip.Addr, count int, timeout time.Duration) error {
	network, laddr := "ip4:icmp", "0.0.0.0"
	reqType, replyType := byte(8), byte(0)
	if dst.Is6() {
		network, laddr = "ip6:ipv6-icmp", "::"
		reqType, replyType = 128, 129
	}
	var c net.PacketConn
	if err := ns.Do(func() (err error) {
		c, err = net.ListenPacket(network, laddr)
		return err
	}); err != nil {
		return fmt.Errorf("ping %s: %w", dst, err)
	}
	defer c.Close()
	id := uint16(os.Getpid())
	buf := make([]byte, 1500)
	for seq := 1; seq <= count; seq++ {
		msg := make([]byte, 8+56)
		msg[0] = reqType
		binary.BigEndian.PutUint16(msg[4:], id)
		binary.BigEndian.PutUint16(msg[6:], uint16(seq))
		for i := 8; i < len(msg); i++ {
			msg[i] = byte(i + seq)
		}
		if !dst.Is6() {
			// The kernel fills in ICMPv6 checksums of raw sockets itself,
			// not ICMPv4 ones.
			binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
		}
		deadline := time.Now().Add(timeout)
		c.SetDeadline(deadline)
		if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return fmt.Errorf("ping %s: send seq %d: %w", dst, seq, err)
		}
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				if errTimeout(err) {
					return fmt.Errorf("ping %s: no echo reply to seq %d within %v", dst, seq, timeout)
				}
				return fmt.Errorf("ping %s: %w", dst, err)
			}
			b := buf[:n]
			// The raw socket sees every ICMP message on the link (NDP,
			// MLD, ...): only our reply counts.
			if len(b) < 8 || b[0] != replyType || binary.BigEndian.Uint16(b[4:]) != id || binary.BigEndian.Uint16(b[6:]) != uint16(seq) {
				continue
			}
			ip, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
			if ip.Unmap() != dst {
				return fmt.Errorf("ping %s: echo reply %d from %s", dst, seq, ip)
			}
			if !bytes.Equal(b[8:], msg[8:]) {
				return fmt.Errorf("ping %s: echo reply %d with payload %x, want %x", dst, seq, b[8:], msg[8:])
			}
			break
		}
	}
	return nil
}

// inetChecksum is the Internet checksum (RFC 1071) of b.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
