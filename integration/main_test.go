//go:build linux

package integration

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/ustack/ustack/internal/testutil"
)

// soak is the duration of TestSoak (soak_test.go): 0, the default, runs it
// for a few seconds only. CI runs it for 2 minutes:
//
//	go test -count=1 -run Soak -soak 2m ./integration
var soak = flag.Duration("soak", 0, "run TestSoak for this long (0: a short smoke run)")

func TestMain(m *testing.M) {
	flag.Parse()
	// testutil.Run: the tests, then no goroutine of theirs may be left.
	code := testutil.Run(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	printSummary()
	if lost := totals().lost; lost != 0 && code == 0 {
		// A test that lost bytes has failed already; this is a backstop.
		fmt.Fprintf(os.Stderr, "integration: %d bytes lost\n", lost)
		code = 1
	}
	os.Exit(code)
}

// tally is what one reliability test records for the summary that TestMain
// prints after the run. Its fields are updated atomically, from any
// goroutine.
type tally struct {
	load    atomic.Int64 // good flows (TCP connections, UDP streams) carried to the end under faults or load
	faults  atomic.Int64 // faults injected: exhaustion hits, flood packets, closes and signals mid-transfer
	bad     atomic.Int64 // bad inputs tried: hostile frames written to the wire
	checked atomic.Int64 // bytes whose SHA-256 or pattern was checked at the receiver
	lost    atomic.Int64 // bytes a reliable flow sent that did not arrive intact (must be 0)

	peakRSS, peakPages atomic.Int64 // the highest peak RSS and pool pages seen (poolWatch)
}

// notePeaks raises t's peaks to rss bytes and pages pool pages.
func (t *tally) notePeaks(rss, pages int64) {
	for _, p := range []struct {
		v *atomic.Int64
		x int64
	}{{&t.peakRSS, rss}, {&t.peakPages, pages}} {
		for old := p.v.Load(); p.x > old && !p.v.CompareAndSwap(old, p.x); old = p.v.Load() {
		}
	}
}

var (
	talliesMu sync.Mutex
	// +checklocks:talliesMu
	tallies = map[string]*tally{}
)

// record returns the tally of the named row (a test's name), creating it.
func record(name string) *tally {
	talliesMu.Lock()
	defer talliesMu.Unlock()
	t := tallies[name]
	if t == nil {
		t = &tally{}
		tallies[name] = t
	}
	return t
}

type summaryRow struct {
	load, faults, bad, checked, lost int64
	peakRSS, peakPages               int64
}

func totals() summaryRow {
	talliesMu.Lock()
	defer talliesMu.Unlock()
	var s summaryRow
	for _, t := range tallies {
		s.load += t.load.Load()
		s.faults += t.faults.Load()
		s.bad += t.bad.Load()
		s.checked += t.checked.Load()
		s.lost += t.lost.Load()
		s.peakRSS = max(s.peakRSS, t.peakRSS.Load())
		s.peakPages = max(s.peakPages, t.peakPages.Load())
	}
	return s
}

// printSummary prints one row per recorded test and their total, when any
// test recorded something.
func printSummary() {
	talliesMu.Lock()
	names := make([]string, 0, len(tallies))
	for n := range tallies {
		names = append(names, n)
	}
	talliesMu.Unlock()
	if len(names) == 0 {
		return
	}
	sort.Strings(names)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\nreliability summary (%s):\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintln(w, "test\tload held (flows)\tfaults injected\tbad inputs tried\tbytes checked\tbytes lost\tpeak RSS MB\tpool peak pages\t")
	line := func(name string, r summaryRow) {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", name, r.load, r.faults, r.bad, r.checked, r.lost, r.peakRSS>>20, r.peakPages)
	}
	for _, n := range names {
		t := record(n)
		line(n, summaryRow{t.load.Load(), t.faults.Load(), t.bad.Load(), t.checked.Load(), t.lost.Load(), t.peakRSS.Load(), t.peakPages.Load()})
	}
	line("total", totals())
	w.Flush()
}

// recordTransfer books a reliable transfer of n bytes into t: a flow held,
// n bytes checked, and n bytes lost unless ok.
func recordTransfer(t *tally, n int64, ok bool) {
	if ok {
		t.load.Add(1)
		t.checked.Add(n)
	} else {
		t.lost.Add(n)
	}
}
