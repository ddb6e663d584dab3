package xsk

import "golang.org/x/sys/unix"

// taiNow returns CLOCK_TAI in nanoseconds (CLOCK_REALTIME if the kernel
// cannot read it).
func taiNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &ts); err != nil {
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return 0
		}
	}
	return uint64(ts.Nano())
}
