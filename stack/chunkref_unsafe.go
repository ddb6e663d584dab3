package stack

import (
	"reflect"
	"sync/atomic"
	"unsafe"

	"gvisor.dev/gvisor/pkg/buffer"
)

// This file holds zero copy's two uses of unsafe: a slice's address, for
// viewMemory's index, and the reference count of a gVisor buffer chunk,
// which gVisor keeps private.

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// chunkRefs reads the reference count of v's chunk: the pool must know
// whether gVisor still holds a lent page before the NIC writes into it
// again. The field offsets come from reflect, and are checked once against
// a chunk whose count is known; if gVisor's layout ever changes, ok is
// false, New logs it, and zero copy copies every frag instead of lending it
// (zc_frags_copied_layout).
func chunkRefs(v *buffer.View) (n int64, ok bool) {
	if !refsLayout.ok {
		return 0, false
	}
	c := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(v), refsLayout.chunk))
	if c == nil {
		return 0, false
	}
	// The low 32 bits are the real references (the high ones speculative).
	return atomic.LoadInt64((*int64)(unsafe.Add(c, refsLayout.refs))) & 0xffffffff, true
}

// chunkLayout is where the chunk pointer sits in a buffer.View, and the
// 64-bit count in a chunk.
type chunkLayout struct {
	chunk, refs uintptr
	ok          bool
}

// refsLayout is buffer.View's layout, found at init. Tests may clear ok, to
// play a gVisor whose layout is not recognised, while no stack runs.
var refsLayout = checkedLayout()

// checkedLayout finds buffer.View's layout and checks it: a new chunk has
// 1 reference, a clone makes 2.
func checkedLayout() chunkLayout {
	l := layoutOf(reflect.TypeFor[buffer.View]())
	if !l.ok {
		return l
	}
	v := buffer.NewViewSize(64)
	c := v.Clone()
	n2 := l.read(v)
	c.Release()
	n1 := l.read(v)
	v.Release()
	if n2 != 2 || n1 != 1 {
		l.ok = false
	}
	return l
}

// read is chunkRefs for a layout not yet checked.
func (l chunkLayout) read(v *buffer.View) int64 {
	c := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(v), l.chunk))
	if c == nil {
		return 0
	}
	return atomic.LoadInt64((*int64)(unsafe.Add(c, l.refs))) & 0xffffffff
}

// layoutOf finds, in a type laid out as buffer.View, the offset of the
// pointer field chunk and, in the struct it points to, of the int64
// refCount.value. ok is false if any of it is missing.
func layoutOf(vt reflect.Type) chunkLayout {
	if vt.Kind() != reflect.Struct {
		return chunkLayout{}
	}
	cf, ok := vt.FieldByName("chunk")
	if !ok || cf.Type.Kind() != reflect.Pointer || cf.Type.Elem().Kind() != reflect.Struct {
		return chunkLayout{}
	}
	off, ok := fieldOffset(cf.Type.Elem(), "refCount", "value")
	if !ok {
		return chunkLayout{}
	}
	return chunkLayout{chunk: cf.Offset, refs: off, ok: true}
}

// fieldOffset returns the offset of the int64 t.outer.inner, following
// embedded fields.
func fieldOffset(t reflect.Type, outer, inner string) (uintptr, bool) {
	of, ok := t.FieldByName(outer)
	if !ok {
		return 0, false
	}
	off := uintptr(0)
	for i := range of.Index {
		f := t.FieldByIndex(of.Index[:i+1])
		off += f.Offset
	}
	if of.Type.Kind() != reflect.Struct {
		return 0, false
	}
	inf, ok := of.Type.FieldByName(inner)
	if !ok || inf.Type.Kind() != reflect.Int64 || len(inf.Index) != 1 {
		return 0, false
	}
	return off + inf.Offset, true
}
