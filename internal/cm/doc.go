// Package cm is the InfiniBand Communication Manager (IBTA Vol 1 chapter 12)
// as RoCEv2 peers speak it, the wire protocol under rdma_cm:
//
//   - MAD is a zero-copy view of the 24-byte common MAD header (IBTA 13.4.3);
//     every CM message is a GMP of exactly MADSize (256) bytes sent with
//     method Send (0x03) to QP1 with Q_Key 0x80010000.
//   - REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDRReq and SIDRRep are views of
//     the 232-byte CM data area that follows the MAD header (IBTA 12.6 and
//     12.11, message tables 106-120). Each has an XxxFields struct with
//     Encode/Fields writing and reading every bit, reserved bits included, so
//     re-encoding parsed fields reproduces a captured MAD exactly.
//   - CMAHeader is the 36-byte rdma_cm private-data header (IBTA Annex A11,
//     "RDMA IP CM Service"), and ServiceID/SplitServiceID build and split the
//     rdma_cm service IDs (0x0000000001PPPPPP: port space << 16 | port).
//   - Manager is the CM state machine (IBTA 12.9): active and passive sides
//     of RC/UC connection establishment, release and TIMEWAIT, SIDR for UD,
//     retransmission with the CM response timeout and MaxCMRetries, duplicate
//     and stale-connection handling as the Linux CM does it. It sends MADs
//     through a Transport, takes time from an injected qp.Clock, drives the
//     QP through a QPControl the engine implements, and reports rdma_cm-style
//     events (CONNECT_REQUEST, ESTABLISHED, REJECTED, ...).
//
// Views do not check their length; Parse does, and remote input never
// panics. See docs/cm.md.
package cm
