# shellcheck shell=bash
# rxe-lab common settings and helpers. Sourced by ./setup and ./vm (test/rxelab/ in the
# softroce repository). See docs/lab.md.
#
# Everything here can be overridden from the environment:
#   RXE_LAB_CACHE   work/cache dir (kernel, initramfs, run state)   [/var/cache/rxe-lab]
#   RXE_LAB_ACCEL   auto | kvm | tcg                                [auto: result of setup's KVM probe]
#   RXE_LAB_SMP     guest vCPUs                                      [2]
#   RXE_LAB_MEM     guest RAM in MiB                                 [1024]
#   RXE_LAB_MTU     MTU of the host tap, guest eth0 and guest veths  [1500 -> rxe active_mtu 1024]
#   RXE_LAB_SHARE   host folder shared with the guest at /mnt/host   [$RXE_LAB_CACHE/share]
#   RXE_LAB_APT_CACHE  where setup keeps downloaded .deb files        [$RXE_LAB_CACHE/apt]
#   RXE_LAB_APPEND  extra guest kernel command line words (experiments; bench/lab-probe.sh)
#
# Network (fixed, see docs/lab.md): netns "rxelab" on the host holds tap "rxetap0"
# with 198.18.0.1/24 and 2001:db8:198:18::1/64; the guest's eth0 is 198.18.0.2/24 and
# 2001:db8:198:18::2/64. Nothing is routed anywhere else: the netns has no other
# interface and no default route.

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RXE_LAB_CACHE:-/var/cache/rxe-lab}
RUN=$CACHE/run                 # state of the (single) running VM
CTL=$RUN/ctl                   # 9p share "rxectl", /mnt/ctl in the guest (job control)
NETNS=rxelab
TAP=rxetap0
HOST_IP=198.18.0.1
GUEST_IP=198.18.0.2
PREFIXLEN=24
HOST_IP6=2001:db8:198:18::1    # IPv6 (documentation prefix, RFC 3849); added without DAD
GUEST_IP6=2001:db8:198:18::2
PREFIXLEN6=64
HOST_MAC=52:54:00:18:00:01     # the tap's: link-local fe80::5054:ff:fe18:1
GUEST_MAC=52:54:00:18:00:02    # eth0's: link-local fe80::5054:ff:fe18:2, rxe0's GID 0
MTU=${RXE_LAB_MTU:-1500}
SMP=${RXE_LAB_SMP:-2}
MEM=${RXE_LAB_MEM:-1024}
APT_CACHE=${RXE_LAB_APT_CACHE:-$CACHE/apt}
APPEND=${RXE_LAB_APPEND:-}

# Debian packages the lab needs on the host (setup installs the missing ones).
# Everything setup, vm, scripts/interop and the guest image use, checked from a
# bare Debian 12 image: qemu (+ seabios/ipxe-qemu by dependency), the guest
# kernel, the rdma userspace copied into the initramfs, readelf (binutils) for
# the PVH note check, cpio, flock/setsid/nsenter (util-linux), pgrep (procps),
# tshark/tcpdump for captures, strace for the guest.
LAB_PACKAGES=(qemu-system-x86 linux-image-amd64 kmod rdma-core ibverbs-providers
  libibverbs1 ibverbs-utils perftest rdmacm-utils busybox-static tcpdump tshark
  iproute2 iputils-ping ethtool cpio python3 binutils util-linux procps strace
  gcc libc6-dev libibverbs-dev    # build the conformance agent (test/conform/agent)
  nftables                        # host-side loss on softroce->rxe in the netem pairings
  make librdmacm-dev python3-pyverbs)   # the drop-in libraries (clib/) and rdma-core's tests

log()  { printf '[rxe-lab] %s\n' "$*" >&2; }
die()  { printf '[rxe-lab] ERROR: %s\n' "$*" >&2; exit "${DIE_RC:-1}"; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

# The Debian amd64 kernel the guest boots: $RXE_LAB_KVER if set (another installed Debian
# kernel, e.g. bookworm's 6.12 for an experiment: docs/performance.md), else the one Debian's
# stock metapackage linux-image-amd64 depends on (bookworm: 6.1), else the newest installed.
# setup records the one it used in $CACHE/kver.
kernel_version() {
  if [ -s "$CACHE/kver" ]; then cat "$CACHE/kver"; return; fi
  if [ -n "${RXE_LAB_KVER:-}" ]; then echo "$RXE_LAB_KVER"; return; fi
  local v
  v=$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null | sed -n 's/^linux-image-\([^ ,]*-amd64\).*/\1/p')
  if [ -n "$v" ] && [ -d "/lib/modules/$v" ]; then echo "$v"; return; fi
  v=$(ls -1 /lib/modules 2>/dev/null | grep -- '-amd64$' | sort -V | tail -n1)
  [ -n "$v" ] || die "no *-amd64 kernel in /lib/modules (run ./setup)"
  echo "$v"
}

# Milliseconds since epoch, for timings.
now_ms() { date +%s%3N; }
fmt_ms() { local ms=$1; printf '%d.%03ds' $((ms / 1000)) $((ms % 1000)); }

# Quote words for a POSIX sh (the guest runs busybox ash): 'it'\''s'.
sh_quote() {
  local out="" a
  for a in "$@"; do out+="'${a//\'/\'\\\'\'}' "; done
  printf '%s' "${out% }"
}
