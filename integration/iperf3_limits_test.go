//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIPerf3RunLimits runs the iperf3 client against `ustack run -iperf3`
// with the server's caps set by flag: a test longer than
// -iperf3-max-duration is refused, and a reversed UDP test at -b 0 is sent
// at no more than -iperf3-max-rate.
func TestIPerf3RunLimits(t *testing.T) {
	needRoot(t)
	needIPerf3(t)
	const rate = 20e6 // bits per second
	r, cmd, _, stderr, exited := startRunBinary(t, "usit-iperf3lim", "-iperf3", ":5201",
		"-iperf3-max-duration", "5s", "-iperf3-max-rate", strconv.Itoa(rate))
	dst := netip.AddrPortFrom(r.bed.StackAddr4.Addr(), 5201)

	t.Run("max-duration", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := r.bed.NS.Exec(ctx, "iperf3", "-c", dst.Addr().String(), "-p", "5201", "--json", "--connect-timeout", "5000", "-t", "10")
		out, err := c.Output()
		var rep iperf3Report
		json.Unmarshal(out, &rep)
		// 3.12 reports the error by number (int_errno=37), and exits 0
		// with --json.
		if rep.Error == "" {
			t.Errorf("iperf3 -t 10 against a 5 s maximum: got exit %v, no error in the report; want it refused:\n%s", err, out)
		}
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "more than the server's maximum"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no line from ustack run about the refused test; stderr:\n%s", stderr.String())
			}
		}
	})
	t.Run("max-rate", func(t *testing.T) {
		rep := runIPerf3(t, r.bed.NS, dst, "-t", "2", "-u", "-R", "-b", "0", "-l", "1400")
		// The pacer never runs ahead of the cap by more than a
		// millisecond's burst; a slow machine only sends less.
		if s := rep.End.SumSent; s.Seconds <= 0 || s.Bytes*8/s.Seconds > 1.5*rate {
			t.Errorf("-u -R -b 0 under a cap of %.0f bit/s: sent %.0f bytes in %.2fs (%.0f bit/s), want at most 1.5 times the cap", rate, s.Bytes, s.Seconds, s.Bytes*8/s.Seconds)
		}
	})
	if err := terminate(t, cmd, exited, stderr, 10*time.Second); err != nil {
		t.Errorf("ustack run after SIGTERM: got %v, want exit status 0", err)
	}
}
