# Minimal: the project's commands are scripts (README.md); this names the benchmark and
# builds the drop-in C libraries (docs/clib.md).
.PHONY: bench bench-quick libs clib-test
bench:
	bench/run --lab
bench-quick:
	bench/run --quick
# build/lib/libibverbs.so.1 and build/lib/librdmacm.so.1 (BUILD=DIR: DIR/lib instead)
BUILD ?= $(CURDIR)/build
libs:
	$(MAKE) -C clib libs BUILD=$(BUILD)
# the C tests under ASan/UBSan and the ABI checks against rdma-core's libraries
clib-test:
	$(MAKE) -C clib test BUILD=$(BUILD)
