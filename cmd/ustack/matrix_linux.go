package main

// ustack bench -matrix: the flags of the test matrix of the mlx5 header-copy patch: every cell of
// {TCP 64 KB, 512 KB writes; UDP 64 B, 1400 B datagrams} x {poll loop and
// reader on one core, on adjacent cores} x {MTU 1500, 4096, 9000} x {LRO
// on, off} x {tunnel off, on}, with a kernel sender in a namespace, and
// policies A and B (and the peers) interleaved in each cell. internal/bench
// runs it.

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ustack/ustack/internal/bench"
)

// isMatrix reports whether bench's arguments ask for the matrix.
func isMatrix(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "matrix" && value != "false" && value != "0" {
			return true
		}
	}
	return false
}

// matrixCmd is `ustack bench -matrix`.
func matrixCmd(args []string) error {
	start := time.Now()
	fs := flag.NewFlagSet("bench -matrix", flag.ContinueOnError)
	fs.Bool("matrix", false, "run the test matrix (this mode)")
	var (
		dur     = fs.Duration("t", 2*time.Second, "sending time per run")
		rounds  = fs.Int("rounds", 3, "rounds per cell; in each the sides run interleaved (A B A B ...)")
		cc      = fs.String("cc", "cubic", "congestion control of the kernel TCP sender")
		protos  = fs.String("proto", "tcp512k,tcp64k,udp64,udp1400", "workloads: tcp64k, tcp512k (TCP bulk, sender write size), udp64, udp1400 (UDP datagrams, pps)")
		cores   = fs.String("core", "same,adjacent", "reader on the poll loop's CPU (same) or on the other (adjacent)")
		mtus    = fs.String("mtu", "1500,4096,9000", "MTUs")
		lros    = fs.String("lro", "on,off", "LRO values")
		tunnels = fs.String("tunnel", "off,on", "tunnel values (on: needs the benchTunnel hook)")
		aFlag   = fs.String("a", "", "policy A: ustack switches as name=value, comma or space separated (e.g. hds=256)")
		bFlag   = fs.String("b", "", "policy B, compared with A in every cell")
		thresh  = fs.String("threshold", "10%", "changes at least this large (and larger than the runs' spread) are listed")
		peers   = fs.Bool("peers", false, "add gVisor's stock fdbased endpoint on the TAP and the kernel's receiver over a veth pair")
		jsonOut = fs.String("json", "", "write every run with every counter as JSON to this file")
		csvOut  = fs.String("csv", "", "write every run with every counter as CSV to this file")
		plotOut = fs.String("plot", "", "draw the cells (A against B, peers) to this .svg or .png file")
		verbose = fs.Bool("v", false, "print a line per run on stderr")
		cpuprof = fs.String("cpuprofile", "", "write a CPU profile of the whole matrix (ustack's side of every cell; the senders are other processes) to this file")
	)
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	// Every policy switch but the dimensions applies to every ustack side.
	var pol policy
	pfs := flag.NewFlagSet("policy", flag.ContinueOnError)
	pol.register(pfs)
	pfs.VisitAll(func(f *flag.Flag) {
		if !own[f.Name] && !matrixDimension(f.Name) {
			fs.Var(f.Value, f.Name, f.Usage+" (every ustack side)")
		}
	})
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var base []string
	fs.Visit(func(f *flag.Flag) {
		if !own[f.Name] {
			base = append(base, f.Name+"="+f.Value.String())
		}
	})
	dims, err := bench.ParseDims(*protos, *cores, *mtus, *lros, *tunnels)
	if err != nil {
		return usageError{err}
	}
	threshold, err := bench.ParsePercent(*thresh)
	if err != nil {
		return usageError{err}
	}
	if *dur <= 0 || *dur > time.Minute || *rounds < 1 || *rounds > 50 {
		return usageError{errors.New("want 0 < -t <= 1m and 1 <= -rounds <= 50")}
	}
	if *plotOut != "" && !strings.HasSuffix(*plotOut, ".svg") && !strings.HasSuffix(*plotOut, ".png") {
		return usageError{fmt.Errorf("-plot %q: want a .svg or .png file", *plotOut)}
	}
	var sides []bench.Side
	ab := *aFlag != "" || *bFlag != ""
	if ab {
		if *aFlag == "" || *bFlag == "" {
			return usageError{errors.New("-a and -b go together")}
		}
		sides = append(sides, bench.Side{Name: "A", Kind: "ustack", Settings: splitSettings(*aFlag)},
			bench.Side{Name: "B", Kind: "ustack", Settings: splitSettings(*bFlag)})
	} else {
		sides = append(sides, bench.Side{Name: "ustack", Kind: "ustack"})
	}
	for _, s := range sides {
		for _, set := range s.Settings {
			if name, _, _ := strings.Cut(strings.TrimLeft(set, "-"), "="); matrixDimension(name) {
				dim := name
				if name == "poll-cpu" {
					dim = "core"
				}
				return usageError{fmt.Errorf("-%s %q: %s is a dimension of the matrix: narrow it with -%s", strings.ToLower(s.Name), set, name, dim)}
			}
		}
		p, err := policyFromSettings(slices.Concat(base, s.Settings))
		if err == nil {
			_, err = p.finish()
		}
		if err != nil {
			return usageError{fmt.Errorf("policy %s: %w", s.Name, err)}
		}
	}
	if *peers {
		sides = append(sides, bench.Side{Name: "stock", Kind: "stock"}, bench.Side{Name: "kernel", Kind: "kernel"})
	}
	if os.Geteuid() != 0 {
		return errors.New("-matrix needs root: it builds network namespaces, a TAP and a veth pair")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	stopProf, err := startCPUProfile(*cpuprof)
	if err != nil {
		return err
	}
	defer stopProf()
	return bench.Matrix(bench.MatrixConfig{Exe: exe, Command: "ustack bench " + strings.Join(args, " "), Start: start,
		Dur: *dur, Rounds: *rounds, CC: *cc, Dims: dims, Sides: sides, AB: ab, Peers: *peers, Threshold: threshold,
		Base: base, Policy: parseBenchPolicy, Verbose: *verbose, JSON: *jsonOut, CSV: *csvOut, Plot: *plotOut})
}

// matrixDimension reports whether a policy switch is set by the matrix's
// cells rather than by -a, -b or the command line.
func matrixDimension(name string) bool {
	switch name {
	case "mtu", "lro", "poll-cpu", "tunnel":
		return true
	}
	return false
}
