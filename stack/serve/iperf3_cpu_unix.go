//go:build unix

package serve

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU returns the user and system CPU time the process has used.
func processCPU() (user, sys time.Duration) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
