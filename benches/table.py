#!/usr/bin/env python3
"""Prints `cargo bench -p iop-benches` results as a Markdown table.

Reads criterion's `<criterion>/**/<run>/{benchmark,estimates}.json`, where
`<criterion>` is $CARGO_TARGET_DIR/criterion (else ./target/criterion) and
`<run>` is `new` (the latest run) or the names given to `--save-baseline`.
For each group and parameter it prints every variant's median time and its
ratio to the group's reference baseline (time / baseline time, both from
the same run: below 1 is faster). With several runs, the time and the
ratio are the median over the runs, and the ratio's range is shown too.

    python3 benches/table.py                 # the latest run
    python3 benches/table.py r1 r2 r3        # runs saved with --save-baseline
"""

import json
import os
import re
import statistics
import sys
from collections import defaultdict

# The baseline each group's ratio is taken against (the others are rows too).
REFERENCE = {
    "codec/encode/": "prost_encode_to_vec_baseline",
    "codec/tunnel_queue": "copying_encode_baseline",
    "codec/decode/": "prost_slice_baseline",
    "http/": "httparse_baseline",
    "sse/parse": "naive_split_baseline",
    "sse/render_chat_chunk": "serde_json_to_vec_baseline",
    "lease/": "atomic_u32_cas_baseline",
    "mailbox/": "crossbeam_bounded_baseline",
    "yield": "monoio_sleep_zero_baseline",
}

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def value_key(s):
    """Sizes by size (16B < 1KiB), numbers by value, the rest as text."""
    m = re.match(r"^(\d+)(B|KiB|MiB)?", s)
    return (int(m.group(1)) * UNITS.get(m.group(2) or "B", 1), s) if m else (0, s)


def group_key(group):
    prefixes = list(REFERENCE)
    rank = next((i for i, p in enumerate(prefixes) if group.startswith(p)), len(prefixes))
    return (rank, group)


def fmt_time(ns):
    for unit, scale in (("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def fmt_ratio(r):
    return f"{r:.3g}×" if r >= 0.01 else f"1/{1 / r:,.0f}"


def load(root, run):
    """(group, value) -> function -> median ns, for one run."""
    rows = defaultdict(dict)
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) != run or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        key = (bench["group_id"], bench.get("value_str") or "")
        rows[key][bench["function_id"]] = est["median"]["point_estimate"]
    return rows


def reference(group, funcs):
    ref = next((r for p, r in REFERENCE.items() if group.startswith(p)), None)
    if ref not in funcs:
        ref = next((f for f in sorted(funcs) if f.endswith("_baseline")), None)
    return ref


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    root = os.path.join(target, "criterion")
    names = sys.argv[1:] or ["new"]
    runs = [load(root, n) for n in names]
    if not all(runs):
        sys.exit(f"missing criterion results under {root} for one of {names}")
    keys = sorted(set().union(*runs), key=lambda k: (group_key(k[0]), value_key(k[1])))

    many = len(runs) > 1
    head = "| group | parameter | variant | median | ratio to reference baseline |"
    print(head + (" ratio range over runs |" if many else ""))
    print("|---|---|---|---:|---:|" + ("---:|" if many else ""))
    for key in keys:
        present = [r[key] for r in runs if key in r]
        funcs = present[0]
        ref = reference(key[0], funcs)
        order = sorted(funcs, key=lambda f: (f.endswith("_baseline"), f != ref, f))
        for f in order:
            times = [r[f] for r in present if f in r]
            ratios = [r[f] / r[ref] for r in present if ref in r and f in r]
            cells = [key[0], key[1], f, fmt_time(statistics.median(times))]
            if f == ref:
                cells.append("1 (reference)")
                cells += [""] if many else []
            elif ratios:
                cells.append(fmt_ratio(statistics.median(ratios)))
                cells += [f"{fmt_ratio(min(ratios))} – {fmt_ratio(max(ratios))}"] if many else []
            else:
                cells += [""] * (2 if many else 1)
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
