package client

import "github.com/softroce/softroce/internal/daemon/proto"

// Debug is the daemon's view of this client's session (Conn.Debug): its objects and
// counters, for diagnostics.
type Debug = proto.Debug
