package bench

// The bench matrix's model and its reports: cells, runs, the mlx5 header-copy patch's form of the
// comparison lines, the significance rule, and the text, JSON and CSV
// outputs. Nothing here needs root or Linux; Matrix (matrix_linux.go)
// measures.

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// matrixProto is a workload of the matrix: TCP bulk with a sender write
// size, or UDP datagrams of a size.
type matrixProto struct {
	Name  string // as given to -proto
	Label string // as the header-copy patch's matrix writes it
	UDP   bool
	Size  int // TCP write size or UDP datagram size, bytes
}

// matrixProtos are the matrix's workloads, in the header-copy patch's order.
var matrixProtos = []matrixProto{
	{"tcp512k", "TCP 512-Kbyte", false, 512 << 10},
	{"tcp64k", "TCP 64-Kbyte", false, 64 << 10},
	{"udp64", "UDP 64-byte", true, 64},
	{"udp1400", "UDP 1400-byte", true, 1400},
}

// Unit is what the workload's figure counts.
func (p matrixProto) Unit() string {
	if p.UDP {
		return "pps"
	}
	return "Mbit/s"
}

// matrixCell is one cell of the matrix.
type matrixCell struct {
	Proto  matrixProto
	Core   string // "same": poll loop and reader on one CPU; "adjacent": on two
	MTU    int
	LRO    string // on|off
	Tunnel string // off, on (VXLAN over IPv6, its super-frames whole through the TAP) or ip6tnl (segmented before the TAP)
}

// Label names the cell as the header-copy patch does: "TCP 512-Kbyte, core same, MTU
// 1500, LRO on, tunnel off".
func (c matrixCell) Label() string {
	return fmt.Sprintf("%s, core %s, MTU %d, LRO %s, tunnel %s", c.Proto.Label, c.Core, c.MTU, c.LRO, c.Tunnel)
}

// Dims are the dimensions a matrix run covers, each a list of values.
type Dims struct {
	Protos  []matrixProto
	Cores   []string
	MTUs    []int
	LROs    []string
	Tunnels []string
}

// ParseDims reads the dimension flags: comma-separated lists.
func ParseDims(protos, cores, mtus, lros, tunnels string) (Dims, error) {
	var d Dims
	for _, f := range splitList(protos) {
		found := false
		for _, p := range matrixProtos {
			if p.Name == f {
				d.Protos = append(d.Protos, p)
				found = true
			}
		}
		if !found {
			return d, fmt.Errorf("-proto %q: want tcp64k, tcp512k, udp64 or udp1400", f)
		}
	}
	var err error
	if d.Cores, err = oneOf("-core", cores, "same", "adjacent"); err != nil {
		return d, err
	}
	if d.LROs, err = oneOf("-lro", lros, "on", "off"); err != nil {
		return d, err
	}
	if d.Tunnels, err = oneOf("-tunnel", tunnels, "off", "on", "ip6tnl"); err != nil {
		return d, err
	}
	for _, f := range splitList(mtus) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1280 || n > 65000 {
			return d, fmt.Errorf("-mtu %q: want MTUs in 1280..65000", f)
		}
		d.MTUs = append(d.MTUs, n)
	}
	if len(d.Protos) == 0 || len(d.Cores) == 0 || len(d.MTUs) == 0 || len(d.LROs) == 0 || len(d.Tunnels) == 0 {
		return d, fmt.Errorf("every dimension needs at least one value")
	}
	return d, nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

func oneOf(name, s string, allowed ...string) ([]string, error) {
	var out []string
	for _, f := range splitList(s) {
		ok := false
		for _, a := range allowed {
			ok = ok || f == a
		}
		if !ok {
			return nil, fmt.Errorf("%s %q: want %s", name, f, strings.Join(allowed, " or "))
		}
		out = append(out, f)
	}
	return out, nil
}

// Cells lists the cells in the header-copy patch's report order: protocol, core, MTU,
// LRO, tunnel.
func (d Dims) Cells() []matrixCell {
	var out []matrixCell
	for _, p := range d.Protos {
		for _, c := range d.Cores {
			for _, m := range d.MTUs {
				for _, l := range d.LROs {
					for _, t := range d.Tunnels {
						out = append(out, matrixCell{Proto: p, Core: c, MTU: m, LRO: l, Tunnel: t})
					}
				}
			}
		}
	}
	return out
}

