// Package serve holds the applications that run on a ustack stack: the
// TCP and UDP discard (RFC 863) and echo (RFC 862) servers, and the
// server side of the iperf3 protocol, so that an unmodified iperf3 client
// measures the stack. They use only the stack's public API (stack.Stack's
// sockets, stack.TCPConn's reads and counters); stack does not import
// this package.
//
// Every server is safe for concurrent use and returns once its listener
// is closed (or, for iperf3, once Close is called), after every
// connection handler it started has ended. What a server holds is bounded
// whatever peers open (Config, IPerf3Config). The servers' counters
// (refusals, timeouts, buffers held) are in a Stats the caller passes in
// the configuration and reads with Stats.EachCounter, next to the stack's
// own (stack.Stack.EachCounter).
package serve
