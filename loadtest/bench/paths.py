"""`run.py paths`: every way a request goes through iop, measured in the
same edge and node, interleaved (issue 25's CPU targets).

One mock, one edge and one node per shape, two providers on that node:
`t` is `openai_compat` serving chat, Messages and Responses natively (the
tunnel), `o` is `ollama` (the normalized run, the other dialects
translated onto it). Each path is one `iop-loadtest` run of N requests,
the paths in turn, round after round (A B C, then C B A), and its cost is
the CPU the edge and the node used during it (every thread's run time from
/proc/PID/task/*/schedstat, in nanoseconds), per request. The same
processes serve every path, so what moves a run of `run.py run` between
starts (placement, caches, the host's hour) cancels out, and a path's cost
is divided by the chat tunnel's of the same round (the host drifts within
a run too): the median of those ratios is what the targets judge.
"""

import glob
import json
import os
import statistics
import subprocess
import tempfile
import time

import procs
import systems

# (label, api, model): the chat tunnel first, the base of every ratio.
PATHS = [
    ("chat tunnel", "chat", "t"),
    ("chat normalized", "chat", "o"),
    ("Messages native", "messages", "t"),
    ("Messages translated", "messages", "o"),
    ("Responses native", "responses", "t"),
    ("Responses translated", "responses", "o"),
]

# S1's and S2's shapes: tokens per answer, streamed, requests per run.
SHAPES = {
    "S1": {"tokens": 16, "stream": False, "requests": 20000, "title": "not streamed, 16 tokens"},
    "S2": {"tokens": 256, "stream": True, "requests": 2000, "title": "streamed, 256 tokens unpaced"},
}

# Issue 25: translation at most 1.1x the tunnel's CPU per request (and per
# event: S2's requests are 256 events each); the native passthrough the
# tunnel's code with another body, held to the same bound.
TARGET = 1.10


def add_args(sub):
    p = sub.add_parser("paths", help="CPU per request of every path (chat, Messages, Responses; tunnel, native, "
                                     "translated) in one edge and node, interleaved")
    p.add_argument("--quick", action="store_true", help="tiny counts and 1 round: a smoke test")
    p.add_argument("--rounds", type=int, help="rounds of every path (default 8; --quick 1)")
    p.add_argument("--shapes", default="S1,S2", help="comma-separated: S1 (not streamed), S2 (streamed)")
    p.add_argument("--prompt-bytes", type=int, default=64, help="the user message's size (default 64)")
    p.add_argument("--bin-dir", help="where the binaries are (default: $CARGO_TARGET_DIR/release or target/release)")
    p.add_argument("--out", help="results file (default: loadtest/bench/results/<UTC time>-paths.json)")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")


def task_cpu_ns(pid):
    """Run time of every thread of `pid` so far, in ns (schedstat's first field)."""
    total = 0
    for path in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended between the listing and the read
    return total


def user_seconds(*pids):
    """User-space CPU seconds of `pids` so far (clock ticks: coarser than
    `task_cpu_ns`, which has no user/kernel split)."""
    return sum(procs.cpu_seconds(p) - procs.sys_seconds(p) for p in pids)


def edge_config(mock_addr, workers):
    text = 'workers = %d\nshutdown_grace_sec = 0\n' % workers
    text += '[http]\nlisten = "127.0.0.1:0"\nmax_body_bytes = 1048576\naccess_log = false\n'
    text += '[node_listener]\nlisten = "127.0.0.1:0"\n'
    text += '[[nodes]]\nid = "paths-node"\ntoken = "%s"\n' % systems.TOKEN
    text += ('[[nodes.providers]]\nid = "pt"\nkind = "openai_compat"\nbase_url = "http://%s/v1"\n'
             'native_apis = ["responses", "messages"]\ncapacity = 4096\n') % mock_addr
    text += '[[nodes.providers]]\nid = "po"\nkind = "ollama"\nbase_url = "http://%s"\ncapacity = 4096\n' % mock_addr
    for model, provider in (("t", "pt"), ("o", "po")):
        text += '[[models]]\nname = "%s"\nprovider = "%s"\nupstream_model = "mock"\nmax_waiters = 4096\n' % (
            model, provider)
    return text


