package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// Mem is `ustack bench` without root: it measures each row's receiver,
// rounds times, against a gVisor TCP sender (another ustack stack) joined
// to it by the in-memory wire, and prints the table.
func Mem(rows []Row, dur time.Duration, rounds int) error {
	res := make([][]float64, len(rows))
	for r := 0; r < rounds; r++ {
		for i, row := range rows {
			g, err := memRun(row, dur)
			if err != nil {
				return fmt.Errorf("%s: %w", row.Name, err)
			}
			res[i] = append(res[i], g)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration (in-memory wire, gVisor sender)\tGbit/s (min-max)\t")
	for i, row := range rows {
		m, lo, hi := Median(res[i])
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t\n", row.Name, m, lo, hi)
	}
	return tw.Flush()
}

func memRun(row Row, dur time.Duration) (float64, error) {
	cfg, err := row.Policy.StackConfig()
	if err != nil {
		return 0, err
	}
	a, b := driver.NewMemPair(4096, driver.VirtioNetHdrLen+65553)
	cfg.Wire = a
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}
	rx, err := stack.New(cfg)
	if err != nil {
		b.Close()
		return 0, err
	}
	defer rx.Close()
	tx, err := stack.New(stack.Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}, Driver: driver.Config{MTU: row.MTU}})
	if err != nil {
		return 0, err
	}
	defer tx.Close()
	dst := netip.MustParseAddrPort("192.0.2.1:9")
	l, err := rx.ListenTCP(dst)
	if err != nil {
		return 0, err
	}
	var n atomic.Uint64
	done := make(chan error, 1)
	go func() { done <- discard(row.Policy)(l, &n) }()
	defer func() { l.Close(); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tx.DialTCP(ctx, dst)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 64<<10)
	start := time.Now()
	c.SetWriteDeadline(start.Add(dur))
	var sent uint64
	for time.Since(start) < dur {
		m, err := c.Write(buf)
		sent += uint64(m)
		if err != nil {
			break
		}
	}
	el := time.Since(start)
	c.Close()
	return float64(sent) * 8 / el.Seconds() / 1e9, nil
}
