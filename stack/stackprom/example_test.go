package stackprom_test

import (
	"fmt"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
	"github.com/ustack/ustack/stack/stackprom"
)

// Example registers a stack's counters, and its servers', on a service's
// registry, which promhttp.HandlerFor(reg, promhttp.HandlerOpts{}) would
// serve at /metrics.
func Example() {
	w, peer := driver.NewMemPair(0, 0)
	defer peer.Close()
	s, err := stack.New(stack.Config{Wire: w, Addrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	var st serve.Stats // the built-in servers' counters, as ustack run keeps them

	reg := prometheus.NewRegistry()
	reg.MustRegister(stackprom.NewCollector(s, stackprom.WithCounters(st.EachCounter)))

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "ustack_rx_packets", "ustack_rx_pp_pages_in_use", "ustack_server_conns_refused":
			fmt.Println(mf.GetName(), mf.GetType())
		}
	}
	// Output:
	// ustack_rx_packets COUNTER
	// ustack_rx_pp_pages_in_use GAUGE
	// ustack_server_conns_refused COUNTER
}
