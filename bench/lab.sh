#!/usr/bin/env bash
# bench/lab.sh SOFTROCE_BIN OUTDIR [QUICK]: the rxe-lab part of bench/run. Takes the lab lock
# ($RXE_LAB_LOCK, default /var/cache/rxe-lab/interop.lock, as scripts/interop does) for the
# whole session, boots the lab VM with --dual, runs bench/lab-guest.sh in the guest (kernel rxe<->rxe, softroce<->softroce and
# softroce<->rxe on veth pairs inside the guest, ib_write_bw/ib_write_lat and `softroce perf`),
# always stops the VM, and prints table rows "lab|..." with the softroce/rxe ratio per row.
# Every server runs on guest CPU 1 and every client on CPU 0 (taskset, rxe and softroce alike;
# LAB_PIN=0 lets the guest scheduler place them): unpinned, softroce's 64 KiB rounds were
# bimodal (docs/performance.md, "Targets").
set -uo pipefail
cd "$(dirname "$0")/.."
SR=$1 OUT=$2 QUICK=${3:-0}
[ "$(id -u)" = 0 ] || { echo "bench/lab.sh: must run as root" >&2; exit 1; }
NBW=1000 NLAT=500
[ "$QUICK" = 1 ] && { NBW=200; NLAT=200; }
SHARE=$(mktemp -d /tmp/softroce-bench-share.XXXXXX)
cp "$SR" "$SHARE/softroce" && cp bench/lab-guest.sh "$SHARE/lab-guest.sh" || exit 1
# LAB_OLD_BIN: an older softroce build, run as "softroce-softroce-bp-old" next to the new one;
# LAB_ONLY=lat8: only the 8-byte write_lat rows (lab-guest.sh)
[ -n "${LAB_OLD_BIN:-}" ] && { cp "$LAB_OLD_BIN" "$SHARE/softroce-old" || exit 1; }
# LAB_PROBE=1: the spinning 8-byte UDP round trip in C and Go in every 8-byte round (the floor);
# with LAB_LADDER=1 also through pkg/link, its options one at a time (bench/probe/link.go)
if [ "${LAB_PROBE:-0}" = 1 ]; then
  CGO_ENABLED=0 /usr/local/go/bin/go build -trimpath -o "$SHARE/probe" ./bench/probe &&
    gcc -O2 -static -o "$SHARE/pingpong" bench/cprobe/pingpong.c || { echo "bench/lab.sh: probe build failed" >&2; exit 1; }
fi
LOG=$OUT/lab.log
# The lab lock: scripts/interop and test/conform/cmd/conform-rxe hold it for their whole run.
# Long-lived children (the VM and its watchdog) get it closed.
echo "   waiting for the lab lock" >&2
LOCK=${RXE_LAB_LOCK:-/var/cache/rxe-lab/interop.lock}   # machine-wide, whatever the cache (lib.sh)
mkdir -p "$(dirname "$LOCK")"
exec 7>"$LOCK"
timeout 2400 flock 7 || { echo "bench/lab.sh: $LOCK not acquired" >&2; exit 1; }
# never touch a VM someone else started
for _ in $(seq 1 120); do
  test/rxelab/vm status > /dev/null 2>&1 || break
  echo "   a lab VM is running (someone else's): waiting" >&2
  sleep 10
done
if test/rxelab/vm status > /dev/null 2>&1; then
  echo "bench/lab.sh: someone else's lab VM is still running: not touching it" >&2
  exit 1
fi
STARTED=0
cleanup() { [ "$STARTED" = 1 ] && test/rxelab/vm stop >> "$LOG" 2>&1 7>&-; rm -rf "$SHARE"; }
trap cleanup EXIT
echo "   $(date -u +%H:%M) host load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
test/rxelab/setup --no-install >> "$LOG" 2>&1 || { echo "bench/lab.sh: lab setup failed" >&2; exit 1; }
STARTED=1
RXE_LAB_MTU=9000 test/rxelab/vm start --dual --share "$SHARE" --max-life 1800 >> "$LOG" 2>&1 7>&- ||
  { echo "bench/lab.sh: VM did not start (see $LOG)" >&2; exit 1; }
