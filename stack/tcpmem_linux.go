package stack

import "golang.org/x/sys/unix"

// totalRAM returns the machine's memory in bytes (sysinfo), or 0.
func totalRAM() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
