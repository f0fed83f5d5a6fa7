//go:build race

package daemon_test

// raceOn: the race detector slows the engine tenfold (the soak widens its ACK timeout).
const raceOn = true
