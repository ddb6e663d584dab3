package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	p := &progress{total: 10, start: start, now: func() time.Time { return now }}
	if got := p.line(200, "TCP 64-Kbyte, core same", 1, 5, 1, 2, "A"); !strings.Contains(got, "cell 1/5 round 1/2 A, ? left") || !strings.HasPrefix(got, "[                    ]   0%") {
		t.Errorf("before the first run: %q", got)
	}
	// 4 runs in 20 s: 6 left take 30 s.
	for range 4 {
		p.Step()
	}
	now = start.Add(20 * time.Second)
	got := p.line(200, "TCP 64-Kbyte, core same", 3, 5, 2, 2, "B")
	want := "[========            ]  40% cell 3/5 round 2/2 B, 30s left: TCP 64-Kbyte, core same"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := p.line(30, "TCP 64-Kbyte, core same", 3, 5, 2, 2, "B"); len([]rune(got)) != 29 {
		t.Errorf("cut to width 30: got %d runes: %q", len([]rune(got)), got)
	}
}

func TestProgressOffWithoutTerminal(t *testing.T) {
	// A progress bar with no writer (stderr not a terminal) draws nothing.
	p := &progress{total: 3, start: time.Now(), now: time.Now}
	p.Show("cell", 1, 1, 1, 1, "A")
	p.Done()
	var b bytes.Buffer
	p = &progress{w: &b, fd: -1, total: 3, start: time.Now(), now: time.Now}
	p.Show("cell", 1, 1, 1, 1, "A")
	p.Done()
	if out := b.String(); !strings.HasPrefix(out, "\r\x1b[K[") || !strings.HasSuffix(out, "\r\x1b[K") {
		t.Errorf("on a terminal: got %q, want the bar drawn and erased", out)
	}
}
