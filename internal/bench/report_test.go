package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestSeedLine(t *testing.T) {
	tests := []struct {
		name       string
		label      string
		unit       string
		a, b, want string
		av, bv     float64
	}{
		// The seed's first line, to the character.
		{"seed", "TCP 512-Kbyte, core same, MTU 1500, LRO on, tunnel off", "Mbit/s", "", "",
			"TCP 512-Kbyte, core same, MTU 1500, LRO on, tunnel off 49810.51 -> 61924.39 (+24.3% ↑)", 49810.51, 61924.39},
		{"regression", "TCP 64-Kbyte, core adjacent, MTU 9000, LRO off, tunnel on", "Mbit/s", "", "",
			"TCP 64-Kbyte, core adjacent, MTU 9000, LRO off, tunnel on 1000.00 -> 850.00 (-15.0% ↓)", 1000, 850},
		{"pps whole", "UDP 64-byte, core same, MTU 1500, LRO on, tunnel off", "pps", "", "",
			"UDP 64-byte, core same, MTU 1500, LRO on, tunnel off 3000000 -> 3000100 (+0.0% =)", 3000000, 3000100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pct := (tt.bv - tt.av) / tt.av * 100
			if got := seedLine(tt.label, tt.unit, tt.av, tt.bv, pct); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestCellLabel(t *testing.T) {
	c := matrixCell{Proto: matrixProtos[0], Core: "same", MTU: 1500, LRO: "on", Tunnel: "off"}
	if got, want := c.Label(), "TCP 512-Kbyte, core same, MTU 1500, LRO on, tunnel off"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// st builds the stats of runs with the given values.
func st(vals ...float64) sideStats {
	var runs []matrixRun
	for _, v := range vals {
		runs = append(runs, matrixRun{Value: v})
	}
	return stats(runs)
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name    string
		a, b    sideStats
		pct     float64
		signif  bool
		thresh  float64
		comment string
	}{
		{"beyond threshold, tight runs", st(100, 101, 99), st(120, 121, 119), 20, true, 10, ""},
		{"below threshold", st(100, 101, 99), st(105, 106, 104), 5, false, 10, ""},
		{"beyond threshold but spread larger", st(100, 70, 130), st(120, 121, 119), 20, false, 10, "A's runs span 60"},
		{"B's spread larger", st(100, 100, 100), st(120, 90, 150), 20, false, 10, ""},
		{"difference just above the spread", st(100, 95, 105), st(111, 111, 111), 11, true, 10, "10 < 11"},
		{"difference equal to the spread, runs overlapping", st(100, 95, 105), st(110, 104, 110), 10, false, 10, "not larger"},
		{"regression", st(100, 100, 100), st(80, 80, 80), -20, true, 10, ""},
		{"B spreads widely but every run beyond A's", st(100, 95, 105), st(300, 200, 900), 200, true, 10, "disjoint"},
		{"disjoint but below threshold", st(100, 100, 100), st(105, 104, 106), 5, false, 10, ""},
		{"one round: no spread", st(100), st(111), 11, true, 10, ""},
		{"threshold 0 counts any change beyond the spread", st(100), st(101), 1, true, 0, ""},
		{"A failed", st(), st(100), 0, false, 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := compare(tt.a, tt.b, tt.thresh)
			if c.Significant != tt.signif {
				t.Errorf("significant: got %v, want %v (%s)", c.Significant, tt.signif, tt.comment)
			}
			if d := c.Pct - tt.pct; d > 1e-9 || d < -1e-9 {
				t.Errorf("pct: got %v, want %v", c.Pct, tt.pct)
			}
		})
	}
}

func TestStatsSkipsFailedRuns(t *testing.T) {
	s := stats([]matrixRun{{Value: 10, RxCPUPerGB: 1}, {Error: "boom"}, {Value: 30, RxCPUPerGB: 3}, {Value: 20, RxCPUPerGB: 2}})
	if s.N != 3 || s.Med != 20 || s.Lo != 10 || s.Hi != 30 || s.RxCPUPerGB != 2 || s.Err != "" {
		t.Errorf("got %+v, want 3 runs, median 20, spread 10-30, CPU 2, no error", s)
	}
	s = stats([]matrixRun{{Error: "boom"}})
	if s.N != 0 || s.Err != "boom" {
		t.Errorf("got %+v, want no run and the error", s)
	}
}

func TestParsePercent(t *testing.T) {
	for in, want := range map[string]float64{"10%": 10, "2.5": 2.5, " 0% ": 0} {
		if got, err := ParsePercent(in); err != nil || got != want {
			t.Errorf("ParsePercent(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x%", "-1%"} {
		if _, err := ParsePercent(in); err == nil {
			t.Errorf("ParsePercent(%q): no error", in)
		}
	}
}

func TestMatrixDims(t *testing.T) {
	d, err := ParseDims("tcp512k,tcp64k,udp64,udp1400", "same,adjacent", "1500,4096,9000", "on,off", "off,on")
	if err != nil {
		t.Fatal(err)
	}
	cells := d.Cells()
	if len(cells) != 96 {
		t.Fatalf("got %d cells, want 96", len(cells))
	}
	seen := map[string]bool{}
	for _, c := range cells {
		if seen[c.Label()] {
			t.Errorf("cell %q twice", c.Label())
		}
		seen[c.Label()] = true
	}
	if got, want := cells[0].Label(), "TCP 512-Kbyte, core same, MTU 1500, LRO on, tunnel off"; got != want {
		t.Errorf("first cell %q, want %q", got, want)
	}
	d, err = ParseDims("tcp64k,udp64", "same", "1500,9000", "on", "off")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.Cells()); n != 4 {
		t.Errorf("narrowed: got %d cells, want 4", n)
	}
	for _, bad := range [][5]string{
		{"tcp1k", "same", "1500", "on", "off"},
		{"tcp64k", "near", "1500", "on", "off"},
		{"tcp64k", "same", "100", "on", "off"},
		{"tcp64k", "same", "1500", "maybe", "off"},
		{"tcp64k", "same", "1500", "on", "yes"},
		{"", "same", "1500", "on", "off"},
	} {
		if _, err := ParseDims(bad[0], bad[1], bad[2], bad[3], bad[4]); err == nil {
			t.Errorf("ParseDims(%q): no error", bad)
		}
	}
}

// fakeReport is an A/B report with peers over three cells: a clear
// improvement, a clear regression, a change within the spread, and a
// skipped cell.
func fakeReport() *matrixReport {
	sides := []Side{{Name: "A", Kind: "ustack", Settings: []string{"gro=off"}}, {Name: "B", Kind: "ustack", Settings: []string{"gro=on"}},
		{Name: "stock", Kind: "stock"}, {Name: "kernel", Kind: "kernel"}}
	rep := &matrixReport{Sides: sides, Threshold: 10, AB: true, Meta: matrixMeta{Rounds: 2, Congestion: "cubic"}}
	mk := func(c matrixCell, vals [][]float64) *matrixCellResult {
		cr := &matrixCellResult{Cell: c, Runs: make([][]matrixRun, len(sides))}
		for si, vs := range vals {
			for r, v := range vs {
				run := matrixRun{Cell: c.Label(), Proto: c.Proto.Name, Core: c.Core, MTU: c.MTU, LRO: c.LRO, Tunnel: c.Tunnel,
					Side: sides[si].Name, Round: r + 1, Value: v, Unit: c.Proto.Unit(), RxCPUPerGB: 0.5, Congestion: "cubic",
					Counters: map[string]uint64{"rx_packets": uint64(v)}, order: []string{"rx_packets"}}
				if si == 1 {
					run.Counters["rx_gro_skbs"] = 7
					run.order = append(run.order, "rx_gro_skbs")
				}
				cr.Runs[si] = append(cr.Runs[si], run)
			}
		}
		return cr
	}
	tcp := matrixCell{Proto: matrixProtos[1], Core: "same", MTU: 1500, LRO: "on", Tunnel: "off"}
	udp := matrixCell{Proto: matrixProtos[2], Core: "adjacent", MTU: 9000, LRO: "off", Tunnel: "off"}
	noisy := matrixCell{Proto: matrixProtos[0], Core: "same", MTU: 4096, LRO: "on", Tunnel: "off"}
	rep.Cells = []*matrixCellResult{
		mk(tcp, [][]float64{{1000, 1010}, {2000, 2010}, {100, 110}, {4000, 4000}}),
		mk(udp, [][]float64{{300000, 300000}, {200000, 200000}, {50000, 50000}, {900000, 900000}}),
		mk(noisy, [][]float64{{1000, 2000}, {1800, 1900}, {100, 100}, {4000, 4000}}),
		{Cell: matrixCell{Proto: matrixProtos[1], Core: "same", MTU: 1500, LRO: "on", Tunnel: "on"}, Skip: "tunnel not built", Runs: make([][]matrixRun, len(sides))},
	}
	return rep
}

func TestReportPrint(t *testing.T) {
	var b bytes.Buffer
	if err := fakeReport().Print(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	improve, regress, ok := strings.Cut(out, "\nRegressions")
	if !ok {
		t.Fatalf("no regressions section:\n%s", out)
	}
	for _, want := range []string{
		"Improvements (B against A, beyond the 10% threshold and the runs' spread):\nTCP 64-Kbyte, core same, MTU 1500, LRO on, tunnel off 1005.00 -> 2005.00 (+99.5% ↑)\n",
	} {
		if !strings.Contains(improve, want) {
			t.Errorf("improvements lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Only one good run") {
		t.Errorf("two rounds everywhere, yet the one-run warning:\n%s", out)
	}
	if !strings.Contains(regress, "\nUDP 64-byte, core adjacent, MTU 9000, LRO off, tunnel off 300000 -> 200000 (-33.3% ↓)\n") {
		t.Errorf("regressions lack the UDP cell:\n%s", out)
	}
	// +23% but within A's spread of 1000: in the table, not in the lists.
	noisy := "TCP 512-Kbyte, core same, MTU 4096, LRO on, tunnel off"
	if strings.Count(out, noisy) != 1 {
		t.Errorf("the noisy cell should appear once (in the table):\n%s", out)
	}
	for _, want := range []string{
		"ustack 2005.00 Mbit/s, stock fdbased 105.00 (ustack 19.10x), kernel veth 4000.00 (ustack 0.50x)",
		"Skipped 1 cells: tunnel not built",
		"1500.00 -> 1850.00 (+23.3% ↑)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestReportPrintOneRound(t *testing.T) {
	rep := fakeReport()
	for _, c := range rep.Cells {
		for i := range c.Runs {
			c.Runs[i] = c.Runs[i][:min(1, len(c.Runs[i]))]
		}
	}
	var b bytes.Buffer
	if err := rep.Print(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Only one good run per side in some cells") {
		t.Errorf("no one-run warning:\n%s", b.String())
	}
}

func TestReportPrintOneSide(t *testing.T) {
	rep := fakeReport()
	rep.AB = false
	rep.Sides = rep.Sides[:1]
	for _, c := range rep.Cells {
		c.Runs = c.Runs[:1]
	}
	var b bytes.Buffer
	if err := rep.Print(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "Improvements") || strings.Contains(out, "Peers") {
		t.Errorf("one side, no peers: no comparison expected:\n%s", out)
	}
	if !strings.Contains(out, "1005.00 (1000.00-1010.00)") {
		t.Errorf("no median (spread) of the TCP cell:\n%s", out)
	}
}

func TestWriteCSV(t *testing.T) {
	var b bytes.Buffer
	if err := fakeReport().WriteCSV(&b); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// 3 cells x 4 sides x 2 rounds, the skipped cell, the header.
	if len(rows) != 1+24+1 {
		t.Fatalf("got %d rows, want 26", len(rows))
	}
	hdr := rows[0]
	if !slices.Equal(hdr[:len(csvFixed)], csvFixed) || !slices.Equal(hdr[len(csvFixed):], []string{"rx_packets", "rx_gro_skbs"}) {
		t.Fatalf("header %q", hdr)
	}
	col := func(name string) int { return slices.Index(hdr, name) }
	// The first rows: the first cell's round 1, A then B then the peers.
	if rows[1][col("side")] != "A" || rows[2][col("side")] != "B" || rows[1][col("round")] != "1" || rows[5][col("round")] != "2" {
		t.Errorf("order: %q / %q / %q", rows[1][:9], rows[2][:9], rows[5][:9])
	}
	if rows[1][col("rx_gro_skbs")] != "" || rows[2][col("rx_gro_skbs")] != "7" || rows[1][col("rx_packets")] != "1000" {
		t.Errorf("counters: A %q, B %q", rows[1][len(csvFixed):], rows[2][len(csvFixed):])
	}
	last := rows[len(rows)-1]
	if last[col("error")] != "skipped: tunnel not built" || last[col("tunnel")] != "on" {
		t.Errorf("skipped row %q", last)
	}
	for _, r := range rows {
		if len(r) != len(hdr) {
			t.Errorf("row of %d columns, want %d", len(r), len(hdr))
		}
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := fakeReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got matrixJSON
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != 24 || len(got.Cells) != 3 || len(got.Skipped) != 1 || len(got.Sides) != 4 {
		t.Fatalf("got %d runs, %d cells, %d skipped, %d sides; want 24, 3, 1, 4", len(got.Runs), len(got.Cells), len(got.Skipped), len(got.Sides))
	}
	if r := got.Runs[1]; r.Side != "B" || r.Counters["rx_gro_skbs"] != 7 || r.Counters["rx_packets"] != 2000 {
		t.Errorf("run %+v", r)
	}
	c := got.Cells[0]
	if c.Change == nil || !c.Significant || c.Sides["A"].Median != 1005 || c.Sides["kernel"].Max != 4000 {
		t.Errorf("cell %+v", c)
	}
	if c := got.Cells[2]; c.Significant {
		t.Errorf("noisy cell significant: %+v", c)
	}
}

// TestRxPath checks the rx path column: the path the driver's counters
// say the packets took, per side.
func TestRxPath(t *testing.T) {
	run := func(kv ...uint64) matrixRun {
		return matrixRun{Counters: map[string]uint64{"rx_skb_linear": kv[0], "rx_skb_nonlinear": kv[1], "rx_gro_hw_packets": kv[2]}}
	}
	for _, tc := range []struct {
		runs []matrixRun
		want string
	}{
		{[]matrixRun{run(1000, 0, 0), run(900, 0, 0)}, "linear"},
		{[]matrixRun{run(0, 1000, 0)}, "nonlinear"},
		{[]matrixRun{run(0, 5, 995)}, "shampo"}, // under 1%: left out
		{[]matrixRun{run(0, 300, 700)}, "nonlinear 30% + shampo 70%"},
		{[]matrixRun{{Counters: map[string]uint64{"rx_packets": 5}}}, "-"},
		{nil, "-"},
	} {
		if got := rxPath(tc.runs); got != tc.want {
			t.Errorf("rxPath(%v): got %q, want %q", tc.runs, got, tc.want)
		}
	}
	rep := fakeReport()
	c := rep.Cells[0]
	for i := range c.Runs[0] {
		c.Runs[0][i].Counters["rx_skb_nonlinear"] = 100
		c.Runs[1][i].Counters["rx_skb_linear"] = 100
	}
	if got, want := rep.rxPaths(c), "nonlinear -> linear"; got != want {
		t.Errorf("rxPaths of an A/B cell whose sides differ: got %q, want %q", got, want)
	}
	var b bytes.Buffer
	if err := rep.Print(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "rx path") || !strings.Contains(out, "nonlinear -> linear") {
		t.Errorf("the table lacks the rx path column:\n%s", out)
	}
}

// TestLostColumn checks the UDP loss column: each side's median share of
// the datagrams sent that did not arrive, in side order, "-" where a side
// has no figure and for TCP cells.
func TestLostColumn(t *testing.T) {
	rep := fakeReport()
	udp := rep.Cells[1]
	for si, recv := range []int64{50, 90, 0, -1} { // per 100 sent; -1: no figure
		for i := range udp.Runs[si] {
			if recv < 0 {
				continue
			}
			udp.Runs[si][i].DatagramsSent, udp.Runs[si][i].DatagramsReceived = 100, recv+int64(i)*2
		}
	}
	// Medians of two runs: (50%+48%)/2, (10%+8%)/2, (100%+98%)/2.
	if got, want := rep.lostColumn(udp), "49%|9%|99%|-"; got != want {
		t.Errorf("UDP cell: got %q, want %q", got, want)
	}
	if got := rep.lostColumn(rep.Cells[0]); got != "-" {
		t.Errorf("TCP cell: got %q, want -", got)
	}
	var b bytes.Buffer
	if err := rep.Print(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "UDP lost A|B|stock|kernel") || !strings.Contains(out, "49%|9%|99%|-") {
		t.Errorf("the table lacks the loss column:\n%s", out)
	}
}
