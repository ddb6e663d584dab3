package bench

import (
	"errors"

	"github.com/ustack/ustack/driver"
	"github.com/ustack/ustack/internal/testbed"
	"github.com/ustack/ustack/stack"
)

// openWire opens the bed's TAP as the wire of a stack with cfg: ustack's
// own TAP code with the virtio-net header and offloads, or, for a policy
// with a plain wire (-wire plain), water's bare frames without offloads.
// It waits for the link as bed.Open does; on error whatever it opened is
// closed. queues > 0 opens that many queues of the bed's multi-queue
// device, the first as cfg.Wire and the rest as cfg.Queues.
func openWire(bed *testbed.TAPBed, p Policy, cfg *stack.Config, queues int) error {
	var w driver.Wire
	if queues > 0 {
		if !bed.MultiQueue || p.PlainWire() {
			return errors.New("queues need a multi-queue bed and ustack's own TAP code")
		}
		var qs []*driver.TAP
		err := bed.Open(func() (err error) {
			qs, err = driver.OpenTAPQueues(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, TUN: bed.TUN}, queues)
			return err
		})
		if err != nil {
			for _, q := range qs {
				q.Close()
			}
			return err
		}
		cfg.Wire = qs[0]
		for _, q := range qs[1:] {
			cfg.Queues = append(cfg.Queues, q)
		}
		return nil
	}
	err := bed.Open(func() (err error) {
		if p.PlainWire() && bed.TUN {
			return errors.New("the plain wire (water) is a TAP's, not a TUN's")
		}
		if p.PlainWire() {
			var pw *driver.PlainWire
			pw, err = driver.OpenWater(bed.TAPName, driver.MaxFrameLen(cfg.Driver.MTU))
			if err == nil {
				w = pw
			}
			return err
		}
		var tap *driver.TAP
		// A VXLAN tunnel's super-frames come whole through a TAP with
		// UDP tunnel GSO.
		tap, err = driver.OpenTAP(driver.TAPConfig{Name: bed.TAPName, VnetHdr: true, Offloads: true, TUN: bed.TUN, UDPTunnel: cfg.VXLAN != nil})
		if err == nil {
			w = tap
		}
		return err
	})
	if err != nil {
		if w != nil {
			w.Close()
		}
		return err
	}
	cfg.Wire = w
	return nil
}
