// Package testbed builds the plumbing that ustack's benchmarks, packet
// generators and integration tests run in: network namespaces created by
// this process, TAP devices and veth pairs inside them, and kernel sockets
// opened from inside a namespace.
//
// Everything testbed creates is confined to namespaces it made itself
// (labelled prefix-PID-N, see NewNetns): no default route is ever added, so
// traffic cannot leave them. The namespaces are held by descriptors, not
// mounted, so the kernel frees them, with their devices, when the process
// dies, even by SIGKILL. Every constructor removes what it made when it
// fails, and every type has a Close that removes the rest; CleanupOnSignal
// extends that to SIGINT and SIGTERM for long-running commands, and
// OpenNetns lets a TestMain check that tests closed theirs.
//
// Devices, addresses and routes are made over netlink
// (github.com/vishvananda/netlink), TAP devices with /dev/net/tun ioctls;
// Netns.Exec starts programs in a namespace by re-executing the binary
// (see Exec). The namespace and device functions are Linux-only and need
// root (CAP_NET_ADMIN and CAP_SYS_ADMIN); only Netns.IP and Netns.Output
// run the ip(8) tool, for callers that want it. The package must not
// import other ustack packages, so that every package can use it in tests.
package testbed
