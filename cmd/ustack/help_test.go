package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpListsEveryCommand checks that `ustack -h` gives a line, with a
// summary, to every command the dispatcher runs, and that the dispatcher's
// table holds every xxxCmd function of the package (a command written but
// not wired in, or wired in but not listed, fails).
func TestHelpListsEveryCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch("-h", nil, &out, &errOut); code != 0 {
		t.Fatalf("ustack -h: exit status %d, stderr %q", code, errOut.String())
	}
	lines := map[string]string{}
	for line := range strings.SplitSeq(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  ") {
			lines[f[0]] = line
		}
	}
	for _, c := range commands {
		line, ok := lines[c.name]
		if !ok {
			t.Errorf("ustack -h has no line for %q:\n%s", c.name, out.String())
			continue
		}
		if c.summary == "" || !strings.Contains(line, c.summary) {
			t.Errorf("ustack -h line for %q has no summary: %q", c.name, line)
		}
	}

	// Every func fooCmd(args []string) error in the package is a command.
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasSuffix(fd.Name.Name, "Cmd") && fd.Name.Name != "Cmd" {
				funcs[strings.TrimSuffix(fd.Name.Name, "Cmd")] = true
			}
		}
	}
	// Modes of a command, reached through its flags, not the dispatcher.
	known := map[string]bool{"matrix": true} // ustack bench -matrix
	for _, c := range commands {
		known[c.name] = true
	}
	for name := range funcs {
		if !known[name] {
			t.Errorf("%sCmd is not in commands: the dispatcher cannot run it and -h does not list it", name)
		}
		if _, ok := lines[name]; !ok && name != "matrix" {
			t.Errorf("ustack -h does not list %q", name)
		}
	}
	if len(funcs) < 4 {
		t.Errorf("found %d xxxCmd functions, want at least run, bench, send, xskgen", len(funcs))
	}
}

// TestUnknownCommand checks that an unknown command is a usage error
// (status 2) naming every command.
func TestUnknownCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch("nosuch", nil, &out, &errOut); code != 2 {
		t.Fatalf("ustack nosuch: exit status %d, want 2", code)
	}
	for _, c := range commands {
		if !strings.Contains(errOut.String(), c.name) {
			t.Errorf("unknown-command error %q does not name %q", errOut.String(), c.name)
		}
	}
}
