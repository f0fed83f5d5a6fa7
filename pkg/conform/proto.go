package conform

// The DUT control protocol: one request line, one reply line, over TCP (the C agent in
// the rxe lab guest speaks it; Serve puts any DUT behind it). Fields are separated by one
// space; numbers are unsigned decimal (requests may use 0x hex); byte strings are lower-case
// hex, "-" when empty. Replies are "OK ..." or "ERR <message>".
//
//	HELLO                                   -> OK <agent name> <device name>
//	MR <size> <access>                      -> OK <id> <rkey> <lkey> <va>
//	MRW <id> <off> <hex>                    -> OK
//	MRR <id> <off> <n>                      -> OK <hex>
//	DMR <id>                                -> OK
//	QP <type> <bench ip> <bench qpn> <bench psn> <dut psn> <mtu> <min_rnr_timer> <timeout>
//	   <retry_cnt> <rnr_retry> <max_dest_rd_atomic> <max_rd_atomic> <access> <qkey>
//	                                        -> OK <qpn>
//	RECV <qpn> <mr> <off> <len> <count> <wrid>        -> OK
//	SEND <qpn> <op> <mr> <off> <len> <remote va> <rkey> <imm> <compare_add> <swap> <wrid>
//	     <remote qpn> <remote qkey>          -> OK
//	POLL <qpn> <max> <wait ms>              -> OK <n> {<wrid> <status> <opcode> <byte_len> <imm> <flags> <src_qp>}*n
//	STATE <qpn>                             -> OK <ibv_qp_state>
//	DQP <qpn>                               -> OK
//	BYE                                     -> OK (the agent closes the connection)

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/internal/cq"
	"github.com/softroce/softroce/internal/mr"
	"github.com/softroce/softroce/pkg/bth"
)

// MaxLine bounds a protocol line (a 256 KiB region in hex fits).
const MaxLine = 1 << 20

// Client is a DUT reached through the control protocol.
type Client struct {
	name string
	addr netip.AddrPort
	conn net.Conn
	r    *bufio.Reader
	// Timeout bounds one request/reply exchange beyond the request's own wait (0 = 20 s).
	Timeout time.Duration
	// Agent is what the agent said in HELLO (name and device).
	Agent string
}

// ClientOptions configure NewClient.
type ClientOptions struct {
	// Name identifies the DUT in reports ("rxe", or the agent address).
	Name string
	// RoCE is the DUT's RoCEv2 endpoint (port 0 = 4791).
	RoCE netip.AddrPort
}

// NewClient talks to an agent on conn (which it owns) and says HELLO.
func NewClient(conn net.Conn, o ClientOptions) (*Client, error) {
	if o.RoCE.Port() == 0 {
		o.RoCE = netip.AddrPortFrom(o.RoCE.Addr(), bth.UDPPort)
	}
	c := &Client{name: o.Name, addr: o.RoCE, conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	f, err := c.call(0, "HELLO")
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.Agent = strings.Join(f, " ")
	return c, nil
}

// Name implements DUT.
func (c *Client) Name() string { return c.name }

// Addr implements DUT.
func (c *Client) Addr() netip.AddrPort { return c.addr }

func (c *Client) call(wait time.Duration, format string, args ...any) ([]string, error) {
	t := c.Timeout
	if t <= 0 {
		t = 20 * time.Second
	}
	_ = c.conn.SetDeadline(time.Now().Add(t + wait))
	req := fmt.Sprintf(format, args...)
	if len(req) > MaxLine {
		return nil, fmt.Errorf("%w: request of %d bytes (max %d)", ErrProto, len(req), MaxLine)
	}
	if _, err := io.WriteString(c.conn, req+"\n"); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrProto, req, err)
	}
	line, err := readLine(c.r)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrProto, req, err)
	}
	f := strings.Fields(line)
	switch {
	case len(f) > 0 && f[0] == "OK":
		return f[1:], nil
	case len(f) > 0 && f[0] == "ERR":
		return nil, fmt.Errorf("%w: %s: %s", ErrDUT, req, strings.Join(f[1:], " "))
	}
	return nil, fmt.Errorf("%w: %s: reply %q", ErrProto, req, line)
}

func readLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return "", err
		}
		b = append(b, chunk...)
		if len(b) > MaxLine {
			return "", fmt.Errorf("%w: line longer than %d bytes", ErrProto, MaxLine)
		}
		if !isPrefix {
			return string(b), nil
		}
	}
}

func nums(f []string, n int) ([]uint64, error) {
	if len(f) < n {
		return nil, fmt.Errorf("%w: %d fields, want %d", ErrProto, len(f), n)
	}
	out := make([]uint64, n)
	for i := range n {
		v, err := strconv.ParseUint(f[i], 0, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: field %q: %v", ErrProto, f[i], err)
		}
		out[i] = v
	}
	return out, nil
}

func hexOf(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	return hex.EncodeToString(b)
}

