//go:build linux

package xsk

import "golang.org/x/sys/unix"

// threadCPU returns the calling thread's CPU time in nanoseconds
// (CLOCK_THREAD_CPUTIME_ID), or -1 if it cannot: on a shared machine it
// moves far less with the load than the wall clock does.
func threadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return -1
	}
	return ts.Nano()
}
