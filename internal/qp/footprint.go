package qp

import "unsafe"

// Footprint is the memory the engine allocates for the work queues of a QP with caps c
// (ensureSQ, ensureRQ): MaxSendWR send slots with room for MaxSendSGE SGEs and
// MaxInlineData bytes each, and MaxRecvWR receive slots with MaxRecvSGE SGEs each (none
// when the QP's receives come from an SRQ). The rings are allocated at the first post, so
// this is what a QP may come to hold, not what it holds at creation. A host service
// charges it to the QP's owner.
func Footprint(c Cap, srq bool) int64 {
	sq := int64(c.MaxSendWR)
	if sq == 0 {
		sq = 1
	}
	n := sq * (int64(unsafe.Sizeof(sendWQE{})) + int64(c.MaxSendSGE)*int64(unsafe.Sizeof(SGE{})) + int64(c.MaxInlineData))
	if !srq {
		rq := max(int64(c.MaxRecvWR), 1)
		n += rq * (int64(unsafe.Sizeof(recvWQE{})) + int64(c.MaxRecvSGE)*int64(unsafe.Sizeof(SGE{})))
	}
	return n
}

// SRQFootprint is the memory NewSRQ preallocates for an SRQ of maxWR receive slots with
// maxSGE SGEs each.
func SRQFootprint(maxWR, maxSGE int) int64 {
	return int64(maxWR) * (int64(unsafe.Sizeof(srqEntry{})) + int64(maxSGE)*int64(unsafe.Sizeof(SGE{})))
}
