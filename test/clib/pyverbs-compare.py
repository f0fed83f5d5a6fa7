#!/usr/bin/env python3
"""Compare two runs of rdma-core's pyverbs suite (test/clib/pyverbs.sh's pyverbs.tsv files).

    test/clib/pyverbs-compare.py SOFTROCE.tsv RXE.tsv
    test/clib/pyverbs-compare.py A=FIRST.tsv B=SECOND.tsv    # other labels
    test/clib/pyverbs-compare.py --per-test SOFTROCE.tsv RXE.tsv

Prints the per-module table (passed / skipped / failed of each run; docs/clib.md's shape, the
vendor and feature modules every device here skips in one row), then every test whose result
differs, with both results (a skip or failure with its reason): the bar is that no test fails
on softroce that passes on rxe, and that softroce passes at least as many. --per-test prints a
markdown table of every test outside the grouped modules instead (the grouped ones are counted
in one line, with how many have the same result in both runs).
"""
import collections
import sys

# modules that need a vendor provider or hardware feature: one row, as in docs/clib.md
GROUPED = ("test_mlx5_", "test_efa", "test_odp", "test_flow", "test_rss_traffic",
           "test_tag_matching", "test_parent_domain", "test_shared_pd", "test_cuda_dmabuf")


def load(path):
    rows = {}
    for line in open(path):
        name, _, res = line.rstrip("\n").partition("\t")
        rows[name] = res
    return rows


def kind(res):
    if res == "ok":
        return "passed"
    if res.startswith("skipped"):
        return "skipped"
    return "failed"


def module(name):
    m = name.split(".")[1]  # tests.test_qp.QPTest.test_x
    return "other" if m.startswith(GROUPED) else m


def table(runs, labels):
    counts = [collections.defaultdict(collections.Counter) for _ in runs]
    mods = set()
    for c, rows in zip(counts, runs):
        for name, res in rows.items():
            c[module(name)][kind(res)] += 1
            mods.add(module(name))
    head = "| module | " + " | ".join(f"{l} passed | {l} skipped | {l} failed" for l in labels) + " |"
    print(head)
    print("|" + "---|" * (1 + 3 * len(runs)))
    for m in sorted(mods, key=lambda m: (m == "other", m)):
        cells = []
        for c in counts:
            cells += [str(c[m]["passed"]), str(c[m]["skipped"]), str(c[m]["failed"])]
        label = "vendor and feature modules (mlx5, efa, odp, flow, ...)" if m == "other" else m
        print(f"| {label} | " + " | ".join(cells) + " |")
    tot = []
    for c in counts:
        for k in ("passed", "skipped", "failed"):
            tot.append(str(sum(v[k] for v in c.values())))
    print("| total | " + " | ".join(tot) + " |")


def cell(res):
    return res.replace("|", "\\|")


def per_test(runs, labels):
    print("| test | " + " | ".join(labels) + " |")
    print("|" + "---|" * (1 + len(runs)))
    names = sorted(set(runs[0]) | set(runs[1]))
    grouped = same = 0
    for n in names:
        res = [rows.get(n, "missing") for rows in runs]
        if module(n) == "other":
            grouped += 1
            same += res[0] == res[1]
            continue
        print(f"| `{n.removeprefix('tests.')}` | " + " | ".join(cell(r) for r in res) + " |")
    print(f"| the {grouped} tests of the vendor and feature modules | {same} with the same result in both runs | |")


def main():
    args = sys.argv[1:]
    full = args[:1] == ["--per-test"]
    if full:
        args = args[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    labels, runs = [], []
    for default, arg in zip(("softroce", "rxe"), args):
        label, eq, path = arg.partition("=")
        labels.append(label if eq else default)
        runs.append(load(path if eq else arg))
    if full:
        per_test(runs, labels)
        return
    table(runs, labels)
    print()
    names = sorted(set(runs[0]) | set(runs[1]))
    diff = [n for n in names if kind(runs[0].get(n, "missing")) != kind(runs[1].get(n, "missing"))]
    print(f"{len(diff)} tests differ:")
    for n in diff:
        print(n)
        for label, rows in zip(labels, runs):
            print(f"    {label + ':':9} {rows.get(n, 'missing')}")


main()
