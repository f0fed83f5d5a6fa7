package daemon

// SetRecvRefillDisabled turns the RecvRefill hook of every session's QPs off (a test knob:
// TestPostRecvVisible shows what the hook fixes).
func SetRecvRefillDisabled(off bool) { recvRefillOff.Store(off) }

// PauseDrainers makes the server's post-ring drainers ignore doorbells: a post in a ring then
// reaches the engine only through the RecvRefill hook or a later socket request.
func (s *Server) PauseDrainers(on bool) { s.drainPaused.Store(on) }

// SetAcceptBackoffHook calls f with each accept error Serve backs off on (a test knob).
func SetAcceptBackoffHook(f func(error)) { acceptBackoffHook = f }
