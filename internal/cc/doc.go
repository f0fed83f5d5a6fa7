// Package cc is RoCEv2 congestion control as pure state machines, time in and decisions out
// (quic-go's "now in, deadline out"): the DCQCN reaction point (RP: a QP's sending rate, cut
// by CNPs and raised by a timer and a byte counter), the notification point's CNP interval
// (NP: at most one CNP per QP per np_min_time_between_cnps), and the token-bucket Pacer that
// holds a QP to a rate (DCQCN's current rate, a rate limit, or the lower of the two).
//
// The engine (internal/qp) owns one of each per QP, under the QP's lock, and passes the time
// it read from its injected clock; nothing here reads a clock, sleeps, allocates or locks.
// The rules: IBTA Annex A17.9 (RoCEv2 congestion management: ECN marks, CNPs) and DCQCN
// (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, section
// 3 and its Algorithm 1, whose rate increase is QCN's, IEEE 802.1Qau), with the parameters
// and defaults ConnectX adapters expose under mlx5's names (Params). See docs/congestion.md.
package cc
