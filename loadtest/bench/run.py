#!/usr/bin/env python3
"""iop against nginx in one run (issue 8).

    python3 loadtest/bench/run.py run [--quick] [--rounds N] [--duration SEC] [--systems ...] [--scenarios ...]
    python3 loadtest/bench/run.py compare [RESULTS.json] [--markdown] [--html OUT.html]
    python3 loadtest/bench/run.py paths [--quick] [--rounds N] [--shapes S1,S2] [--markdown]

`run` starts every system fresh for every run (the mock directly, one nginx,
two chained nginx, iop edge + node on the tunnel and on the normalized
path), runs the scenarios S1-S7 interleaved (for each scenario, round after
round, every system in turn: A B C A B C), writes every measurement, the
machine, the versions, the exact commands and what else was busy to
RESULTS.json, and prints the comparison. `compare` prints it again from a
results file. See loadtest/README.md, "Benchmark: iop against nginx".

Python 3.11 standard library only; the load comes from iop-loadtest.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

import compare  # noqa: E402
import paths  # noqa: E402
import procs  # noqa: E402
import scenarios  # noqa: E402
import systems  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
BINARIES = ["iop-edge", "iop-node", "iop-mockprov", "iop-loadtest"]
BUILD = ["cargo", "build", "--release", "-p", "iop-edge", "-p", "iop-node", "-p", "iop-loadtest"]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark and print the comparison")
    r.add_argument("--quick", action="store_true", help="tiny counts and 1 round: a smoke test of the harness")
    r.add_argument("--rounds", type=int, help="rounds of every (scenario, system), S3 twice as many (default 2; --quick 1)")
    r.add_argument("--duration", type=int, help="seconds of each closed-loop load (default 10; --quick 2)")
    r.add_argument("--warmup", type=int, help="seconds of unmeasured load before S1, S2, S3, S6, S7 (default 2; --quick 1)")
    r.add_argument("--systems", default=",".join(systems.DEFAULT_SYSTEMS),
                   help="comma-separated, from %s, or 'all' (default: the first five)" % ",".join(systems.SYSTEMS))
    r.add_argument("--scenarios", default=",".join(scenarios.DEFAULT), help="comma-separated subset of S1..S7 and the dialects' M1, M2, M4 (Messages), R1, R2, R4 (Responses); "
                        "`dialects` is all six; A1 (cache affinity) runs on iop-affinity,iop-affinity-off only; "
                        "S2B4, S2B16, S2B64, S3B4, S3B16 (the mock writes that many events per write) and S1L "
                        "(16 KiB prompts and answers): `bursts` is all six (default: S1..S7, S2B16, S3B16, S1L)")
    r.add_argument("--workers", type=int, help="workers per process outside S7 (default: cores)")
    r.add_argument("--bin-dir", help="where the four binaries are (default: $CARGO_TARGET_DIR/release or target/release)")
    r.add_argument("--build", action="store_true", help="run `%s` first" % " ".join(BUILD))
    r.add_argument("--out", help="results file (default: loadtest/bench/results/<UTC time>.json)")
    r.add_argument("--wait-idle", type=int,
                   help="before each run, wait up to this many seconds while cargo/rustc run (default 600; --quick 0)")
    r.add_argument("--markdown", action="store_true", help="print the comparison as markdown")
    r.add_argument("--html", help="also write the runs as charts, the systems side by side, to this HTML file")
    r.add_argument("--dry-run", action="store_true", help="print the runs in order and the time they should take")
    c = sub.add_parser("compare", help="print the comparison of a results file")
    c.add_argument("results", nargs="?", help="results file (default: the newest in loadtest/bench/results/)")
    c.add_argument("--markdown", action="store_true", help="markdown tables (for loadtest/README.md)")
    c.add_argument("--html", help="also write the runs as charts, the systems side by side, to this HTML file")
    c.add_argument("--bin-dir", help="where iop-loadtest is, which draws the charts (default: $CARGO_TARGET_DIR/release "
                                     "or target/release, else the results' own)")
    paths.add_args(sub)
    return ap.parse_args(argv)


def default_bin_dir():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    return os.path.join(target, "release")


def find_program(name):
    return shutil.which(name) or next((p for p in ("/usr/sbin/" + name, "/sbin/" + name) if os.path.exists(p)), None)


def find_nginx():
    return find_program("nginx")


def find_haproxy():
    return find_program("haproxy")


def ensure_program(name, systems):
    """`name` from Debian's package of the same name, installed when missing."""
    found = find_program(name)
    if found:
        return found
    print("%s is missing: apt-get install -y %s" % (name, name), flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(sudo + ["apt-get", "install", "-y", name], env=env).returncode != 0:
        subprocess.run(sudo + ["apt-get", "update"], env=env)
        subprocess.run(sudo + ["apt-get", "install", "-y", name], env=env)
    found = find_program(name)
    if not found:
        raise SystemExit("could not install %s; install it (apt-get install %s) or leave out %s" % (name, name, systems))
    return found


def ensure_nginx():
    return ensure_program("nginx", "nginx1,nginx2")


def ensure_haproxy():
    return ensure_program("haproxy", "haproxy1,haproxy2")


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    want = min(want, 1 << 20)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def versions(bin_dir, nginx, haproxy=None):
    git = procs.output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO) or "unknown"
    dirty = bool(procs.output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO))
    return {
        "git": git,
        "dirty": dirty,
        "rustc": procs.output(["rustc", "-V"]) or "rustc unknown",
        "nginx": (procs.output([nginx, "-v"]) or "nginx unknown").replace("nginx version: ", "") if nginx else "no nginx",
        "haproxy": ((procs.output([haproxy, "-v"]) or "haproxy unknown").splitlines() or ["haproxy unknown"])[0]
        if haproxy else "no haproxy",
        "iop_edge": procs.output([os.path.join(bin_dir, "iop-edge"), "-V"]) or "unknown",
        "iop_node": procs.output([os.path.join(bin_dir, "iop-node"), "-V"]) or "unknown",
    }


