//go:build !linux

package xsk

import "time"

// taiNow returns the wall clock in nanoseconds: without CLOCK_TAI there is
// no TAI offset to add.
func taiNow() uint64 { return uint64(time.Now().UnixNano()) }
