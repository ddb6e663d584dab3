package bench

import (
	"errors"
	"io"
	"sync"
)

// Closers closes what was added to it, last first, once. It is the
// io.Closer handed to testbed.CleanupOnSignal before everything exists.
type Closers struct {
	mu sync.Mutex
	// +checklocks:mu
	cs []io.Closer
}

// Add adds c, to be closed before what was added earlier.
func (l *Closers) Add(c io.Closer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cs = append(l.cs, c)
}

// Close closes every closer, last added first, and forgets them.
func (l *Closers) Close() error {
	l.mu.Lock()
	cs := l.cs
	l.cs = nil
	l.mu.Unlock()
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
