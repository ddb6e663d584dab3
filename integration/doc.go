// Package integration holds ustack's end-to-end tests: a ustack stack (or
// the `ustack run` binary) on a real TAP device inside a network namespace
// the test creates, talking to the Linux kernel's own TCP, UDP and ICMP on
// the other side of the TAP.
//
// The tests need root (CAP_NET_ADMIN and CAP_SYS_ADMIN for the network
// namespaces, /dev/net/tun and TAP devices) and, for a few, the ip(8)
// tool from iproute2; without root every test skips. Run them as root with
//
//	go test ./integration/
//
// (add -v for the per-transfer throughput figures, -race as CI does).
// Traffic stays inside the namespaces the tests make: no namespace gets a
// default route, and every namespace and device is removed when its test
// ends, also when it fails. The package has no non-test code; the tests
// are Linux-only.
package integration
