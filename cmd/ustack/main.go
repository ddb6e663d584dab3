// Command ustack runs ustack, a userspace TCP/IP receive stack, on a TAP
// device, and measures it.
//
//	ustack run   -tap NAME -addr CIDR [flags]   serve discard/echo on a TAP
//	ustack bench [flags]                        build a namespace and TAP, measure policies
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

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ustack run|bench [flags]   (ustack <command> -h for flags)")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "run":
		err = runCmd(args)
	case "bench":
		err = benchCmd(args)
	case "send":
		err = sendCmd(args)
	case "xskgen":
		err = xskgenCmd(args)
	case "-h", "-help", "--help", "help":
		fmt.Println("usage: ustack run|bench [flags]   (ustack <command> -h for flags)")
		return
	default:
		err = usageError{fmt.Errorf("unknown command %q: want run or bench", cmd)}
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	fmt.Fprintf(os.Stderr, "ustack %s: %v\n", os.Args[1], err)
	var ue usageError
	if errors.As(err, &ue) {
		os.Exit(2)
	}
	os.Exit(1)
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
