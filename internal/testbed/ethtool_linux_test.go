//go:build linux

package testbed

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTxChecksum turns a veth's TX checksum offload off and on again with
// SetTxChecksum and reads it back with TxChecksum; the peer keeps its own.
func TestTxChecksum(t *testing.T) {
	needRoot(t)
	a, b := newNetns(t), newNetns(t)
	if err := NewVethPair(a, b, "tbca", "tbcb", 0); err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true, false} {
		if err := a.SetTxChecksum("tbca", on); err != nil {
			t.Fatal(err)
		}
		got, err := a.TxChecksum("tbca")
		if err != nil {
			t.Fatal(err)
		}
		if got != on {
			t.Errorf("tx checksumming after SetTxChecksum(%v): got %v, want %v", on, got, on)
		}
	}
	// veth offers TX checksum offload (NETIF_F_HW_CSUM) by default.
	if got, err := b.TxChecksum("tbcb"); err != nil || !got {
		t.Errorf("peer's tx checksumming: got %v, %v; want true", got, err)
	}
	// The device is looked up in the namespace, not the caller's.
	if _, err := b.TxChecksum("tbca"); !errors.Is(err, unix.ENODEV) {
		t.Errorf("TxChecksum of a device in another namespace: got %v, want ENODEV", err)
	}
}