func unhex(s string) ([]byte, error) {
	if s == "-" {
		return []byte{}, nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProto, err)
	}
	return b, nil
}

// RegMR implements DUT.
func (c *Client) RegMR(m MRConfig) (MRInfo, error) {
	f, err := c.call(0, "MR %d %d", m.Size, uint32(m.Access))
	if err != nil {
		return MRInfo{}, err
	}
	v, err := nums(f, 4)
	if err != nil {
		return MRInfo{}, err
	}
	return MRInfo{ID: int(v[0]), RKey: uint32(v[1]), LKey: uint32(v[2]), VA: v[3], Size: m.Size}, nil
}

// WriteMR implements DUT.
func (c *Client) WriteMR(id, off int, data []byte) error {
	_, err := c.call(0, "MRW %d %d %s", id, off, hexOf(data))
	return err
}

// ReadMR implements DUT.
func (c *Client) ReadMR(id, off, n int) ([]byte, error) {
	f, err := c.call(0, "MRR %d %d %d", id, off, n)
	if err != nil {
		return nil, err
	}
	if len(f) != 1 {
		return nil, fmt.Errorf("%w: MRR reply %q", ErrProto, f)
	}
	b, err := unhex(f[0])
	if err == nil && len(b) != n {
		err = fmt.Errorf("%w: MRR returned %d bytes, want %d", ErrProto, len(b), n)
	}
	return b, err
}

// DeregMR implements DUT.
func (c *Client) DeregMR(id int) error {
	_, err := c.call(0, "DMR %d", id)
	return err
}

// CreateQP implements DUT.
func (c *Client) CreateQP(q QPConfig) (uint32, error) {
	f, err := c.call(0, "QP %d %s %d %d %d %d %d %d %d %d %d %d %d %d", uint8(q.Type), q.BenchAddr.Unmap(),
		q.BenchQPN, uint32(q.BenchPSN), uint32(q.DUTPSN), q.MTU, q.MinRNRTimer, q.Timeout, q.RetryCnt,
		q.RNRRetry, q.MaxDestRDAtomic, q.MaxRDAtomic, uint32(q.Access), q.QKey)
	if err != nil {
		return 0, err
	}
	v, err := nums(f, 1)
	if err != nil {
		return 0, err
	}
	return uint32(v[0]), nil
}

// PostRecv implements DUT.
func (c *Client) PostRecv(qpn uint32, r RecvConfig) error {
	_, err := c.call(0, "RECV %d %d %d %d %d %d", qpn, r.MR, r.Off, r.Len, r.Count, r.WRID)
	return err
}

// PostSend implements DUT.
func (c *Client) PostSend(qpn uint32, s SendConfig) error {
	_, err := c.call(0, "SEND %d %d %d %d %d %d %d %d %d %d %d %d %d", qpn, uint8(s.Op), s.MR, s.Off, s.Len,
		s.RemoteVA, s.RKey, s.Imm, s.CompareAdd, s.Swap, s.WRID, s.RemoteQPN, s.RemoteQKey)
	return err
}

// Poll implements DUT.
func (c *Client) Poll(qpn uint32, max int, wait time.Duration) ([]Completion, error) {
	f, err := c.call(wait, "POLL %d %d %d", qpn, max, wait.Milliseconds())
	if err != nil {
		return nil, err
	}
	v, err := nums(f, 1)
	if err != nil {
		return nil, err
	}
	n := int(v[0])
	if n > max || len(f) != 1+7*n {
		return nil, fmt.Errorf("%w: POLL reply with %d fields for %d completions", ErrProto, len(f), n)
	}
	out := make([]Completion, n)
	for i := range out {
		w, err := nums(f[1+7*i:], 7)
		if err != nil {
			return nil, err
		}
		out[i] = Completion{WRID: w[0], Status: cq.Status(w[1]), Opcode: cq.Opcode(w[2]), ByteLen: uint32(w[3]),
			Imm: uint32(w[4]), Flags: cq.Flags(w[5]), SrcQP: uint32(w[6])}
	}
	return out, nil
}

// State implements DUT.
func (c *Client) State(qpn uint32) (QPState, error) {
	f, err := c.call(0, "STATE %d", qpn)
	if err != nil {
		return 0, err
	}
	v, err := nums(f, 1)
	if err != nil {
		return 0, err
	}
	return QPState(v[0]), nil
}

// DestroyQP implements DUT.
func (c *Client) DestroyQP(qpn uint32) error {
	_, err := c.call(0, "DQP %d", qpn)
	return err
}

// Close says BYE and closes the connection.
func (c *Client) Close() error {
	_, _ = c.call(0, "BYE")
	return c.conn.Close()
}

// Serve answers control-protocol requests on conn with d until BYE or EOF (the Go side
// of the protocol: it lets a softroce DUT run as an agent, and tests the Client).
func Serve(conn io.ReadWriter, d DUT, name string) error {
	r := bufio.NewReaderSize(conn, 64<<10)
	w := bufio.NewWriter(conn)
	for {
		line, err := readLine(r)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		reply, bye := serveLine(d, name, strings.Fields(line))
		if _, err := w.WriteString(reply + "\n"); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if bye {
			return nil
		}
	}
}

