//go:build !race

package proto

const raceOn = false