def plan(sids, names, rounds, workers):
    """The runs in order: per scenario, round after round, every system in turn."""
    out = []
    for sid in sids:
        for rnd in range(1, scenarios.rounds_of(sid, rounds) + 1):
            for system in names:
                if not scenarios.applies(sid, system):
                    continue
                for w in ((1, 2) if sid == "S7" else (workers,)):
                    out.append((sid, rnd, system, w))
    return out


def estimate(runs, params):
    secs = 0
    for sid, _, system, _ in runs:
        p = params[sid]
        secs += p.get("warmup", 0) + (p["tokens"] * p["interval_ms"] / 1000 if p.get("warmup") else 0)
        if scenarios.base(sid) == "S4":
            secs += p["tokens"] * p["interval_ms"] / 1000 + 2
        elif sid == "S6":
            d = int(p["paced"][p["paced"].index("--duration-sec") + 1])
            secs += 2 * d + 2 + p["tokens"] * p["interval_ms"] / 1000 * 2
        else:
            d = int(p["load"][p["load"].index("--duration-sec") + 1])
            secs += d + p["tokens"] * p["interval_ms"] / 1000 if sid != "S5" else d + 3
        secs += 1.5 if system.startswith("iop") else 0.5
    return secs


def summary_line(rec):
    retried = " (retried after: %s)" % "; ".join(rec["failed_attempts"]) if rec.get("failed_attempts") else ""
    if "error" in rec:
        return "ERROR " + rec["error"] + retried
    m = compare.metrics(rec, os.cpu_count() or 1) or {}
    sid = scenarios.base(rec["scenario"])
    keys = {"S1": ["req_s", "cpu_us_req"], "S2": ["events_s", "mb_s", "cpu_us_req"], "S3": ["ttft_p99", "gap_p99"],
            "S4": [k for k in m if k.startswith("rss_")], "S5": ["close_p50", "close_p99", "never_closed"],
            "S6": ["gap_p99_alone", "gap_p99_big", "gap_shift"], "S7": ["events_s"],
            "A1": ["req_s", "ttft_p50", "ttft_p99", "hit_pct"]}[sid]
    return " ".join("%s=%s" % (k, compare.fmt(m.get(k))) for k in keys) + " errors=%s" % m.get("errors") + retried


