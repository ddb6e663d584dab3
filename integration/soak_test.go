//go:build linux

package integration

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ustack/ustack/bufpool"
	"github.com/ustack/ustack/cpumap"
	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/stack"
)

// soakPolicy is one receive-path configuration the soak cycles through.
type soakPolicy struct {
	name string
	sc   func() stack.Config
	// udpShare is the share of UDP datagrams that must arrive (a small
	// pool drops what it has no room for).
	udpShare float64
}

func soakPolicies() []soakPolicy {
	cfg := func(dc driver.Config, pc bufpool.Config) func() stack.Config {
		return func() stack.Config { return stack.Config{Driver: dc, Pool: pc} }
	}
	return []soakPolicy{
		{"lro-on", cfg(driver.Config{LRO: true}, bufpool.Config{}), 0.9},
		{"lro-off/gro", cfg(driver.Config{}, bufpool.Config{}), 0.9},
		{"hw-gro-on", cfg(driver.Config{HWGRO: driver.HWGROOn}, bufpool.Config{}), 0.9},
		{"hw-gro-coalesce/order-2", cfg(driver.Config{HWGRO: driver.HWGROCoalesce}, bufpool.Config{Order: 2}), 0.9},
		{"cpumap-hash", func() stack.Config {
			prog, err := cpumap.ParseProgram("hash", 2)
			if err != nil {
				panic(err) // a built-in program: a broken invariant
			}
			return stack.Config{Driver: driver.Config{}, XDP: prog, CPUMap: []int{0, 1}}
		}, 0.9},
		{"no-recycle/cyclic/hds-256", cfg(driver.Config{RQ: driver.RQCyclic, HDS: 256}, bufpool.Config{NoRecycle: true}), 0.9},
		{"small-pool/lro-off", cfg(driver.Config{RQ: driver.RQCyclic}, bufpool.Config{MaxPages: 48}), 0},
		{"page-64k/lro-on", cfg(driver.Config{LRO: true}, bufpool.Config{PageSize: bufpool.PageSize64K}), 0.9},
		{"run-to-completion/lro-on", cfg(driver.Config{LRO: true, RunToCompletion: true}, bufpool.Config{}), 0.9},
	}
}

// TestSoak runs rounds of mixed traffic (TCP and UDP, IPv4 and IPv6, from
// the kernel to the stack and back) over a fresh rig per round, cycling
// through receive policies, checking every byte as it goes, for the
// duration given by -soak (default: a short smoke run of a few seconds).
//
//	go test -count=1 -v -run Soak -soak 10m ./integration
func TestSoak(t *testing.T) {
	needRoot(t)
	d := *soak
	const tcpN = 8 << 20
	if d == 0 {
		d = 3 * time.Second
	}
	tl := record("TestSoak")
	policies := soakPolicies()
	end := time.Now().Add(d)
	round := 0
	for ; round == 0 || time.Now().Before(end); round++ {
		p := policies[round%len(policies)]
		ok := t.Run(fmt.Sprintf("round-%03d/%s", round, p.name), func(t *testing.T) {
			soakRound(t, round, p, tcpN, tl)
		})
		if !ok {
			break // the first failure says enough; keep the log short
		}
	}
	t.Logf("%d rounds in %v", round, d)
}

