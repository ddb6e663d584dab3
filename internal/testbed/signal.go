package testbed

import (
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// CleanupOnSignal arranges for closers to be closed, in reverse order, when
// the process receives SIGINT or SIGTERM, after which the process exits
// with status 128 plus the signal's number (130 for SIGINT, 143 for
// SIGTERM), as a shell reports a process killed by that signal. It is meant
// for long-running commands (benchmarks, generators) that would otherwise
// leave namespaces and devices behind when interrupted; tests use
// t.Cleanup instead.
//
// The returned stop undoes the arrangement: call it (typically deferred)
// once the closers are closed in the normal way. After stop returns the
// closers are not closed by a signal and the signals have their default
// behaviour again. stop is idempotent. Closers must be safe to close
// twice, as a signal may race with the normal shutdown; testbed's types
// are.
func CleanupOnSignal(closers ...io.Closer) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case sig := <-ch:
			signal.Stop(ch)
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i].Close()
			}
			code := 1
			if s, ok := sig.(syscall.Signal); ok {
				code = 128 + int(s)
			}
			os.Exit(code)
		case <-done:
			signal.Stop(ch)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-finished
	}
}
