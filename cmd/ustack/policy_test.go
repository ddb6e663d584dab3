package main

import (
	"errors"
	"flag"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

var update = flag.Bool("update", false, "rewrite docs/policies.md from the policy table")

// policyExamples are values of every policy switch, each in the canonical
// form the flag prints; the default comes from the table.
var policyExamples = map[string][]string{
	"mtu":               {"9000"},
	"rq":                {"cyclic", "striding"},
	"lro":               {"off", "on"},
	"wire":              {"plain", "offload"},
	"wire-read":         {"bounce", "direct"},
	"hds":               {"256", "auto"},
	"gro":               {"off", "on"},
	"hw-gro":            {"on", "coalesce", "off"},
	"gro-flush-timeout": {"1ms"},
	"budget":            {"8"},
	"coalesce-bytes":    {"262144"},
	"rx-usecs":          {"8"},
	"rx-ring":           {"256"},
	"rq-size":           {"4"},
	"rq-full":           {"drop", "stall"},
	"page-order":        {"2"},
	"page-size":         {"64k", "4k"},
	"pool-recycle":      {"off", "on"},
	"rx-uso":            {"on", "off"},
	"delayed-ack":       {"1ms", "0s"},
	"inline-tcp":        {"on", "off"},
	"busy-poll":         {"50µs", "0s"},
	"busy-read":         {"50µs", "0s"},
	"run-to-completion": {"on", "off"},
	"pool-poison":       {"true", "false"},
	"pool-mem":          {"67108864"},
	"pool-ring":         {"512"},
	"tcp-rmem-max":      {"67108864"},
	"tcp-rmem":          {"bytes", "truesize"},
	"tcp-mem-limit":     {"8388608", "-1"},
	"tcp-mem-pressure":  {"4194304"},
	"zero-copy":         {"on", "views", "off"},
	"tunnel":            {"ip6tnl", "vxlan", "off"},
	"tunnel-id":         {"7", "16777215"},
	"tunnel-local":      {"fd00::1"},
	"tunnel-remote":     {"fd00::2"},
	"tunnel-remote4":    {"fd00::3"},
	"tunnel-addr":       {"10.9.0.2/24", "10.9.0.2/24,fd09::2/64"},
	"xdp":               {"hash", "cpu:0", "drop-port:9"},
	"cpumap":            {"0,1"},
	"cpumap-gro":        {"off", "on"},
	"cpumap-qsize":      {"4096"},
	"nic-cpu":           {"1"},
	"poll-cpu":          {"0,1"},
}

// TestPolicyTableRoundTrip sets every value of every switch of the table
// as the command line does and checks that it lands in the policy's
// stack.Config (or the fields beside it): a copy of the policy, bound to
// no flag, gives the value back, and so does String. Every switch has
// examples, and its default is what a policy without flags holds.
func TestPolicyTableRoundTrip(t *testing.T) {
	def := defaultPolicy()
	for _, e := range policies {
		t.Run(e.name, func(t *testing.T) {
			if got := e.value(&def); got != e.def {
				t.Errorf("default: got %q, want the table's %q", got, e.def)
			}
			vals, ok := policyExamples[e.name]
			if !ok {
				t.Fatalf("no examples in policyExamples")
			}
			for _, v := range append(vals, e.def) {
				set := []string{e.name + "=" + v}
				if e.name == "xdp" {
					set = append(set, "cpumap=0,1", "lro=off")
				}
				p, err := policyFromSettings(set)
				if err != nil {
					t.Fatalf("%s: %v", set, err)
				}
				q := p // the value is in the struct, not in a flag's state
				if got := e.value(&q); got != v {
					t.Errorf("%s: got %q back", set, got)
				}
				for _, f := range policies { // and in a field of its own
					if got := f.value(&q); f.name != e.name && got != f.def && !(e.name == "xdp" && (f.name == "cpumap" || f.name == "lro")) {
						t.Errorf("%s: -%s changed to %q", set, f.name, got)
					}
				}
				if s := q.String(); (v != e.def || e.summary) != strings.Contains(" "+s+" ", " "+e.name+"="+v+" ") {
					t.Errorf("%s: String %q", set, s)
				}
				// String is flag form: its settings give the same policy.
				r, err := policyFromSettings(strings.Fields(q.String()))
				if err != nil {
					t.Fatalf("settings of String %q: %v", q.String(), err)
				}
				if !reflect.DeepEqual(normalize(r), normalize(q)) {
					t.Errorf("%s: String %q does not round-trip:\n got %+v\nwant %+v", set, q.String(), r, q)
				}
				if _, err := q.finish(); err != nil {
					t.Errorf("%s: finish: %v", set, err)
				}
			}
		})
	}
	// Bad values are refused when the flag is set.
	for _, bad := range []string{"rq=ring", "lro=maybe", "hds=0", "hds=4097", "hw-gro=yes", "gro-flush-timeout=-1ms", "budget=x",
		"page-size=8k", "pool-recycle=1", "pool-mem=-1", "pool-ring=-1", "tcp-rmem-max=-1", "tcp-mem-pressure=-1", "zero-copy=all", "tunnel=gre",
		"tunnel-local=10.0.0.1", "tunnel-remote=::ffff:10.0.0.1", "tunnel-addr=10.0.0.1", "cpumap=a", "cpumap-qsize=-1", "nic-cpu=1024"} {
		if _, err := policyFromSettings([]string{bad}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	for _, set := range [][]string{
		{"xdp=cpu:2", "cpumap=0,1", "lro=off"}, // no entry 2
		{"xdp=hash", "cpumap=0,1"},             // LRO on: mlx5e_xdp_allowed refuses
		{"xdp=pass", "lro=off", "hw-gro=on"},   // and so with hardware GRO
	} {
		if p, err := policyFromSettings(set); err != nil {
			t.Error(err)
		} else if _, err := p.finish(); err == nil {
			t.Errorf("%s: finish: no error", set)
		}
	}
}

// normalize makes two policies that hold the same settings compare equal:
// an empty list and none are the same setting.
func normalize(p policy) policy {
	if len(p.tun.Addrs) == 0 {
		p.tun.Addrs = nil
	}
	return p
}

// TestPolicyJoinRules checks that the CLI and a Go user who sets the same
// fields get the same driver from stack.New: the rules that join
// packages are stack.New's, not the command's (recycling off means a page
// per frame).
func TestPolicyJoinRules(t *testing.T) {
	p, err := policyFromSettings([]string{"pool-recycle=off", "lro=off"})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := p.finish()
	if err != nil {
		t.Fatal(err)
	}
	if cli.Driver.PagePerFrame {
		t.Errorf("the command set Driver.PagePerFrame: that rule is stack.New's")
	}
	goUser := stack.Config{
		Driver: driver.Config{MTU: 1500, Budget: driver.DefaultBudget, RingSize: driver.DefaultRingSize},
		Pool:   bufpool.Config{NoRecycle: true, PageSize: bufpool.PageSize4K},
	}
	got := []driver.Config{newStackDriver(t, cli), newStackDriver(t, goUser)}
	for i, c := range got {
		if !c.PagePerFrame {
			t.Errorf("stack %d (cli, go): Pool.NoRecycle without Driver.PagePerFrame", i)
		}
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Errorf("driver configurations differ:\n cli %+v\n  go %+v", got[0], got[1])
	}
	if on := newStackDriver(t, stack.Config{}); on.PagePerFrame {
		t.Errorf("recycling on: PagePerFrame set")
	}
}

// newStackDriver starts a stack of cfg on an in-memory wire and returns its
// driver's configuration, the fields stack.New fills per stack cleared.
func newStackDriver(t *testing.T, cfg stack.Config) driver.Config {
	t.Helper()
	w, _ := driver.NewMemPair(64, 1<<17)
	cfg.Wire = w
	cfg.Addrs = []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}
	s, err := stack.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.Driver().Config()
	c.Pool = nil
	return c
}

// TestPolicyTableDocs checks that docs/policies.md is the table the code
// generates (go test ./cmd/ustack -run TestPolicyTableDocs -update
// rewrites it).
func TestPolicyTableDocs(t *testing.T) {
	const path = "../../docs/policies.md"
	want := policyDoc()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not the policy table's (rewrite it with go test ./cmd/ustack -run TestPolicyTableDocs -update):\n%s", path, lineDiff(string(got), want))
	}
}

// lineDiff lists the lines only in got (-) and only in want (+).
func lineDiff(got, want string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	g, w := in(got), in(want)
	var b strings.Builder
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// TestPolicyHelp checks that -h names every policy switch with the table's
// values and default.
func TestPolicyHelp(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var p policy
	p.register(fs)
	var b strings.Builder
	printDefaults(&b, fs)
	for _, e := range policies {
		head := "  -" + e.name
		if e.values != "" {
			head += " " + e.values
		}
		if !strings.Contains(b.String(), head+"\n    \t"+e.help()) {
			t.Errorf("-h lacks %q with its usage:\n%s", head, b.String())
		}
	}
}

// TestRunMetricsFailureCleansUp builds run's stack on an in-memory wire
// with every server and a -metrics address already taken: run fails with
// a usage error, and everything it built is undone when it returns (the
// servers' goroutines ended, the stack and so its wire closed).
func TestRunMetricsFailureCleansUp(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	o, err := parseRun([]string{"-tap", "mem0", "-addr", "10.0.0.2/24", "-discard", ":9", "-echo", ":7", "-iperf3", ":5201", "-metrics", busy.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	r := newRunner(o, &stdout, &stderr)
	var peer *driver.MemWire
	err = r.run(func(string) (driver.Wire, error) {
		w, p := driver.NewMemPair(64, 1<<17)
		peer = p
		return w, nil
	}, nil)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-metrics") {
		t.Fatalf("run: got %v, want a -metrics usage error", err)
	}
	if n := len(r.cleanups); n != 0 {
		t.Errorf("%d cleanups left undone", n)
	}
	if n := r.live.Load(); n != 0 {
		t.Errorf("%d server goroutines still running", n)
	}
	if _, err := peer.Read(make([]byte, 2048), false); !errors.Is(err, os.ErrClosed) {
		t.Errorf("wire after run: read got %v, want os.ErrClosed (the stack closes it)", err)
	}
	if strings.Contains(stderr.String(), "ustack run:") {
		t.Errorf("servers did not end quietly:\n%s", stderr.String())
	}
}
