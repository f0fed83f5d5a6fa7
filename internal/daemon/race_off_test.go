//go:build !race

package daemon_test

const raceOn = false
