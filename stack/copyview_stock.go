//go:build stockgvisor

package stack

import "gvisor.dev/gvisor/pkg/buffer"

// newCopyView is NewView with the stock module, which clears the chunk.
func newCopyView(n int) *buffer.View { return buffer.NewView(n) }
