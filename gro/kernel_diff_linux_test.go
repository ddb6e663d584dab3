//go:build linux

package gro

import (
	"errors"
	"flag"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/internal/testbed"
)

var (
	diffCount = flag.Int("gro.diff", 0, "sequences TestKernelDiff sends through the kernel's GRO (0: diffCICount)")
	diffFirst = flag.Int64("gro.diff.seed", 1, "first seed of TestKernelDiff; it runs seeds first..first+count-1")
)

const (
	// diffCICount sequences run in CI: about 20 ms each (two
	// gro_flush_timeout periods and the reads), well within a minute.
	diffCICount = 400
	// diffMaxFrames bounds a sequence, below veth's NAPI budget (64,
	// NAPI_POLL_WEIGHT) so that one veth_poll takes the whole sequence.
	diffMaxFrames = 60
	// diffFlushTimeout is the receiving veth's gro_flush_timeout: with
	// napi_defer_hard_irqs 1 a poll that did work re-arms a timer instead
	// of unmasking the device (napi_complete_done), so that frames sent
	// within it queue in veth's ring and are polled together when it
	// fires.
	diffFlushTimeout = 10 * time.Millisecond
	diffTries        = 5 // a difference must show in every one of this many runs
)

// kernelGRO is a veth pair inside a namespace whose receiving end runs the
// kernel's GRO: frames written on one end come out of an AF_PACKET socket on
// the other after GRO, as the kernel's gro.sh/setup_veth.sh arrange.
type kernelGRO struct {
	tx, rx *testbed.Injector
	buf    []byte
}

// etherPrimer is the EtherType of the frame that starts each sequence: GRO
// has no handler for it (IEEE 802 local experimental), so it goes up at once
// and its poll arms the gro_flush_timeout timer.
const etherPrimer = 0x88b5

func newKernelGRO(t *testing.T, maxFrames int) *kernelGRO {
	t.Helper()
	ns, err := testbed.NewNetns("grodiff")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := testbed.NewVethPair(ns, ns, "grotx", "grorx", 9000); err != nil {
		t.Fatal(err)
	}
	if err := ns.IP("link", "set", "dev", "grorx", "address", "02:00:00:00:00:ee"); err != nil {
		t.Fatal(err)
	}
	if err := ns.SetGRO("grorx", true); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("veth has no GRO here: %v", err)
		}
		t.Fatal(err)
	}
	if err := ns.SetTSO("grotx", false); err != nil {
		t.Fatal(err)
	}
	for attr, v := range map[string]string{
		"gro_flush_timeout":    "10000000", // diffFlushTimeout in ns
		"napi_defer_hard_irqs": "1",
	} {
		if err := ns.SetDevAttr("grorx", attr, v); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Duration(maxFrames/50+60) * time.Second)
	maxFrames += 1000 // and the frames that wait for the link
	k := &kernelGRO{buf: make([]byte, 70000)}
	if k.tx, err = ns.NewInjector(testbed.InjectorConfig{Dev: "grotx", SndBuf: 16 << 20, MaxFrames: maxFrames, Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.tx.Close() })
	if k.rx, err = ns.NewInjector(testbed.InjectorConfig{Dev: "grorx", Receive: true, RcvBuf: 16 << 20, MaxFrames: 1, Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.rx.Close() })
	// Wait until frames cross: until linkwatch has activated the fresh
	// veth's queue (dev_activate), the kernel drops what is sent on it.
	for end := time.Now().Add(30 * time.Second); ; {
		if time.Now().After(end) {
			t.Fatal("no frame crossed the veth pair in 30 s")
		}
		if err := k.tx.Write(primerFrame()); err != nil {
			t.Fatal(err)
		}
		n, _, err := k.rx.ReadFrame(k.buf, 100*time.Millisecond)
		if err == nil && n >= 14 && k.buf[12] == etherPrimer>>8 && k.buf[13] == etherPrimer&0xff {
			break
		}
	}
	return k
}

// primerFrame returns a frame of EtherType etherPrimer.
func primerFrame() []byte {
	f := make([]byte, 60)
	copy(f, []byte{2, 0, 0, 0, 0, 0xee, 2, 0, 0, 0, 0, 1, etherPrimer >> 8, etherPrimer & 0xff})
	return f
}

// run sends frames and returns what the kernel's GRO made of them, per
// flow, once every payload byte and every empty segment came up.
func (k *kernelGRO) run(frames []built) (flowLens, error) {
	out, _, err := k.runAll(frames)
	return out, err
}

