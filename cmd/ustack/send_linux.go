package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sendResult is what `ustack send` prints as JSON on its last line.
type sendResult struct {
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	Congestion string  `json:"congestion"`
}

// sendCmd is the kernel sender of `ustack bench`: a separate process (run
// inside the bench's namespace) so that its CPU time is not counted as the
// receiver's. It writes to a TCP address for a bounded time and byte count.
func sendCmd(args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	addr := fs.String("addr", "", "TCP address to send to")
	dur := fs.Duration("t", 3*time.Second, "how long to send")
	max := fs.Int64("max", 64<<30, "stop after this many bytes")
	wsize := fs.Int("w", 64<<10, "write size")
	cc := fs.String("cc", "cubic", "congestion control of the sending socket")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dur <= 0 || *dur > 10*time.Minute || *wsize <= 0 {
		return usageError{errors.New("want 0 < -t <= 10m and -w > 0")}
	}
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, *cc) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set congestion control %q: %w", *cc, serr)
		}
		return nil
	}}
	c, err := d.Dial("tcp", *addr)
	if err != nil {
		return err
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var got string
	rc.Control(func(fd uintptr) { got, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	buf := make([]byte, *wsize)
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	deadline := start.Add(*dur)
	c.SetWriteDeadline(deadline)
	var sent int64
	for sent < *max && time.Now().Before(deadline) {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			break
		}
	}
	el := time.Since(start)
	return json.NewEncoder(os.Stdout).Encode(sendResult{Bytes: sent, Seconds: el.Seconds(), Congestion: got})
}