func serveLine(d DUT, name string, f []string) (reply string, bye bool) {
	if len(f) == 0 {
		return "ERR empty request", false
	}
	fail := func(err error) string { return "ERR " + strings.ReplaceAll(err.Error(), "\n", " ") }
	argc := map[string]int{"HELLO": 0, "MR": 2, "MRW": 3, "MRR": 3, "DMR": 1, "QP": 14, "RECV": 6,
		"SEND": 13, "POLL": 3, "STATE": 1, "DQP": 1, "BYE": 0}
	want, ok := argc[f[0]]
	if !ok {
		return "ERR unknown request " + f[0], false
	}
	if len(f)-1 != want {
		return fmt.Sprintf("ERR %s takes %d arguments", f[0], want), false
	}
	numArgs := func(skip ...int) ([]uint64, error) {
		out := make([]uint64, len(f)-1)
		for i, s := range f[1:] {
			if contains(skip, i) {
				continue
			}
			v, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				return nil, fmt.Errorf("bad number %q", s)
			}
			out[i] = v
		}
		return out, nil
	}
	switch f[0] {
	case "HELLO":
		return "OK " + name + " " + d.Name(), false
	case "BYE":
		return "OK", true
	case "MRW":
		v, err := numArgs(2)
		if err != nil {
			return fail(err), false
		}
		b, err := unhex(f[3])
		if err != nil {
			return fail(err), false
		}
		if err := d.WriteMR(int(v[0]), int(v[1]), b); err != nil {
			return fail(err), false
		}
		return "OK", false
	case "QP":
		v, err := numArgs(1)
		if err != nil {
			return fail(err), false
		}
		ip, err := netip.ParseAddr(f[2])
		if err != nil {
			return fail(err), false
		}
		qpn, err := d.CreateQP(QPConfig{Type: QPType(v[0]), BenchAddr: ip, BenchQPN: uint32(v[2]),
			BenchPSN: bth.PSN(v[3] & bth.PSNMask), DUTPSN: bth.PSN(v[4] & bth.PSNMask), MTU: int(v[5]),
			MinRNRTimer: uint8(v[6]), Timeout: uint8(v[7]), RetryCnt: uint8(v[8]), RNRRetry: uint8(v[9]),
			MaxDestRDAtomic: uint8(v[10]), MaxRDAtomic: uint8(v[11]), Access: mr.Access(v[12]), QKey: uint32(v[13])})
		if err != nil {
			return fail(err), false
		}
		return fmt.Sprintf("OK %d", qpn), false
	}
	v, err := numArgs()
	if err != nil {
		return fail(err), false
	}
	switch f[0] {
	case "MR":
		m, err := d.RegMR(MRConfig{Size: int(v[0]), Access: mr.Access(v[1])})
		if err != nil {
			return fail(err), false
		}
		return fmt.Sprintf("OK %d %d %d %d", m.ID, m.RKey, m.LKey, m.VA), false
	case "MRR":
		b, err := d.ReadMR(int(v[0]), int(v[1]), int(v[2]))
		if err != nil {
			return fail(err), false
		}
		return "OK " + hexOf(b), false
	case "DMR":
		err = d.DeregMR(int(v[0]))
	case "RECV":
		err = d.PostRecv(uint32(v[0]), RecvConfig{MR: int(v[1]), Off: int(v[2]), Len: int(v[3]), Count: int(v[4]), WRID: v[5]})
	case "SEND":
		err = d.PostSend(uint32(v[0]), SendConfig{Op: SendOp(v[1]), MR: int(v[2]), Off: int(v[3]), Len: int(v[4]),
			RemoteVA: v[5], RKey: uint32(v[6]), Imm: uint32(v[7]), CompareAdd: v[8], Swap: v[9], WRID: v[10],
			RemoteQPN: uint32(v[11]), RemoteQKey: uint32(v[12])})
	case "POLL":
		wcs, err := d.Poll(uint32(v[0]), int(v[1]), time.Duration(v[2])*time.Millisecond)
		if err != nil {
			return fail(err), false
		}
		var b strings.Builder
		fmt.Fprintf(&b, "OK %d", len(wcs))
		for _, w := range wcs {
			fmt.Fprintf(&b, " %d %d %d %d %d %d %d", w.WRID, w.Status, w.Opcode, w.ByteLen, w.Imm, w.Flags, w.SrcQP)
		}
		return b.String(), false
	case "STATE":
		st, err := d.State(uint32(v[0]))
		if err != nil {
			return fail(err), false
		}
		return fmt.Sprintf("OK %d", st), false
	case "DQP":
		err = d.DestroyQP(uint32(v[0]))
	}
	if err != nil {
		return fail(err), false
	}
	return "OK", false
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
