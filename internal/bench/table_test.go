package bench

import (
	"bytes"
	"strings"
	"testing"
)

// tableWant is what the tables printed for tableSamples before they moved
// out of cmd/ustack (printBench, printPoolBench, printHWGROBench at the
// branch base): the move and summarize keep every column. The hw-gro table
// has since gained why its session packets went up (flush|miss|space|poll),
// the bench table its peak pool memory (peak pool MB).
const tableWant = `         configuration     Gbit/s (min-max)  x kernel  x stock  rx CPU s/GB  machine CPU s/GB  NIC share  peak pool MB  frames/read  pkts/poll  hds B/pkt  hds payload B  segs/GRO pkt  frag_list     cc
              ustack a  11.00 (10.00-12.00)         -     5.50        0.450             0.950        32%           2.1        100.0       25.0       66.0              5          40.0          3    bbr
              ustack b     8.50 (8.00-9.00)         -     4.25        0.650             1.150        22%           3.1            -          -          -              0             -          -   reno
  gVisor stock fdbased     2.00 (2.00-2.00)         -     1.00        3.000             4.000         0%             -            -          -          -              -             -          -  cubic
--
         configuration     Gbit/s (min-max)  rx CPU s/GB  pages/GRO pkt  peak pool bytes/ring slot  peak pool MB  pages alloc|reused|busy per 1k pkts  pages 1|2|3-4|5-8|9-16|17-32|33-64|65+     cc
              ustack a  11.00 (10.00-12.00)        0.450            3.0                       2048           2.1                          0.0|0.0|0.0                         7|0|0|0|0|0|0|2    bbr
              ustack b     8.50 (8.00-9.00)        0.650              -                       3072           3.1                                -|-|-                         0|0|0|0|0|0|0|0   reno
  gVisor stock fdbased     2.00 (2.00-2.00)        3.000              -                          0           0.0                                -|-|-                         0|0|0|0|0|0|0|0  cubic
--
         configuration     Gbit/s (min-max)  rx CPU s/GB  NIC share  frames/session  frags/session  flush|miss|space|poll  mappable share  read mapped  segs/GRO pkt     cc
              ustack a  11.00 (10.00-12.00)        0.450        32%             4.0            3.0           50|10|30|10%             75%          60%          40.0    bbr
              ustack b     8.50 (8.00-9.00)        0.650        22%               -              -                      -               -            -             -   reno
  gVisor stock fdbased     2.00 (2.00-2.00)        3.000         0%               -              -                      -               -            -             -  cubic
`

// tableSamples are three rows: ustack with three runs, ustack with two
// (an even median, counters missing) and the stock endpoint.
func tableSamples() ([]Row, [][]Sample) {
	rows := []Row{{Name: "ustack a"}, {Name: "ustack b"}, {Name: "gVisor stock fdbased", Stock: true}}
	c := map[string]uint64{"rx_packets": 1000, "rx_wire_reads": 10, "rx_napi_polls": 40, "rx_hds_bytes": 66000, "rx_hds_payload_bytes": 5,
		"rx_gro_skbs": 25, "rx_gro_packets": 1000, "rx_gro_frag_list": 3, "rx_pkt_pages_1": 7, "rx_pkt_pages_65_plus": 2, "rx_gro_pkt_pages": 90, "rx_gro_pkt_paged": 30,
		"rx_gro_hw_payload_bytes": 1000, "rx_gro_hw_mappable_bytes": 750, "zc_read_mapped_bytes": 600, "zc_read_copied_bytes": 400, "zc_read_page_bytes": 500,
		"rx_gro_hw_packets": 80, "rx_gro_hw_sessions": 20, "rx_gro_hw_frags": 60,
		"rx_gro_hw_flush_cqe": 10, "rx_gro_hw_flush_mismatch": 2, "rx_gro_hw_flush_space": 6, "rx_gro_hw_flush_poll": 2}
	mk := func(g, rx, sys, nic float64, held int64, cc string, counters map[string]uint64) Sample {
		return Sample{gbps: g, rxCPUPerGB: rx, sysCPUPerGB: sys, nicShare: nic, peakHeld: held, congestion: cc, counters: counters}
	}
	res := [][]Sample{
		{mk(10, 0.5, 1, 0.3, 1<<20, "cubic", c), mk(12, 0.4, 0.9, 0.35, 3<<20, "cubic", c), mk(11, 0.45, 0.95, 0.32, 2<<20, "bbr", c)},
		{mk(9, 0.6, 1.1, 0.2, 1<<22, "cubic", map[string]uint64{"rx_packets": 5}), mk(8, 0.7, 1.2, 0.25, 1<<21, "reno", map[string]uint64{})},
		{mk(2, 3, 4, 0, 0, "cubic", nil)},
	}
	return rows, res
}

func TestTables(t *testing.T) {
	rows, res := tableSamples()
	var b bytes.Buffer
	PrintBench(&b, rows, res)
	b.WriteString("--\n")
	PrintPool(&b, rows, res)
	b.WriteString("--\n")
	PrintHWGRO(&b, rows, res)
	if got := b.String(); got != tableWant {
		t.Errorf("got\n%s\nwant\n%s", got, tableWant)
	}
}

// TestBenchKernelColumn: with a kernel row, every row gets its ratio to
// the kernel's median, and the kernel row shows no counters.
func TestBenchKernelColumn(t *testing.T) {
	rows := []Row{{Name: "ustack a"}, {Name: "kernel over veth", Kernel: true}}
	c := map[string]uint64{"rx_packets": 1000, "rx_wire_reads": 10}
	res := [][]Sample{{{gbps: 10, counters: c}, {gbps: 12, counters: c}}, {{gbps: 20}, {gbps: 24}}}
	var b bytes.Buffer
	PrintBench(&b, rows, res)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("got\n%s", b.String())
	}
	for i, want := range []string{"ustack a  11.00 (10.00-12.00)      0.50        -", "kernel over veth  22.00 (20.00-24.00)      1.00        -"} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("row %d %q: want %q", i, lines[i+1], want)
		}
	}
	if f := strings.Fields(lines[2]); f[len(f)-5] != "-" {
		t.Errorf("kernel row %q: want no counters", lines[2])
	}
}

func TestPrintQueueShares(t *testing.T) {
	rows := []Row{{Name: "one"}, {Name: "two queues", Queues: 2}}
	results := [][]Sample{
		{{gbps: 1, counters: map[string]uint64{"rx_packets": 10}}},
		{{gbps: 1, counters: map[string]uint64{"rx_packets": 100, "rx0_packets": 25, "rx1_packets": 75, "q1_poll_cpu_ns": 2e9}}},
	}
	var b strings.Builder
	PrintQueueShares(&b, rows, results)
	want := "two queues: queue 0 25%, queue 1 75%\n"
	if got := b.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
