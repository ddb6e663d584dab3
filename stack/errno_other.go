//go:build !linux

package stack

import "syscall"

// errNoNet is what gVisor's ErrNoNet maps to. Systems without Linux's
// ENONET get the nearest errno they have.
const errNoNet = syscall.ENETUNREACH
