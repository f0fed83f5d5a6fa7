package afxdp

// The XDP programs (xdp.c) are compiled by bpf2go into xdp_bpfel.o and xdp_bpfeb.o with the Go
// code that embeds and loads them (xdp_bpfel.go, xdp_bpfeb.go): all four are committed, so a
// build needs no C compiler. `go generate ./pkg/link/afxdp` regenerates them with Debian 12's
// clang 14 (clang-14, llvm-strip-14, libbpf-dev; the include path is its amd64 one); CI checks
// that the committed files are what it generates (.ci/run).
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -tags linux -type qp_entry -type mr_entry xdp xdp.c
