//go:build !linux

package xsk

// threadCPU returns -1: no per-thread CPU clock here.
func threadCPU() int64 { return -1 }
