# Minimal: the project's commands are scripts (README.md); this only names the benchmark.
.PHONY: bench bench-quick
bench:
	bench/run --lab
bench-quick:
	bench/run --quick
