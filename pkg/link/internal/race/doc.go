// Package race tells the race detector that a datagram's send happens before its receive
// (the kernel's guarantee, invisible to the detector): the socket paths (link/udp,
// link/afxdp) call Sent and Received; outside race-instrumented builds both are empty.
package race
