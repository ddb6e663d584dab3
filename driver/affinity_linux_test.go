package driver

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ustack/ustack/internal/testutil"
)

// TestDriverCPUs pins both threads to one CPU the test may use and checks
// that NICCPU and PollCPU report it once the threads have started.
func TestDriverCPUs(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for c := 0; c < len(set)*64 && cpu < 0; c++ {
		if set.IsSet(c) {
			cpu = c
		}
	}
	if cpu < 0 {
		t.Fatal("no CPU in the affinity mask")
	}
	d, _ := newTestDriver(t, Config{NICCPUs: []int{cpu}, PollCPUs: []int{cpu}}, &collector{})
	deadline := time.Now().Add(30 * time.Second)
	for d.NICCPU() != cpu || d.PollCPU() != cpu {
		if time.Now().After(deadline) {
			t.Fatalf("NICCPU %d, PollCPU %d: want %d", d.NICCPU(), d.PollCPU(), cpu)
		}
		runtime.Gosched()
	}
}

// TestPollCPUUnpinned: an unpinned poll loop (not locked to a thread)
// still sums its CPU time, run by run between parks: more than nothing
// after work, never more than the whole process used.
func TestPollCPUUnpinned(t *testing.T) {
	var ru0 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	c := &collector{}
	d, w := newTestDriver(t, Config{}, c)
	h, frame, _ := tcpSuper(t, L3IPv4, 64000)
	b := wireFrame(h, frame)
	per := int64(64000+1447) / 1448
	for i := int64(1); i <= 300; i++ {
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		c.waitFor(t, i*per)
	}
	var ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	proc := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
	// The poll loop publishes its time when it parks: wait for that.
	testutil.WaitFor(t, "poll_cpu_ns published", func() bool { return d.Stats().PollCPUNanos.Load() > 0 })
	if got := d.Stats().PollCPUNanos.Load(); got > proc+int64(10*time.Millisecond) {
		t.Errorf("poll_cpu_ns %d, more than the process's %d", got, proc)
	}
}
