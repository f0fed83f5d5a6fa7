#!/usr/bin/env bash
# ibv_*_str and the rate conversions print the same on rdma-core's
# libibverbs.so.1 and on ours (tests/strings_dump.c, one binary, two libraries).
set -euo pipefail
BUILD=${BUILD:?}
if ! diff <("$BUILD/strings_dump") <(LD_LIBRARY_PATH=$BUILD/lib "$BUILD/strings_dump"); then
  echo "FAIL strings: ours (>) differ from rdma-core's (<)"; exit 1
fi
libs=$(LD_LIBRARY_PATH=$BUILD/lib ldd "$BUILD/strings_dump")
case $libs in
*"$BUILD/lib/libibverbs.so.1"*) ;;
*) echo "FAIL strings: the second run did not load our library"; exit 1 ;;
esac
echo "ok   strings: $("$BUILD/strings_dump" | wc -l) names and rates as rdma-core 44"
