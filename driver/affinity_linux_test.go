package driver

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
