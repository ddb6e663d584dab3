// Package stackprom exports a stack.Stack's counters as Prometheus metrics,
// for a Go service that embeds the stack and serves its own /metrics:
//
//	reg.MustRegister(stackprom.NewCollector(s))
//
// Each counter (Stack.EachCounter, docs/counters.md) is one metric named
// ustack_<counter>, typed by the counter's kind (stack.KindOf): a
// Prometheus counter for the counts that only grow, a gauge for levels
// such as rx_pp_pages_in_use and maxima such as rx_gro_held_max. A
// queue's counter of a multi-queue stack (rx1_packets, q1_poll_cpu_ns) is
// ustack_queue_<total's name> with a queue label:
// ustack_queue_rx_packets{queue="1"}, beside the total ustack_rx_packets.
//
// The package is apart from stack so that stack links no metrics library.
// A Collector reads the counters when it is collected, from any goroutine:
// the stack's counters are safe to read while it runs.
package stackprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ustack/ustack/stack"
)

// An Option configures a collector (NewCollector).
type Option func(*collector)

// WithCounters adds a source of further counters, exported after the
// stack's and as they are: each calls its argument once per counter, as
// Stack.EachCounter does, such as the built-in servers' serve.Stats's
// EachCounter. Their names take their kinds from stack.KindOf too, and
// must not repeat the stack's. Several sources are exported in order.
func WithCounters(each func(fn func(name string, v uint64))) Option {
	return func(c *collector) { c.each = append(c.each, each) }
}

// NewCollector returns a collector of s's counters and of those the
// options add. s may be nil: then it collects the options' sources only.
// Register it with a prometheus.Registry and serve that with promhttp.
// The set of counters depends on the stack's configuration, so the
// collector is unchecked (it describes no metric in advance).
func NewCollector(s *stack.Stack, opts ...Option) prometheus.Collector {
	c := &collector{}
	if s != nil {
		c.each = append(c.each, s.EachCounter)
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// collector implements prometheus.Collector over counter sources.
type collector struct {
	each []func(fn func(name string, v uint64))
}

// Describe implements prometheus.Collector: nothing, the collector is
// unchecked.
func (c *collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(name string, v uint64) {
		base, labels := name, prometheus.Labels(nil)
		metric := "ustack_" + name
		if b, q, ok := stack.SplitQueueCounter(name); ok {
			base, labels, metric = b, prometheus.Labels{"queue": strconv.Itoa(q)}, "ustack_queue_"+b
		}
		help := "ustack " + base + " (a " + stack.KindOf(base).String() + ", see docs/counters.md)."
		desc := prometheus.NewDesc(metric, help, nil, labels)
		ch <- prometheus.MustNewConstMetric(desc, promType(base), float64(v))
	}
	for _, each := range c.each {
		each(emit)
	}
}

// promType is the Prometheus type of counter name: a counter for the
// counts that only grow, a gauge for levels and maxima (stack.KindOf).
func promType(name string) prometheus.ValueType {
	if stack.KindOf(name) == stack.KindCounter {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}
