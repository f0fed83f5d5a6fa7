#!/usr/bin/env bash
# bench/loss.sh: loss recovery on a lossy bottleneck (docs/reliability.md, "Loss recovery on a
# lossy bottleneck"). In the rxe lab guest (docs/lab.md) bench/loss-guest.sh builds a line of
# network namespaces whose bottleneck is a tbf at RATE Mbit/s with `netem loss P%` below it,
# and runs one RC stream of ITERS 64 KiB RDMA WRITEs through it per stack and loss:
#   softroce      softroce <-> softroce, go-back-N (the engine's default)
#   softroce-sr   softroce <-> softroce, both ends --selective-repeat (skipped, saying why, when
#                 the built binary has no such flag)
#   rxe           kernel rxe <-> kernel rxe (ib_write_bw on two rxe devices in the guest)
# bench/loss (Go) turns the counters into the table (goodput, request packets sent per packet
# the data needs, netem's drops) and an SVG (goodput and sent/needed against the loss).
#
# usage: sudo bench/loss.sh [--losses LIST] [--phases LIST] [--iters N] [--depth D] [--rate MBIT] [--rounds R] [--out DIR] [--update]
#   --losses   comma-separated netem loss percentages (default 0,1,5)
#   --phases   comma-separated, of softroce, softroce-sr, rxe (default: all three)
#   --iters    64 KiB WRITEs per run (default 150: about 4 s at 20 Mbit/s without loss)
#   --depth    WRITEs outstanding (perftest's -t; default 2)
#   --rounds   run the whole list (every loss, every stack) R times, one round after the other
#              (default 1); the table sums a row's counters over its runs
#   --update   write the results to bench/results/loss.{txt,svg} and the table into
#              docs/reliability.md (between its markers)
# Environment: RXE_LAB_LOCK.
#
# The lab lock (scripts/interop's) is held for one VM session: boot, the runs (losses x
# stacks, each a few seconds to a minute: the guest is TCG), power off.
set -uo pipefail
cd "$(dirname "$0")/.."
LOSSES=0,1,5 PHASES=softroce,softroce-sr,rxe ITERS=150 DEPTH=2 RATE=20 ROUNDS=1 OUT="" UPDATE=0
while [ $# -gt 0 ]; do
  case "$1" in
  --losses) LOSSES=$2; shift ;;
  --phases) PHASES=$2; shift ;;
  --iters) ITERS=$2; shift ;;
  --depth) DEPTH=$2; shift ;;
  --rate) RATE=$2; shift ;;
  --rounds) ROUNDS=$2; shift ;;
  --out) OUT=$2; shift ;;
  --update) UPDATE=1 ;;
  *) echo "usage: bench/loss.sh [--losses LIST] [--phases LIST] [--iters N] [--depth D] [--rate MBIT] [--rounds R] [--out DIR] [--update]" >&2; exit 2 ;;
  esac
  shift
done
for ph in ${PHASES//,/ }; do
  case "$ph" in softroce | softroce-sr | rxe) ;; *) echo "bench/loss.sh: unknown phase $ph" >&2; exit 2 ;; esac
done
[ "$(id -u)" = 0 ] || { echo "bench/loss.sh: must run as root" >&2; exit 1; }
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/softroce-loss.XXXXXX)
mkdir -p "$OUT"
SHARE=$(mktemp -d /tmp/softroce-loss-share.XXXXXX)
trap 'rm -rf "$SHARE"' EXIT
CGO_ENABLED=0 go build -trimpath -o "$SHARE/softroce" ./cmd/softroce || exit 1
go build -o "$SHARE/report" ./bench/loss || exit 1
cp bench/loss-guest.sh "$SHARE/" || exit 1
LOG=$OUT/lab.log RAW=$OUT/loss.txt
: > "$RAW"
# selective repeat is a flag of the tools on both ends; a binary without it runs no SR phase
SR_OK=1
"$SHARE/softroce" perf -h 2>&1 | grep -q selective-repeat || SR_OK=0

source test/rxelab/session.sh   # lab_session_start, lab_session_end: the lock, the VM
trap 'lab_session_end; rm -rf "$SHARE"' EXIT
lab_session_start bench/loss.sh "$LOG" 2400 --share "$SHARE" --max-life $((600 + ROUNDS * 900)) || exit 1
G="bash /mnt/host/loss-guest.sh /mnt/host/softroce"
test/rxelab/vm exec --timeout 120 -c "$G up $RATE" >> "$LOG" 2>&1 7>&- ||
  { echo "bench/loss.sh: the bottleneck did not come up (see $LOG)" >&2; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
  for loss in ${LOSSES//,/ }; do
    for ph in ${PHASES//,/ }; do
      if [ "$ph" = softroce-sr ] && [ "$SR_OK" = 0 ]; then
        why="this softroce has no --selective-repeat (softroce perf -h)"
        [ "$round" = 1 ] && echo "   phase $ph skipped: $why" >&2
        echo "SKIP|$ph|$loss|$why" >> "$RAW"
        continue
      fi
      echo "   round $round/$ROUNDS: phase $ph, loss $loss% ($ITERS x 64 KiB, $RATE Mbit/s)" >&2
      test/rxelab/vm exec --timeout $((ITERS + 180)) -c "$G run $ph $loss $ITERS $DEPTH" 2>> "$LOG" 7>&- >> "$RAW" ||
        echo "bench/loss.sh: phase $ph at $loss% failed (see $LOG)" >&2
    done
  done
done
lab_session_end
"$SHARE/report" table "$RAW" || exit 1
"$SHARE/report" svg "$RAW" > "$OUT/loss.svg" || exit 1
echo "raw results: $RAW, plot: $OUT/loss.svg, log: $LOG" >&2
if [ "$UPDATE" = 1 ]; then
  mkdir -p bench/results
  cp "$RAW" "$OUT/loss.svg" bench/results/
  "$SHARE/report" docs docs/reliability.md bench/results/loss.txt || exit 1
  echo "updated bench/results/loss.{txt,svg} and the table in docs/reliability.md" >&2
fi
