//go:build linux

package driver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/internal/testutil"
)

// tapTestStackMAC is the MAC the tests pretend the userspace stack has; a
// static neighbour entry maps the bed's StackAddr4 to it.
var tapTestStackMAC = net.HardwareAddr{0x02, 0x00, 0x5e, 0x00, 0x00, 0x02}

const tapTestBufLen = VirtioNetHdrLen + 65536 + 14

func tapTestNeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for TAP and netns")
	}
}

// tapTestHdr is the test's own decoding of struct virtio_net_hdr.
type tapTestHdr struct {
	flags, gsoType                         uint8
	hdrLen, gsoSize, csumStart, csumOffset uint16
}

func tapTestDecodeHdr(b []byte) tapTestHdr {
	e := binary.NativeEndian
	return tapTestHdr{b[0], b[1], e.Uint16(b[2:]), e.Uint16(b[4:]), e.Uint16(b[6:]), e.Uint16(b[8:])}
}

func (h tapTestHdr) encode(b []byte) {
	e := binary.NativeEndian
	b[0], b[1] = h.flags, h.gsoType
	e.PutUint16(b[2:], h.hdrLen)
	e.PutUint16(b[4:], h.gsoSize)
	e.PutUint16(b[6:], h.csumStart)
	e.PutUint16(b[8:], h.csumOffset)
}

// tapTestBed is a testbed.TAPBed with a TAP opened on its device and a
// static neighbour entry for the stack's IPv4 address.
type tapTestBed struct {
	*testbed.TAPBed
	tap *TAP
}

