package client

import "github.com/softroce/softroce/internal/daemon/proto"

// Debug is the daemon's view of this client's session (Conn.Debug): its objects and
// counters, for diagnostics.
type Debug = proto.Debug

// Usage is an amount of each resource the daemon limits per user (Debug.User, UserLimit,
// Refused): a holding, a limit (-1 = none) or a count of refusals (docs/daemon.md "Limits").
type Usage = proto.Usage
