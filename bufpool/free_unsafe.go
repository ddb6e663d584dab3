package bufpool

import (
	"math/bits"
	"sync"
	"unsafe"
)

// freePages is the page allocator's free lists: the memory of Go-heap
// pages whose last reference was dropped while no borrower could still
// hold it, by size (index log2 of it), for the next allocation of that
// size; a second set holds the memory of pages freed with poisoning on,
// filled with the pattern and checked when taken again. The kernel's
// page_pool, when its ring is empty, allocates from the buddy allocator,
// which hands back recently freed pages from per-CPU lists without zeroing
// them; a new Go allocation is zeroed and adds to the garbage collector's
// work, a cost per page no kernel pays. So the memory of a page that leaves
// a pool (its ring full, or the page held past it: a socket queue holding
// many small packets, one stride each) comes back through these lists, and
// the GC frees only what they hold over two of its cycles (sync.Pool). The
// Page struct is new each time: only the memory is reused.
//
// The lists hold a pointer to the memory's first byte (an unsafe.Pointer
// in an interface does not allocate, a slice would); the size is the
// list's.
var freePages [2][64]sync.Pool

// takeFree returns the memory of a freed page of size bytes (a power of
// two), or nil if the list has none. With poison, it takes a poisoned one
// and checks that nobody wrote to it after it was freed.
func takeFree(size int, poison bool) []byte {
	ptr, _ := freePages[b2i(poison)][bits.TrailingZeros(uint(size))].Get().(unsafe.Pointer)
	if ptr == nil {
		return nil
	}
	buf := unsafe.Slice((*byte)(ptr), size)
	if poison {
		checkPoisoned(buf)
	}
	return buf
}

// putFree puts buf, the whole memory of a page no one holds or can hold,
// on its free list, filled with the poison pattern if poison.
func putFree(buf []byte, poison bool) {
	if len(buf) == 0 || len(buf)&(len(buf)-1) != 0 || cap(buf) != len(buf) {
		return // not a whole page of a power-of-two size: the GC's
	}
	if poison {
		fillPoisoned(buf)
	}
	freePages[b2i(poison)][bits.TrailingZeros(uint(len(buf)))].Put(unsafe.Pointer(unsafe.SliceData(buf)))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
