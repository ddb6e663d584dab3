//go:build !race

package testutil

// RaceEnabled is true when the tests run under the race detector, whose
// runtime allocates: zero-allocation tests skip then.
const RaceEnabled = false
