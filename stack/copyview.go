//go:build !stockgvisor

package stack

import "gvisor.dev/gvisor/pkg/buffer"

// newCopyView returns an empty view of at least n bytes that the caller
// fills with Write, every byte of what it exposes, before anything reads
// it: the patched gVisor's NewViewUninit, which leaves the pooled chunk
// uncleared (internal/gvisor, patch 0003) rather than clearing memory the
// copy overwrites at once.
func newCopyView(n int) *buffer.View { return buffer.NewViewUninit(n) }
