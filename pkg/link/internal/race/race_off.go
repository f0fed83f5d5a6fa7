//go:build !race

package race

// Sent marks a send; without the race detector it does nothing.
func Sent() {}

// Received marks a receive; without the race detector it does nothing.
func Received() {}
