# shellcheck shell=bash
# rxe-lab common settings and helpers. Sourced by ./setup and ./vm (test/rxelab/ in the
# softroce repository). See docs/lab.md.
#
# Everything here can be overridden from the environment:
#   RXE_LAB_TARGET  a second guest kernel: a Debian kernel series with its own metapackage,
#                   linux-image-<series>-amd64 (bookworm ships 6.12: RXE_LAB_TARGET=6.12);
#                   empty: the stock kernel (linux-image-amd64, bookworm: 6.1)
#   RXE_LAB_CACHE   work/cache dir (kernel, initramfs, run state)   [/var/cache/rxe-lab,
#                   with a target /var/cache/rxe-lab-<series>]
#   RXE_LAB_LOCK    the machine-wide lab lock (one lab VM at a time, whatever the cache)
#                                                                    [/var/cache/rxe-lab/interop.lock]
#   RXE_LAB_ACCEL   auto | kvm | tcg                                [auto: result of setup's KVM probe]
#   RXE_LAB_SMP     guest vCPUs                                      [2]
#   RXE_LAB_MEM     guest RAM in MiB                                 [1024]
#   RXE_LAB_MTU     MTU of the host tap, guest eth0 and guest veths  [1500 -> rxe active_mtu 1024]
#   RXE_LAB_SHARE   host folder shared with the guest at /mnt/host   [$RXE_LAB_CACHE/share]
#   RXE_LAB_APT_CACHE  where setup keeps downloaded .deb files        [/var/cache/rxe-lab/apt]
#   RXE_LAB_APPEND  extra guest kernel command line words (experiments; bench/lab-probe.sh)
#
# Network (fixed, see docs/lab.md): netns "rxelab" on the host holds tap "rxetap0"
# with 198.18.0.1/24 and 2001:db8:198:18::1/64; the guest's eth0 is 198.18.0.2/24 and
# 2001:db8:198:18::2/64. Nothing is routed anywhere else: the netns has no other
# interface and no default route.

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_HOME=/var/cache/rxe-lab    # the default cache: the lock and the .deb files of every target
TARGET=${RXE_LAB_TARGET:-}
if [ -n "$TARGET" ] && ! [[ $TARGET =~ ^[0-9]+\.[0-9]+$ ]]; then
  printf '[rxe-lab] ERROR: RXE_LAB_TARGET=%s: want a Debian kernel series such as 6.12\n' "$TARGET" >&2
  exit 2
fi
CACHE=${RXE_LAB_CACHE:-$LAB_HOME${TARGET:+-$TARGET}}
# One lab VM at a time on the machine (fixed netns, tap and addresses), whichever cache or
# target it boots: scripts/interop, bench/lab*.sh and `softroce conform --dut rxe` flock this.
LAB_LOCK=${RXE_LAB_LOCK:-$LAB_HOME/interop.lock}
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
APT_CACHE=${RXE_LAB_APT_CACHE:-$LAB_HOME/apt}
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
# a target's kernel (6.12) is zstd-compressed: setup unpacks it for the PVH boot
[ -z "$TARGET" ] || LAB_PACKAGES+=(zstd)

log()  { printf '[rxe-lab] %s\n' "$*" >&2; }
die()  { printf '[rxe-lab] ERROR: %s\n' "$*" >&2; exit "${DIE_RC:-1}"; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

# The Debian amd64 kernel the guest boots: $RXE_LAB_KVER if set (another installed Debian
# kernel, for experiments), else the one Debian's stock metapackage linux-image-amd64 depends
# on (bookworm: 6.1), else the newest installed. setup records the one it used in
# $CACHE/kver. A target (RXE_LAB_TARGET) is not installed on the host: setup resolves it
# itself (target_package) and extracts the package into $CACHE/kroot.
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

# target_package: "name=version" of the kernel image package Debian's linux-image-$TARGET-amd64
# metapackage depends on (its candidate version in the apt lists).
target_package() {
  apt-cache show --no-all-versions "linux-image-$TARGET-amd64" 2>/dev/null |
    sed -n 's/^Depends: \(linux-image-[^ ,]*-amd64\) (= \([^)]*\)).*/\1=\2/p' | head -n1
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
