package cpumap

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/ustack/ustack/internal/rss"
)

// Action is a Program's verdict on a frame, as an XDP program's return code.
type Action uint8

// Actions.
const (
	// Pass hands the frame up on the poll loop (XDP_PASS).
	Pass Action = iota
	// Drop releases the frame (XDP_DROP).
	Drop
	// TX sends the frame back out of the port it came from (XDP_TX).
	TX
	// Redirect moves the frame to a cpumap entry (XDP_REDIRECT into a
	// BPF_MAP_TYPE_CPUMAP).
	Redirect
	// RedirectXSK copies the frame into the AF_XDP socket bound to the
	// receive queue and releases it (XDP_REDIRECT into a
	// BPF_MAP_TYPE_XSKMAP: bpf_redirect_map(&xsks, rx_queue_index,
	// XDP_PASS)). With no socket bound the frame passes, as that call's
	// XDP_PASS fallback makes it.
	RedirectXSK
)

var actionNames = [...]string{Pass: "pass", Drop: "drop", TX: "tx", Redirect: "redirect", RedirectXSK: "redirect-xsk"}

// String returns the action's name: "pass", "drop", "tx", "redirect" or
// "redirect-xsk".
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Program decides what happens to one frame, in the poll loop, before a
// packet is built for it, as an XDP program runs on the xdp_buff. It sees
// the frame's bytes from the Ethernet header on (data to data_end: the
// whole frame in its RX stride on the linear RQ, the first buffer's header
// copy of a multi-buffer frame) and may rewrite bytes in place; it borrows
// data for the call only. For
// Redirect it returns the target entry: an index into the Map's CPU list,
// not an OS CPU number. Run is called from the poll loops' goroutines, one
// per receive queue, possibly at once: it must be safe for concurrent use
// (the built-in programs only read their tables), must not allocate, and
// must not panic whatever the bytes.
type Program interface {
	Run(data []byte) (Action, int)
}

// Limits of the built-in programs.
const (
	// indirSize is the size of the hash program's indirection table, as
	// a NIC's RSS table: an entry is indir[hash % indirSize], filled
	// round robin (ethtool_rxfh_indir_default). It is also the most
	// entries the hash program spreads over.
	indirSize = 128
	maxPort   = 65535
)

// ParseProgram returns the built-in program called name, for a map of ncpu
// entries (0 when there is no cpumap):
//
//	pass          every frame passes
//	drop          every frame is dropped
//	cpu:N         every frame goes to entry N (0 <= N < ncpu)
//	hash          a Toeplitz flow hash (RSS's) over the IPv4 or IPv6
//	              addresses, protocol and TCP/UDP ports picks the entry,
//	              through a 128-slot indirection table; fragments hash on
//	              the addresses only, frames that are not IP go to entry 0
//	drop-port:P   TCP and UDP frames to destination port P are dropped,
//	              the rest pass (0 <= P <= 65535)
//	xsk:P         TCP and UDP frames to destination port P go to the
//	              receive queue's AF_XDP socket (RedirectXSK), the rest
//	              pass (0 <= P <= 65535)
//
// The returned programs are safe for concurrent use by several poll loops.
func ParseProgram(name string, ncpu int) (Program, error) { return ParseProgramLink(name, ncpu, false) }

// ParseProgramLink is ParseProgram for frames that start at their IP
// header when l3 is set: a TUN's, on which the kernel runs XDP as generic
// XDP over an ARPHRD_NONE device, whose program sees the network header
// first. Programs that read no header are the same either way.
func ParseProgramLink(name string, ncpu int, l3 bool) (Program, error) {
	switch {
	case name == "pass":
		return passProgram{}, nil
	case name == "drop":
		return dropProgram{}, nil
	case name == "hash":
		if ncpu < 1 || ncpu > indirSize {
			return nil, programError(name, ncpu, fmt.Sprintf("needs 1 to %d cpumap entries, have %d", indirSize, ncpu))
		}
		h := newHashProgram(ncpu)
		h.l3 = l3
		return h, nil
	}
	if s, ok := strings.CutPrefix(name, "cpu:"); ok {
		n, err := strconv.ParseUint(s, 10, 31)
		if err != nil || int(n) >= ncpu {
			return nil, programError(name, ncpu, "entry out of range")
		}
		return cpuProgram(n), nil
	}
	if s, ok := strings.CutPrefix(name, "drop-port:"); ok {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return nil, programError(name, ncpu, "port out of range")
		}
		return dropPortProgram{uint16(n), l3}, nil
	}
	if s, ok := strings.CutPrefix(name, "xsk:"); ok {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return nil, programError(name, ncpu, "port out of range")
		}
		return xskPortProgram{uint16(n), l3}, nil
	}
	return nil, programError(name, ncpu, "unknown program")
}

