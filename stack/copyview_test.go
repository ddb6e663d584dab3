//go:build !stockgvisor

package stack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
)

// TestCopyViewUninit: a view from newCopyView comes from gVisor's chunk
// pool uncleared, so its spare capacity holds an earlier packet's bytes;
// what it exposes is only what was written, through a Buffer too.
func TestCopyViewUninit(t *testing.T) {
	for _, n := range []int{64, 1448, 9000, 65535, buffer.MaxChunkSize} {
		junk := bytes.Repeat([]byte{0xee}, n)
		data := make([]byte, n/2+1)
		for i := range data {
			data[i] = byte(i * 7)
		}
		// Poison the pools: chunks of this size go back full of junk.
		for range 8 {
			v := buffer.NewViewWithData(junk)
			v.Release()
		}
		v := newCopyView(len(data))
		if v.Size() != 0 {
			t.Fatalf("n=%d: fresh view has %d bytes, want 0", n, v.Size())
		}
		v.Write(data)
		var b buffer.Buffer
		appendView(&b, v)
		if got := b.Flatten(); !bytes.Equal(got, data) {
			t.Fatalf("n=%d: buffer holds %d bytes (%x...), want the %d written", n, len(got), got[:min(8, len(got))], len(data))
		}
		b.Release()
	}
}
