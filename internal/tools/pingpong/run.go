package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/softroce/softroce/internal/oob"
	oobpp "github.com/softroce/softroce/internal/oob/pingpong"
	"github.com/softroce/softroce/internal/tools/cli"
	"github.com/softroce/softroce/pkg/roce"
)

// Run runs one pingpong as client (cfg.Server set) or server, printing the tool's lines to
// out.
func Run(ctx context.Context, cfg Config, out io.Writer) (err error) {
	c := &cfg
	oo := oobpp.Options{Options: oob.Options{Timeout: c.Timeout}, Records: c.Tool.Records()}
	var (
		ld *cli.VerbsDev
		p  *ppCtx
	)
	defer func() {
		if p != nil {
			err = errors.Join(err, p.close())
		}
		if ld != nil {
			err = errors.Join(err, ld.Close())
		}
	}()
	open := func(peer netip.Addr) error {
		var e error
		if ld, e = cli.OpenVerbs(c.Daemon, &c.Dev, cli.DevOptions{Port: c.RocePort, Portable: c.Portable, Peer: peer,
			GIDIndex: c.GIDIndex, ByGIDIndex: c.GIDIndex >= 0}); e != nil {
			return e
		}
		if p, e = newPPCtx(c, ld); e != nil {
			return e
		}
		for _, d := range p.mine {
			fmt.Fprint(out, oobpp.LocalLine(c.Tool, d))
		}
		return nil
	}
	var remote []oobpp.Dest
	if c.Server != "" {
		host, err := cli.ResolveHost(ctx, c.Server, c.Timeout)
		if err != nil {
			return err
		}
		if err := open(host); err != nil {
			return err
		}
		conn, err := cli.Dial(ctx, netip.AddrPortFrom(host, uint16(c.Port)), c.Timeout)
		if err != nil {
			return err
		}
		remote, err = oobpp.Client(ctx, conn, p.mine, oo)
		conn.Close()
		if err != nil {
			return fmt.Errorf("Couldn't read/write remote address: %w", err)
		}
		for _, d := range remote[:c.NumQP] {
			fmt.Fprint(out, oobpp.RemoteLine(d))
		}
		if err := p.connect(remote, host); err != nil {
			return err
		}
	} else {
		// Listen first, so that once the local address is printed a client can connect
		// (the tools print it just before listening).
		ln := c.Listener
		if ln == nil {
			if ln, err = net.Listen("tcp", ":"+strconv.Itoa(c.Port)); err != nil {
				return fmt.Errorf("Couldn't listen to port %d: %w", c.Port, err)
			}
		}
		defer ln.Close()
		if c.Dev.IsSet() {
			if err := open(netip.Addr{}); err != nil {
				return err
			}
		}
		actx, cancel := context.WithTimeout(ctx, c.Timeout)
		conn, err := oob.Accept(actx, ln)
		timedOut := ctx.Err() == nil && (actx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded))
		cancel()
		ln.Close()
		if err != nil {
			if timedOut {
				err = fmt.Errorf("%w: no client connected to port %d within %v", errPPTimeout, c.Port, c.Timeout)
			}
			return fmt.Errorf("accept() failed: %w", err)
		}
		tcpPeer := cli.AddrOf(conn.RemoteAddr())
		remote, err = oobpp.Server(ctx, conn, oo, func(r []oobpp.Dest) ([]oobpp.Dest, error) {
			if p == nil { // no -d: the device speaks from the address the client reached
				if err := open(cli.AddrOf(conn.LocalAddr())); err != nil {
					return nil, err
				}
			}
			if err := p.connect(r, tcpPeer); err != nil {
				return nil, fmt.Errorf("Couldn't connect to remote QP: %w", err)
			}
			return p.mine, nil
		})
		conn.Close()
		if err != nil {
			return fmt.Errorf("Couldn't send/recv local address: %w", err)
		}
		for _, d := range remote[:c.NumQP] {
			fmt.Fprint(out, oobpp.RemoteLine(d))
		}
	}
	el, err := p.run(c.Server != "")
	if err != nil {
		return err
	}
	fmt.Fprint(out, oobpp.ResultLines(c.Size, c.Iters, el))
	if c.Server != "" && c.Validate {
		ppCheckPages(out, p.finalBuf())
	}
	if c.Linger > 0 { // the QPs stay up: the device answers a retransmitted last SEND (Config.Linger)
		t := time.NewTimer(c.Linger)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return nil
}

// ppCQErr is the CQ's overrun error (ibv_poll_cq failing): the embedded CQ's Err; through the
// daemon an overrun arrives as an asynchronous event instead (nil here).
func ppCQErr(c roce.CompletionQueue) error {
	if e, ok := c.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}
