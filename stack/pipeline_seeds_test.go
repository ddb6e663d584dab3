package stack

// pipeSeeds returns FuzzPipeline's seed inputs: for every configuration,
// valid frames of each template kind with the virtio-net headers a kernel
// sender writes (each checksum mode), and valid frames a hostile or odd
// sender may write: Ethernet padding after the IP packet, IP fragments and
// datagrams for another host to the TrainConns' ports, a USO super-frame of
// one-byte datagrams, a raw frame, a mutated frame.
func pipeSeeds() [][]byte {
	tm := func(kind, flags, dst uint8, size, size2 uint16) pipeTmpl {
		return pipeTmpl{kind: kind, flags: flags, dst: dst, size: size, size2: size2}
	}
	port := func(i uint8) uint8 { return i << 2 } // pipePorts[i]
	const (
		v6      = 1
		ooo     = 4
		flag3   = 8
		tcpFIN  = 1 << 5
		csumNC  = 1 // NEEDS_CSUM
		csumDV  = 2 // DATA_VALID
		foreign = 2
		bcast   = 1
		inner   = 3
	)
	with := func(t pipeTmpl, f func(*pipeTmpl)) pipeTmpl { f(&t); return t }
	sets := []struct {
		conn uint8
		ts   []pipeTmpl
	}{
		{0, []pipeTmpl{ // datagrams to every socket, each checksum mode
			tm(tmplUDP, 0, port(0), 100, 0),
			with(tm(tmplUDP, v6, port(1), 1000, 0), func(t *pipeTmpl) { t.csum = csumNC }),
			with(tm(tmplUDPBurst, 0, port(2), 500, 2), func(t *pipeTmpl) { t.csum = csumDV }),
			tm(tmplUDPBurst, v6|2, port(3), 200, 1),
			with(tm(tmplUDP, 0x10, port(4), 1400, 0), func(t *pipeTmpl) { t.csum = csumNC }),
			tm(tmplUDP, 0, port(5), 50, 0),
			tm(tmplUDP, 0, port(0)|bcast, 60, 0),
			tm(tmplUDP, v6, port(1)|bcast, 70, 0),
		}},
		{0, []pipeTmpl{ // USO super-frames
			tm(tmplUDPGSO, 0, port(1), 8000, 1000),
			tm(tmplUDPGSO, v6, port(0), 3000, 1200),
			tm(tmplUDPGSO, 0x20, port(3), 6400, 100),
			tm(tmplUDPGSO, 0, port(4), 5000, 1472),
		}},
		{0, []pipeTmpl{ // fragments to the gVisor socket
			tm(tmplUDPFrag, 0, port(0), 3000, 184),
			tm(tmplUDPFrag, v6, port(0), 2000, 153),
			tm(tmplUDPFrag, flag3, port(0), 1000, 50),
		}},
		{0, []pipeTmpl{ // a connection over IPv4, copied reads
			tm(tmplTCP, 0, 0, 1000, 0),
			with(tm(tmplTCP, 0, 0, 1200, 0), func(t *pipeTmpl) { t.csum = csumNC }),
			tm(tmplTCPGSO, 0, 0, 20000, 1200),
			with(tm(tmplTCP, ooo, 0, 500, 30000), func(t *pipeTmpl) { t.csum = csumDV }),
			tm(tmplTCP, tcpFIN, 0, 100, 0),
		}},
		{connV6 | connViews | connSmall, []pipeTmpl{ // IPv6, zero-copy reads, zero windows
			tm(tmplTCPGSO, 0, 0, 60000, 1200),
			tm(tmplTCPGSO, 0, 0, 30000, 1000),
			tm(tmplTCP, 0, 0, 1200, 0),
		}},
		{connNoTS, []pipeTmpl{ // through the tunnel
			tm(tmplTunnel, 0, port(0)|inner, 500, 0),
			with(tm(tmplTunnel, v6, port(1)|inner, 800, 0), func(t *pipeTmpl) { t.csum = csumNC }),
			tm(tmplTunnel, flag3|v6, 0, 900, 0),
			tm(tmplTCP, flag3, 0, 300, 0),
		}},
		{0, []pipeTmpl{ // Ethernet padding after the IP packet
			with(tm(tmplUDP, 0, port(1), 18, 0), func(t *pipeTmpl) { t.pad = 28 }),
			with(tm(tmplUDP, 0, port(0), 10, 0), func(t *pipeTmpl) { t.pad = 36 }),
			with(tm(tmplUDPGSO, 0, port(4), 300, 100), func(t *pipeTmpl) { t.pad = 40 }),
		}},
		{0, []pipeTmpl{ // fragments, and datagrams to another host, at the TrainConns
			tm(tmplUDPFrag, 0, port(1), 3000, 184),
			tm(tmplUDPFrag, v6, port(2), 3000, 184),
			tm(tmplUDP, 0, port(3)|foreign, 200, 0),
			tm(tmplUDP, v6, port(1)|foreign, 300, 0),
		}},
		{0, []pipeTmpl{ // a USO super-frame of one-byte datagrams
			tm(tmplUDPGSO, 0, port(1), 60000, 1),
			tm(tmplUDPGSO, v6, port(0), 60000, 1),
		}},
		{0, []pipeTmpl{ // a raw frame, mutated frames, random headers
			{kind: tmplRaw, raw: []byte{0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 192, 0, 2, 1, 0x75, 0x30, 0x1b, 0x59, 0, 8, 0, 0}},
			with(tm(tmplUDP, 0, port(0), 300, 0), func(t *pipeTmpl) { t.muts = [][4]byte{{0, 0, 17, 0x40}}; t.trunc = 0x40 }),
			with(tm(tmplUDP, 0, port(1), 300, 0), func(t *pipeTmpl) {
				t.vnet = 3
				t.vraw = [10]byte{2, 5, 0, 0, 50, 0, 34, 0, 6, 0}
			}),
		}},
	}
	var out [][]byte
	for ci := range pipeConfigs {
		for _, s := range sets {
			out = append(out, encodePipeInput(pipeInputHdr{config: uint8(ci), conn: s.conn}, s.ts))
		}
	}
	return out
}
