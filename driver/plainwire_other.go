//go:build !unix

package driver

import "io"

// newRawReader returns nil: outside Unix a device is read by a goroutine
// (queueReader).
func newRawReader(io.ReadWriteCloser) plainReader { return nil }
