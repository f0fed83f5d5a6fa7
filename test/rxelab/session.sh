# shellcheck shell=bash
# A lab session for scripts that boot the lab VM for a job of their own (bench/congestion.sh,
# bench/loss.sh, test/clib/pyverbs.sh --rxe). Sourced from the repository root, after lib.sh
# is available (it is sourced here). docs/lab.md.
#
#   lab_session_start NAME LOG WAIT VM_START_ARGS...
#       takes the machine-wide lab lock on fd 7 (waiting up to WAIT seconds for another lab
#       user), refuses to touch a VM someone else started, builds the guest if it is not
#       (setup --no-install, output to LOG) and starts the VM with RXE_LAB_MEM (default 2048)
#       and VM_START_ARGS. Returns non-zero, having said why on stderr, on any failure.
#   lab_session_end
#       stops the VM lab_session_start started and releases the lock; safe to call again, and from
#       the caller's EXIT trap (which must call it: a failed script leaves no VM behind).
#
# Commands the caller runs in the VM (test/rxelab/vm exec ...) should close fd 7 (7>&-), so a
# guest job that outlives the script cannot hold the lock.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LAB_SESSION_NAME= LAB_SESSION_LOG=/dev/null LAB_SESSION_STARTED=0

lab_session_start() {
  LAB_SESSION_NAME=$1 LAB_SESSION_LOG=$2
  local wait=$3
  shift 3
  mkdir -p "$(dirname "$LAB_LOCK")"
  exec 7>"$LAB_LOCK"
  echo "   waiting for the lab lock" >&2
  timeout "$wait" flock 7 || { echo "$LAB_SESSION_NAME: $LAB_LOCK not acquired" >&2; return 1; }
  if test/rxelab/vm status > /dev/null 2>&1; then
    echo "$LAB_SESSION_NAME: someone else's lab VM is running: not touching it" >&2
    return 1
  fi
  LAB_SESSION_STARTED=1
  test/rxelab/setup --no-install >> "$LAB_SESSION_LOG" 2>&1 ||
    { echo "$LAB_SESSION_NAME: lab setup failed (see $LAB_SESSION_LOG)" >&2; return 1; }
  RXE_LAB_MEM=${RXE_LAB_MEM:-2048} test/rxelab/vm start "$@" >> "$LAB_SESSION_LOG" 2>&1 7>&- ||
    { echo "$LAB_SESSION_NAME: VM did not start (see $LAB_SESSION_LOG)" >&2; return 1; }
}

lab_session_end() {
  if [ "$LAB_SESSION_STARTED" = 1 ]; then
    test/rxelab/vm stop >> "$LAB_SESSION_LOG" 2>&1 7>&-
    LAB_SESSION_STARTED=0
  fi
  { flock -u 7; } 2>/dev/null || true
}
