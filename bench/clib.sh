#!/usr/bin/env bash
# bench/clib.sh: rdma-core's perftest through the drop-in libraries (clib/) against the Go
# tools (`softroce perf`) on the same two softroce daemons, in one run, as ratios
# (docs/performance.md, "What bounds the figures"; docs/clib.md, "Speed"):
#   - ib_write_bw -s 65536   vs  softroce perf write -s 65536 --daemon    (bandwidth; the C
#     pair also with SOFTROCE_ZERO_COPY=0, its buffers then copied memory)
#   - ib_send_lat -s 8       vs  softroce perf send --lat -s 8 --daemon   (typical latency;
#     the C pair also with SOFTROCE_ZERO_COPY=0)
# Each pair alternates C and Go RUNS times (default 3) and compares the best of each.
# Two daemons on loopback (127.0.0.1 and 127.0.0.2, sockets in a temporary directory);
# nothing leaves the host.
#
# --update writes the table into docs/clib.md ("Speed").
#
# usage: bench/clib.sh [--quick] [--update]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
RUNS=${RUNS:-3} BW_ITERS=${BW_ITERS:-5000} LAT_ITERS=${LAT_ITERS:-5000}
update=0
for a in "$@"; do
  case $a in
    --quick) RUNS=1 BW_ITERS=500 LAT_ITERS=500 ;;
    --update) update=1 ;;
    *) echo "usage: bench/clib.sh [--quick] [--update]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
make -s libs BUILD="$work/build" >/dev/null
go build -o "$work/softroce" ./cmd/softroce
LIB=$work/build/lib
for x in A:127.0.0.1 B:127.0.0.2; do
  "$work/softroce" daemon --listen "${x#*:}" --socket "$work/${x%%:*}.sock" > "$work/${x%%:*}.log" 2>&1 &
  pids+=($!)
done
for s in A B; do for _ in $(seq 100); do [ -S "$work/$s.sock" ] && break; sleep 0.1; done; done

port=19000
# run_pair NAME SERVER... -- CLIENT...: both sides' output in $work/NAME.{s,c}
run_pair() {
  local name=$1; shift
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift
  cli=("$@")
  "${srv[@]}" > "$work/$name.s" 2>&1 &
  local sp=$!
  sleep 0.5
  "${cli[@]}" > "$work/$name.c" 2>&1 || { echo "$name client failed:" >&2; cat "$work/$name.c" "$work/$name.s" >&2; exit 1; }
  wait $sp || { echo "$name server failed:" >&2; cat "$work/$name.s" >&2; exit 1; }
}
# col N FILE: column N of the result row (the line after the header that starts with #bytes)
col() { awk -v n="$1" '/#bytes/ {h=1; next} h && NF > 4 && $1 ~ /^[0-9]+$/ {print $n; exit}' "$2"; }

# cbw [ZERO_COPY]: the C pair; SOFTROCE_ZERO_COPY=0 registers the buffers as copied memory.
cbw() {
  port=$((port + 1))
  local zc=${1:-1}
  run_pair cbw env SOFTROCE_ZERO_COPY="$zc" SOFTROCE_SOCKET="$work/A.sock" LD_LIBRARY_PATH="$LIB" ib_write_bw -d softroce0 -x 1 -F -s 65536 -n "$BW_ITERS" -p $port -- \
    env SOFTROCE_ZERO_COPY="$zc" SOFTROCE_SOCKET="$work/B.sock" LD_LIBRARY_PATH="$LIB" ib_write_bw -d softroce0 -x 1 -F -s 65536 -n "$BW_ITERS" -p $port 127.0.0.1
  col 4 "$work/cbw.c"
}
gbw() {
  port=$((port + 1))
  run_pair gbw "$work/softroce" perf write --daemon "$work/A.sock" -F -s 65536 -n "$BW_ITERS" -p $port -- \
    "$work/softroce" perf write --daemon "$work/B.sock" -F -s 65536 -n "$BW_ITERS" -p $port 127.0.0.1
  col 4 "$work/gbw.c"
}
clat() {
  port=$((port + 1))
  local zc=${1:-1}
  run_pair clat env SOFTROCE_ZERO_COPY="$zc" SOFTROCE_SOCKET="$work/A.sock" LD_LIBRARY_PATH="$LIB" ib_send_lat -d softroce0 -x 1 -F -s 8 -n "$LAT_ITERS" -p $port -- \
    env SOFTROCE_ZERO_COPY="$zc" SOFTROCE_SOCKET="$work/B.sock" LD_LIBRARY_PATH="$LIB" ib_send_lat -d softroce0 -x 1 -F -s 8 -n "$LAT_ITERS" -p $port 127.0.0.1
  col 5 "$work/clat.c"
}
glat() {
  port=$((port + 1))
  run_pair glat "$work/softroce" perf send --lat --daemon "$work/A.sock" -F -s 8 -n "$LAT_ITERS" -p $port -- \
    "$work/softroce" perf send --lat --daemon "$work/B.sock" -F -s 8 -n "$LAT_ITERS" -p $port 127.0.0.1
  col 5 "$work/glat.c"
}