test/rxelab/vm exec --timeout 1500 -c "LAB_PIN=${LAB_PIN:-1} LAB_ONLY=${LAB_ONLY:-} LAB_STATS=${LAB_STATS:-0} LAB_LADDER=${LAB_LADDER:-0} LAB_XDP=${LAB_XDP:-1} LAB_RPS=${LAB_RPS:-0} ROUNDS=${ROUNDS:-3} bash /mnt/host/lab-guest.sh /mnt/host/softroce $NBW $NLAT 4096" > "$OUT/lab.rows" 2>> "$LOG" 7>&-
st=$?
echo "   guest script exit $st; host load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# rows with ratios softroce/rxe: bandwidth higher is better, latency lower is better
awk -F'|' '
  # repeated rows (ROUNDS in lab-guest.sh): the best value (bandwidth: highest, latency:
  # lowest) and the list of all of them
  $1 == "ROW" {
    key = $2 "|" $3 "|" $4; k[$3 "|" $4] = 1
    if ($2 == "rxe-rxe" || m == "") m = $5 # the MTU of the row: that of rxe (the --xdp rows run at 2048)
    if (!(key in v) || v[key] == "FAIL" || ($6 != "FAIL" && (($3 ~ /_bw$/) ? $6 + 0 > v[key] + 0 : $6 + 0 < v[key] + 0))) v[key] = $6
    all[key] = (cnt[key] > 0) ? all[key] "/" $6 : $6; cnt[key]++
  }
  END {
    for (t in k) {
      split(t, a, "|"); test = a[1]; size = a[2]
      r = v["rxe-rxe|" t]; s = v["softroce-softroce|" t]; x = v["softroce-rxe|" t]; s2 = v["softroce-softroce-gmp2|" t]; sb = v["softroce-softroce-bp|" t]; xb = v["softroce-rxe-bp|" t]
      sx = v["softroce-softroce-xdp|" t]; xx = v["softroce-rxe-xdp|" t]
      sd = v["softroce-softroce-xdp-dm|" t]; xd = v["softroce-rxe-xdp-dm|" t]
      rounds = ""
      if (cnt["rxe-rxe|" t] > 1) rounds = sprintf(" [best of rounds: rxe %s, softroce %s, --busy-poll %s%s%s%s%s]", all["rxe-rxe|" t], all["softroce-softroce|" t], all["softroce-softroce-bp|" t], ("softroce-softroce-xdp|" t in all) ? ", --busy-poll --xdp " all["softroce-softroce-xdp|" t] : "", ("softroce-softroce-xdp-dm|" t in all) ? ", --busy-poll --xdp --dm " all["softroce-softroce-xdp-dm|" t] : "", ("softroce-softroce-bp-old|" t in all) ? ", --busy-poll with LAB_OLD_BIN " all["softroce-softroce-bp-old|" t] : "", ("softroce-softroce-xdp-old|" t in all) ? ", --busy-poll --xdp with LAB_OLD_BIN " all["softroce-softroce-xdp-old|" t] : "")
      unit = (test ~ /_bw$/) ? "Gbit/s" : "us typical"
      ratio = "?"; rb = ""
      if (r + 0 > 0 && s + 0 > 0) ratio = sprintf("%.2fx", (test ~ /_bw$/) ? s / r : r / s)
      if (r + 0 > 0 && sb + 0 > 0) rb = sprintf(", --busy-poll %.2fx", (test ~ /_bw$/) ? sb / r : r / sb)
      if (r + 0 > 0 && sx + 0 > 0) rb = rb sprintf(", --busy-poll --xdp %.2fx", (test ~ /_bw$/) ? sx / r : r / sx)
      if (r + 0 > 0 && sd + 0 > 0) rb = rb sprintf(", --busy-poll --xdp --dm %.2fx", (test ~ /_bw$/) ? sd / r : r / sd)
      printf "lab|%s (TCG guest)|%s|%s|1|rxe<->rxe %s, softroce<->softroce %s%s%s%s%s, softroce<->rxe %s%s%s%s %s; softroce/rxe %s%s%s%s\n",
        test, size, m, r, s, (s2 != "") ? " (GOMAXPROCS=2: " s2 ")" : "", (sb != "") ? " (--busy-poll: " sb ")" : "", (sx != "") ? " (--busy-poll --xdp: " sx ")" : "",
        (sd != "") ? " (--busy-poll --xdp --dm: " sd ")" : "",
        x, (xb != "") ? " (--busy-poll: " xb ")" : "", (xx != "") ? " (--busy-poll --xdp: " xx ")" : "", (xd != "") ? " (--busy-poll --xdp --dm: " xd ")" : "",
        unit, ratio, rb, (test ~ /_lat$/) ? " (rxe latency / softroce latency)" : "", rounds
    }
  }' "$OUT/lab.rows" | sort
# every pairing's rounds, in session order (including LAB_OLD_BIN and LAB_PROBE rows), and
# their median (the best round flatters whichever side had the quietest moment; the lab's
# noise between rounds is often larger than a change being measured)
awk -F'|' '$1 == "ROW" { k = $2 "|" $3 "|" $4; all[k] = (k in all) ? all[k] "/" $6 : $6; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    if ($6 != "FAIL") { c = ++nv[k]; val[k, c] = $6 + 0 } }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]; m = nv[k]; med = "FAIL"
      for (a = 2; a <= m; a++) { x = val[k, a]; for (b = a - 1; b >= 1 && val[k, b] > x; b--) val[k, b + 1] = val[k, b]; val[k, b + 1] = x }
      if (m > 0) med = (m % 2) ? val[k, (m + 1) / 2] : (val[k, m / 2] + val[k, m / 2 + 1]) / 2
      printf "labrounds|%s|%s|median %s\n", k, all[k], med
    }
  }' "$OUT/lab.rows"
