package daemon

import (
	"fmt"

	"github.com/softroce/softroce/internal/daemon/proto"
)

// Quota limits what one client may hold at a time, so one client cannot
// exhaust the device's shared limits (max_qp, max_cq, max_mr, ...) for the
// others. Zero fields are unlimited (the device limits still apply).
type Quota struct {
	PDs, MRs, CQs, SRQs, QPs int
	// CMIDs bounds the rdma_cm IDs a client creates (rdma_create_id;
	// the IDs of incoming requests are not counted against it).
	CMIDs int
	// MRBytes bounds the client memory registered (and so mapped by the
	// daemon) at a time, summed over its MRs.
	MRBytes int64
}

// checkQuota refuses a new object of type T when the client already holds
// limit of them (proto.ErrQuota).
func checkQuota[T any](ss *session, limit int, what string) error {
	if limit <= 0 {
		return nil
	}
	n := 0
	ss.mu.Lock()
	for _, o := range ss.objs {
		if _, ok := o.(T); ok {
			n++
		}
	}
	ss.mu.Unlock()
	if n >= limit {
		return fmt.Errorf("%w: %d %s", proto.ErrQuota, limit, what)
	}
	return nil
}

// checkMRBytes refuses registering n more bytes beyond Quota.MRBytes.
func (ss *session) checkMRBytes(n int) error {
	limit := ss.s.quota.MRBytes
	if limit <= 0 {
		return nil
	}
	var held int64
	ss.mu.Lock()
	for _, o := range ss.objs {
		if m, ok := o.(*mrObj); ok {
			held += int64(m.m.Len())
		}
	}
	ss.mu.Unlock()
	if held+int64(n) > limit {
		return fmt.Errorf("%w: %d MR bytes (holding %d, asked %d)", proto.ErrQuota, limit, held, n)
	}
	return nil
}
