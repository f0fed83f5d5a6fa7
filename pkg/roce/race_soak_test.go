//go:build race

package roce

// raceSoak: the race detector slows the engine ~10x, so the soak uses
// longer ACK timeouts and fewer messages by default.
const raceSoak = true
