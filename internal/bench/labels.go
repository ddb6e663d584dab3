package bench

import (
	"context"
	"runtime/pprof"
)

// labelled runs fn under pprof labels that name what it measures, so that
// a -cpuprofile of a whole bench run (every row in one file) can be cut per
// row: `go tool pprof -tagfocus row='cpumap GRO off' ustack cpu.prof`, or
// `-tags` to list them. The goroutines fn starts (the stack's NIC model,
// poll loop, cpumap workers, gVisor's and the reader's) inherit the labels;
// the kernel sender is another process and is not in the profile.
func labelled(fn func(), kv ...string) {
	pprof.Do(context.Background(), pprof.Labels(kv...), func(context.Context) { fn() })
}
