package daemon

// SetRecvRefillDisabled turns the RecvRefill hook of every session's QPs off (a test knob:
// TestPostRecvVisible shows what the hook fixes).
func SetRecvRefillDisabled(off bool) { recvRefillOff.Store(off) }
