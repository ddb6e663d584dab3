//go:build !rrtrace

package rrtrace

// Mark records that an exchange reached stage s: nothing without the
// rrtrace build tag.
func Mark(Stage) {}
