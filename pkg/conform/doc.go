// Package conform is softroce's packet-level conformance bench, in the style of
// gVisor's packetimpact: a testbench crafts RoCEv2 packets byte by byte with
// internal/rocetest (every header and field settable, wrong ones included, ICRC computed
// for what is actually sent) and sends them from its own UDP socket to a device under
// test (DUT), then matches the DUT's replies (Expect, ExpectNothing) and reads back its
// completions, memory and QP state through the DUT interface.
//
// Two DUTs implement the interface: Softroce (pkg/roce in process, on a UDP link) and
// Client, which speaks the line protocol of proto.go to an agent — the C agent over
// libibverbs in test/conform/agent, run in the rxe lab guest against kernel rxe
// (test/conform wires it up), or Serve in front of any DUT.
//
// Scenarios (Scenarios()) each cite the IBTA Vol. 1 section they check. Where kernel rxe
// 6.1 deviates from the spec, the scenario documents it (Scenario.RxeDeviation) and
// expects rxe's observed behaviour from the rxe DUT only; softroce's own by-design
// deviations are documented the same way (Scenario.SoftroceDeviation). See
// docs/conformance.md for the scenario list, the results for both DUTs and the
// deviations, and `softroce conform` for the command line.
package conform
