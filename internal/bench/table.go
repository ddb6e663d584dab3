package bench

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ustack/ustack/driver"
)

// Sample is one measured run of a row.
type Sample struct {
	gbps        float64
	rxCPUPerGB  float64 // receiver process CPU seconds per GB
	sysCPUPerGB float64 // whole machine CPU seconds per GB
	nicShare    float64 // share of the receiver's CPU spent in the NIC model's thread
	counters    map[string]uint64
	congestion  string
	peakHeld    int64 // most bytes the page pool held at once during the run
}

// summary is a row's samples summed up for a table: the medians, the
// throughput's spread, and the last run's counters and congestion control.
type summary struct {
	gbps, lo, hi                 float64
	rxCPUPerGB, sysCPUPerGB, nic float64
	peakHeld                     float64
	counters                     map[string]uint64
	congestion                   string
}

// summarize sums up ss, which holds at least one sample.
func summarize(ss []Sample) summary {
	vals := func(f func(Sample) float64) []float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = f(s)
		}
		return xs
	}
	var m summary
	m.gbps, m.lo, m.hi = Median(vals(func(s Sample) float64 { return s.gbps }))
	m.rxCPUPerGB, _, _ = Median(vals(func(s Sample) float64 { return s.rxCPUPerGB }))
	m.sysCPUPerGB, _, _ = Median(vals(func(s Sample) float64 { return s.sysCPUPerGB }))
	m.nic, _, _ = Median(vals(func(s Sample) float64 { return s.nicShare }))
	m.peakHeld, _, _ = Median(vals(func(s Sample) float64 { return float64(s.peakHeld) }))
	last := ss[len(ss)-1]
	m.counters, m.congestion = last.counters, last.congestion
	return m
}

// printTable writes a right-aligned table: the header's tab-separated
// columns, then a line per row, which line writes from the row's summary.
func printTable(w io.Writer, header string, rows []Row, results [][]Sample, line func(tw io.Writer, r Row, m summary)) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, header)
	for i, r := range rows {
		line(tw, r, summarize(results[i]))
	}
	tw.Flush()
}

// PrintBench prints one line per row: medians with their spread, and the
// ratio to the stock endpoint when it ran.
func PrintBench(w io.Writer, rows []Row, results [][]Sample) {
	stockMed, kernelMed := 0.0, 0.0
	for i, r := range rows {
		switch {
		case r.Stock:
			stockMed = summarize(results[i]).gbps
		case r.Kernel:
			kernelMed = summarize(results[i]).gbps
		}
	}
	ratioTo := func(v, base float64) string {
		if base > 0 {
			return fmt.Sprintf("%.2f", v/base)
		}
		return "-"
	}
	printTable(w, "configuration\tGbit/s (min-max)\tx kernel\tx stock\trx CPU s/GB\tmachine CPU s/GB\tNIC share\tpeak pool MB\tframes/read\tpkts/poll\thds B/pkt\thds payload B\tsegs/GRO pkt\tfrag_list\tcc\t", rows, results, func(tw io.Writer, r Row, m summary) {
		c := m.counters
		fpr, ppp, hdsPkt, hdsPay, segs, fl, pool := "-", "-", "-", "-", "-", "-", "-"
		if !r.Stock && !r.Kernel && !r.Floor {
			pool = fmt.Sprintf("%.1f", m.peakHeld/1e6)
			fpr = ratioStr(c["rx_packets"], c["rx_wire_reads"])
			ppp = ratioStr(c["rx_packets"], c["rx_napi_polls"])
			hdsPkt = ratioStr(c["rx_hds_bytes"], c["rx_packets"])
			hdsPay = strconv.FormatUint(c["rx_hds_payload_bytes"], 10)
			if _, ok := c["rx_gro_skbs"]; ok {
				segs = ratioStr(c["rx_gro_packets"], c["rx_gro_skbs"])
				fl = strconv.FormatUint(c["rx_gro_frag_list"], 10)
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%s\t%s\t%.3f\t%.3f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Name, m.gbps, m.lo, m.hi, ratioTo(m.gbps, kernelMed), ratioTo(m.gbps, stockMed), m.rxCPUPerGB, m.sysCPUPerGB, m.nic*100, pool, fpr, ppp, hdsPkt, hdsPay, segs, fl, m.congestion)
	})
}

// PrintPool prints mlx4's page-recycling patch's figures: distinct pages per GRO packet
// and pool memory per RX ring slot, with throughput.
func PrintPool(w io.Writer, rows []Row, results [][]Sample) {
	printTable(w, "configuration\tGbit/s (min-max)\trx CPU s/GB\tpages/GRO pkt\tpeak pool bytes/ring slot\tpeak pool MB\tpages alloc|reused|busy per 1k pkts\tpages 1|2|3-4|5-8|9-16|17-32|33-64|65+\tcc\t", rows, results, func(tw io.Writer, r Row, m summary) {
		c := m.counters
		var hist []string
		for _, b := range []string{"1", "2", "3_4", "5_8", "9_16", "17_32", "33_64", "65_plus"} {
			hist = append(hist, strconv.FormatUint(c["rx_pkt_pages_"+b], 10))
		}
		// rx_alloc_pages, rx_cache_reuse, rx_cache_busy per thousand
		// frames: how often the cyclic RQ needed a page, and found the
		// oldest one free or still held.
		per1k := func(n uint64) string { return ratioStr(1000*n, c["rx_packets"]) }
		pages := per1k(c["rx_alloc_pages"]) + "|" + per1k(c["rx_cache_reuse"]) + "|" + per1k(c["rx_cache_busy"])
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%.3f\t%s\t%.0f\t%.1f\t%s\t%s\t%s\t\n",
			r.Name, m.gbps, m.lo, m.hi, m.rxCPUPerGB, ratioStr(c["rx_gro_pkt_pages"], c["rx_gro_pkt_paged"]),
			m.peakHeld/float64(driver.DefaultRingSize), m.peakHeld/1e6, pages, strings.Join(hist, "|"), m.congestion)
	})
}

