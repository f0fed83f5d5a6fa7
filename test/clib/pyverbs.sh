#!/usr/bin/env bash
# rdma-core's own test suite (Debian's python3-pyverbs: /usr/share/doc/rdma-core/tests,
# run_tests.py) against a softroce daemon, through the drop-in libraries, or against kernel
# rxe in the lab guest (--rxe), for the comparison (docs/clib.md).
#
#   test/clib/pyverbs.sh [--rxe] [OUT]   # results: OUT/pyverbs.log (unittest -v) and OUT/pyverbs.tsv
#
# softroce (the default): the suite finds a device's network interface in sysfs
# (/sys/class/infiniband/DEV/device/net/IFNAME) and its address with `ip addr`. The adapter
# is a private mount namespace whose /sys/class is the host's (every class bind-mounted back)
# plus infiniband/softroce0/device/net/lo: the interface the daemon really listens on
# (127.0.0.1 on lo). Nothing else is faked: every verb goes to the daemon. Needs root
# (unshare -m), python3-pyverbs, and a built softroce (go build) and libraries (make libs).
#
# --rxe: the same suite, `run_tests.py --dev rxe0 --gid N` (N: rxe0's RoCE v2 GID of the
# guest's IPv4 address), in the kernel-rxe lab guest (docs/lab.md), which has no Python of its
# own: the guest boots with the host's root filesystem exported read-only (`vm --rootfs /`)
# and test/clib/pyverbs-guest.sh chroots into it, so the host's python3-pyverbs and rdma-core
# userspace (libibverbs with its rxe provider, Debian 12's, as the guest's) run on the guest's
# kernel. Takes the lab lock (RXE_LAB_LOCK; waits for another run to finish) and reuses the
# built guest (setup --no-install).
set -euo pipefail
cd "$(dirname "$0")/../.."
RXE=0
if [ "${1:-}" = --rxe ]; then RXE=1; shift; fi
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
SRC=/usr/share/doc/rdma-core/tests
[ -d "$SRC" ] || { echo "python3-pyverbs is not installed ($SRC missing)"; exit 1; }
work=$(mktemp -d)
dpid=
trap '[ -z "$dpid" ] || kill $dpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cp -r "$SRC" "$work/tests"
gunzip -f "$work"/tests/*.gz

# rxe: the lab guest, the suite from the host's root (pyverbs-guest.sh); the log comes back
# through the share ($work, the guest's /mnt/host)
run_rxe() {
  source test/rxelab/session.sh   # GUEST_IP; lab_session_start, lab_session_end
  LOG=$OUT/lab.log
  : > "$LOG"
  trap 'lab_session_end; rm -rf "$work"' EXIT
  lab_session_start pyverbs.sh "$LOG" 3600 --share "$work" --rootfs / --max-life 2400 || exit 1
  test/rxelab/vm exec --timeout 1800 test/clib/pyverbs-guest.sh "$GUEST_IP" /mnt/host >> "$LOG" 2>&1 7>&- ||
    { echo "pyverbs.sh: the guest job failed (see $LOG)" >&2; exit 1; }
  lab_session_end
  cp "$work/pyverbs.log" "$work/pyverbs-sysfs.log" "$OUT/"
}

# softroce: a daemon on 127.0.0.1, the suite through the libraries in a private mount namespace
run_softroce() {
  make -s libs
  go build -o build/softroce ./cmd/softroce
  local sock=$work/d.sock
  build/softroce daemon --listen 127.0.0.1 --socket "$sock" > "$OUT/daemon.log" 2>&1 &
  dpid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || { echo "daemon did not start"; cat "$OUT/daemon.log"; exit 1; }

unshare -m --propagation private bash -s "$work" "$sock" "$PWD/build/lib" "$OUT" <<'INNER'
set -euo pipefail
work=$1 sock=$2 lib=$3 out=$4
stage=$work/sysclass
mkdir -p "$stage"
mount -t tmpfs softroce-sysfs "$stage"
for c in /sys/class/*; do
  n=${c##*/}; mkdir "$stage/$n"; mount --bind "$c" "$stage/$n"
done
mkdir -p "$stage/infiniband/softroce0/device/net/lo"
mount --rbind "$stage" /sys/class
cd "$work/tests"
SOFTROCE_SOCKET=$sock LD_LIBRARY_PATH=$lib timeout 1500 \
  /usr/bin/python3 run_tests.py --dev softroce0 --gid 1 -v > "$out/pyverbs.log" 2>&1 || true
INNER
}

if [ "$RXE" = 1 ]; then run_rxe; else run_softroce; fi

# One row per test: name, result (ok / skipped: reason / FAIL / ERROR). A test with a
# docstring prints its result at the end of the docstring's line; a player's message may
# come between a test's "..." and its result.
tsv() { python3 - "$1" <<'PY'
import re, sys
RES = r"(ok|FAIL|ERROR|expected failure|unexpected success|skipped.*)"
def result(r):
    if r.startswith("skipped"):
        return "skipped: " + r[len("skipped"):].strip().strip("'\"")
    return r
lines = [l.rstrip() for l in open(sys.argv[1], errors="replace")]
for i, line in enumerate(lines):
    m = re.match(r"^(test\S+) \((\S+)\)(.*)$", line)
    if not m:
        continue
    name, cls, rest = m.groups()
    full = cls if cls.endswith("." + name) else f"{cls}.{name}"
    res = None
    for l in [rest] + lines[i + 1:i + 8]:
        if l is not rest and re.match(r"^test\S+ \(", l):
            break
        r = re.search(r"(?:^|\.\.\. )" + RES + r"$", l.strip())
        if r:
            res = result(r.group(1))
            break
    print(f"{full}\t{res or '?'}")
PY
}
tsv "$OUT/pyverbs.log" > "$OUT/pyverbs.tsv"
[ "$RXE" = 0 ] || tsv "$OUT/pyverbs-sysfs.log" > "$OUT/pyverbs-sysfs.tsv"
tail -3 "$OUT/pyverbs.log"
awk -F'\t' '{r=$2; sub(/:.*/, "", r); n[r]++} END {for (k in n) printf "%s %d\n", k, n[k]}' "$OUT/pyverbs.tsv"