best_max() { printf '%s\n' "$@" | sort -g | tail -1; }
best_min() { printf '%s\n' "$@" | sort -g | head -1; }
c_bw=() cc_bw=() g_bw=() c_lat=() cc_lat=() g_lat=()
for _ in $(seq "$RUNS"); do
  c_bw+=("$(cbw)"); cc_bw+=("$(cbw 0)"); g_bw+=("$(gbw)")
  c_lat+=("$(clat)"); cc_lat+=("$(clat 0)"); g_lat+=("$(glat)")
done
cb=$(best_max "${c_bw[@]}") ccb=$(best_max "${cc_bw[@]}") gb=$(best_max "${g_bw[@]}")
cl=$(best_min "${c_lat[@]}") ccl=$(best_min "${cc_lat[@]}") gl=$(best_min "${g_lat[@]}")
echo "runs: $RUNS (best of each); BW iterations $BW_ITERS, latency iterations $LAT_ITERS"
echo "ib_write_bw -s 65536 (C, libraries)      ${c_bw[*]} MB/s -> $cb"
echo "ib_write_bw, SOFTROCE_ZERO_COPY=0        ${cc_bw[*]} MB/s -> $ccb"
echo "softroce perf write -s 65536 (Go)        ${g_bw[*]} MB/s -> $gb"
awk -v c="$cb" -v g="$gb" 'BEGIN {printf "write BW ratio C/Go: %.2f (target >= 0.80)\n", c / g}'
awk -v c="$ccb" -v g="$gb" 'BEGIN {printf "write BW ratio C/Go, copied memory: %.2f\n", c / g}'
echo "ib_send_lat -s 8 (C, libraries)          ${c_lat[*]} us typical -> $cl"
echo "ib_send_lat, SOFTROCE_ZERO_COPY=0        ${cc_lat[*]} us typical -> $ccl"
echo "softroce perf send --lat -s 8 (Go)       ${g_lat[*]} us typical -> $gl"
awk -v c="$cl" -v g="$gl" 'BEGIN {printf "send latency ratio C/Go: %.2f (target <= 1.30)\n", c / g}'
awk -v c="$ccl" -v g="$gl" 'BEGIN {printf "send latency ratio C/Go, copied memory: %.2f\n", c / g}'

if [ "$update" = 1 ]; then
  table=$work/table.md
  {
    echo "| | C through the libraries | Go tool (\`softroce perf --daemon\`) | ratio | target |"
    echo "|---|---|---|---|---|"
    awk -v c="$cb" -v g="$gb" 'BEGIN {printf "| `ib_write_bw -s 65536` vs `perf write -s 65536` | %.0f MB/s | %.0f MB/s | %.2f | >= 0.80 |\n", c, g, c / g}'
    awk -v c="$ccb" -v g="$gb" 'BEGIN {printf "| the same, copied memory (`SOFTROCE_ZERO_COPY=0`) | %.0f MB/s | %.0f MB/s | %.2f | |\n", c, g, c / g}'
    awk -v c="$cl" -v g="$gl" 'BEGIN {printf "| `ib_send_lat -s 8` vs `perf send --lat -s 8` (typical) | %.1f us | %.1f us | %.2f | <= 1.30 |\n", c, g, c / g}'
    awk -v c="$ccl" -v g="$gl" 'BEGIN {printf "| the same, copied memory (`SOFTROCE_ZERO_COPY=0`) | %.1f us | %.1f us | %.2f | |\n", c, g, c / g}'
    echo
    echo "Runs: each side $RUNS times, alternating, best of each ($BW_ITERS bandwidth and $LAT_ITERS latency iterations)."
  } > "$table"
  begin='<!-- bench/clib.sh table: begin (generated by bench/clib.sh --update; do not edit) -->'
  end='<!-- bench/clib.sh table: end -->'
  grep -qF "$begin" docs/clib.md && grep -qF "$end" docs/clib.md || { echo "docs/clib.md: no bench/clib.sh table markers" >&2; exit 1; }
  awk -v b="$begin" -v e="$end" -v t="$table" '
    $0 == b { print; while ((getline l < t) > 0) print l; skip = 1; next }
    $0 == e { skip = 0 }
    !skip { print }' docs/clib.md > "$work/clib.md"
  cp "$work/clib.md" docs/clib.md
  echo "docs/clib.md: table updated"
fi