// soakRound runs one round: two TCP flows of n bytes (IPv4 and IPv6) into
// the stack, one from the stack to a kernel listener, and a UDP flow of each
// family, all at once, each checked.
func soakRound(t *testing.T, round int, p soakPolicy, n int64, tl *tally) {
	r := newRigConfig(t, "usit-soak", 1500, p.sc())
	w := watchPool(r.st)
	deadline := time.Now().Add(transferTimeout(3*n) + time.Minute)
	seed := uint64(round) * 10
	in4 := startBulk(t, r, false, 7001, n, 5000+seed, deadline)
	in6 := startBulk(t, r, true, 7002, n, 5001+seed, deadline)

	var wg sync.WaitGroup
	for i, v6 := range []bool{false, true} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr, sent := pacedUDP(t, r, v6, uint16(5353+i), 1500, 1200, deadline)
			checkUDPResult(t, "udp "+family(v6), rr, sent, p.udpShare)
			tl.checked.Add(rr.bytes)
			if len(rr.corrupt) == 0 && rr.err == nil {
				tl.load.Add(1)
			}
		}()
	}
	// The stack's transmit path, to a kernel listener (IPv6 every other
	// round).
	wg.Add(1)
	go func() {
		defer wg.Done()
		stackToKernel(t, r, round%2 == 1, n/2, 5002+seed, deadline, tl)
	}()
	in4.wait(t, r, tl, deadline)
	in6.wait(t, r, tl, deadline)
	wg.Wait()
	w.end(t, tl)
	c := counters(r.st)
	tl.faults.Add(int64(c["rx_drop_no_buffer"] + c["cpumap_dropped"]))
	if p.udpShare > 0 {
		checkFlowDrops(t, r.st)
	} else {
		t.Logf("rx_drop_no_buffer %d", c["rx_drop_no_buffer"])
	}
	r.close(t)
}

// pacedUDP sends count datagrams of size bytes from a kernel socket to the
// stack's port, keeping at most 8 unread, and returns what arrived and how
// many were sent.
func pacedUDP(t *testing.T, r *rig, v6 bool, port uint16, count, size int, deadline time.Time) (udpResult, int) {
	u, err := r.st.ListenUDP(r.stackAP(v6, port))
	if err != nil {
		t.Error(err)
		return udpResult{}, 0
	}
	defer u.Close()
	k, err := r.bed.NS.DialUDP(r.stackAP(v6, port))
	if err != nil {
		t.Error(err)
		return udpResult{}, 0
	}
	defer k.Close()
	var read atomic.Int64
	var done atomic.Bool
	res := make(chan udpResult, 1)
	go func() { res <- readDatagrams(u, count, size, deadline, &read, &done) }()
	msg := make([]byte, size)
	k.SetWriteDeadline(deadline)
	sent := 0
	pace := udpPacer{read: &read}
	for seq := uint32(0); seq < uint32(count) && time.Now().Before(deadline); seq++ {
		pace.wait(sent)
		fillDatagram(msg, seq)
		if _, err := k.Write(msg); err != nil {
			t.Errorf("udp sender: %v", err)
			break
		}
		sent++
	}
	done.Store(true)
	return <-res, sent
}

// stackToKernel sends n bytes of seed's stream from the stack to a kernel
// listener and checks them; it books the transfer in tl.
func stackToKernel(t *testing.T, r *rig, v6 bool, n int64, seed uint64, deadline time.Time, tl *tally) {
	l, err := r.bed.NS.ListenTCP(r.kernelAP(v6, 0))
	if err != nil {
		t.Error(err)
		return
	}
	defer l.Close()
	l.SetDeadline(deadline)
	res := acceptOne(l, deadline)
	kap := r.kernelAP(v6, uint16(l.Addr().(*net.TCPAddr).Port))
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := r.st.DialTCP(ctx, kap)
	if err != nil {
		t.Error(err)
		l.Close()
		<-res
		return
	}
	defer c.Close()
	c.SetDeadline(deadline)
	want, err := sendHashed(progressConn{c, deadline}, n, writeSize, seed)
	if err == nil {
		err = c.Close()
	}
	if err != nil {
		t.Errorf("stack sender: %v", err)
	}
	var got hashResult
	select {
	case got = <-res:
	case <-time.After(time.Until(deadline) + 5*time.Second):
		t.Errorf("kernel receiver did not finish by its deadline")
		l.Close()
		got = <-res
	}
	ok := checkHash(t, got, n, want)
	recordTransfer(tl, n, ok)
}

// udpPacer keeps a datagram sender at most 8 datagrams ahead of its
// reader, waiting up to 100 ms for the reader each time. When the reader
// does not catch up in that time, what is outstanding is taken as lost,
// so that losses do not slow every later datagram down.
type udpPacer struct {
	read *atomic.Int64
	lost int64
}

func (p *udpPacer) wait(sent int) {
	for end := time.Now().Add(100 * time.Millisecond); int64(sent)-p.read.Load()-p.lost >= 8; {
		if time.Now().After(end) {
			p.lost = int64(sent) - p.read.Load()
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}