// Side is one receiver the matrix measures in every cell.
type Side struct {
	Name     string   `json:"name"`               // A, B, ustack, stock, kernel
	Kind     string   `json:"kind"`               // ustack, stock or kernel
	Settings []string `json:"settings,omitempty"` // ustack policy switches, name=value
}

// Peer reports whether the side is a peer column (not ustack).
func (s Side) Peer() bool { return s.Kind != "ustack" }

// matrixRun is one measured run of one side in one cell, with every
// counter of the receiving stack.
type matrixRun struct {
	Cell              string            `json:"cell"`
	Proto             string            `json:"proto"`
	Core              string            `json:"core"`
	MTU               int               `json:"mtu"`
	LRO               string            `json:"lro"`
	Tunnel            string            `json:"tunnel"`
	Side              string            `json:"side"`
	Policy            string            `json:"policy,omitempty"`
	Round             int               `json:"round"`
	Value             float64           `json:"value"` // Mbit/s (TCP) or datagrams/s (UDP) received
	Unit              string            `json:"unit"`
	Bytes             int64             `json:"bytes"`      // payload bytes received
	SentBytes         int64             `json:"sent_bytes"` // payload bytes the sender wrote
	Seconds           float64           `json:"seconds"`    // sending time
	DatagramsSent     int64             `json:"datagrams_sent,omitempty"`
	DatagramsReceived int64             `json:"datagrams_received,omitempty"`
	RxCPUSeconds      float64           `json:"rx_cpu_seconds"`      // this process (the receiver)
	MachineCPUSeconds float64           `json:"machine_cpu_seconds"` // the whole machine
	RxCPUPerGB        float64           `json:"rx_cpu_s_per_gb"`
	MachineCPUPerGB   float64           `json:"machine_cpu_s_per_gb"`
	Congestion        string            `json:"congestion,omitempty"`
	PollCPU           int               `json:"poll_cpu"`   // -1: not pinned
	ReaderCPU         int               `json:"reader_cpu"` // -1: not pinned
	SetupSeconds      float64           `json:"setup_seconds"`
	Error             string            `json:"error,omitempty"`
	Counters          map[string]uint64 `json:"counters,omitempty"`

	order []string // the counters' names in the stack's order
}

// matrixCellResult is a cell and its runs, per side in round order.
type matrixCellResult struct {
	Cell matrixCell
	Skip string        // why the cell did not run ("" if it ran)
	Runs [][]matrixRun // indexed like matrixReport.Sides
}

// matrixReport is a whole matrix run.
type matrixReport struct {
	Meta      matrixMeta
	Sides     []Side
	Cells     []*matrixCellResult
	Threshold float64 // percent
	AB        bool    // Sides[0] and Sides[1] are A and B
}

// matrixMeta describes how the matrix was measured.
type matrixMeta struct {
	Start        time.Time `json:"start"`
	WallSeconds  float64   `json:"wall_seconds"`
	Command      string    `json:"command"`
	Kernel       string    `json:"kernel,omitempty"`
	CPUs         int       `json:"cpus"`
	Congestion   string    `json:"congestion"` // asked of the sender
	RunSeconds   float64   `json:"run_seconds"`
	Rounds       int       `json:"rounds"`
	BaseSettings []string  `json:"base_settings,omitempty"`
	PollCPU      int       `json:"poll_cpu"`
	ReaderCPUs   [2]int    `json:"reader_cpus"` // same, adjacent
	Sender       string    `json:"sender"`
}

// sideStats summarises one side's good runs in a cell.
type sideStats struct {
	N          int     // good runs
	Med        float64 // median value
	Lo, Hi     float64 // spread
	RxCPUPerGB float64 // median
	MachPerGB  float64 // median
	Congestion string
	Err        string  // the last error, when no run was good
	Lost       float64 // UDP: median share of the datagrams sent that were not received
	HasLost    bool    // Lost is known (UDP runs with datagrams sent)
}

// stats summarises runs: medians and spread of the good ones.
func stats(runs []matrixRun) sideStats {
	var s sideStats
	var vals, cpu, mach, lost []float64
	for _, r := range runs {
		if r.Error != "" {
			s.Err = r.Error
			continue
		}
		if r.DatagramsSent > 0 {
			lost = append(lost, max(0, 1-float64(r.DatagramsReceived)/float64(r.DatagramsSent)))
		}
		vals = append(vals, r.Value)
		cpu = append(cpu, r.RxCPUPerGB)
		mach = append(mach, r.MachineCPUPerGB)
		s.Congestion = r.Congestion
	}
	s.N = len(vals)
	if s.N == 0 {
		return s
	}
	s.Err = ""
	s.Med, s.Lo, s.Hi = Median(vals)
	s.RxCPUPerGB, _, _ = Median(cpu)
	s.MachPerGB, _, _ = Median(mach)
	if len(lost) > 0 {
		s.Lost, _, _ = Median(lost)
		s.HasLost = true
	}
	return s
}

