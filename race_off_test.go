//go:build !race

package tide_test

// raceOn: the race detector is on; it adds allocations of its own.
const raceOn = false
