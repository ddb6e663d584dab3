package driver

import "unsafe"

func ptr(p *uint32) unsafe.Pointer { return unsafe.Pointer(p) }
