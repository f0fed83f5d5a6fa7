//go:build race

package proto

// raceOn: the race detector slows the lost-wakeup stress tests tenfold.
const raceOn = true
