package stack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// FuzzSocketAPI makes random calls with random arguments on a TCP
// connection's two ends, a listener and a UDP socket over the in-memory
// pair: no call panics, every error is io.EOF or a *net.OpError, and once
// everything is closed no goroutine is left (calls blocked at Close
// return). Each input byte pair is an operation and its argument.
func FuzzSocketAPI(f *testing.F) {
	f.Add([]byte{0, 8, 1, 8, 9, 0, 1, 0})                              // write, read, close, read
	f.Add([]byte{10, 0, 9, 1, 1, 3, 16, 0, 9, 0})                      // linger 0, close, read the RST, blocked read
	f.Add([]byte{4, 1, 1, 4, 0, 64, 8, 0, 1, 2, 7, 1, 0, 2, 2, 200})   // deadlines, CloseWrite, CloseRead, ReadViews
	f.Add([]byte{13, 0x80, 14, 0xff, 11, 0x81, 15, 3, 12, 0, 3, 0})    // odd option values
	f.Add([]byte{17, 0, 17, 1, 17, 2, 17, 3, 17, 4, 17, 5, 18, 0, 19}) // UDP destinations, close
	f.Add([]byte{20, 0, 21, 0, 22, 0, 20, 1, 23, 0, 23, 1, 23, 2})     // listener, dials
	f.Add([]byte{23, 3, 23, 4, 24, 0, 24, 1, 16, 1, 9, 1, 9, 0})       // dials, blocked read at Close
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 128 {
			ops = ops[:128]
		}
		rx, peer := pairConfig(t, Config{})
		leaks := goleak.IgnoreCurrent()
		ln, err := rx.ListenTCP(netip.MustParseAddrPort("192.0.2.1:7500"))
		if err != nil {
			t.Fatal(err)
		}
		l := ln.(*TCPListener)
		d, a, err := dialAccept(peer, l, netip.MustParseAddrPort("192.0.2.1:7500"))
		if err != nil {
			t.Fatal(err)
		}
		conns := [2]*TCPConn{d, a}
		var extra []net.Conn // dialed by the operations
		uc, err := rx.ListenUDP(netip.MustParseAddrPort("192.0.2.1:7501"))
		if err != nil {
			t.Fatal(err)
		}
		u := uc.(*UDPConn)
		var blocked sync.WaitGroup
		check := func(what string, err error) {
			t.Helper()
			var oe *net.OpError
			if err != nil && err != io.EOF && !errors.As(err, &oe) {
				t.Errorf("%s: got %v (%T), want nil, io.EOF or a *net.OpError", what, err, err)
			}
		}
		short := func() time.Time { return time.Now().Add(5 * time.Millisecond) }
		buf := make([]byte, 64<<10)
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%25, ops[i+1]
			c := conns[arg&1]
			n := int(arg) * 97
			switch op {
			case 0:
				c.SetWriteDeadline(short())
				_, err := c.Write(buf[:n%len(buf)])
				check("Write", err)
			case 1:
				c.SetReadDeadline(short())
				_, err := c.Read(buf[:n%len(buf)])
				check("Read", err)
			case 2:
				c.SetReadDeadline(short())
				vs, _, err := c.ReadViews(nil, int(int8(arg))*1000)
				for i := range vs {
					vs[i].Release()
				}
				check("ReadViews", err)
			case 3:
				_, err := c.TryRead(buf[:n%len(buf)])
				check("TryRead", err)
			case 4, 5, 6:
				t := fuzzTime(arg)
				switch op {
				case 4:
					check("SetDeadline", c.SetDeadline(t))
				case 5:
					check("SetReadDeadline", c.SetReadDeadline(t))
				default:
					check("SetWriteDeadline", c.SetWriteDeadline(t))
				}
			case 7:
				check("CloseRead", c.CloseRead())
			case 8:
				check("CloseWrite", c.CloseWrite())
			case 9:
				check("Close", c.Close())
			case 10:
				check("SetLinger", c.SetLinger(int(arg%3)-1)) // -1, 0 or 1 s: Close may block that long
			case 11:
				check("SetKeepAlivePeriod", c.SetKeepAlivePeriod(time.Duration(int8(arg))*time.Hour))
			case 12:
				check("SetNoDelay", c.SetNoDelay(arg&2 != 0))
			case 13:
				check("SetReadBuffer", c.SetReadBuffer(int(int8(arg))<<12))
			case 14:
				check("SetWriteBuffer", c.SetWriteBuffer(int(int8(arg))<<12))
			case 15:
				check("SetKeepAliveConfig", c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: arg&2 != 0,
					Idle: time.Duration(int8(arg)) * time.Minute, Interval: time.Duration(int8(arg)) * time.Second, Count: int(int8(arg))}))
			case 16:
				// A read with no deadline, ended by the Close at the end.
				c.SetReadDeadline(time.Time{})
				blocked.Add(1)
				go func() {
					defer blocked.Done()
					_, err := c.Read(make([]byte, 16))
					check("blocked Read", err)
				}()
			case 17:
				u.SetWriteDeadline(short())
				_, err := u.WriteTo(buf[:n%2000], fuzzUDPDest(arg))
				check("WriteTo", err)
			case 18:
				u.SetReadDeadline(short())
				_, _, err := u.ReadFrom(buf[:n%len(buf)])
				check("ReadFrom", err)
			case 19:
				check("UDP Close", u.Close())
			case 20:
				l.SetDeadline(short())
				if c, err := l.Accept(); err == nil {
					extra = append(extra, c)
				} else {
					check("Accept", err)
				}
			case 21:
				check("listener SetDeadline", l.SetDeadline(fuzzTime(arg)))
			case 22:
				check("listener Close", l.Close())
			case 23, 24:
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				var c net.Conn
				var err error
				if op == 23 {
					c, err = peer.DialTCP(ctx, fuzzTCPDest(arg))
				} else {
					c, err = peer.DialContext(ctx, "udp", fuzzTCPDest(arg).String())
				}
				cancel()
				if err == nil {
					extra = append(extra, c)
				}
				check("Dial", err)
			}
		}
		for _, c := range conns {
			c.Close()
		}
		for _, c := range extra {
			c.Close()
		}
		l.Close()
		u.Close()
		blocked.Wait()
		goleak.VerifyNone(t, leaks)
	})
}

