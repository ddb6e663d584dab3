//go:build !race

package cpumap

const raceEnabled = false
