// Package testbed builds the plumbing that ustack's benchmarks, packet
// generators and integration tests run in: network namespaces created by
// this process, TAP devices and veth pairs inside them, and kernel sockets
// opened from inside a namespace.
//
// Everything testbed creates is confined to namespaces it made itself
// (named prefix-PID-N, see NewNetns): no default route is ever added, so
// traffic cannot leave them. Every constructor removes what it made when it
// fails, and every type has a Close that removes the rest; CleanupOnSignal
// extends that to SIGINT and SIGTERM for long-running commands.
//
// The namespace and device functions are Linux-only and need root
// (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip(8) tool from iproute2. The
// package must not import other ustack packages, so that every package can
// use it in tests.
package testbed
