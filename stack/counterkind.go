package stack

import "strings"

// CounterKind is what a counter measures. It says how the values of
// several queues (Config.Queues) or cpumap workers make the total that
// EachCounter reports under the single-queue name, and how an exporter
// types the counter (Prometheus: counter or gauge). docs/counters.md lists
// the kinds; KindOf is where the code keeps them.
type CounterKind uint8

const (
	// KindCounter counts events and only grows: the total is the sum.
	// Every counter not named in counterKinds (nor ending in _current).
	KindCounter CounterKind = iota
	// KindGauge is a level that adds up over queues, such as pages in use
	// or bytes held: the total is the sum. Every counter whose name ends
	// in _current is one.
	KindGauge
	// KindMax is a level whose sum means nothing: the total is the largest
	// queue's (or worker's). A high-water mark (rx_gro_held_max, the most
	// packets one GRO engine held at once) and the page pools' current
	// allocation order (rx_pp_alloc_order: the largest order a queue's pool
	// allocates at; rx_pp_order_fallbacks counts the steps down).
	KindMax
)

// String returns the kind's name in docs/counters.md: counter, gauge, max.
func (k CounterKind) String() string {
	switch k {
	case KindGauge:
		return "gauge"
	case KindMax:
		return "max"
	}
	return "counter"
}

// counterKinds marks the counters that are not KindCounter and whose names
// do not end in _current: the driver's, the page pool's, GRO's (also as
// the cpumap workers' cpumap_rx_gro_*) and the stack's own.
var counterKinds = map[string]CounterKind{
	"rx_pp_pages_in_use":      KindGauge,
	"rx_pp_bytes_held":        KindGauge,
	"tcp_established":         KindGauge,
	"tcp_mem_committed_bytes": KindGauge,
	"tcp_mem_pressure":        KindGauge,
	"tcp_mem_hard_limit":      KindGauge,
	"rx_pp_alloc_order":       KindMax,
	"rx_gro_held_max":         KindMax,
	"cpumap_rx_gro_held_max":  KindMax,
}

// KindOf returns the kind of the counter name, as EachCounter and the
// built-in servers' Stats.EachCounter name it; a queue's counter
// (rx1_pp_alloc_order, SplitQueueCounter) is of its total's kind.
func KindOf(name string) CounterKind {
	if base, _, ok := SplitQueueCounter(name); ok {
		name = base
	}
	if k, ok := counterKinds[name]; ok {
		return k
	}
	if strings.HasSuffix(name, "_current") {
		return KindGauge
	}
	return KindCounter
}

// counterTotals adds up the counters of several queues or workers by
// name, each by its kind (KindOf), and yields the totals in the order the
// names first came. Not for a hot path: it allocates.
type counterTotals struct {
	names []string
	vals  map[string]uint64
}

// add adds a queue's value of counter name.
func (t *counterTotals) add(name string, v uint64) {
	old, ok := t.vals[name]
	if !ok {
		if t.vals == nil {
			t.vals = map[string]uint64{}
		}
		t.names = append(t.names, name)
	}
	if KindOf(name) == KindMax {
		t.vals[name] = max(old, v)
	} else {
		t.vals[name] = old + v
	}
}

// each calls fn with every total, its name prefixed by prefix.
func (t *counterTotals) each(prefix string, fn func(string, uint64)) {
	for _, n := range t.names {
		fn(prefix+n, t.vals[n])
	}
}