// lostColumn is the text report's UDP loss column for cell c: each side's
// median share of the datagrams sent that did not arrive, in side order
// ("-" for a side without it, or for a TCP cell).
func (r *matrixReport) lostColumn(c *matrixCellResult) string {
	if !c.Cell.Proto.UDP {
		return "-"
	}
	parts := make([]string, len(r.Sides))
	for i := range r.Sides {
		parts[i] = "-"
		if st := stats(c.Runs[i]); st.HasLost {
			parts[i] = fmt.Sprintf("%.0f%%", st.Lost*100)
		}
	}
	return strings.Join(parts, "|")
}

// hasUDP reports whether any measured cell is UDP.
func (r *matrixReport) hasUDP() bool {
	for _, c := range r.Cells {
		if c.Skip == "" && c.Cell.Proto.UDP {
			return true
		}
	}
	return false
}

// comparison is B against A in one cell.
type comparison struct {
	A, B        sideStats
	Pct         float64 // (B - A) / A, percent
	Significant bool    // beyond the threshold and beyond the spread
}

// compare compares B against A. A change is significant when its size is
// at least threshold percent of A and either the difference of the medians
// is larger than the spread (max - min) of either side's runs, or the two
// sides' runs do not overlap at all (every B run beyond every A run: a
// side whose runs spread widely, as UDP's do, can still have moved): a
// change the runs' own noise could explain is not counted.
func compare(a, b sideStats, threshold float64) comparison {
	c := comparison{A: a, B: b}
	if a.N == 0 || b.N == 0 || a.Med <= 0 {
		return c
	}
	c.Pct = (b.Med - a.Med) / a.Med * 100
	spread := math.Max(a.Hi-a.Lo, b.Hi-b.Lo)
	disjoint := b.Lo > a.Hi || b.Hi < a.Lo
	c.Significant = math.Abs(c.Pct) >= threshold && (math.Abs(b.Med-a.Med) > spread || disjoint)
	return c
}

// seedLine writes a comparison as the mlx5 header-copy patch does: "TCP 512-Kbyte, core
// same, MTU 1500, LRO on, tunnel off 49810.51 -> 61924.39 (+24.3% ↑)".
func seedLine(label, unit string, a, b, pct float64) string {
	return fmt.Sprintf("%s %s -> %s (%s)", label, fmtValue(unit, a), fmtValue(unit, b), pctArrow(pct))
}

