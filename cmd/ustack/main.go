// Command ustack runs ustack, a userspace TCP/IP receive stack, on a TAP
// or TUN device, and measures it.
//
//	ustack run    -tap|-tun NAME -addr CIDR [flags]  serve discard, echo, iperf3, sockperf on a TAP or TUN
//	ustack bench  [flags]                       build a namespace and TAP, measure policies against the kernel
//	ustack send   -addr HOST:PORT [flags]       the bench's kernel sender (TCP bulk, UDP, request/response)
//	ustack xskgen [flags]                       send UDP from an AF_XDP-style socket through a TAP, time TX metadata
//
// Run `ustack <command> -h` for the flags of each.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// usageError is a bad command line: printed as one line, exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

// command is one subcommand of ustack: its name, its line in the help and
// the function that runs it on its arguments.
type command struct {
	name, args, summary string
	run                 func(args []string) error
}

// commands are every subcommand main dispatches to, in the order the help
// lists them.
var commands = []command{
	{"run", "-tap|-tun NAME -addr CIDR [flags]", "serve discard, echo, iperf3, sockperf on a TAP or TUN", runCmd},
	{"bench", "[flags]", "build a namespace and TAP, measure policies against the kernel", benchCmd},
	{"send", "-addr HOST:PORT [flags]", "the bench's kernel sender (TCP bulk, UDP, request/response)", sendCmd},
	{"xskgen", "[flags]", "send UDP from an AF_XDP-style socket through a TAP, time TX metadata", xskgenCmd},
}

// usage prints the help: a line per command.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ustack <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %-34s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run `ustack <command> -h` for the flags of each.")
}

// commandNames is the commands' names joined for an error message.
func commandNames() string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	os.Exit(dispatch(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
}

// dispatch runs the command named cmd on args and returns the exit status:
// 0, 1 when the command failed, 2 for a bad command line. The help goes to
// stdout, errors to stderr.
func dispatch(cmd string, args []string, stdout, stderr io.Writer) int {
	var err error
	switch cmd {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	default:
		err = usageError{fmt.Errorf("unknown command %q: want one of %s", cmd, commandNames())}
		for _, c := range commands {
			if c.name == cmd {
				err = c.run(args)
				break
			}
		}
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "ustack %s: %v\n", cmd, err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// parseFlags parses args into fs; errors become usage errors. -h prints the
// flags and returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(new(discard))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printDefaults(os.Stdout, fs)
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// printDefaults prints fs's flags as flag.PrintDefaults does, naming a
// policy switch's values as the policy table does (-rq striding|cyclic).
func printDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if e, ok := policySwitchNamed(f.Name); ok && strings.HasPrefix(f.Usage, e.help()) { // not bench -matrix's own -mtu, -lro
			name = e.values
		}
		var b strings.Builder
		fmt.Fprintf(&b, "  -%s", f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			if _, ok := f.Value.(interface{ IsBoolFlag() bool }); ok || fmt.Sprintf("%T", f.Value) != "*flag.stringValue" {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
