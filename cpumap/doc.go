// Package cpumap will hold XDP-style verdicts and cpumap redirection of
// frames, in bulks of 8, to per-CPU workers that each run their own GRO
// instance (seed 004). It is empty until that work lands.
package cpumap
