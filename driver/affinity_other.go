//go:build !linux

package driver

import "runtime"

// PinThread locks the calling goroutine to its OS thread; pinning to CPUs
// needs Linux and returns ErrNotSupported elsewhere.
func PinThread(cpus []int) (int, error) {
	runtime.LockOSThread()
	if len(cpus) > 0 {
		return -1, ErrNotSupported
	}
	return -1, nil
}

// CurrentCPU returns -1: not known outside Linux.
func CurrentCPU() int { return -1 }

// ThreadCPUTime returns 0: not known outside Linux.
func ThreadCPUTime() int64 { return 0 }
