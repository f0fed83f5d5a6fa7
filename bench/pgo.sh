#!/usr/bin/env bash
# bench/pgo.sh: regenerates cmd/softroce/default.pgo, the CPU profile `go build` uses for
# profile-guided optimization of the softroce binary (docs/performance.md, "How it is
# measured"). Root: two network namespaces on a veth pair (198.18.61.0/24), created and
# removed here. Rerun it when hot code moves between packages: a profile names functions by
# package path, and one that names packages no longer there guides nothing. It profiles,
# with a build made WITHOUT the current profile, both sides of the polled AF_XDP 8-byte WRITE
# latency ping-pong (`perf --lat --busy-poll --xdp`) and of a 64 KiB WRITE bandwidth run over
# the UDP link, and merges the four profiles.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/pgo.sh: must run as root" >&2; exit 1; }
W=$(mktemp -d /tmp/softroce-pgo.XXXXXX)
trap 'ip netns del p7a 2>/dev/null; ip netns del p7b 2>/dev/null; rm -rf "$W"' EXIT
B=$W/softroce
CGO_ENABLED=0 go build -trimpath -pgo=off -o "$B" ./cmd/softroce
ip netns add p7a; ip netns add p7b
ip link add p7va type veth peer name p7vb
ip link set p7va netns p7a; ip link set p7vb netns p7b
ip -n p7a addr add 198.18.61.1/24 dev p7va; ip -n p7b addr add 198.18.61.2/24 dev p7vb
for n in p7a p7b; do ip -n $n link set lo up; done
ip -n p7a link set p7va mtu 9000 up; ip -n p7b link set p7vb mtu 9000 up
run() { # run NAME FLAGS...: server in p7b, client in p7a, each with a CPU profile
  local name=$1; shift
  ip netns exec p7b env GOMAXPROCS=1 "$B" "$@" --cpuprofile "$W/$name-srv.prof" -d 198.18.61.2 > "$W/$name-srv.out" 2>&1 &
  sleep 0.5
  ip netns exec p7a env GOMAXPROCS=1 "$B" "$@" --cpuprofile "$W/$name-cli.prof" -d 198.18.61.1 198.18.61.2 > "$W/$name-cli.out" 2>&1
  wait
}
run lat perf write --lat -s 8 -n 1000000 -m 1024 -F -p 22501 --timeout 30s --run-timeout 120s --busy-poll --xdp
run bw perf write -s 65536 -n 100000 -m 4096 -F -p 22502 --timeout 30s --run-timeout 120s
go tool pprof -proto "$W"/lat-srv.prof "$W"/lat-cli.prof "$W"/bw-srv.prof "$W"/bw-cli.prof > cmd/softroce/default.pgo
echo "bench/pgo.sh: cmd/softroce/default.pgo ($(stat -c %s cmd/softroce/default.pgo) bytes)"
