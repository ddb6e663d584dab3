//go:build !unix

package serve

import "time"

// processCPU returns zero where getrusage is not available.
func processCPU() (user, sys time.Duration) { return 0, 0 }
