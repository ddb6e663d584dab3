//go:build linux && race

package integration

// raceEnabled is true when the tests run under the race detector; the
// ustack binary is then built with -race as well.
const raceEnabled = true
