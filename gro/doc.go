// Package gro will hold ustack's standalone GRO engine: TCP over IPv4 and
// IPv6 and UDP with the kernel's flush rules, not tied to a poll loop, so
// that the driver's poll loop and cpumap workers can each own an instance
// (seeds 000 and 004). Until it lands, the receive path hands every frame to
// gVisor on its own.
package gro
