// Package bench measures ustack for `ustack bench`: it builds the receiver
// of a bench row (ustack's stack with a Policy, or gVisor's stock fdbased
// endpoint) on a testbed TAP, runs the kernel sender against it in the
// TAP's namespace and turns what both report into tables; and it runs
// the header-copy patch's test matrix (Matrix: cells of workload x core x MTU x LRO x
// tunnel, policies A and B and the peers interleaved in each) with its
// text, JSON, CSV and plot reports and its progress bar.
//
// cmd/ustack keeps the command line: it parses the flags and the policy
// switches, builds the rows (a Policy is its parsed switches behind a small
// interface, and ParsePolicy turns the matrix's name=value settings into
// one), and loops over rounds and rows. The sender is `ustack send`: the
// bench re-executes the ustack binary whose path the command passes in
// (exe, MatrixConfig.Exe) inside the namespace, and reads its SendResult.
//
// Threading: every function runs one measurement at a time on the caller's
// goroutine. While a run lasts, the receiver's readers (discard servers,
// pinned sink goroutines) and the page-pool sampler run on goroutines of
// their own, joined before the run returns; the sender is a child process
// (in the matrix, killed if this one dies). Output goes to stdout (tables, reports) and
// stderr (progress, per-run lines).
//
// Imports: stack, driver and internal/testbed, gonum.org/v1/plot for the
// matrix's plot and golang.org/x/term for the progress bar; nothing imports
// it but cmd/ustack, and it imports nothing of cmd. Only the measuring
// needs Linux and root (*_linux.go); the rows' model, the tables, the
// matrix's report, plot and progress bar and the in-memory bench (Mem) are
// OS-neutral.
package bench