def load(ctx, url, api, model, shape, requests, prompt_bytes):
    args = [ctx.bin("iop-loadtest"), "--url", url, "--api", api, "--model", model, "--concurrency", "64",
            "--requests", str(requests), "--prompt-bytes", str(prompt_bytes), "--timeout-sec", "60", "--json",
            "--stream" if shape["stream"] else "--no-stream"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (procs.quote(args), r.returncode, r.stderr[-2000:]))
    rep = json.loads(r.stdout)
    if rep["errors"]["total"] or rep["completed"] != requests:
        raise SystemExit("%s %s: %d of %d completed, errors %s" % (api, model, rep["completed"], requests,
                                                                   rep["errors"]))
    return rep


def run_shape(ctx, sid, shape, rounds, requests, prompt_bytes, log_dir):
    """{label: [(edge µs, node µs, user µs of both) per request, one per
    round]} for one shape."""
    workers = os.cpu_count() or 1
    run_dir = tempfile.mkdtemp(prefix="iop-paths-")
    started = []
    try:
        mock = procs.Proc("mockprov", [ctx.bin("iop-mockprov"), "--listen", "127.0.0.1:0", "--tokens", shape["tokens"],
                                       "--token-interval-ms", 0, "--no-record"], log_dir, env=systems.QUIET,
                          ready=r"listening on (\S+)")
        started.append(mock)
        edge_cfg = os.path.join(run_dir, "edge.toml")
        with open(edge_cfg, "w") as f:
            f.write(edge_config(mock.match.group(1), workers))
        edge = procs.Proc("edge", [ctx.bin("iop-edge"), "--config", edge_cfg], log_dir, env=systems.QUIET,
                          ready=r"ready http=(\S+) nodes=(\S+)")
        started.append(edge)
        node_cfg = os.path.join(run_dir, "node.toml")
        with open(node_cfg, "w") as f:
            f.write(systems.node_config(edge.match.group(2), workers, True))
        node = procs.Proc("node", [ctx.bin("iop-node"), "--config", node_cfg], log_dir, env=systems.QUIET)
        started.append(node)
        url = "http://" + edge.match.group(1)
        for model in ("t", "o"):
            probe = {"model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
            procs.wait_http("POST", url + "/v1/chat/completions", probe, what="iop (%s)" % model)
        # Warm every path (connections to the mock, the allocator's pages).
        for _, api, model in PATHS:
            load(ctx, url, api, model, shape, max(requests // 4, 1), prompt_bytes)
        costs = {label: [] for label, _, _ in PATHS}
        for r in range(rounds):
            for label, api, model in (PATHS if r % 2 == 0 else PATHS[::-1]):
                e0, n0, u0 = task_cpu_ns(edge.pid), task_cpu_ns(node.pid), user_seconds(edge.pid, node.pid)
                load(ctx, url, api, model, shape, requests, prompt_bytes)
                e1, n1, u1 = task_cpu_ns(edge.pid), task_cpu_ns(node.pid), user_seconds(edge.pid, node.pid)
                costs[label].append(((e1 - e0) / requests / 1000, (n1 - n0) / requests / 1000,
                                     (u1 - u0) / requests * 1e6))
            print("  %s round %d/%d done" % (sid, r + 1, rounds), flush=True)
        return costs
    finally:
        for p in reversed(started):
            p.stop()


def summarize(costs):
    """Per path: medians over rounds (edge, node, both) and its ratio to
    the chat tunnel, taken within each round (the host's drift over a run
    moves both alike) and the median of those."""
    base = [e + n for e, n, _ in costs[PATHS[0][0]]]
    base_user = [u for _, _, u in costs[PATHS[0][0]]]
    rows = []
    for label, _, _ in PATHS:
        runs = costs[label]
        totals = [e + n for e, n, _ in runs]
        ratios = [t / b for t, b in zip(totals, base) if b]
        user_ratios = [u / b for (_, _, u), b in zip(runs, base_user) if b]
        rows.append({
            "path": label,
            "edge_us": statistics.median(e for e, _, _ in runs),
            "node_us": statistics.median(n for _, n, _ in runs),
            "user_us": statistics.median(u for _, _, u in runs),
            "user_ratio": statistics.median(user_ratios) if user_ratios else None,
            "total_us": statistics.median(totals),
            "rounds_us": totals,
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        })
    return rows


def render(results, md):
    out = []
    for sid, shape in results["shapes"].items():
        rows = shape["rows"]
        out.append("%s  %s, %d requests a run, %d rounds, %d-byte prompts" % (
            sid, SHAPES[sid]["title"], shape["requests"], shape["rounds"], results["meta"]["prompt_bytes"]))
        out.append("")
        head = ["path", "edge + node CPU µs/req", "edge / node", "rounds (µs/req)", "÷ chat tunnel (rounds' range)",
                "target", "of it user µs/req (÷ tunnel's)"]
        lines = []
        for r in rows:
            first = r["path"] == PATHS[0][0]
            judged = "base" if first else ("≤ %.2f× %s" % (TARGET, "met" if r["ratio"] <= TARGET else "NOT met"))
            lines.append([r["path"], "%.1f" % r["total_us"], "%.1f / %.1f" % (r["edge_us"], r["node_us"]),
                          " ".join("%.1f" % t for t in r["rounds_us"]),
                          "%.3f× (%.2f-%.2f)" % (r["ratio"], *r["ratio_range"]), judged,
                          "%.1f (%.2f×)" % (r["user_us"], r["user_ratio"] or 0)])
        if md:
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out.extend("| " + " | ".join(line) + " |" for line in lines)
        else:
            widths = [max(len(x) for x in col) for col in zip(head, *lines)]
            for line in [head] + lines:
                out.append("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
        out.append("")
    return "\n".join(out)


def cmd_paths(a, bin_dir, here):
    quick = a.quick
    rounds = a.rounds or (1 if quick else 8)
    sids = [s.strip().upper() for s in a.shapes.split(",") if s.strip()]
    for s in sids:
        if s not in SHAPES:
            raise SystemExit("unknown shape %r (known: %s)" % (s, ", ".join(SHAPES)))
    for b in ("iop-edge", "iop-node", "iop-mockprov", "iop-loadtest"):
        if not os.access(os.path.join(bin_dir, b), os.X_OK):
            raise SystemExit("missing in %s: %s" % (bin_dir, b))
    ctx = systems.Ctx(bin_dir, None, node_workers=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.abspath(a.out or os.path.join(here, "results", stamp + "-paths.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    log_dir = os.path.splitext(out)[0] + ".logs"
    os.makedirs(log_dir, exist_ok=True)
    results = {"meta": {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": quick,
                        "rounds": rounds, "prompt_bytes": a.prompt_bytes, "machine": procs.machine(),
                        "bin_dir": bin_dir, "target": TARGET},
               "shapes": {}}
    for sid in sids:
        shape = SHAPES[sid]
        requests = 40 if quick else shape["requests"]
        print("%s: %d paths x %d rounds of %d requests" % (sid, len(PATHS), rounds, requests), flush=True)
        costs = run_shape(ctx, sid, shape, rounds, requests, a.prompt_bytes, log_dir)
        results["shapes"][sid] = {"requests": requests, "rounds": rounds, "rows": summarize(costs)}
    results["meta"]["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(render(results, a.markdown), end="")
    print("\nresults: %s" % out)
