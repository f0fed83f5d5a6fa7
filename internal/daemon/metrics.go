package daemon

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/softroce/softroce/internal/daemon/proto"
	"github.com/softroce/softroce/internal/qp"
)

// WriteMetrics writes the Prometheus text exposition (format 0.0.4): the
// device counters under rxe's hw_counters names (softroce_<name>, e.g.
// softroce_sent_pkts, labelled by device), daemon resource gauges, and
// per-QP gauges labelled by device, qpn and client pid.
func (s *Server) WriteMetrics(w io.Writer) error {
	bw := bufio.NewWriter(w)
	dev := s.dev.Name()
	m := s.dev.Stats().Map()
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(bw, "# HELP softroce_%s rxe hw counter %s\n# TYPE softroce_%s counter\n", k, k, k)
		fmt.Fprintf(bw, "softroce_%s{device=%q} %d\n", k, dev, m[k])
	}
	d := s.Debug()
	gauges := []struct {
		name, help string
		v          int64
	}{
		{"clients", "connected clients", int64(d.Clients)},
		{"pds", "live protection domains of clients", int64(d.PDs)},
		{"mrs", "live memory regions of clients", int64(d.MRs)},
		{"mws", "live memory windows of clients", s.nMW.Load()},
		{"cqs", "live completion queues of clients", int64(d.CQs)},
		{"srqs", "live shared receive queues of clients", int64(d.SRQs)},
		{"qps", "live queue pairs of clients", int64(d.QPs)},
		{"cm_ids", "live rdma_cm IDs of clients", int64(d.CMIDs)},
		{"mapped_bytes", "client memory mapped by the daemon (MRs and completion rings)", d.MappedBytes},
		{"open_fds", "open file descriptors of the daemon", int64(d.FDs)},
	}
	for _, g := range gauges {
		fmt.Fprintf(bw, "# HELP softroce_daemon_%s %s\n# TYPE softroce_daemon_%s gauge\n", g.name, g.help, g.name)
		fmt.Fprintf(bw, "softroce_daemon_%s{device=%q} %d\n", g.name, dev, g.v)
	}
	fmt.Fprintf(bw, "# HELP softroce_daemon_refused_total requests refused over a per-user limit or the daemon-wide ceiling\n# TYPE softroce_daemon_refused_total counter\n")
	for i, v := range d.Refused.Values() {
		fmt.Fprintf(bw, "softroce_daemon_refused_total{device=%q,limit=%q} %d\n", dev, proto.UsageNames()[i], v)
	}
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"bad_posts_total", "asynchronous posts and post-ring records refused (malformed, no such QP)", d.BadPosts},
		{"dropped_events_total", "asynchronous events dropped on full event rings", d.DroppedEvents},
		{"accept_backoffs_total", "accept errors backed off on (out of descriptors or memory)", d.AcceptBackoffs},
		{"refused_privileged_total", "requests refused as reserved to privileged users (controlled Q_Keys)", d.RefusedPrivileged},
	} {
		fmt.Fprintf(bw, "# HELP softroce_daemon_%s %s\n# TYPE softroce_daemon_%s counter\n", c.name, c.help, c.name)
		fmt.Fprintf(bw, "softroce_daemon_%s{device=%q} %d\n", c.name, dev, c.v)
	}
	s.acct.mu.Lock()
	type userRow struct {
		uid    uint32
		used   usage
		budget *qp.Budget
	}
	users := make([]userRow, 0, len(s.acct.users))
	for uid, t := range s.acct.users {
		users = append(users, userRow{uid, t.used, t.budget})
	}
	s.acct.mu.Unlock()
	sort.Slice(users, func(i, j int) bool { return users[i].uid < users[j].uid })
	fmt.Fprintf(bw, "# HELP softroce_daemon_user_usage what each user's clients hold, per limited resource\n# TYPE softroce_daemon_user_usage gauge\n")
	for _, u := range users {
		for r, v := range u.used {
			fmt.Fprintf(bw, "softroce_daemon_user_usage{device=%q,uid=\"%d\",resource=%q} %d\n", dev, u.uid, resNames[r], v)
		}
	}
	fmt.Fprintf(bw, "# HELP softroce_daemon_user_inflight RC request packets each user's QPs have unacknowledged (its inflight budget)\n# TYPE softroce_daemon_user_inflight gauge\n")
	for _, u := range users {
		if u.budget != nil {
			fmt.Fprintf(bw, "softroce_daemon_user_inflight{device=%q,uid=\"%d\"} %d\n", dev, u.uid, u.budget.InFlight())
		}
	}
	fmt.Fprintf(bw, "# HELP softroce_daemon_user_inflight_waits_total times one of a user's QPs waited for the user's inflight budget\n# TYPE softroce_daemon_user_inflight_waits_total counter\n")
	for _, u := range users {
		if u.budget != nil {
			fmt.Fprintf(bw, "softroce_daemon_user_inflight_waits_total{device=%q,uid=\"%d\"} %d\n", dev, u.uid, u.budget.Waits())
		}
	}
	type qpRow struct {
		qpn, pid int64
		typ      string
		state    int
		rkeyErrs uint64
	}
	var rows []qpRow
	s.mu.Lock()
	ss := make([]*session, 0, len(s.sessions))
	for x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	for _, x := range ss {
		qps, _, _, _, _ := x.snapshot()
		for _, o := range qps {
			rows = append(rows, qpRow{qpn: int64(o.q.Num()), pid: int64(x.pid), typ: o.q.Type().String(), state: int(o.q.State()),
				rkeyErrs: o.q.RemoteAccessErrors()})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].qpn < rows[j].qpn })
	fmt.Fprintf(bw, "# HELP softroce_qp_state QP state (ibv_qp_state: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 4 SQD, 5 SQE, 6 ERR)\n# TYPE softroce_qp_state gauge\n")
	for _, r := range rows {
		fmt.Fprintf(bw, "softroce_qp_state{device=%q,qpn=\"%d\",type=%q,pid=\"%d\"} %d\n", dev, r.qpn, r.typ, r.pid, r.state)
	}
	fmt.Fprintf(bw, "# HELP softroce_qp_remote_access_errors requests the QP's responder refused for their R_Key (a UC QP drops them silently)\n# TYPE softroce_qp_remote_access_errors counter\n")
	for _, r := range rows {
		fmt.Fprintf(bw, "softroce_qp_remote_access_errors{device=%q,qpn=\"%d\",type=%q,pid=\"%d\"} %d\n", dev, r.qpn, r.typ, r.pid, r.rkeyErrs)
	}
	return bw.Flush()
}

// MetricsHandler serves WriteMetrics over HTTP.
func (s *Server) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.WriteMetrics(w)
	})
}
