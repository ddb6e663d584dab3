//go:build !linux

package main

import (
	"errors"
	"fmt"
	"os"
	"time"
)

func benchCmd(args []string) error {
	fmt.Fprintln(os.Stderr, "ustack bench: TAP devices need Linux: measuring over the in-memory wire")
	return benchMem(3*time.Second, 3, 1500)
}

func sendCmd([]string) error { return errors.New("send needs Linux") }
