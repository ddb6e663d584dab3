//go:build !linux

package main

import "errors"

func xskgenCmd([]string) error {
	return errors.New("xskgen needs Linux (TAP devices and network namespaces)")
}
