//go:build race

package xsk

const raceEnabled = true