func programError(name string, ncpu int, why string) error {
	cpu := "cpu:N (0 <= N < ncpu)"
	if ncpu > 0 {
		cpu = fmt.Sprintf("cpu:N (0 <= N < %d)", ncpu)
	}
	return fmt.Errorf("xdp program %q: %s; want pass, drop, %s, hash, drop-port:P or xsk:P (0 <= P <= %d)", name, why, cpu, maxPort)
}

type passProgram struct{}

func (passProgram) Run([]byte) (Action, int) { return Pass, 0 }
func (passProgram) String() string           { return "pass" }

type dropProgram struct{}

func (dropProgram) Run([]byte) (Action, int) { return Drop, 0 }
func (dropProgram) String() string           { return "drop" }

// cpuProgram redirects every frame to one entry.
type cpuProgram int

func (c cpuProgram) Run([]byte) (Action, int) { return Redirect, int(c) }
func (c cpuProgram) String() string           { return "cpu:" + strconv.Itoa(int(c)) }

// dropPortProgram drops TCP and UDP frames to one destination port. A
// fragment after the first, which carries no ports, passes.
type dropPortProgram struct {
	port uint16
	l3   bool // frames start at the IP header
}

func (d dropPortProgram) Run(b []byte) (Action, int) {
	if toPort(b, d.port, d.l3) {
		return Drop, 0
	}
	return Pass, 0
}

// toPort reports whether the frame b (from its IP header with l3) is TCP
// or UDP to destination port.
func toPort(b []byte, port uint16, l3 bool) bool {
	var f flow
	return parseFlowLink(b, &f, l3) && f.ports(b) && binary.BigEndian.Uint16(b[f.l4+2:]) == port
}

func (d dropPortProgram) String() string { return "drop-port:" + strconv.Itoa(int(d.port)) }

// xskPortProgram sends TCP and UDP frames to one destination port to the
// AF_XDP socket, as xdpsock's filtering programs do; the rest, fragments
// after the first among them, pass.
type xskPortProgram struct {
	port uint16
	l3   bool // frames start at the IP header
}

func (x xskPortProgram) Run(b []byte) (Action, int) {
	if toPort(b, x.port, x.l3) {
		return RedirectXSK, 0
	}
	return Pass, 0
}

func (x xskPortProgram) String() string { return "xsk:" + strconv.Itoa(int(x.port)) }

// hashProgram spreads flows over entries as RSS spreads them over queues.
type hashProgram struct {
	n     int
	l3    bool       // frames start at the IP header
	t     *rss.Table // rss.Default: RSS's Toeplitz hash with its example key
	indir [indirSize]uint8
}

func newHashProgram(n int) *hashProgram {
	h := &hashProgram{n: n, t: rss.Default()}
	for i := range h.indir {
		h.indir[i] = uint8(i % n)
	}
	return h
}

func (h *hashProgram) String() string { return "hash" }

func (h *hashProgram) Run(b []byte) (Action, int) {
	var f flow
	if !parseFlowLink(b, &f, h.l3) {
		return Redirect, 0
	}
	return Redirect, int(h.indir[h.hash(b, &f)%indirSize])
}

// hash returns the flow hash of the IP frame b, parsed into f. Only the
// addresses are hashed for a fragment (the ports are in the first one
// only), and the addresses and protocol when the transport header is not in
// b or is neither TCP nor UDP. The Toeplitz input, after RSS's:
//
//	IPv4: src(4) dst(4) sport(2) dport(2) proto(1)       13 bytes
//	IPv6: src(16) dst(16) sport(2) dport(2) proto(1)     37 bytes
//
// The protocol byte, which RSS does not hash, comes last so that the hash is
// RSS's 4-tuple hash (rss.Table.Hash, the NIC's) XORed with a constant per
// protocol.
func (h *hashProgram) hash(b []byte, f *flow) uint32 {
	var v uint32
	alen, pos := 4, 0 // address length; input position of the ports
	src := f.l3 + 12
	if f.v6 {
		alen, src = 16, f.l3+8
	}
	if len(b) < src+2*alen { // parseFlow checked; keep the compiler's view simple
		return 0
	}
	v = h.t.Bytes(0, b[src:src+2*alen])
	pos = 2 * alen
	if f.frag || f.l4 < 0 {
		return v
	}
	if f.ports(b) {
		v ^= h.t.Bytes(pos, b[f.l4:f.l4+4])
	}
	return v ^ h.t.Byte(pos+4, f.proto)
}
