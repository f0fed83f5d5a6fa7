package daemon

// SetRecvRefillDisabled turns the RecvRefill hook of every session's QPs off (a test knob:
// TestPostRecvVisible shows what the hook fixes).
func SetRecvRefillDisabled(off bool) { recvRefillOff.Store(off) }

// PauseDrainers makes the server's post-ring drainers ignore their clients' doorbells: a post
// in a ring then reaches the engine only when the engine asks for it (the RecvRefill hook) or
// before a later socket request.
func (s *Server) PauseDrainers(on bool) { s.drainPaused.Store(on) }

// SetAcceptBackoffHook calls f with each accept error Serve backs off on (a test knob).
func SetAcceptBackoffHook(f func(error)) { acceptBackoffHook = f }

// LockPosts takes the post lock of the client that owns QP qpn, as that client's drainer holds
// it for as long as the client keeps its post ring full, and returns the function releasing it.
func (s *Server) LockPosts(qpn uint32) (unlock func()) {
	s.omu.Lock()
	o, ok := s.owners[qpn]
	s.omu.Unlock()
	if !ok {
		panic("LockPosts: no such QP")
	}
	o.ss.postMu.Lock()
	return o.ss.postMu.Unlock
}

// LiveMWs is the count of clients' memory windows (the mws metric).
func (s *Server) LiveMWs() int64 { return s.nMW.Load() }

// UserInFlight is uid's in-flight budget: the PSNs its QPs have in flight and the limit (0, 0:
// none, or no such user).
func (s *Server) UserInFlight(uid uint32) (inflight, limit int) {
	s.acct.mu.Lock()
	t := s.acct.users[uid]
	s.acct.mu.Unlock()
	if t == nil || t.budget == nil {
		return 0, 0
	}
	return t.budget.InFlight(), t.budget.Limit()
}