func tapTestOpen(t *testing.T, cfg TAPConfig) *tapTestBed {
	t.Helper()
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustaptest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	cfg.Name = bed.TAPName
	var tap *TAP
	if err := bed.Open(func() (err error) {
		tap, err = OpenTAP(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() }) // runs before bed.Close
	if err := bed.NS.IP("neigh", "add", bed.StackAddr4.Addr().String(), "lladdr", tapTestStackMAC.String(),
		"dev", bed.TAPName, "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	return &tapTestBed{bed, tap}
}

// readUDP4 reads frames from the TAP until an IPv4 UDP frame to port
// arrives, skipping the kernel's own traffic (IPv6 router solicitations,
// MLD reports). A watchdog closes the TAP if nothing arrives in time, which
// turns a hang into a test failure.
func (b *tapTestBed) readUDP4(t *testing.T, buf []byte, port uint16) (tapTestHdr, []byte) {
	t.Helper()
	watchdog := time.AfterFunc(5*time.Second, func() { b.tap.Close() })
	defer watchdog.Stop()
	for range 100 {
		n, err := b.tap.Read(buf, true)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		frame := buf[:n]
		var h tapTestHdr
		if b.tap.VnetHdr() {
			if n < VirtioNetHdrLen {
				t.Fatalf("frame of %d bytes, shorter than a virtio-net header", n)
			}
			h = tapTestDecodeHdr(frame)
			frame = frame[VirtioNetHdrLen:]
		}
		if len(frame) < header.EthernetMinimumSize+header.IPv4MinimumSize+header.UDPMinimumSize {
			continue
		}
		eth := header.Ethernet(frame)
		if eth.Type() != header.IPv4ProtocolNumber {
			continue
		}
		ip := header.IPv4(frame[header.EthernetMinimumSize:])
		if ip.Protocol() != uint8(header.UDPProtocolNumber) || header.UDP(ip.Payload()).DestinationPort() != port {
			continue
		}
		return h, frame
	}
	t.Fatal("no matching frame among 100")
	return tapTestHdr{}, nil
}

// tapTestUDPFrame builds an Ethernet/IPv4/UDP frame. With partial set the
// UDP checksum field holds only the pseudo-header sum, to be completed by
// whoever honours VIRTIO_NET_HDR_F_NEEDS_CSUM.
func tapTestUDPFrame(dst, src net.HardwareAddr, from, to netip.AddrPort, payload []byte, partial bool) []byte {
	f := testutil.Frame{
		SrcMAC: tcpip.LinkAddress(src), DstMAC: tcpip.LinkAddress(dst),
		Src: tcpip.AddrFrom4(from.Addr().As4()), Dst: tcpip.AddrFrom4(to.Addr().As4()),
		Proto: header.UDPProtocolNumber, SrcPort: from.Port(), DstPort: to.Port(), Payload: payload,
	}
	if partial {
		f.Csum = testutil.CsumPartial
	}
	return f.Build()
}

// tapTestUDPChecksumOK reports whether the IPv4/UDP frame's UDP checksum is
// correct, completing it first if h asks for that (NEEDS_CSUM).
func tapTestUDPChecksumOK(t *testing.T, h tapTestHdr, frame []byte) bool {
	t.Helper()
	frame = bytes.Clone(frame)
	if h.flags&1 != 0 { // VIRTIO_NET_HDR_F_NEEDS_CSUM
		start, off := int(h.csumStart), int(h.csumOffset)
		if start+off+2 > len(frame) {
			t.Fatalf("csum_start %d + csum_offset %d beyond the frame (%d bytes)", start, off, len(frame))
		}
		xsum := ^checksum.Checksum(frame[start:], 0)
		binary.BigEndian.PutUint16(frame[start+off:], xsum)
	}
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	udp := header.UDP(ip.Payload())
	return udp.IsChecksumValid(ip.SourceAddress(), ip.DestinationAddress(), checksum.Checksum(udp.Payload(), 0))
}

var tapTestConfigs = []struct {
	name string
	cfg  TAPConfig
}{
	{"vnet+offloads", TAPConfig{VnetHdr: true, Offloads: true}},
	{"vnet", TAPConfig{VnetHdr: true}},
	{"plain", TAPConfig{}},
}

func TestTAPKernelToTAP(t *testing.T) {
	tapTestNeedRoot(t)
	for _, tt := range tapTestConfigs {
		t.Run(tt.name, func(t *testing.T) {
			b := tapTestOpen(t, tt.cfg)
			dst := netip.AddrPortFrom(b.StackAddr4.Addr(), 7777)
			c, err := b.NS.DialUDP(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := []byte("hello from the kernel")
			if _, err := c.Write(payload); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, tapTestBufLen)
			h, frame := b.readUDP4(t, buf, dst.Port())
			t.Logf("vnet header %+v, frame %d bytes", h, len(frame))

			eth := header.Ethernet(frame)
			if !bytes.Equal([]byte(eth.DestinationAddress()), tapTestStackMAC) {
				t.Errorf("destination MAC %v, want %v", eth.DestinationAddress(), tapTestStackMAC)
			}
			mac, err := b.tap.HardwareAddr()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal([]byte(eth.SourceAddress()), mac) {
				t.Errorf("source MAC %v, want the TAP's %v", eth.SourceAddress(), mac)
			}
			ip := header.IPv4(frame[header.EthernetMinimumSize:])
			if got := netip.AddrFrom4(ip.SourceAddress().As4()); got != b.KernelAddr4.Addr() {
				t.Errorf("source %v, want %v", got, b.KernelAddr4.Addr())
			}
			if got := header.UDP(ip.Payload()).Payload(); !bytes.Equal(got, payload) {
				t.Errorf("payload %q, want %q", got, payload)
			}
			if h.gsoType != 0 {
				t.Errorf("gso_type %d for a small datagram", h.gsoType)
			}
			switch {
			case tt.cfg.Offloads:
				// TUN_F_CSUM lets the kernel leave the checksum to us.
				const wantStart = header.EthernetMinimumSize + header.IPv4MinimumSize
				if h.flags&1 != 0 && (h.csumStart != wantStart || h.csumOffset != 6) {
					t.Errorf("NEEDS_CSUM with csum_start %d csum_offset %d, want %d and 6", h.csumStart, h.csumOffset, wantStart)
				}
			case tt.cfg.VnetHdr:
				if h != (tapTestHdr{}) {
					t.Errorf("vnet header %+v without offloads, want zeros", h)
				}
			}
			if !tapTestUDPChecksumOK(t, h, frame) {
				t.Error("bad UDP checksum")
			}
		})
	}
}

func TestTAPToKernel(t *testing.T) {
	tapTestNeedRoot(t)
	for _, tt := range tapTestConfigs {
		for _, partial := range []bool{false, true} {
			if partial && !tt.cfg.VnetHdr {
				continue
			}
			name := tt.name + "/full-csum"
			if partial {
				name = tt.name + "/needs-csum"
			}
			t.Run(name, func(t *testing.T) {
				b := tapTestOpen(t, tt.cfg)
				srv, err := b.NS.ListenUDP(netip.AddrPortFrom(b.KernelAddr4.Addr(), 0))
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				mac, err := b.tap.HardwareAddr()
				if err != nil {
					t.Fatal(err)
				}
				from := netip.AddrPortFrom(b.StackAddr4.Addr(), 5555)
				payload := []byte("hello from ustack")
				frame := tapTestUDPFrame(mac, tapTestStackMAC, from, srv.LocalAddr().(*net.UDPAddr).AddrPort(), payload, partial)
				if tt.cfg.VnetHdr {
					var h tapTestHdr
					if partial {
						h = tapTestHdr{flags: 1, csumStart: header.EthernetMinimumSize + header.IPv4MinimumSize, csumOffset: 6}
					}
					frame = append(make([]byte, VirtioNetHdrLen), frame...)
					h.encode(frame)
				}
				if err := b.tap.Write(frame); err != nil {
					t.Fatal(err)
				}
				srv.SetReadDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 256)
				n, src, err := srv.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("kernel socket: %v", err)
				}
				if !bytes.Equal(buf[:n], payload) || src != from {
					t.Errorf("kernel got %q from %v, want %q from %v", buf[:n], src, payload, from)
				}
			})
		}
	}
}

