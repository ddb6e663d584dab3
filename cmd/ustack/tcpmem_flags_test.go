package main

import "testing"

// TestPolicyTCPMem checks that -tcp-mem-limit and -tcp-mem-pressure reach
// the stack's configuration, and that a pressure past the limit is refused.
func TestPolicyTCPMem(t *testing.T) {
	p, err := policyFromSettings([]string{"tcp-mem-limit=8388608", "tcp-mem-pressure=4194304"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.finish()
	if err != nil {
		t.Fatal(err)
	}
	if c.TCPMemLimit != 8<<20 || c.TCPMemPressure != 4<<20 {
		t.Errorf("got TCPMemLimit %d, TCPMemPressure %d, want %d, %d", c.TCPMemLimit, c.TCPMemPressure, 8<<20, 4<<20)
	}
	base := basePolicy(1500)
	def, err := base.finish()
	if err != nil {
		t.Fatal(err)
	}
	if def.TCPMemLimit != 0 || def.TCPMemPressure != 0 {
		t.Errorf("defaults: TCPMemLimit %d, TCPMemPressure %d, want 0, 0", def.TCPMemLimit, def.TCPMemPressure)
	}
	for _, bad := range [][]string{{"tcp-mem-pressure=-1"}, {"tcp-mem-limit=1048576", "tcp-mem-pressure=2097152"}} {
		p, err := policyFromSettings(bad)
		if err == nil {
			_, err = p.finish()
		}
		if err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
