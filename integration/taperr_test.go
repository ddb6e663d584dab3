//go:build linux

package integration

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRunTAPDeleted deletes the TAP under a running `ustack run`: the
// TAP's reads then fail (EBADFD: tun_chr_read_iter finds the tun_file
// detached from its device), which stops receive for good. ustack must
// not sit there deaf: it logs the error, prints its final counters with
// rx_wire_errors 1 and exits 1.
func TestRunTAPDeleted(t *testing.T) {
	needRoot(t)
	r, _, stdout, stderr, exited := startRunBinary(t, "usit-taperr", "-discard", ":9")
	if err := r.bed.NS.IP("link", "del", "dev", r.bed.TAPName); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("ustack run still running 60 s after its TAP was deleted; stderr:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: got %v, want exit status 1; stderr:\n%s", err, stderr.String())
	}
	t.Logf("stderr:\n%s", stderr.String())
	for _, want := range []string{"wire read failed", "receive stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if v, ok := finalCounter(stdout.String(), "rx_wire_errors"); !ok || v != 1 {
		t.Errorf("final rx_wire_errors: got %d (found %v), want 1; stdout:\n%s", v, ok, stdout.String())
	}
}
