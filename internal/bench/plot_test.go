package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteMatrixPlot(t *testing.T) {
	dir := t.TempDir()
	for name, magic := range map[string][]byte{"m.png": []byte("\x89PNG\r\n\x1a\n"), "m.svg": []byte("<?xml")} {
		path := filepath.Join(dir, name)
		if err := writeMatrixPlot(path, fakeReport()); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, magic) || len(b) < 1000 {
			t.Errorf("%s: %d bytes starting %q, want a picture starting %q", name, len(b), b[:min(len(b), 8)], magic)
		}
	}
	if err := writeMatrixPlot(filepath.Join(dir, "m.gif"), fakeReport()); err == nil {
		t.Error("m.gif: no error")
	}
	empty := fakeReport()
	for _, c := range empty.Cells {
		c.Skip = "skipped"
	}
	if err := writeMatrixPlot(filepath.Join(dir, "e.png"), empty); err == nil {
		t.Error("nothing measured: no error")
	}
}

func TestCellTicks(t *testing.T) {
	rep := fakeReport()
	// Both TCP cells differ in MTU only... and the proto; ticks are per
	// protocol, so take the two cells of one protocol by hand.
	cells := []*matrixCellResult{rep.Cells[0], rep.Cells[3]}
	got := cellTicks(cells)
	if got[0] != "tunnel off" || got[1] != "tunnel on" {
		t.Errorf("got %q, want the tunnel only", got)
	}
	if got := cellTicks(cells[:1]); got[0] != "MTU 1500" {
		t.Errorf("one cell: got %q, want the MTU", got)
	}
}
