package main

import (
	"strconv"

	"github.com/ustack/ustack/stack"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports counters as Prometheus metrics, one per counter, named
// ustack_<counter>, typed by the counter's kind (stack.KindOf: gauges for
// levels such as rx_pp_pages_in_use and maxima such as rx_gro_held_max;
// counters otherwise). A queue's counter of a
// multi-queue stack (rx1_packets, q1_poll_cpu_ns) is
// ustack_queue_<total's name> with a queue label:
// ustack_queue_rx_packets{queue="1"}. each enumerates the counters:
// run's are the stack's and its servers'. Register it with a
// prometheus.Registry and serve that with promhttp.
type collector struct {
	each func(fn func(name string, v uint64))
}

// newCollector returns a collector of the counters each enumerates.
func newCollector(each func(fn func(name string, v uint64))) *collector {
	return &collector{each: each}
}

// Describe implements prometheus.Collector. The set of counters depends on
// the stack's configuration, so the collector is unchecked.
func (c *collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.each(func(name string, v uint64) {
		base, labels := name, prometheus.Labels(nil)
		metric := "ustack_" + name
		if b, q, ok := stack.SplitQueueCounter(name); ok {
			base, labels, metric = b, prometheus.Labels{"queue": strconv.Itoa(q)}, "ustack_queue_"+b
		}
		help := "ustack " + base + " (a " + stack.KindOf(base).String() + ", see docs/counters.md)."
		desc := prometheus.NewDesc(metric, help, nil, labels)
		ch <- prometheus.MustNewConstMetric(desc, promType(base), float64(v))
	})
}

// promType is the Prometheus type of counter name: a counter for the
// counts that only grow, a gauge for levels and maxima (stack.KindOf).
func promType(name string) prometheus.ValueType {
	if stack.KindOf(name) == stack.KindCounter {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}
