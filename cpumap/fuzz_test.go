package cpumap

import (
	"bytes"
	"fmt"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// FuzzPrograms runs the built-in programs on arbitrary bytes: none may
// panic, touch the bytes, or redirect out of range, and each must give the
// same verdict twice.
func FuzzPrograms(f *testing.F) {
	for _, s := range []frameSpec{
		{}, {udp: true}, {v6: true}, {v6: true, udp: true},
		{frag: fragFirst}, {frag: fragLater, n: 8}, {v6: true, udp: true, frag: fragFirst},
		{v6: true, frag: fragLater, n: 8}, {vlans: 2}, {ipOpts: true}, {v6: true, ipOpts: true},
		{icmp: true}, {v6: true, icmp: true}, {arp: true},
	} {
		f.Add(s.frame(), uint8(4), uint16(80))
	}
	f.Fuzz(func(t *testing.T, data []byte, ncpu uint8, port uint16) {
		n := int(ncpu)%indirSize + 1
		progs := []Program{
			mustProgram(t, "pass", n),
			mustProgram(t, "drop", n),
			mustProgram(t, fmt.Sprint("cpu:", n-1), n),
			mustProgram(t, "hash", n),
			mustProgram(t, fmt.Sprint("drop-port:", port), n),
			mustProgram(t, fmt.Sprint("xsk:", port), n),
		}
		p := packetOf(data)
		defer p.Release()
		orig := bytes.Clone(p.Linear)
		for _, prog := range progs {
			a, e := prog.Run(p.Linear)
			if a > RedirectXSK {
				t.Fatalf("%v: got action %d", prog, a)
			}
			if a == Redirect && (e < 0 || e >= n) {
				t.Fatalf("%v: got entry %d, want 0..%d", prog, e, n-1)
			}
			if a2, e2 := prog.Run(p.Linear); a2 != a || e2 != e {
				t.Fatalf("%v: got %v %d, then %v %d", prog, a, e, a2, e2)
			}
			if !bytes.Equal(p.Linear, orig) {
				t.Fatalf("%v changed the frame", prog)
			}
		}

		// xsk:P redirects exactly what drop-port:P drops.
		if d, _ := progs[4].Run(p.Linear); (d == Drop) != (first(progs[5].Run(p.Linear)) == RedirectXSK) {
			t.Fatalf("drop-port:%d says %v, xsk:%d disagrees", port, d, port)
		}

		// parseFlow's offsets stay sane.
		var fl flow
		if parseFlow(p.Linear, &fl) {
			if fl.l3 < header.EthernetMinimumSize || fl.l3 > len(p.Linear) {
				t.Fatalf("got l3 %d, frame of %d bytes", fl.l3, len(p.Linear))
			}
			if fl.l4 >= 0 && fl.l4 <= fl.l3 {
				t.Fatalf("got l4 %d at or before l3 %d", fl.l4, fl.l3)
			}
			if fl.later && !fl.frag {
				t.Fatal("got a later fragment that is not a fragment")
			}
		}
	})
}

func first(a Action, _ int) Action { return a }