// PrintHWGRO prints the SHAMPO coalescing patch's figures: throughput, CPU, frags per
// packet and the share of payload bytes in page-sized, page-aligned frags.
func PrintHWGRO(w io.Writer, rows []Row, results [][]Sample) {
	printTable(w, "configuration\tGbit/s (min-max)\trx CPU s/GB\tNIC share\tframes/session\tfrags/session\tflush|miss|space|poll\tmappable share\tread mapped\tsegs/GRO pkt\tcc\t", rows, results, func(tw io.Writer, r Row, m summary) {
		c := m.counters
		share := "-"
		if p := c["rx_gro_hw_payload_bytes"]; p > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(c["rx_gro_hw_mappable_bytes"])/float64(p))
		}
		// ReadViews' mappable share: what it handed over in place (whole
		// pages, tcp_mmap's rule), of all it read.
		read := "-"
		if t := c["zc_read_mapped_bytes"] + c["zc_read_copied_bytes"]; t > 0 {
			read = fmt.Sprintf("%.0f%%", 100*float64(c["zc_read_mapped_bytes"])/float64(t))
		}
		// Why the session packets went up, in percent of them: the
		// CQE's flush bit (PSH and the like), another session's CQE, no
		// room (has_enough_space), the end of a poll.
		ends := "-"
		if n := c["rx_gro_hw_sessions"]; n > 0 {
			pc := func(k string) uint64 { return (100*c[k] + n/2) / n }
			ends = fmt.Sprintf("%d|%d|%d|%d%%", pc("rx_gro_hw_flush_cqe"), pc("rx_gro_hw_flush_mismatch"), pc("rx_gro_hw_flush_space"), pc("rx_gro_hw_flush_poll"))
		}
		fmt.Fprintf(tw, "%s\t%.2f (%.2f-%.2f)\t%.3f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Name, m.gbps, m.lo, m.hi, m.rxCPUPerGB, m.nic*100,
			ratioStr(c["rx_gro_hw_packets"], c["rx_gro_hw_sessions"]), ratioStr(c["rx_gro_hw_frags"], c["rx_gro_hw_sessions"]), ends, share, read,
			ratioStr(c["rx_gro_packets"], c["rx_gro_skbs"]), m.congestion)
	})
}

func ratioStr(a, b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(a)/float64(b))
}

// Median returns the median and the spread (min, max) of xs.
func Median(xs []float64) (med, lo, hi float64) {
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

// PrintQueueShares prints, for each row on several queues, how the last
// run's packets split over the queues (rxN_packets over rx_packets):
// whether the kernel spread the flows. (The per-queue CPU counters are
// left out: an unpinned loop's thread CPU clock is read on whichever
// thread it runs, which several loops make meaningless.) Nothing when no
// row has several queues.
func PrintQueueShares(w io.Writer, rows []Row, results [][]Sample) {
	for i, r := range rows {
		if r.Queues < 2 || len(results[i]) == 0 {
			continue
		}
		c := summarize(results[i]).counters
		var parts []string
		for q := range r.Queues {
			n := strconv.Itoa(q)
			share := 0.0
			if t := c["rx_packets"]; t > 0 {
				share = 100 * float64(c["rx"+n+"_packets"]) / float64(t)
			}
			parts = append(parts, fmt.Sprintf("queue %d %.0f%%", q, share))
		}
		fmt.Fprintf(w, "%s: %s\n", r.Name, strings.Join(parts, ", "))
	}
}
