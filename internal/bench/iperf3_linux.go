package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

// The bench's TCP senders (Row.Client, ustack bench -client).
const (
	ClientBuiltin = "builtin" // `ustack send`, a kernel TCP sender of ours
	ClientIPerf3  = "iperf3"  // the iperf3 client against ustack's iperf3 server
)

// iperf3Options are the client's settings for sendIPerf3.
type iperf3Options struct {
	dur     time.Duration
	streams int
	cc      string // TCP congestion control (-C); "": the kernel's default
	wsize   int    // TCP write size (-l); 0: iperf3's default (128 KiB)
}

// iperf3JSON is the part of `iperf3 --json` output the bench reads.
type iperf3JSON struct {
	Error string `json:"error"`
	End   struct {
		SumReceived *struct {
			Seconds float64 `json:"seconds"`
			Bytes   float64 `json:"bytes"`
		} `json:"sum_received"`
		SenderTCPCongestion string `json:"sender_tcp_congestion"`
	} `json:"end"`
}

// sendIPerf3 runs the iperf3 client (`iperf3 -c`, from the system's iperf3
// package) in ns against the iperf3 server at dst (serveIPerf3) for a
// bench row: TCP for o.dur, rounded up to whole seconds as iperf3's -t
// takes them, with o.streams parallel streams (-P). It returns the
// client's report as the built-in sender gives its figures: Bytes and
// Seconds are what the server received and over which time
// (end.sum_received), which is what the bench checks against the server's
// count. The client runs at most o.dur plus 30 seconds.
func sendIPerf3(ns *testbed.Netns, dst netip.AddrPort, o iperf3Options) (SendResult, error) {
	var r SendResult
	if _, err := exec.LookPath("iperf3"); err != nil {
		return r, errors.New("iperf3 not found: install it (apt-get install iperf3)")
	}
	if o.dur <= 0 || o.streams < 1 || o.streams > 128 {
		return r, fmt.Errorf("iperf3: want a duration > 0 and 1..128 streams, got %v, %d", o.dur, o.streams)
	}
	secs := int(math.Ceil(o.dur.Seconds()))
	args := []string{"-c", dst.Addr().String(), "-p", strconv.Itoa(int(dst.Port())),
		"-t", strconv.Itoa(secs), "-P", strconv.Itoa(o.streams), "--json", "--connect-timeout", "5000"}
	if o.cc != "" {
		args = append(args, "-C", o.cc)
	}
	if o.wsize > 0 {
		args = append(args, "-l", strconv.Itoa(o.wsize))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	cmd := ns.Exec(ctx, "iperf3", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	var j iperf3JSON
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		return r, fmt.Errorf("iperf3 %s: %v: %s%s", strings.Join(args, " "), runErr, strings.TrimSpace(errb.String()), strings.TrimSpace(out.String()))
	}
	if j.Error != "" {
		return r, fmt.Errorf("iperf3 %s: %s", strings.Join(args, " "), j.Error)
	}
	if runErr != nil {
		return r, fmt.Errorf("iperf3 %s: %v: %s", strings.Join(args, " "), runErr, strings.TrimSpace(errb.String()))
	}
	sum := j.End.SumReceived
	if sum == nil {
		return r, fmt.Errorf("iperf3 %s: no end.sum_received in its report", strings.Join(args, " "))
	}
	return SendResult{Bytes: int64(sum.Bytes), Seconds: sum.Seconds, Congestion: j.End.SenderTCPCongestion}, nil
}

// IPerf3Version returns the first line of `iperf3 --version`, such as
// "iperf 3.12 (cJSON 1.7.15)".
func IPerf3Version() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "iperf3", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("iperf3 --version: %w (is iperf3 installed? apt-get install iperf3)", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// serveIPerf3 serves iperf3 on st at ap for a bench row, adding the
// bytes of every test to received. stop closes the server and waits for
// it.
func serveIPerf3(st *stack.Stack, ap netip.AddrPort, received *atomic.Uint64) (stop func(), err error) {
	srv, err := serve.ListenIPerf3(st, ap, serve.IPerf3Config{OnTest: func(r serve.IPerf3Result) { received.Add(r.BytesReceived) }})
	if err != nil {
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	return func() { srv.Close(); <-served }, nil
}
