package bench

import (
	"strings"
	"testing"
)

// sockperfReport is sockperf 3.7's ping-pong report, as Debian's client
// prints it (colour codes included).
const sockperfReport = `sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=19076; ReceivedMessages=19075
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=11276; ReceivedMessages=11276
sockperf: ` + "\x1b[2;35m" + `====> avg-latency=24.353 (std-dev=39.875)` + "\x1b[0m" + `
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Latency is 24.353 usec
sockperf: ---> percentile 99.999 =  910.946
sockperf: ---> percentile 99.000 =  202.384
sockperf: ---> percentile 90.000 =   21.685
sockperf: ---> percentile 50.000 =   14.627
`

func TestParseSockperf(t *testing.T) {
	s, err := parseSockperf(sockperfReport)
	if err != nil {
		t.Fatal(err)
	}
	if s.avg != 24.353 || s.p50 != 14.627 || s.p99 != 202.384 || s.rate < 20501 || s.rate > 20503 {
		t.Errorf("got %+v, want avg 24.353, p50 14.627, p99 202.384, rate 11276/0.55", s)
	}
	if _, err := parseSockperf("sockperf: ERROR: no reply"); err == nil {
		t.Error("a report without figures: no error")
	}
}

func TestPrintSockperf(t *testing.T) {
	var b strings.Builder
	samples := [][2][]spSample{
		{{{avg: 44, p99: 90}, {avg: 40, p99: 80}, {avg: 48, p99: 100}}, {{avg: 30}}},
		{{{avg: 20, p99: 50}}, {{avg: 25}}},
	}
	if err := printSockperf(&b, []string{"ustack defaults", "kernel over veth"}, samples); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"44.0 (40.0-48.0)", "90.0 (80.0-100.0)", "2.20", "1.20", "1.00"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
