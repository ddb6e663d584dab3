package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// benchMem is `ustack bench` without root: the receiver under test and a
// gVisor TCP sender (another ustack stack) joined by the in-memory wire.
func benchMem(dur time.Duration, rounds, mtu int) error {
	rows := defaultRows(mtu)
	res := make([][]float64, len(rows))
	for r := 0; r < rounds; r++ {
		for i, row := range rows {
			g, err := memRun(row, dur)
			if err != nil {
				return fmt.Errorf("%s: %w", row.name, err)
			}
			res[i] = append(res[i], g)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration (in-memory wire, gVisor sender)\tGbit/s (min-max)\t")
	for i, row := range rows {
		m, lo, hi := median(res[i])
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t\n", row.name, m, lo, hi)
	}
	return tw.Flush()
}

func memRun(row benchRow, dur time.Duration) (float64, error) {
	cfg, err := row.pol.stackConfig()
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
	tx, err := stack.New(stack.Config{Wire: b, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/24")}, MAC: [6]byte{2, 0, 0, 0, 0, 2}, Driver: driver.Config{MTU: row.pol.mtu}})
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
	go func() { done <- row.pol.discard()(l, &n) }()
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

// median returns the median and the spread (min, max) of xs.
func median(xs []float64) (med, lo, hi float64) {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return 0, 0, 0
	}
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// benchRow is one configuration of the bench table.
type benchRow struct {
	name    string
	streams int // parallel TCP streams (0 or 1: one)
	pol     policy
	stock   bool // gVisor's stock fdbased endpoint instead of ustack's driver
}

// defaultRows are the bench's configurations: {LRO on, off} x {hds auto,
// 256} with GRO on, and LRO off with GRO off.
func defaultRows(mtu int) []benchRow {
	var rows []benchRow
	add := func(lro, hds, gro string) {
		p := basePolicy(mtu)
		p.lro, p.hds, p.gro = lro, hds, gro
		rows = append(rows, benchRow{name: "ustack " + p.String(), pol: p})
	}
	add("on", "auto", "on")
	add("on", "256", "on")
	add("off", "auto", "on")
	add("off", "256", "on")
	add("off", "auto", "off")
	return rows
}

// poolRows are `ustack bench -pool`: seed 001's comparison, page recycling
// off and on at 4 KB and 64 KB pages, LRO off and GRO on.
func poolRows(mtu int) []benchRow {
	var rows []benchRow
	for _, size := range []string{"4k", "64k"} {
		for _, recycle := range []string{"off", "on"} {
			p := basePolicy(mtu)
			p.lro, p.pageSize, p.recycle = "off", size, recycle
			rows = append(rows, benchRow{name: "ustack " + p.String(), pol: p})
		}
	}
	return rows
}

// hwGRORows are `ustack bench -hwgro`: seed 002's three-way comparison at
// LRO off: software GRO only, hardware GRO, hardware GRO with coalescing;
// each with payload copied into gVisor and read with Read, and with zero
// copy read in place with ReadViews (tcp_mmap's side of the seed).
func hwGRORows(mtu int) []benchRow {
	var rows []benchRow
	for _, zc := range []string{"off", "views"} {
		for _, m := range []string{"off", "on", "coalesce"} {
			p := basePolicy(mtu)
			p.lro, p.hwGRO, p.zeroCopy = "off", m, zc
			rows = append(rows, benchRow{name: "ustack " + p.String(), pol: p})
		}
	}
	return rows
}

// basePolicy is the default of every switch.
func basePolicy(mtu int) policy {
	return policy{mtu: mtu, rq: "striding", lro: "on", hds: "auto", gro: "on", budget: driver.DefaultBudget, ring: driver.DefaultRingSize, pageSize: "4k", recycle: "on", cpuGRO: "on", hwGRO: "off", zeroCopy: "off"}
}