// TestTAPUSO checks that with USO accepted a UDP_SEGMENT write reaches the
// TAP as one GSO super-frame.
func TestTAPUSO(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	if !b.tap.USO() {
		t.Skip("kernel did not accept TUN_F_USO4/USO6")
	}
	const gsoSize, total = 1400, 20000
	dst := netip.AddrPortFrom(b.StackAddr4.Addr(), 7778)
	c, err := b.NS.DialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, gsoSize) })
	if serr != nil {
		t.Fatalf("UDP_SEGMENT: %v", serr)
	}
	payload := bytes.Repeat([]byte("0123456789"), total/10)
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, tapTestBufLen)
	h, frame := b.readUDP4(t, buf, dst.Port())
	t.Logf("vnet header %+v, frame %d bytes", h, len(frame))
	const hdrs = header.EthernetMinimumSize + header.IPv4MinimumSize + header.UDPMinimumSize
	if h.gsoType != 5 || h.gsoSize != gsoSize {
		t.Errorf("gso_type %d gso_size %d, want 5 (VIRTIO_NET_HDR_GSO_UDP_L4) and %d", h.gsoType, h.gsoSize, gsoSize)
	}
	if len(frame) != hdrs+total {
		t.Errorf("frame of %d bytes, want one super-frame of %d", len(frame), hdrs+total)
	}
	if h.flags&1 == 0 || h.csumStart != header.EthernetMinimumSize+header.IPv4MinimumSize || h.csumOffset != 6 {
		t.Errorf("flags %#x csum_start %d csum_offset %d: want NEEDS_CSUM at the UDP header", h.flags, h.csumStart, h.csumOffset)
	}
	if len(frame) >= hdrs && !bytes.Equal(frame[hdrs:], payload) {
		t.Error("super-frame payload differs from what was written")
	}
}

