package main

import (
	"strconv"
	"strings"

	"github.com/ustack/ustack/stack"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports counters as Prometheus metrics, one per counter, named
// ustack_<counter> (gauges for the few that are levels, such as
// rx_pp_pages_in_use; counters otherwise). A queue's counter of a
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
		typ, help := prometheus.CounterValue, "ustack counter "+base+" (see docs/counters.md)."
		if isGauge(base) {
			typ = prometheus.GaugeValue
		}
		desc := prometheus.NewDesc(metric, help, nil, labels)
		ch <- prometheus.MustNewConstMetric(desc, typ, float64(v))
	})
}

// isGauge reports the counters that are levels rather than totals.
func isGauge(name string) bool {
	switch name {
	case "rx_pp_pages_in_use", "rx_pp_bytes_held", "rx_pp_alloc_order", "tcp_established", "rx_gro_held_max":
		return true
	case "tcp_mem_committed_bytes", "tcp_mem_pressure", "tcp_mem_hard_limit":
		return true
	}
	return strings.HasSuffix(name, "_current")
}
