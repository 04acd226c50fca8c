#!/usr/bin/env python3
"""Prints the latest `cargo bench -p iop-benches` results as a Markdown table.

Reads criterion's `<target>/criterion/**/new/{benchmark,estimates}.json`
(target: $CARGO_TARGET_DIR, else ./target) and prints, per group and
parameter, each variant's median time and its ratio to the group's
reference baseline (time / baseline time: below 1 is faster).

    python3 benches/table.py [criterion_dir]
"""

import json
import os
import re
import sys
from collections import defaultdict

# The baseline each group's ratio is taken against (others are listed too).
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


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "criterion")
    rows = defaultdict(dict)  # (group, value) -> function -> median ns
    for dirpath, _, files in os.walk(root):
        if not dirpath.endswith(os.sep + "new") or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        key = (bench["group_id"], bench.get("value_str") or "")
        rows[key][bench["function_id"]] = est["median"]["point_estimate"]
    if not rows:
        sys.exit(f"no criterion results under {root}")

    print("| group | parameter | variant | median | ratio to reference baseline |")
    print("|---|---|---|---:|---:|")
    for group, value in sorted(rows, key=lambda k: (group_key(k[0]), value_key(k[1]))):
        funcs = rows[(group, value)]
        ref = next((r for p, r in REFERENCE.items() if group.startswith(p)), None)
        if ref not in funcs:
            ref = next((f for f in sorted(funcs) if f.endswith("_baseline")), None)
        order = sorted(funcs, key=lambda f: (f.endswith("_baseline"), f != ref, f))
        for f in order:
            ratio = f"{funcs[f] / funcs[ref]:.3g}×" if ref else ""
            if f == ref:
                ratio = "1 (reference)"
            print(f"| {group} | {value} | {f} | {fmt_time(funcs[f])} | {ratio} |")


if __name__ == "__main__":
    main()