// fmtValue writes a figure: Mbit/s with two decimals as the header-copy patch does,
// datagrams per second whole.
func fmtValue(unit string, v float64) string {
	if unit == "pps" {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// pctArrow writes a change as "+24.3% ↑", "-5.0% ↓" or "+0.0% =".
func pctArrow(pct float64) string {
	arrow := "="
	switch r := math.Round(pct*10) / 10; {
	case r > 0:
		arrow = "↑"
	case r < 0:
		arrow = "↓"
	}
	return fmt.Sprintf("%+.1f%% %s", pct, arrow)
}

// ParsePercent reads a threshold such as "10%" or "10".
func ParsePercent(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err != nil || v < 0 || v > 1000 {
		return 0, fmt.Errorf("threshold %q: want a percentage such as 10%%", s)
	}
	return v, nil
}

// sideIndex returns the index of the side named name, or -1.
func (r *matrixReport) sideIndex(name string) int {
	for i, s := range r.Sides {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// bestUstack is the better median of the ustack sides in a cell.
func (r *matrixReport) bestUstack(c *matrixCellResult) float64 {
	best := 0.0
	for i, s := range r.Sides {
		if !s.Peer() {
			best = math.Max(best, stats(c.Runs[i]).Med)
		}
	}
	return best
}

// Print writes the text report: one line per cell, then with A and B the
// significant improvements and regressions in the header-copy patch's form, then the
// peers' summary and the skipped cells.
func (r *matrixReport) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	stock, kernel := r.sideIndex("stock"), r.sideIndex("kernel")
	hdr := []string{"cell"}
	if r.AB {
		hdr = append(hdr, "median A -> B (change)", "A min-max", "B min-max", "rx CPU s/GB A -> B", "machine CPU s/GB A -> B")
	} else {
		hdr = append(hdr, "median (min-max)", "rx CPU s/GB", "machine CPU s/GB")
	}
	if stock >= 0 {
		hdr = append(hdr, "stock fdbased", "best/stock")
	}
	if kernel >= 0 {
		hdr = append(hdr, "kernel veth", "best/kernel")
	}
	udp := r.hasUDP()
	if udp {
		var names []string
		for _, sd := range r.Sides {
			names = append(names, sd.Name)
		}
		hdr = append(hdr, "UDP lost "+strings.Join(names, "|"))
	}
	hdr = append(hdr, "rx path", "unit", "cc")
	fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
	var improved, regressed []string
	oneRun := false
	skipped := map[string]int{}
	var skipOrder []string
	for _, c := range r.Cells {
		if c.Skip != "" {
			if skipped[c.Skip] == 0 {
				skipOrder = append(skipOrder, c.Skip)
			}
			skipped[c.Skip]++
			continue
		}
		row := []string{c.Cell.Label()}
		unit := c.Cell.Proto.Unit()
		a := stats(c.Runs[0])
		cc := a.Congestion
		if r.AB {
			b := stats(c.Runs[1])
			if cc == "" {
				cc = b.Congestion
			}
			cmp := compare(a, b, r.Threshold)
			oneRun = oneRun || a.N == 1 || b.N == 1
			switch {
			case a.N == 0 || b.N == 0:
				row = append(row, "failed: "+firstNonEmpty(a.Err, b.Err), "-", "-", "-", "-")
			default:
				row = append(row, fmt.Sprintf("%s -> %s (%s)", fmtValue(unit, a.Med), fmtValue(unit, b.Med), pctArrow(cmp.Pct)),
					spreadStr(unit, a), spreadStr(unit, b),
					fmt.Sprintf("%.3f -> %.3f", a.RxCPUPerGB, b.RxCPUPerGB),
					fmt.Sprintf("%.3f -> %.3f", a.MachPerGB, b.MachPerGB))
			}
			if cmp.Significant {
				line := seedLine(c.Cell.Label(), unit, a.Med, b.Med, cmp.Pct)
				if cmp.Pct > 0 {
					improved = append(improved, line)
				} else {
					regressed = append(regressed, line)
				}
			}
		} else if a.N == 0 {
			row = append(row, "failed: "+a.Err, "-", "-")
		} else {
			row = append(row, fmt.Sprintf("%s (%s)", fmtValue(unit, a.Med), spreadStr(unit, a)), fmt.Sprintf("%.3f", a.RxCPUPerGB), fmt.Sprintf("%.3f", a.MachPerGB))
		}
		best := r.bestUstack(c)
		for _, i := range []int{stock, kernel} {
			if i < 0 {
				continue
			}
			p := stats(c.Runs[i])
			switch {
			case len(c.Runs[i]) == 0:
				row = append(row, "-", "-")
			case p.N == 0:
				row = append(row, "failed: "+p.Err, "-")
			default:
				row = append(row, fmt.Sprintf("%s (%s)", fmtValue(unit, p.Med), spreadStr(unit, p)), ratio(best, p.Med))
			}
		}
		if cc == "" {
			cc = "-"
		}
		if udp {
			row = append(row, r.lostColumn(c))
		}
		row = append(row, r.rxPaths(c), c.Cell.Proto.Unit(), cc)
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.AB && oneRun {
		fmt.Fprintln(w, "\nOnly one good run per side in some cells: no spread to tell noise by there, so every change beyond the threshold counts; use -rounds 3 or more.")
	}
	if r.AB {
		fmt.Fprintf(w, "\nImprovements (B against A, beyond the %g%% threshold and the runs' spread):\n", r.Threshold)
		writeLines(w, improved, "none")
		fmt.Fprintf(w, "\nRegressions (B against A, beyond the %g%% threshold and the runs' spread):\n", r.Threshold)
		writeLines(w, regressed, "none")
	}
	if stock >= 0 || kernel >= 0 {
		r.printPeers(w, stock, kernel)
	}
	for _, s := range skipOrder {
		fmt.Fprintf(w, "\nSkipped %d cells: %s\n", skipped[s], s)
	}
	return nil
}

// rxPath names the way the driver built the packets of runs, from their
// counters (summed over the runs): "linear" (rx_skb_linear, mlx5's
// mlx5e_skb_from_cqe_mpwrq_linear: nothing copied, -hds does not apply),
// "nonlinear" (rx_skb_nonlinear: the header copy), "shampo"
// (rx_gro_hw_packets: hardware GRO sessions), each path that took at
// least 1% of the frames with its share when there are several, or "-"
// without counters.
func rxPath(runs []matrixRun) string {
	names := []string{"linear", "nonlinear", "shampo"}
	var n [3]uint64
	for _, run := range runs {
		n[0] += run.Counters["rx_skb_linear"]
		n[1] += run.Counters["rx_skb_nonlinear"]
		n[2] += run.Counters["rx_gro_hw_packets"]
	}
	total := n[0] + n[1] + n[2]
	if total == 0 {
		return "-"
	}
	var parts, alone []string
	for i, v := range n {
		if v*100 >= total {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", names[i], 100*float64(v)/float64(total)))
			alone = append(alone, names[i])
		}
	}
	if len(parts) == 1 {
		return alone[0]
	}
	return strings.Join(parts, " + ")
}

// rxPaths is the rx path column of cell c: the ustack sides' rxPath, once
// if they agree, else A's -> B's (or each side's, joined by " | ").
func (r *matrixReport) rxPaths(c *matrixCellResult) string {
	var paths []string
	for i, s := range r.Sides {
		if s.Kind == "ustack" && i < len(c.Runs) {
			paths = append(paths, rxPath(c.Runs[i]))
		}
	}
	switch {
	case len(paths) == 0:
		return "-"
	case len(slices.Compact(slices.Clone(paths))) == 1:
		return paths[0]
	case r.AB && len(paths) == 2:
		return paths[0] + " -> " + paths[1]
	}
	return strings.Join(paths, " | ")
}

// printPeers sums up single-stream TCP at MTU 1500 against the peers: the
// worst ratio of the best ustack side over the cells.
func (r *matrixReport) printPeers(w io.Writer, stock, kernel int) {
	fmt.Fprintln(w, "\nPeers, single-stream TCP at MTU 1500, tunnel off (best ustack side per cell):")
	n := 0
	for _, c := range r.Cells {
		if c.Skip != "" || c.Cell.Proto.UDP || c.Cell.MTU != 1500 || c.Cell.Tunnel != "off" {
			continue
		}
		best := r.bestUstack(c)
		line := fmt.Sprintf("  %s: ustack %.2f Mbit/s", c.Cell.Label(), best)
		if stock >= 0 {
			p := stats(c.Runs[stock])
			line += fmt.Sprintf(", stock fdbased %.2f (ustack %sx)", p.Med, ratio(best, p.Med))
		}
		if kernel >= 0 {
			p := stats(c.Runs[kernel])
			line += fmt.Sprintf(", kernel veth %.2f (ustack %sx)", p.Med, ratio(best, p.Med))
		}
		fmt.Fprintln(w, line)
		n++
	}
	if n == 0 {
		fmt.Fprintln(w, "  none measured")
	}
}

func writeLines(w io.Writer, lines []string, empty string) {
	if len(lines) == 0 {
		fmt.Fprintln(w, empty)
	}
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

func spreadStr(unit string, s sideStats) string {
	return fmtValue(unit, s.Lo) + "-" + fmtValue(unit, s.Hi)
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// allRuns lists every run of the report, cell by cell, round by round.
func (r *matrixReport) allRuns() []matrixRun {
	var out []matrixRun
	for _, c := range r.Cells {
		rounds := 0
		for _, rs := range c.Runs {
			rounds = max(rounds, len(rs))
		}
		for round := 0; round < rounds; round++ {
			for _, rs := range c.Runs {
				if round < len(rs) {
					out = append(out, rs[round])
				}
			}
		}
	}
	return out
}

// matrixJSON is the -json file: how it was measured, the sides, the cells
// with their summaries, and every run with every counter.
type matrixJSON struct {
	Meta      matrixMeta        `json:"meta"`
	Sides     []Side            `json:"sides"`
	Threshold float64           `json:"threshold_percent"`
	Cells     []matrixCellJSON  `json:"cells"`
	Runs      []matrixRun       `json:"runs"`
	Skipped   map[string]string `json:"skipped,omitempty"`
}

type matrixCellJSON struct {
	Cell        string              `json:"cell"`
	Unit        string              `json:"unit"`
	Sides       map[string]sideJSON `json:"sides"`
	Change      *float64            `json:"change_percent,omitempty"`
	Significant bool                `json:"significant,omitempty"`
	RxPath      string              `json:"rx_path"` // the rx path column (rxPaths)
}

type sideJSON struct {
	Runs       int     `json:"runs"`
	Median     float64 `json:"median"`
	Min        float64 `json:"min"`
	Max        float64 `json:"max"`
	RxCPUPerGB float64 `json:"rx_cpu_s_per_gb"`
	MachPerGB  float64 `json:"machine_cpu_s_per_gb"`
	Error      string  `json:"error,omitempty"`
}

// WriteJSON writes the report as JSON.
func (r *matrixReport) WriteJSON(w io.Writer) error {
	out := matrixJSON{Meta: r.Meta, Sides: r.Sides, Threshold: r.Threshold, Runs: r.allRuns(), Skipped: map[string]string{}}
	for _, c := range r.Cells {
		if c.Skip != "" {
			out.Skipped[c.Cell.Label()] = c.Skip
			continue
		}
		cj := matrixCellJSON{Cell: c.Cell.Label(), Unit: c.Cell.Proto.Unit(), Sides: map[string]sideJSON{}, RxPath: r.rxPaths(c)}
		for i, s := range r.Sides {
			st := stats(c.Runs[i])
			cj.Sides[s.Name] = sideJSON{Runs: st.N, Median: st.Med, Min: st.Lo, Max: st.Hi, RxCPUPerGB: st.RxCPUPerGB, MachPerGB: st.MachPerGB, Error: st.Err}
		}
		if r.AB {
			cmp := compare(stats(c.Runs[0]), stats(c.Runs[1]), r.Threshold)
			pct := cmp.Pct
			cj.Change, cj.Significant = &pct, cmp.Significant
		}
		out.Cells = append(out.Cells, cj)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(out)
}

// csvFixed are the CSV columns before the counters.
var csvFixed = []string{"cell", "proto", "core", "mtu", "lro", "tunnel", "side", "policy", "round", "value", "unit",
	"bytes", "sent_bytes", "seconds", "datagrams_sent", "datagrams_received", "rx_cpu_seconds", "machine_cpu_seconds",
	"rx_cpu_s_per_gb", "machine_cpu_s_per_gb", "congestion", "poll_cpu", "reader_cpu", "setup_seconds", "error"}

// WriteCSV writes one row per run (and one per skipped cell, with the
// reason in the error column): the fixed columns, then every counter any
// run has, in the order first seen; a counter a run does not have is empty.
func (r *matrixReport) WriteCSV(w io.Writer) error {
	runs := r.allRuns()
	var names []string
	seen := map[string]bool{}
	for _, run := range runs {
		order := run.order
		if order == nil {
			order = slices.Sorted(maps.Keys(run.Counters))
		}
		for _, n := range order {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	cw := csv.NewWriter(w)
	cw.Write(append(append([]string(nil), csvFixed...), names...))
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	i := strconv.Itoa
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, run := range runs {
		row := []string{run.Cell, run.Proto, run.Core, i(run.MTU), run.LRO, run.Tunnel, run.Side, run.Policy, i(run.Round),
			f(run.Value), run.Unit, i64(run.Bytes), i64(run.SentBytes), f(run.Seconds), i64(run.DatagramsSent), i64(run.DatagramsReceived),
			f(run.RxCPUSeconds), f(run.MachineCPUSeconds), f(run.RxCPUPerGB), f(run.MachineCPUPerGB), run.Congestion,
			i(run.PollCPU), i(run.ReaderCPU), f(run.SetupSeconds), run.Error}
		for _, n := range names {
			if v, ok := run.Counters[n]; ok {
				row = append(row, strconv.FormatUint(v, 10))
			} else {
				row = append(row, "")
			}
		}
		cw.Write(row)
	}
	for _, c := range r.Cells {
		if c.Skip == "" {
			continue
		}
		row := make([]string, len(csvFixed)+len(names))
		row[0], row[1], row[2], row[3], row[4], row[5] = c.Cell.Label(), c.Cell.Proto.Name, c.Cell.Core, i(c.Cell.MTU), c.Cell.LRO, c.Cell.Tunnel
		row[len(csvFixed)-1] = "skipped: " + c.Skip
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
