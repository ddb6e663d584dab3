package testutil

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestOnlyTestsImport checks that no package's non-test code imports
// testutil, but stack/stacktest (itself test code): the tests' helpers
// stay out of every binary and library.
func TestOnlyTestsImport(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "github.com/ustack/ustack/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/ustack/ustack/internal/testutil"
	allowed := map[string]bool{"github.com/ustack/ustack/stack/stacktest": true}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if imp == self && !allowed[fields[0]] {
				t.Errorf("%s imports %s outside its tests", fields[0], self)
			}
		}
	}
}