// runAll is run that also returns the payload lengths of all flows in the
// order they came up.
func (k *kernelGRO) runAll(frames []built) (flowLens, []int, error) {
	wantBytes, wantEmpty := map[string]int{}, map[string]int{}
	for _, b := range frames {
		sport, n, _ := frameFlow(b.frame)
		wantBytes[sport] += n
		if n == 0 {
			wantEmpty[sport]++
		}
	}
	if err := k.tx.Write(primerFrame()); err != nil {
		return nil, nil, err
	}
	for _, b := range frames {
		if err := k.tx.Write(b.frame); err != nil {
			return nil, nil, err
		}
	}
	out := flowLens{}
	var all []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for p, n := range wantBytes {
			if n != 0 || wantEmpty[p] != 0 {
				done = false
			}
		}
		if done {
			return out, all, nil
		}
		if time.Now().After(deadline) {
			return out, all, os.ErrDeadlineExceeded
		}
		n, outgoing, err := k.rx.ReadFrame(k.buf, time.Second)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return out, all, err
		}
		sport, plen, ok := frameFlow(k.buf[:n])
		if outgoing || !ok {
			continue
		}
		if _, mine := wantBytes[sport]; !mine {
			continue
		}
		out[sport] = append(out[sport], plen)
		all = append(all, plen)
		wantBytes[sport] -= plen
		if plen == 0 {
			wantEmpty[sport]--
		}
	}
}

// TestKernelDiff sends random segment sequences through the running
// kernel's GRO on a veth and through the engine, and requires the same
// packet boundaries: per flow, the payload lengths of what came up, in
// order. A sequence that differs is run again (diffTries in all) to rule
// out a poll split by the scheduler, shrunk, and printed with its seed;
// rerun it with -gro.diff 1 -gro.diff.seed SEED.
func TestKernelDiff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for netns, veth and AF_PACKET; run go test -exec sudo")
	}
	count := *diffCount
	if count <= 0 {
		count = diffCICount
	}
	k := newKernelGRO(t, count*diffMaxFrames*(diffTries+2)*2)
	w := newWire(t, newPool(t))
	defer w.close()
	rerun := 0 // sequences that differed once and then did not: a split poll
	differs := func(d diffSeq) (bool, flowLens, flowLens, error) {
		frames := d.frames()
		want := engineLens(w, frames)
		var got flowLens
		for try := range diffTries {
			var err error
			if got, err = k.run(frames); err != nil {
				return false, got, want, err
			}
			if got.String() == want.String() {
				if try > 0 {
					rerun++
				}
				return false, got, want, nil
			}
		}
		return true, got, want, nil
	}
	differed := 0
	for seed := *diffFirst; seed < *diffFirst+int64(count); seed++ {
		d := genDiffSeq(seed, diffMaxFrames)
		bad, got, want, err := differs(d)
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, &d)
		}
		if !bad {
			continue
		}
		differed++
		m := shrinkDiff(d, func(c diffSeq) bool { b, _, _, err := differs(c); return err == nil && b })
		_, got, want, _ = differs(m)
		t.Errorf("seed %d differs from the kernel's GRO; minimal sequence:\n%skernel:\n%sengine:\n%s", seed, &m, got, want)
		if differed >= 5 {
			t.Fatal("too many differences")
		}
	}
	t.Logf("%d sequences (seeds %d to %d), %d differing, %d equal only when run again", count, *diffFirst, *diffFirst+int64(count)-1, differed, rerun)
}

// TestKernelSelftestKernel runs the TCP cases of the kernel's gro.c
// selftest (selftest_test.go) through the running kernel's GRO and requires
// the payloads TestKernelSelftest requires of the engine: the table is
// Linux 6.18's, not just gro.c's. (udpgro.sh's cases need UDP GRO on the
// receiving socket or rx-udp-gro-forwarding; they are not sent.)
func TestKernelSelftestKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for netns, veth and AF_PACKET; run go test -exec sudo")
	}
	k := newKernelGRO(t, 20000)
	for _, v6 := range []bool{false, true} {
		for _, tc := range selftestCases() {
			if tc.v4 && v6 || tc.v6 && !v6 {
				continue
			}
			bd := newBuilder()
			var frames []built
			for _, s := range tc.segs {
				s.v6 = v6
				frames = append(frames, bd.build(s))
			}
			var got []int
			for range diffTries {
				_, all, err := k.runAll(frames)
				if err != nil {
					t.Fatalf("v6 %v %s: %v", v6, tc.name, err)
				}
				if got = all; slices.Equal(got, tc.want) {
					break
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("v6 %v %s: the kernel handed up %v, the table says %v", v6, tc.name, got, tc.want)
			}
		}
	}
}
