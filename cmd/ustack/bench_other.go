//go:build !linux

package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ustack/ustack/internal/bench"
)

func benchCmd(args []string) error {
	fmt.Fprintln(os.Stderr, "ustack bench: TAP devices need Linux: measuring over the in-memory wire")
	return bench.Mem(defaultRows(1500), 3*time.Second, 3)
}

func sendCmd([]string) error { return errors.New("send needs Linux") }
