package testbed

import (
	"slices"
	"sync"
	"sync/atomic"
)

// netnsCounter makes namespace labels unique within this process.
var netnsCounter atomic.Uint64

// openNetns are the namespaces NewNetns made and Close has not yet
// released, for OpenNetns.
var openNetns struct {
	mu sync.Mutex
	// +checklocks:mu
	names map[uint64]string // by netnsCounter's number
}

// trackOpen records the namespace numbered id, labelled name, as open.
func trackOpen(id uint64, name string) {
	openNetns.mu.Lock()
	defer openNetns.mu.Unlock()
	if openNetns.names == nil {
		openNetns.names = map[uint64]string{}
	}
	openNetns.names[id] = name
}

// untrackOpen records the namespace numbered id as closed.
func untrackOpen(id uint64) {
	openNetns.mu.Lock()
	defer openNetns.mu.Unlock()
	delete(openNetns.names, id)
}

// OpenNetns returns the names of the namespaces this process made (NewNetns,
// and the constructors that call it) and has not closed, sorted. A
// namespace is held by a descriptor, not a mount, so no listing outside
// the process shows one that a test forgot to close: a TestMain checks
// this instead (internal/testutil does).
func OpenNetns() []string {
	openNetns.mu.Lock()
	defer openNetns.mu.Unlock()
	var names []string
	for _, name := range openNetns.names {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
