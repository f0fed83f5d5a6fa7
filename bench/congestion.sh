#!/usr/bin/env bash
# bench/congestion.sh: congestion control on a real ECN-marking bottleneck (docs/congestion.md,
# "Measured"). In the rxe lab guest (docs/lab.md) bench/congestion-guest.sh builds a dumbbell of
# network namespaces whose bottleneck is a tbf at RATE Mbit/s with RED marking ECN below it, and
# runs N RC flows of 64 KiB RDMA WRITEs through it, one phase after another:
#   softroce-cc     softroce senders with DCQCN (--cc "on,$CC_PARAMS")
#   softroce-cc-sr  the same with selective repeat on both ends (--selective-repeat; skipped,
#                   saying why, when the built binary has no such flag)
#   softroce-nocc   softroce senders with congestion control and ECN off (--cc off)
#   rxe             kernel rxe senders (ib_write_bw on rxe devices in the guest)
# softroce receives every flow. bench/congestion (Go) turns the samples into the table
# (utilization, Jain's fairness over 1 s intervals, drops, marks, queue) and an SVG of each
# flow's rate over time.
#
# usage: sudo bench/congestion.sh [--flows N] [--secs S] [--rate MBIT] [--phases LIST] [--rounds R] [--out DIR] [--update]
#   --phases   comma-separated, of softroce-cc, softroce-cc-sr, softroce-nocc, rxe (default: all)
#   --rounds   run the phases R times, one round after the other, in one VM session (default 1);
#              the table has a row per phase and round and says in how many rounds each phase
#              met each target
#   --update   write the results to bench/results/congestion-N.{txt,svg} and the table into
#              docs/congestion.md (between its markers)
# Environment: CC_PARAMS (DCQCN settings for this bottleneck's scale, below), RED_MIN, RED_MAX,
# RED_LIMIT, RED_P, RED_BURST (bench/congestion-guest.sh), RXE_LAB_LOCK.
#
# The lab lock (scripts/interop's) is held for one VM session: boot, the phases, power off
# (about 40 s per phase); each phase is short because the guest is shared with the interop suite.
set -uo pipefail
cd "$(dirname "$0")/.."
FLOWS=4 SECS=15 RATE=20 PHASES=softroce-cc,softroce-cc-sr,softroce-nocc,rxe ROUNDS=1 OUT="" UPDATE=0
while [ $# -gt 0 ]; do
  case "$1" in
  --flows) FLOWS=$2; shift ;;
  --secs) SECS=$2; shift ;;
  --rate) RATE=$2; shift ;;
  --phases) PHASES=$2; shift ;;
  --rounds) ROUNDS=$2; shift ;;
  --out) OUT=$2; shift ;;
  --update) UPDATE=1 ;;
  *) echo "usage: bench/congestion.sh [--flows N] [--secs S] [--rate MBIT] [--phases LIST] [--rounds R] [--out DIR] [--update]" >&2; exit 2 ;;
  esac
  shift
done
for ph in ${PHASES//,/ }; do
  case "$ph" in softroce-cc | softroce-cc-sr | softroce-nocc | rxe) ;; *) echo "bench/congestion.sh: unknown phase $ph" >&2; exit 2 ;; esac
done
[ "$(id -u)" = 0 ] || { echo "bench/congestion.sh: must run as root" >&2; exit 1; }
# DCQCN's defaults are a 40-100 Gbit/s NIC's with microseconds of feedback delay (a CNP per
# 50 us, a cut per CNP, an increase every 300 us). The lab's feedback delay is milliseconds
# (the RED queue at 20 Mbit/s, RED's averaging, TCG's scheduling), so the periods are scaled
# to it keeping their order: a CNP per 4 ms, alpha updated per CNP interval with DCTCP's gain
# (g 1/16: rp_dce_tcp_g 960), a cut at most every 16 ms (about a round trip through the queue
# while RED marks: one cut per round trip, as TCP), an increase of 1 Mbit/s (5% of the
# bottleneck) every 25 ms (longer than the cut period), the target rate clamped at each cut,
# no byte counter; the first CNP sets a QP to 5 Mbit/s, the fair share of four flows (a QP
# starts at line rate, as on a NIC: without it the start overflowed the queue).
CC_PARAMS=${CC_PARAMS:-rp_clamp_tgt_rate=1,rp_ai_rate=1,rp_hai_rate=2,rp_time_reset=25000,rp_byte_reset=0,rp_dce_tcp_g=960,rp_dce_tcp_rtt=4000,np_min_time_between_cnps=4000,rp_rate_reduce_monitor_period=16000,rp_rate_to_set_on_first_cnp=5}
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/softroce-congestion.XXXXXX)
mkdir -p "$OUT"
SHARE=$(mktemp -d /tmp/softroce-congestion-share.XXXXXX)
trap 'rm -rf "$SHARE"' EXIT
CGO_ENABLED=0 go build -trimpath -o "$SHARE/softroce" ./cmd/softroce || exit 1
go build -o "$SHARE/report" ./bench/congestion || exit 1
cp bench/congestion-guest.sh "$SHARE/" || exit 1
LOG=$OUT/lab.log RAW=$OUT/congestion-$FLOWS.txt
: > "$RAW"
# selective repeat is a flag of the tools on both ends; a binary without it runs no SR phase
SR_OK=1
"$SHARE/softroce" perf -h 2>&1 | grep -q selective-repeat || SR_OK=0

