package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/term"
)

// progress draws a one-line progress bar on a terminal: the share of runs
// done, the cell and round being measured and the time left, estimated
// from the mean time of the runs so far. It draws nothing when its output
// is not a terminal. It is not safe for concurrent use.
type progress struct {
	w     io.Writer
	fd    int // terminal to ask for the width, or -1
	total int // runs
	done  int
	start time.Time
	now   func() time.Time
	drawn bool
}

// newProgress returns a progress bar on stderr for total runs, or one that
// draws nothing if stderr is not a terminal.
func newProgress(total int) *progress {
	fd := int(os.Stderr.Fd())
	if !term.IsTerminal(fd) {
		return &progress{total: total, now: time.Now, start: time.Now()}
	}
	return &progress{w: os.Stderr, fd: fd, total: total, now: time.Now, start: time.Now()}
}

// Step records that a run finished.
func (p *progress) Step() { p.done++ }

// Show draws the bar for the run about to start.
func (p *progress) Show(cell string, cellN, cells, round, rounds int, side string) {
	if p.w == nil {
		return
	}
	width := 100
	if w, _, err := term.GetSize(p.fd); err == nil && w > 20 {
		width = w
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", p.line(width, cell, cellN, cells, round, rounds, side))
	p.drawn = true
}

// line renders the bar, cut to width characters.
func (p *progress) line(width int, cell string, cellN, cells, round, rounds int, side string) string {
	const barLen = 20
	frac := 0.0
	if p.total > 0 {
		frac = float64(p.done) / float64(p.total)
	}
	fill := min(barLen, int(frac*barLen))
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", barLen-fill)
	left := "?"
	if p.done > 0 {
		el := p.now().Sub(p.start)
		left = (el / time.Duration(p.done) * time.Duration(p.total-p.done)).Round(time.Second).String()
	}
	s := fmt.Sprintf("[%s] %3.0f%% cell %d/%d round %d/%d %s, %s left: %s", bar, frac*100, cellN, cells, round, rounds, side, left, cell)
	if utf8.RuneCountInString(s) > width-1 {
		r := []rune(s)
		s = string(r[:width-1])
	}
	return s
}

// Done erases the bar.
func (p *progress) Done() {
	if p.w != nil && p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
}
