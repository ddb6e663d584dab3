package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	runpprof "runtime/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
	"github.com/ustack/ustack/stack/stackprom"
)

// startCPUProfile starts a CPU profile of the whole process into path (the
// -cpuprofile flag of every bench mode) and returns the function that
// stops it and closes the file. An empty path profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("-cpuprofile: %w", err)}
	}
	if err := runpprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		runpprof.StopCPUProfile()
		f.Close()
	}, nil
}

// metricsMux serves run's -metrics address: the metrics c collects (run's:
// runCollector) at /metrics, and Go's profiles (net/http/pprof) at
// /debug/pprof/, so a user can see where ustack's CPU goes while it runs
// (`go tool pprof http://ADDR/debug/pprof/profile?seconds=10`).
func metricsMux(c prometheus.Collector) *http.ServeMux {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// runCollector exports run's counters as Prometheus metrics: the stack's,
// then its servers' (st), as printCounters prints them.
func runCollector(s *stack.Stack, st *serve.Stats) prometheus.Collector {
	return stackprom.NewCollector(s, stackprom.WithCounters(st.EachCounter))
}
