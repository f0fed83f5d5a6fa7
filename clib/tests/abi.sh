#!/usr/bin/env bash
# The libraries' dynamic ABI against rdma-core 44's (Debian's libibverbs1 and
# librdmacm1): the same SONAMEs, version nodes (with their parents) and
# versioned symbols, default and compat, so the dynamic linker binds
# programs built against rdma-core to these libraries.
set -euo pipefail
BUILD=${BUILD:?}
SYS=/usr/lib/x86_64-linux-gnu
fail=0

exports() { # versioned definitions: "VERSION symbol", (VERSION) for non-default
  objdump -T "$1" | awk '/ DF | DO / && !/\*UND\*/ {v=$(NF-1); s=$NF; if (v !~ /GLIBC|Base/ && s != v) print v, s}' | sort
}
verdefs() { # version nodes and their parents, one line each
  readelf -V "$1" | awk '/Version definition/{d=1} /Version needs/{d=0} d && /Name:/{printf "%s%s", (n++ ? "\n" : ""), $NF} d && /Parent 1:/{printf " <- %s", $NF} END{print ""}'
}

for lib in libibverbs.so.1 librdmacm.so.1; do
  ours=$BUILD/lib/$lib
  soname=$(readelf -d "$ours" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  if [ "$soname" != "$lib" ]; then echo "FAIL $lib: SONAME $soname"; fail=1; fi
  if [ ! -e "$SYS/$lib" ]; then
    echo "FAIL $lib: rdma-core's $SYS/$lib is not installed (libibverbs1, librdmacm1)"; fail=1; continue
  fi
  if ! diff <(verdefs "$SYS/$lib" | sed 1d) <(verdefs "$ours" | sed 1d) > /tmp/abi.$$; then
    echo "FAIL $lib: version nodes differ (< rdma-core, > ours):"; cat /tmp/abi.$$; fail=1
  fi
  if ! diff <(exports "$SYS/$lib") <(exports "$ours") > /tmp/abi.$$; then
    echo "FAIL $lib: versioned symbols differ (< rdma-core, > ours):"; cat /tmp/abi.$$; fail=1
  fi
  # Nothing else exported: helpers stay local (unversioned globals).
  extra=$(objdump -T "$ours" | awk '/ DF | DO / && !/\*UND\*/ && $(NF-1) == "Base"' || true)
  if [ -n "$extra" ]; then echo "FAIL $lib: unversioned exports:"; echo "$extra"; fail=1; fi
  [ $fail = 0 ] && echo "ok   $lib: SONAME, $(verdefs "$ours" | sed 1d | wc -l) version nodes, $(exports "$ours" | wc -l) versioned symbols as rdma-core 44"
done
rm -f /tmp/abi.$$
exit $fail
