#!/usr/bin/env bash
# bench/lab-probe.sh [N_LAT]: an ad-hoc evidence run in the rxe lab VM (docs/lab.md,
# "What the guest costs"). Builds the static softroce, bench/probe (Go) and bench/cprobe/pingpong (C,
# static), takes the machine-wide lab lock ($RXE_LAB_LOCK, default
# /var/cache/rxe-lab/interop.lock, as bench/lab.sh and scripts/interop do), boots the VM with --dual, runs bench/lab-probe-guest.sh in the guest
# (clocksource, timers, clock/sleep/UDP costs in C and Go, rxe vs softroce 8-byte latency per
# clocksource), prints its output and always stops the VM. Root only.
# Environment: RXE_LAB_APPEND (extra guest kernel command line, e.g. "tsc=reliable"),
# CLOCKSOURCES (which to try; default every one the guest offers), PROBE_TRACE=0 (no strace),
# PROBE_MICRO=0 (no C/Go micro-benchmarks), PROBE_LAT=0 (no latency rows), PROBE_BW=1
# (64 KiB WRITE bandwidth rows, one pair CPU-profiled), PROBE_PROF=1 (a CPU-profiled busy-poll
# latency run). Profiles go to $PROBE_OUT (default /tmp/softroce-probe-prof) with the softroce
# binary, for `go tool pprof`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
NLAT=${1:-300}
[ "$(id -u)" = 0 ] || { echo "bench/lab-probe.sh: must run as root" >&2; exit 1; }
SHARE=$(mktemp -d /tmp/softroce-probe-share.XXXXXX)
LOG=$SHARE.log
# softroce from the working tree, or from HEAD when the shared tree is mid-edit (as bench/run)
if ! CGO_ENABLED=0 go build -trimpath -o "$SHARE/softroce" ./cmd/softroce 2> "$LOG"; then
  echo "   working tree does not build: softroce from HEAD $(git rev-parse --short HEAD)" >&2
  SRC=$(mktemp -d /tmp/softroce-probe-src.XXXXXX)
  git archive HEAD | tar -x -C "$SRC" &&
    (cd "$SRC" && CGO_ENABLED=0 go build -trimpath -o "$SHARE/softroce" ./cmd/softroce)
  st=$?; rm -rf "$SRC"; [ $st = 0 ] || { echo "bench/lab-probe.sh: build failed" >&2; exit 1; }
fi
CGO_ENABLED=0 go build -trimpath -o "$SHARE/probe" ./bench/probe &&
  gcc -O2 -static -o "$SHARE/pingpong" bench/cprobe/pingpong.c &&
  cp bench/lab-probe-guest.sh "$SHARE/" || { echo "bench/lab-probe.sh: build failed" >&2; exit 1; }
echo "   waiting for the lab lock" >&2
LOCK=${RXE_LAB_LOCK:-/var/cache/rxe-lab/interop.lock}   # machine-wide, whatever the cache (lib.sh)
mkdir -p "$(dirname "$LOCK")"
exec 7>"$LOCK"
timeout 2400 flock 7 || { echo "bench/lab-probe.sh: $LOCK not acquired" >&2; exit 1; }
for _ in $(seq 1 60); do
  test/rxelab/vm status > /dev/null 2>&1 || break
  echo "   a lab VM is running (someone else's): waiting" >&2
  sleep 10
done
if test/rxelab/vm status > /dev/null 2>&1; then
  echo "bench/lab-probe.sh: someone else's lab VM is still running: not touching it" >&2
  exit 1
fi
STARTED=0
cleanup() {
  [ "$STARTED" = 1 ] && test/rxelab/vm stop >> "$LOG" 2>&1 7>&-
  if ls "$SHARE"/prof.* > /dev/null 2>&1; then
    mkdir -p "${PROBE_OUT:-/tmp/softroce-probe-prof}" && cp "$SHARE"/prof.* "$SHARE/softroce" "${PROBE_OUT:-/tmp/softroce-probe-prof}/"
  fi
  rm -rf "$SHARE"
}
trap cleanup EXIT
echo "   $(date -u +%H:%M:%S) host load: $(cut -d' ' -f1-3 /proc/loadavg); RXE_LAB_APPEND='${RXE_LAB_APPEND:-}'" >&2
test/rxelab/setup --no-install >> "$LOG" 2>&1 || { echo "bench/lab-probe.sh: lab setup failed" >&2; exit 1; }
STARTED=1
RXE_LAB_MTU=9000 test/rxelab/vm start --dual --share "$SHARE" --max-life 1200 >> "$LOG" 2>&1 7>&- ||
  { echo "bench/lab-probe.sh: VM did not start (see $LOG)" >&2; exit 1; }
test/rxelab/vm exec --timeout 1000 -c "CLOCKSOURCES='${CLOCKSOURCES:-}' PROBE_TRACE='${PROBE_TRACE:-1}' PROBE_MICRO='${PROBE_MICRO:-1}' PROBE_LAT='${PROBE_LAT:-1}' PROBE_BW='${PROBE_BW:-0}' PROBE_PROF='${PROBE_PROF:-0}' PROBE_XDP='${PROBE_XDP:-0}' PROF_N='${PROF_N:-2000}' bash /mnt/host/lab-probe-guest.sh /mnt/host $NLAT" 7>&-
echo "   guest script exit $?; $(date -u +%H:%M:%S) host load: $(cut -d' ' -f1-3 /proc/loadavg); lab log $LOG" >&2
