package driver

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// PinThread locks the calling goroutine to its OS thread and, if cpus is not
// empty, restricts that thread to cpus. It returns the CPU the thread is on.
func PinThread(cpus []int) (int, error) {
	runtime.LockOSThread()
	if len(cpus) > 0 {
		var set unix.CPUSet
		for _, c := range cpus {
			set.Set(c)
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return -1, fmt.Errorf("sched_setaffinity %v: %w", cpus, err)
		}
	}
	return CurrentCPU(), nil
}

// CurrentCPU returns the CPU the calling thread runs on, or -1.
func CurrentCPU() int {
	var cpu, node uint32
	// getcpu(2); x/sys has no wrapper.
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(ptr(&cpu)), uintptr(ptr(&node)), 0); e != 0 {
		return -1
	}
	return int(cpu)
}

// ThreadCPUTime returns the CPU time the calling thread has used, in
// nanoseconds.
func ThreadCPUTime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
