// Package qp is the transport engine: queue pairs and their state machine, shared receive
// queues, address handles, the device and port attributes, and the three roles kernel rxe
// names — the requester (requester.go: send WQEs to request packets, IBTA 9.4), the
// responder (responder.go: request packets executed, ACK/NAK/READ responses, IBTA 9.7.4
// "responder side") and the completer (completer.go: responses retire WQEs into
// completions, IBTA 9.7.6 "requester side") — with the retry and RNR timers (timers.go)
// and the state machine of ibv_modify_qp (modify.go, IBTA 10.3.1 and 11.2.4.2). pkg/roce ties QPs to a device and a link and
// re-exports the types a program names (roce.SendWR, roce.QPAttr, ...); docs/engine.md and
// docs/objects.md describe the engine.
//
// # Concurrency and pipeline (read this first)
//
// A QP is one object guarded by one mutex (QP.mu). Everything that touches
// its state runs under that mutex, on whichever goroutine caused it:
//
//   - PostSend (application goroutine) queues WQEs and runs the requester
//     inline: it segments as many packets as the window allows, builds them
//     in the QP's pooled send buffers and hands them to Output.Send.
//   - Receive (the device's receive goroutine) runs the responder for
//     request packets (placing data, sending ACK/NAK/READ responses) or the
//     completer for response packets (retiring WQEs in order, then running
//     the requester again, since the window may have opened).
//   - the QP's single Timer (from the injected Clock) fires onTimer, which
//     retransmits (go-back-N) or gives up.
//
// Output.Send is called with QP.mu held. Links must therefore never block
// indefinitely on the peer (the in-memory link and UDP drop when full, as a
// network does). Completions are pushed to the CQs (which have their own
// short lock) with QP.mu held; CQ consumers never take QP.mu, so the lock
// order is always QP.mu -> CQ.mu. Atomics take the device-wide atomic lock
// (Config.AtomicMu) inside QP.mu. Modify, Query and Destroy also take QP.mu.
//
// No per-packet allocation: WQE slots (with their SGE arrays and inline
// buffers) are preallocated at creation, packets are built in place in a
// fixed set of send buffers that are reused after each Output.Send (links
// do not retain buffers), and payload is copied once from the MR into the
// send buffer and once from the receive buffer into the MR.
package qp
