//go:build race

package gro

const raceEnabled = true
