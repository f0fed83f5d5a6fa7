#!/bin/bash
# The kernel-rxe half of test/clib/pyverbs.sh --rxe, run in the lab guest (docs/lab.md) as a
# job in /mnt/host (the share, holding tests/: rdma-core's suite, unpacked):
#
#   pyverbs-guest.sh GUEST_IP OUTDIR
#
# The guest's initramfs has no Python, so the suite runs in a chroot of the host's root
# filesystem, exported read-only by `vm start --rootfs /` (9p tag rxeroot): the host's python3,
# python3-pyverbs and rdma-core userspace (libibverbs and its rxe provider) on the guest's
# kernel, its /proc, /sys and /dev (/dev/infiniband's uverbs and rdma_cm nodes included).
# /tmp, /run and the suite's copy are tmpfs in the guest. The GID is rxe0's RoCE v2 GID of
# GUEST_IP (eth0's IPv4 address).
#
# Two passes, each `run_tests.py --dev rxe0 --gid N -v`:
#   OUTDIR/pyverbs-sysfs.log  sysfs as the kernel has it. rxe on 6.1 registers rxe0 without a
#                             parent device, so /sys/class/infiniband/rxe0/device/net/ (where the
#                             suite looks for a device's interface) is missing and the suite
#                             skips what needs an IP address (the rdma_cm tests)
#   OUTDIR/pyverbs.log        the softroce run's adapter: /sys/class is the guest's plus
#                             infiniband/rxe0/device/net/IFNAME, IFNAME the interface rxe0 is on
#                             (rxe's own `parent` attribute: eth0); rxe0's other entries are the
#                             kernel's, bind-mounted
set -u
ip=${1:?guest IPv4 address} out=${2:?output directory}
R=/mnt/rootfs
mkdir -p "$R"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro rxeroot "$R" ||
  { echo "pyverbs-guest: mount rxeroot failed (vm start --rootfs?)"; exit 1; }
mount -t proc proc "$R/proc" &&
  mount -o rbind /sys "$R/sys" &&
  mount -o rbind /dev "$R/dev" &&
  mount -t tmpfs tmpfs "$R/tmp" &&
  mount -t tmpfs tmpfs "$R/run" || { echo "pyverbs-guest: chroot mounts failed"; exit 1; }
cp -r /mnt/host/tests "$R/tmp/tests" || exit 1
gid=$(rxelab-gid rxe0 "$ip") || { echo "pyverbs-guest: rxe0 has no GID for $ip"; exit 1; }
ifname=$(cat /sys/class/infiniband/rxe0/parent) || exit 1
echo "pyverbs-guest: $(uname -r), rxe0 on $ifname, GID $gid ($ip)"

suite() { # suite LOG
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LANG=C.UTF-8 \
    chroot "$R" /bin/sh -c "cd /tmp/tests && exec timeout 1500 python3 run_tests.py --dev rxe0 --gid $gid -v" \
    > "$1" 2>&1
  echo "pyverbs-guest: $1: run_tests.py exit status $?"
}

echo "pyverbs-guest: pass 1, the kernel's sysfs (rxe0/device: $(ls -d /sys/class/infiniband/rxe0/device 2>&1))"
suite "$out/pyverbs-sysfs.log"

# The adapter, in the chroot's view only: a tmpfs /sys/class with every class bind-mounted back
# but infiniband, whose rxe0 is a directory of the kernel's entries (attribute files and
# directories bind-mounted, links as absolute links) plus device/net/IFNAME.
stage=/tmp/sysclass
mkdir -p "$stage" && mount -t tmpfs pyverbs-sysfs "$stage" || exit 1
for c in /sys/class/*; do
  n=${c##*/}
  mkdir "$stage/$n"
  [ "$n" = infiniband ] || mount --bind "$c" "$stage/$n" || exit 1
done
for d in /sys/class/infiniband/*; do
  n=${d##*/}
  if [ "$n" != rxe0 ]; then ln -s "$(readlink -f "$d")" "$stage/infiniband/$n"; continue; fi
  real=$(readlink -f "$d")
  mkdir "$stage/infiniband/rxe0"
  for e in "$real"/*; do
    t=$stage/infiniband/rxe0/${e##*/}
    if [ -L "$e" ]; then ln -s "$(readlink -f "$e")" "$t"
    elif [ -d "$e" ]; then mkdir "$t" && mount --bind "$e" "$t"
    else : > "$t" && mount --bind "$e" "$t"
    fi || exit 1
  done
  mkdir -p "$stage/infiniband/rxe0/device/net/$ifname"
done
mount -o rbind "$stage" "$R/sys/class" || exit 1
echo "pyverbs-guest: pass 2, with $(ls -d "$R/sys/class/infiniband/rxe0/device/net/$ifname")"
suite "$out/pyverbs.log"
exit 0
