package cq

import "unsafe"

// Footprint is the memory New allocates for a CQ of capacity completions (its ring of WCs).
// A host service charges it to the CQ's owner.
func Footprint(capacity int) int64 { return int64(capacity) * int64(unsafe.Sizeof(WC{})) }
