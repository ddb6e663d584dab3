package xsk

import "unsafe"

// unsafeSizeofDesc is sizeof(Desc), pinned to sizeof(struct xdp_desc).
func unsafeSizeofDesc() uintptr { return unsafe.Sizeof(Desc{}) }
