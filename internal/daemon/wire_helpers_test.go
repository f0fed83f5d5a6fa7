package daemon

import (
	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/daemon/proto/wire"
	"github.com/softroce/softroce/internal/qp"
)

// request serves one request on ss directly (no socket) and returns the
// response body or its error.
func (ss *session) request(op wire.Op, body []byte) ([]byte, error) {
	var fds []int
	ss.wbuf = ss.wbuf[:0]
	ss.handle(proto.AppendRequest(nil, op, body), &fds)
	proto.CloseFDs(fds)
	h, b, ok := proto.ParseHdr(ss.wbuf)
	if !ok {
		return nil, nil // no response (asynchronous post)
	}
	if h.Status != 0 {
		_, err := proto.ResponseError(h, b)
		return nil, err
	}
	return b, nil
}

// testSession is a session with no connection, past HELLO.
func testSession(s *Server, next proto.Handle) *session {
	return &session{s: s, next: next, objs: map[proto.Handle]any{}, hello: true, ten: s.acct.user(0), memFD: -1}
}

// reqMsg is the request message op with body v (nil: no body).
func reqMsg[T wire.Struct](op wire.Op, v *T) []byte {
	if v == nil {
		return proto.AppendRequest(nil, op, nil)
	}
	return proto.AppendRequest(nil, op, wire.Bytes(v))
}

// modifyQPMsg is ibv_modify_qp's request on QP h.
func modifyQPMsg(h proto.Handle, a qp.Attr, mask qp.AttrMask) []byte {
	return reqMsg(wire.OpModifyQP, &wire.ModifyQPReq{Handle: uint32(h), AttrMask: uint32(mask), Attr: proto.QPAttrToWire(&a)})
}

// lastStatus is the status of the last response handle wrote (0: success) and its error.
func (ss *session) lastStatus() (int32, error) {
	h, b, ok := proto.ParseHdr(ss.wbuf)
	if !ok {
		return -1, nil
	}
	if h.Status == 0 {
		return 0, nil
	}
	_, err := proto.ResponseError(h, b)
	return h.Status, err
}