// tapTestOpenLoose opens a TAP that OpenTAP creates itself, in a fresh
// namespace, and leaves it down: nothing but the test sends on it.
func tapTestOpenLoose(t *testing.T, cfg TAPConfig) (*testbed.Netns, *TAP) {
	t.Helper()
	ns, err := testbed.NewNetns("ustaptest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	var tap *TAP
	if err := ns.Do(func() (err error) {
		tap, err = OpenTAP(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() })
	return ns, tap
}

func TestTAPCreateAndClose(t *testing.T) {
	tapTestNeedRoot(t)
	ns, tap := tapTestOpenLoose(t, TAPConfig{Name: "ustapnp0", VnetHdr: true, Offloads: true})
	if tap.Name() != "ustapnp0" {
		t.Errorf("Name = %q", tap.Name())
	}
	if tap.FD() < 0 {
		t.Errorf("FD = %d", tap.FD())
	}
	out, err := ns.Output("-d", "link", "show", "dev", "ustapnp0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "tun type tap") || !strings.Contains(out, "vnet_hdr") || strings.Contains(out, "persist on") {
		t.Errorf("want a non-persistent TAP with vnet_hdr:\n%s", out)
	}
	mac, err := tap.HardwareAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "link/ether "+mac.String()) {
		t.Errorf("HardwareAddr %v not in:\n%s", mac, out)
	}

	buf := make([]byte, tapTestBufLen)
	if _, err := tap.Read(buf, false); err != ErrNoFrame {
		t.Errorf("non-blocking Read on an idle TAP: %v, want ErrNoFrame", err)
	}

	// Close wakes a blocked Read.
	done := make(chan error, 1)
	var woke time.Time
	go func() {
		_, err := tap.Read(buf, true)
		woke = time.Now()
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("blocking Read returned early: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	closed := time.Now()
	if err := tap.Close(); err != nil {
		t.Fatal(err)
	}
	closeTook := time.Since(closed)
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("blocked Read after Close: %v, want os.ErrClosed", err)
		}
		// Close itself takes longer: releasing the last descriptor of a
		// non-persistent TAP unregisters the device.
		t.Logf("Read woke %v after Close started; Close took %v", woke.Sub(closed), closeTook)
	case <-time.After(time.Second):
		t.Fatal("Close did not wake the blocked Read within a second")
	}
	if _, err := tap.Read(buf, false); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := tap.Write(buf[:64]); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if err := tap.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// The TAP OpenTAP created is gone with its descriptor.
	if err := ns.IP("link", "show", "dev", "ustapnp0"); err == nil {
		t.Error("non-persistent TAP survived Close")
	}
}

// TestTAPPersistentSurvivesClose checks that attaching to a device made by
// `ip tuntap add` (no vnet_hdr of its own) works and leaves it persistent.
func TestTAPPersistentSurvivesClose(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	out, err := b.NS.Output("-d", "link", "show", "dev", b.TAPName)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached:\n%s", out)
	if !strings.Contains(out, "vnet_hdr") || !strings.Contains(out, "persist on") {
		t.Errorf("want persist on and vnet_hdr while attached")
	}
	if err := b.tap.Close(); err != nil {
		t.Fatal(err)
	}
	out, err = b.NS.Output("-d", "link", "show", "dev", b.TAPName)
	if err != nil {
		t.Fatalf("persistent TAP gone after Close: %v", err)
	}
	t.Logf("closed:\n%s", out)
	if !strings.Contains(out, "persist on") || !strings.Contains(out, "NO-CARRIER") {
		t.Errorf("after Close want persist on and NO-CARRIER:\n%s", out)
	}
}

func TestTAPOffloadsNeedVnetHdr(t *testing.T) {
	tapTestNeedRoot(t)
	if tap, err := OpenTAP(TAPConfig{Name: "ustapbad0", Offloads: true}); err == nil {
		tap.Close()
		t.Fatal("OpenTAP with Offloads but no VnetHdr succeeded")
	}
}

// TestTAPTruncate checks Read's behaviour with a buffer shorter than the
// frame.
func TestTAPTruncate(t *testing.T) {
	tapTestNeedRoot(t)
	for _, tt := range tapTestConfigs {
		t.Run(tt.name, func(t *testing.T) {
			b := tapTestOpen(t, tt.cfg)
			dst := netip.AddrPortFrom(b.StackAddr4.Addr(), 7779)
			c, err := b.NS.DialUDP(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := bytes.Repeat([]byte{'x'}, 1000)
			// Two datagrams: the first is read truncated, the second whole,
			// showing that truncation discards the rest of the frame only.
			for range 2 {
				if _, err := c.Write(payload); err != nil {
					t.Fatal(err)
				}
			}
			full := make([]byte, tapTestBufLen)
			hdr := 0
			if tt.cfg.VnetHdr {
				hdr = VirtioNetHdrLen
			}
			short := full[:hdr+100]
			want := hdr + 14 + 20 + 8 + len(payload)
			watchdog := time.AfterFunc(5*time.Second, func() { b.tap.Close() })
			defer watchdog.Stop()
			// The kernel's own chatter (IPv6 neighbour discovery, MLD) may
			// come between or before the datagrams: skip it.
			var got []int
			for range 20 {
				n, err := b.tap.Read(short, true)
				if err != nil {
					t.Fatalf("short Read: %v", err)
				}
				if n == len(short) && header.Ethernet(short[hdr:]).Type() == header.IPv4ProtocolNumber {
					got = append(got, n)
					break
				}
			}
			for range 20 {
				n, err := b.tap.Read(full, true)
				if err != nil {
					t.Fatal(err)
				}
				if n > hdr+header.EthernetMinimumSize && header.Ethernet(full[hdr:]).Type() == header.IPv4ProtocolNumber {
					got = append(got, n)
					break
				}
			}
			if len(got) != 2 || got[0] != len(short) || got[1] != want {
				t.Errorf("read lengths %v, want [%d %d]", got, len(short), want)
			}
		})
	}
}

// TestTAPConcurrent writes from several goroutines at once (for -race) and
// closes the TAP while a Read and Writes are in flight.
func TestTAPConcurrent(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	srv, err := b.NS.ListenUDP(netip.AddrPortFrom(b.KernelAddr4.Addr(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	mac, err := b.tap.HardwareAddr()
	if err != nil {
		t.Fatal(err)
	}
	const writers, perWriter = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := netip.AddrPortFrom(b.StackAddr4.Addr(), uint16(6000+w))
			frame := append(make([]byte, VirtioNetHdrLen),
				tapTestUDPFrame(mac, tapTestStackMAC, from, srv.LocalAddr().(*net.UDPAddr).AddrPort(), []byte("concurrent"), false)...)
			for range perWriter {
				if err := b.tap.Write(frame); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	buf := make([]byte, 64)
	got := 0
	srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	for got < writers*perWriter {
		if _, _, err := srv.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
		got++
	}
	if got != writers*perWriter {
		t.Errorf("kernel received %d of %d datagrams", got, writers*perWriter)
	}

	// Close while a Read blocks and Writes run: every goroutine ends with
	// os.ErrClosed. Frames go to an unknown MAC so the kernel drops them.
	junk := append(make([]byte, VirtioNetHdrLen),
		tapTestUDPFrame(net.HardwareAddr{2, 0, 0, 0, 0, 0x99}, tapTestStackMAC,
			netip.AddrPortFrom(b.StackAddr4.Addr(), 1), netip.AddrPortFrom(b.KernelAddr4.Addr(), 9), []byte("x"), false)...)
	errs := make(chan error, writers+1)
	go func() {
		rb := make([]byte, tapTestBufLen)
		for range 100000 {
			if _, err := b.tap.Read(rb, true); err != nil {
				errs <- err
				return
			}
		}
		errs <- errors.New("reader: bound reached")
	}()
	for range writers {
		go func() {
			for range 100000 {
				if err := b.tap.Write(junk); err != nil {
					errs <- err
					return
				}
			}
			errs <- errors.New("writer: bound reached before Close")
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := b.tap.Close(); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(2 * time.Second)
	for range writers + 1 {
		select {
		case err := <-errs:
			if !errors.Is(err, os.ErrClosed) {
				t.Errorf("after Close: %v, want os.ErrClosed", err)
			}
		case <-timeout:
			t.Fatal("goroutines still running 2s after Close")
		}
	}
}

func TestTAPAllocs(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	mac, err := b.tap.HardwareAddr()
	if err != nil {
		t.Fatal(err)
	}
	const runs = 50
	dst := netip.AddrPortFrom(b.StackAddr4.Addr(), 7780)
	c, err := b.NS.DialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Queue enough frames for every blocking Read below.
	for range runs + 1 {
		if _, err := c.Write([]byte("alloc")); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, tapTestBufLen)
	watchdog := time.AfterFunc(5*time.Second, func() { b.tap.Close() })
	defer watchdog.Stop()
	frame := append(make([]byte, VirtioNetHdrLen),
		tapTestUDPFrame(mac, tapTestStackMAC, netip.AddrPortFrom(b.StackAddr4.Addr(), 1),
			netip.AddrPortFrom(b.KernelAddr4.Addr(), 9), []byte("alloc"), false)...)
	var rerr, werr error
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := b.tap.Read(buf, true); err != nil {
			rerr = err
		}
		if err := b.tap.Write(frame); err != nil {
			werr = err
		}
	})
	if rerr != nil || werr != nil {
		t.Fatalf("Read: %v, Write: %v", rerr, werr)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per Read+Write, want 0", allocs)
	}
	// Drain, then a non-blocking Read of nothing must not allocate either.
	for {
		if _, err := b.tap.Read(buf, false); err != nil {
			break
		}
	}
	allocs = testing.AllocsPerRun(runs, func() { b.tap.Read(buf, false) })
	if allocs != 0 {
		t.Errorf("%v allocations per empty non-blocking Read, want 0", allocs)
	}
}

// TestTAPReadVec reads frames scattered over several buffers, as the NIC
// model reads super-frames into its ring's pages, and checks that they
// join into the frame the kernel sent, and that ReadVec does not allocate.
func TestTAPReadVec(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	const port = 7781
	c, err := b.NS.DialUDP(netip.AddrPortFrom(b.StackAddr4.Addr(), port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 1200)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	const runs = 20
	for range runs + 1 {
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
	}
	watchdog := time.AfterFunc(5*time.Second, func() { b.tap.Close() })
	defer watchdog.Stop()
	buf := make([]byte, tapTestBufLen)
	iov := [][]byte{buf[:VirtioNetHdrLen+7], buf[VirtioNetHdrLen+7 : VirtioNetHdrLen+7], buf[VirtioNetHdrLen+7 : 300], buf[300:1000], buf[1000:]}
	// Scatter into pieces of the same buffer, in order: joined, they
	// are buf itself.
	var udp header.UDP
	for range 20 {
		n, err := b.tap.ReadVec(iov, true)
		if err != nil {
			t.Fatal(err)
		}
		eth := header.Ethernet(buf[VirtioNetHdrLen:n])
		if eth.Type() != header.IPv4ProtocolNumber {
			continue // ARP, IPv6 neighbour discovery
		}
		ip := header.IPv4(eth[header.EthernetMinimumSize:])
		if ip.Protocol() == uint8(header.UDPProtocolNumber) && header.UDP(ip.Payload()).DestinationPort() == port {
			udp = header.UDP(ip.Payload())
			break
		}
	}
	if udp == nil {
		t.Fatal("no UDP frame to the port in 20 reads")
	}
	if !bytes.Equal(udp.Payload(), payload) {
		t.Errorf("datagram read with ReadVec: got %d bytes, not the %d sent", len(udp.Payload()), len(payload))
	}
	if allocs := testing.AllocsPerRun(runs-5, func() { b.tap.ReadVec(iov, true) }); allocs != 0 && !testutil.RaceEnabled {
		t.Errorf("%v allocations per ReadVec, want 0", allocs)
	}
}

// TestTAPResetsVnetByteOrder checks that OpenTAP puts a persistent
// device's virtio-net header byte order back to the default: an earlier
// user set it big endian (TUNSETVNETBE, where the kernel has
// CONFIG_TUN_VNET_CROSS_LE) and little endian (TUNSETVNETLE, which only
// matters on a big-endian host but is kept by the device all the same).
func TestTAPResetsVnetByteOrder(t *testing.T) {
	tapTestNeedRoot(t)
	bed, err := testbed.NewTAPBed(testbed.TAPConfig{Prefix: "ustaptest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Error(err)
		}
	})
	// The earlier user: attach, set both byte orders, detach. The device
	// is persistent (ip tuntap add), so the flags stay with it.
	crossLE := true
	if err := bed.NS.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(bed.TAPName)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF: %w", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETLE, 1); err != nil {
			return fmt.Errorf("TUNSETVNETLE: %w", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETBE, 1); errors.Is(err, unix.EINVAL) {
			crossLE = false // no CONFIG_TUN_VNET_CROSS_LE: no big-endian mode
		} else if err != nil {
			return fmt.Errorf("TUNSETVNETBE: %w", err)
		}
		if le, err := unix.IoctlGetInt(fd, unix.TUNGETVNETLE); err != nil || le != 1 {
			return fmt.Errorf("TUNGETVNETLE after setting it: %d, %v", le, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("CONFIG_TUN_VNET_CROSS_LE: %v", crossLE)

	var tap *TAP
	if err := bed.Open(func() (err error) {
		tap, err = OpenTAP(TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() }) // runs before bed.Close
	if le, err := unix.IoctlGetInt(tap.FD(), unix.TUNGETVNETLE); err != nil || le != 0 {
		t.Errorf("TUNGETVNETLE after OpenTAP: got %d (%v), want 0", le, err)
	}
	if crossLE {
		if be, err := unix.IoctlGetInt(tap.FD(), unix.TUNGETVNETBE); err != nil || be != 0 {
			t.Errorf("TUNGETVNETBE after OpenTAP: got %d (%v), want 0", be, err)
		}
	}
}

// TestTAPWait: the Waiter's Wait returns for a queued frame, a timeout, a
// Wake (before or during the wait) and Close (os.ErrClosed), and does not
// allocate.
func TestTAPWait(t *testing.T) {
	tapTestNeedRoot(t)
	b := tapTestOpen(t, TAPConfig{VnetHdr: true, Offloads: true})
	waitDone := func(f func() error) error {
		t.Helper()
		c := make(chan error, 1)
		go func() { c <- f() }()
		select {
		case err := <-c:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Wait did not return in 10 s")
			return nil
		}
	}
	// The kernel's own frames (IPv6 router solicitations, MLD) end a
	// Wait too: a wake counts when no frame was queued after it.
	buf := make([]byte, tapTestBufLen)
	drain := func() (n int) {
		for {
			if _, err := b.tap.Read(buf, false); err != nil {
				return n
			}
			n++
		}
	}
	woken := func(during bool) {
		t.Helper()
		for try := 0; try < 50; try++ {
			drain()
			var err error
			if during {
				c := make(chan error, 1)
				go func() { c <- b.tap.Wait(-1) }()
				time.Sleep(5 * time.Millisecond) // into the ppoll, most likely; either way Wake ends it
				b.tap.Wake()
				err = waitDone(func() error { return <-c })
			} else {
				b.tap.Wake()
				err = waitDone(func() error { return b.tap.Wait(-1) })
			}
			if err != nil {
				t.Fatal(err)
			}
			if drain() == 0 {
				return // nothing else could have ended it
			}
		}
		t.Fatal("a kernel frame came with every Wake in 50 tries")
	}
	woken(false) // a Wake before the Wait ends it at once
	woken(true)  // a Wake during the Wait ends it
	// A timeout ends it.
	if err := waitDone(func() error { return b.tap.Wait(time.Millisecond) }); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() { b.tap.Wait(0) }); n != 0 {
		t.Errorf("Wait allocates %.1f times", n)
	}
	// A frame: the kernel sends a datagram; Wait returns and a
	// non-blocking read finds frames until the datagram.
	dst := netip.AddrPortFrom(b.StackAddr4.Addr(), 7777)
	u, err := b.NS.DialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("wake up")); err != nil {
		t.Fatal(err)
	}
	found := false
	for i := 0; i < 100 && !found; i++ {
		if err := waitDone(func() error { return b.tap.Wait(-1) }); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := b.tap.Read(buf, false)
			if errors.Is(err, ErrNoFrame) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			found = found || bytes.Contains(buf[:n], []byte("wake up"))
		}
	}
	if !found {
		t.Fatal("the datagram never came after a Wait")
	}
	// Close ends a Wait with os.ErrClosed.
	c := make(chan error, 1)
	go func() {
		for {
			// A kernel frame may end a Wait before Close.
			if err := b.tap.Wait(-1); err != nil {
				c <- err
				return
			}
			drain()
		}
	}()
	time.Sleep(10 * time.Millisecond)
	b.tap.Close()
	select {
	case err := <-c:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Wait after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the Wait")
	}
	b.tap.Wake() // after Close: nothing, no panic
}
