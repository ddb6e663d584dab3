package stack

import "syscall"

// errNoNet is what gVisor's ErrNoNet maps to: Linux's ENONET ("machine is
// not on the network"), as TranslateNetstackError has it.
const errNoNet = syscall.ENONET