source test/rxelab/session.sh   # lab_session_start, lab_session_end: the lock, the VM
trap 'lab_session_end; rm -rf "$SHARE"' EXIT
lab_session_start bench/congestion.sh "$LOG" 2400 --share "$SHARE" --max-life $((300 + ROUNDS * 300)) || exit 1
# RED marks with probability up to 0.5 within its band: the bottleneck passes about 600 packets
# a second, so at 0.1 a flow got a mark only every 70-130 ms inside the band, fewer than its
# increases, and the flows kept rising until the queue passed the point where RED marks every
# packet: control by all or nothing, the queue swinging between empty and twice that point.
G="RED_MIN=${RED_MIN:-40000} RED_MAX=${RED_MAX:-160000} RED_LIMIT=${RED_LIMIT:-500000} RED_P=${RED_P:-0.5} RED_BURST=${RED_BURST:-11} bash /mnt/host/congestion-guest.sh /mnt/host/softroce"
test/rxelab/vm exec --timeout 120 -c "$G up $FLOWS $RATE" >> "$LOG" 2>&1 7>&- ||
  { echo "bench/congestion.sh: the dumbbell did not come up (see $LOG)" >&2; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
  echo "ROUND|$round" >> "$RAW"
  for ph in ${PHASES//,/ }; do
    case "$ph" in
    softroce-cc) args="softroce $FLOWS $SECS on,$CC_PARAMS" ;;
    softroce-cc-sr) args="softroce-sr $FLOWS $SECS on,$CC_PARAMS" ;;
    softroce-nocc) args="softroce $FLOWS $SECS off" ;;
    rxe) args="rxe $FLOWS $SECS" ;;
    esac
    if [ "$ph" = softroce-cc-sr ] && [ "$SR_OK" = 0 ]; then
      [ "$round" = 1 ] && echo "   phase $ph skipped: this softroce has no --selective-repeat (softroce perf -h)" >&2
      continue
    fi
    echo "   round $round/$ROUNDS: phase $ph ($FLOWS flows, $SECS s, $RATE Mbit/s)" >&2
    # the samples' clock from the phase's start (the guest's wall clock is no part of the result)
    test/rxelab/vm exec --timeout $((SECS + 150)) -c "$G run $ph $args" 2>> "$LOG" 7>&- |
      awk -F'|' -v OFS='|' '$1 == "S" { if (t0 == "") t0 = $2; $2 = sprintf("%.3f", $2 - t0) } { print }' >> "$RAW" ||
      echo "bench/congestion.sh: phase $ph failed (see $LOG)" >&2
  done
done
lab_session_end
"$SHARE/report" table "$RAW" || exit 1
"$SHARE/report" svg "$RAW" > "$OUT/congestion-$FLOWS.svg" || exit 1
echo "raw samples: $RAW, plot: $OUT/congestion-$FLOWS.svg, log: $LOG" >&2
if [ "$UPDATE" = 1 ]; then
  mkdir -p bench/results
  cp "$RAW" "$OUT/congestion-$FLOWS.svg" bench/results/
  "$SHARE/report" docs docs/congestion.md bench/results/congestion-*.txt || exit 1
  echo "updated bench/results/congestion-$FLOWS.{txt,svg} and the table in docs/congestion.md" >&2
fi
