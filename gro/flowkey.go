package gro

// flowKey names a flow: IP version, addresses, protocol and ports, packed in
// five words so that comparing two keys is five compares.
//
//	IPv4: a = source<<32 | destination, b = c = d = 0
//	IPv6: a, b = source; c, d = destination
//	both: e = source port<<32 | destination port<<16 | protocol<<8 | version
type flowKey struct {
	a, b, c, d, e uint64
}

// setProto sets the version and protocol, clearing the ports.
func (k *flowKey) setProto(version, proto uint8) {
	k.e = uint64(proto)<<8 | uint64(version)
}

// setPorts sets the ports from the first word of the L4 header.
func (k *flowKey) setPorts(ports uint32) {
	k.e = k.e&0xffff | uint64(ports)<<16
}

// proto returns the protocol, 0 when unknown.
func (k *flowKey) proto() uint8 { return uint8(k.e >> 8) }

// sameAddrs reports whether k and o have the same version and addresses,
// and the same protocol unless k's is unknown (0).
func (k *flowKey) sameAddrs(o *flowKey) bool {
	if k.a != o.a || k.b != o.b || k.c != o.c || k.d != o.d || uint8(k.e) != uint8(o.e) {
		return false
	}
	return k.proto() == 0 || k.proto() == o.proto()
}

// bucket returns the flow's hash bucket, 0..numBuckets-1. A NIC would hand
// up an RSS hash; this one mixes every word of the key (multiply-xorshift),
// so flows that differ only in a port spread over the buckets.
func (k *flowKey) bucket() int {
	h := k.a*0x9e3779b97f4a7c15 ^ k.b*0xc2b2ae3d27d4eb4f ^ k.c*0x165667b19e3779f9 ^
		k.d*0xd6e8feb86659fd93 ^ k.e*0xff51afd7ed558ccd
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	return int(h >> (64 - numBucketsLog2))
}