def save(path, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def cmd_run(a):
    quick = a.quick
    rounds = a.rounds or (1 if quick else 2)
    duration = a.duration or (2 if quick else 10)
    wait_idle = a.wait_idle if a.wait_idle is not None else (0 if quick else 600)
    names = systems.SYSTEMS if a.systems == "all" else [s.strip() for s in a.systems.split(",") if s.strip()]
    for s in names:
        if s not in systems.SYSTEMS:
            raise SystemExit("unknown system %r (known: %s)" % (s, ", ".join(systems.SYSTEMS)))
    sids = scenarios.expand([s.strip().upper() for s in a.scenarios.split(",") if s.strip()])
    for s in sids:
        if s not in scenarios.KNOWN:
            raise SystemExit("unknown scenario %r (known: %s, or dialects, bursts)" % (s, ", ".join(scenarios.KNOWN)))
    warmup = a.warmup if a.warmup is not None else (1 if quick else 2)
    params = scenarios.params(quick, duration, warmup)
    workers = a.workers or os.cpu_count() or 1
    runs = plan(sids, names, rounds, workers)
    if a.dry_run:
        for i, (sid, rnd, system, w) in enumerate(runs, 1):
            print("%3d  %s  round %d  %-15s workers %d" % (i, sid, rnd, system, w))
        print("%d runs, about %.0f min" % (len(runs), estimate(runs, params) / 60))
        return
    if a.build:
        print("building:", " ".join(BUILD), flush=True)
        if subprocess.run(BUILD, cwd=REPO).returncode != 0:
            raise SystemExit("build failed")
    bin_dir = os.path.abspath(a.bin_dir or default_bin_dir())
    needed = [b for b in BINARIES if b not in ("iop-edge", "iop-node") or any(s.startswith("iop-") for s in names)]
    missing = [b for b in needed if not os.access(os.path.join(bin_dir, b), os.X_OK)]
    if missing:
        raise SystemExit("missing in %s: %s (build them: %s)" % (bin_dir, ", ".join(missing), " ".join(BUILD)))
    nginx = ensure_nginx() if any(s.startswith("nginx") for s in names) else find_nginx()
    haproxy = ensure_haproxy() if any(s.startswith("haproxy") for s in names) else find_haproxy()
    fd_limit = raise_fd_limit()
    ctx = systems.Ctx(bin_dir, nginx, node_workers=False, fd_limit=fd_limit, haproxy=haproxy)
    ctx.node_workers = systems.node_workers_supported(ctx) if "iop-edge" in needed else None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.abspath(a.out or os.path.join(HERE, "results", stamp + ("-quick" if quick else "") + ".json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    log_root = os.path.splitext(out)[0] + ".logs"
    os.makedirs(log_root, exist_ok=True)
    built = {b: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(os.path.join(bin_dir, b)))) for b in needed}
    results = {
        "meta": {
            "command": procs.quote([sys.executable] + sys.argv),
            "cwd": os.getcwd(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "quick": quick, "rounds": rounds, "duration_sec": duration, "warmup_sec": warmup, "workers": workers,
            "systems": names, "scenarios": sids, "params": params,
            "machine": procs.machine(), "versions": versions(bin_dir, nginx, haproxy), "bin_dir": bin_dir,
            "binaries_built": built, "nginx": nginx, "node_workers": ctx.node_workers, "fd_limit": fd_limit,
            "logs": log_root,
        },
        "runs": [],
    }
    print("benchmark: %d runs (%s x %s, %d rounds), about %.0f min; results: %s" % (
        len(runs), ",".join(sids), ",".join(names), rounds, estimate(runs, params) / 60, out), flush=True)
    if ctx.node_workers is False:
        print("note: this iop-node has no `workers` key; S7 scales the edge only", flush=True)
    t0 = time.time()
    try:
        for i, (sid, rnd, system, w) in enumerate(runs, 1):
            ctx.log_dir = os.path.join(log_root, "%03d-%s-%s-r%d-w%d" % (i, sid, system, rnd, w))
            os.makedirs(ctx.log_dir, exist_ok=True)
            rec = scenarios.run_one(ctx, sid, system, rnd, w, params[sid], wait_idle)
            results["runs"].append(rec)
            save(out, results)
            print("[%3d/%d %5.0fs] %s %-15s r%d w%d  %s" % (i, len(runs), time.time() - t0, sid, system, rnd, w,
                                                          summary_line(rec)), flush=True)
    finally:
        results["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save(out, results)
    print()
    print(compare.render(results, md=a.markdown), end="")
    if a.html:
        compare.write_html(results, a.html, os.path.join(bin_dir, "iop-loadtest"))
        print("\ncharts: %s" % a.html)
    print("\nresults: %s\ncompare: python3 %s compare %s" % (out, os.path.relpath(os.path.join(HERE, "run.py")), out))


def newest_results():
    d = os.path.join(HERE, "results")
    files = sorted((f for f in os.listdir(d) if f.endswith(".json")), key=lambda f: os.path.getmtime(os.path.join(d, f))) \
        if os.path.isdir(d) else []
    if not files:
        raise SystemExit("no results in %s: run `run.py run` first" % d)
    return os.path.join(d, files[-1])


def cmd_compare(a):
    path = a.results or newest_results()
    with open(path) as f:
        results = json.load(f)
    print(compare.render(results, md=a.markdown), end="")
    if a.html:
        dirs = [a.bin_dir] if a.bin_dir else [default_bin_dir(), results["meta"].get("bin_dir", "")]
        loadtest = next((os.path.join(d, "iop-loadtest") for d in dirs if os.access(os.path.join(d, "iop-loadtest"), os.X_OK)),
                        os.path.join(dirs[0], "iop-loadtest"))
        compare.write_html(results, a.html, loadtest)
        print("\ncharts: %s" % a.html)


def main(argv):
    a = parse_args(argv)
    if a.cmd == "run":
        cmd_run(a)
    elif a.cmd == "paths":
        paths.cmd_paths(a, os.path.abspath(a.bin_dir or default_bin_dir()), HERE)
    else:
        cmd_compare(a)


if __name__ == "__main__":
    main(sys.argv[1:])