// fuzzTime returns a deadline of arg's choosing: none, past, or soon.
func fuzzTime(arg byte) time.Time {
	switch arg % 4 {
	case 0:
		return time.Time{}
	case 1:
		return time.Now().Add(-time.Hour)
	case 2:
		return time.Unix(0, 0)
	}
	return time.Now().Add(time.Duration(arg) * 100 * time.Microsecond)
}

// fuzzUDPDest returns a WriteTo destination of arg's choosing, good or bad.
func fuzzUDPDest(arg byte) net.Addr {
	switch arg % 7 {
	case 0:
		return nil
	case 1:
		return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 9}
	case 2:
		return (*net.UDPAddr)(nil)
	case 3:
		return &net.UDPAddr{IP: net.IP{1, 2, 3, 4, 5}, Port: 9}
	case 4:
		return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 1 << 20}
	case 5:
		return &net.UDPAddr{IP: net.ParseIP("2001:db8::2"), Port: 9}
	}
	return &net.UDPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 9}
}

// fuzzTCPDest returns a dial destination of arg's choosing.
func fuzzTCPDest(arg byte) netip.AddrPort {
	switch arg % 6 {
	case 0:
		return netip.AddrPort{}
	case 1:
		return netip.MustParseAddrPort("0.0.0.0:7500")
	case 2:
		return netip.MustParseAddrPort("192.0.2.255:7500")
	case 3:
		return netip.MustParseAddrPort("192.0.2.1:7500")
	case 4:
		return netip.MustParseAddrPort("[::]:0")
	}
	return netip.MustParseAddrPort("192.0.2.1:9")
}
