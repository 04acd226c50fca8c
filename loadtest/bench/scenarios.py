"""The seven scenarios of issue 8, and the same shapes spoken in the other
dialects (issue 25: M1, M2, M4 for the Anthropic Messages API, R1, R2, R4
for the Responses API): their parameters (full and --quick) and how one
run of one scenario on one system is measured."""

import json
import math
import os
import statistics
import subprocess
import tempfile
import threading
import time

import procs
import systems

TITLES = {
    "S1": "non-stream, 64 concurrent, 16 tokens",
    "S2": "stream, 64 concurrent, 256 tokens, no pacing",
    "S3": "stream, 256 concurrent, 64 tokens at 20 ms",
    "S4": "1000 concurrent streams, 20 tokens at 500 ms",
    "S5": "client disconnect mid-stream",
    "S6": "100-400 KB prompts at a few per second beside 256 paced streams",
    "S7": "scaling: S2 with 1 and 2 workers",
}
ALL = list(TITLES)
# The other dialects, by the letter that replaces S1/S2/S4's S: the load
# generator's --api. Not in the default run: `--scenarios dialects`.
DIALECTS = {"M": "messages", "R": "responses"}
DIALECT_SHAPES = ["1", "2", "4"]
DIALECT_IDS = [letter + n for letter in DIALECTS for n in DIALECT_SHAPES]
for _sid in DIALECT_IDS:
    TITLES[_sid] = "%s API, S%s's shape: %s" % (
        {"M": "Messages", "R": "Responses"}[_sid[0]], _sid[1:], TITLES["S" + _sid[1:]])
# Cache affinity (issue 28, part 4): its own systems (three targets, each a
# mock that models a prefix cache), not in the default run: `--scenarios A1
# --systems iop-affinity,iop-affinity-off`.
AFFINITY_IDS = ["A1"]
TITLES["A1"] = "cache affinity: sessions over 3 targets that reward a repeated prefix"
# Bursts (issue 29): S2 and S3 whose mock writes several events per write,
# so a read holds many (a fast engine's several tokens a scheduler step, a
# congested link), and S1 with 16 KiB prompts and answers. The default run
# has S2B16, S3B16 and S1L; `--scenarios bursts` is all six.
BURSTS = {"S2B4": 4, "S2B16": 16, "S2B64": 64, "S3B4": 4, "S3B16": 16}
for _sid, _n in BURSTS.items():
    TITLES[_sid] = "%s, %d events per write" % (TITLES[_sid[:2]], _n)
TITLES["S1L"] = "S1 with 16 KiB prompts and 16 KiB answers"
BURST_IDS = list(BURSTS) + ["S1L"]
KNOWN = ALL + DIALECT_IDS + AFFINITY_IDS + BURST_IDS
# What `run` runs without --scenarios.
DEFAULT = ALL + ["S2B16", "S3B16", "S1L"]


def base(sid):
    """The scenario whose shape `sid` has: S2 for M2, R2 and S2B16."""
    if sid[0] in DIALECTS:
        return "S" + sid[1:]
    return sid[:2] if sid in BURST_IDS else sid


def api_of(sid):
    """The load generator's --api of scenario `sid` (None: chat)."""
    return DIALECTS.get(sid[0])


def expand(names):
    """Scenario ids from a --scenarios list (`dialects` is every M and R)."""
    out = []
    for n in names:
        out.extend({"DIALECTS": DIALECT_IDS, "BURSTS": BURST_IDS}.get(n, [n]))
    return out


def params(quick, duration, warmup):
    """Per scenario: the mock's pacing (tokens, interval_ms) and the load.
    `duration` bounds each closed-loop run in seconds; `warmup` seconds of
    the same load run first, unmeasured (S1, S2, S3, S6, S7)."""
    d = duration
    out = _params(quick, d)
    for sid, p in out.items():
        if base(sid) in ("S1", "S2", "S3", "S6", "S7"):
            p["warmup"] = warmup
    # Long enough for every session's first (missed) request.
    out["A1"]["warmup"] = max(warmup, 3)
    # The paced loads start their connections spread over one stream's
    # length: streams that all last as long stay in step once started
    # together, and the percentiles would then measure how fast a burst of
    # every connection at once drains, not the load.
    for sid, load in [("S3", "load"), ("S6", "paced")] + [(b, "load") for b in BURSTS if b.startswith("S3")]:
        p = out[sid]
        p[load] = p[load] + ["--ramp-ms", p["tokens"] * p["interval_ms"]]
    for sid in DIALECT_IDS:
        p = dict(out[base(sid)], api=api_of(sid))
        if "load" in p:
            p["load"] = p["load"] + ["--api", p["api"]]
        out[sid] = p
    return out


def _params(quick, d):
    out = _shapes(quick, d)
    for sid, n in BURSTS.items():
        out[sid] = dict(out[sid[:2]], burst=n)
    # 16 tokens of 1 KiB each, and a 16 KiB user message.
    out["S1L"] = dict(out["S1"], token_bytes=1024, load=out["S1"]["load"] + ["--prompt-bytes", 16384])
    # 96 sessions, in turn, over 24 connections on 3 targets of 32 leases
    # each; each mock remembers 48 prefixes: with affinity a target holds
    # its share of the sessions (about 32, never all 96), without it every
    # target sees all of them in turn, which an LRU of 48 mostly misses.
    out["A1"] = {"tokens": 16, "interval_ms": 5, "hit_ms": 20, "miss_ms": 200, "entries": 48, "targets": 3,
                 "capacity": 32, "load": ["--concurrency", 24, "--stream", "--sessions", 96, "--duration-sec", d]}
    return out


def _shapes(quick, d):
    if quick:
        return {
            "S1": {"tokens": 16, "interval_ms": 0, "load": ["--concurrency", 64, "--no-stream", "--duration-sec", d]},
            "S2": {"tokens": 256, "interval_ms": 0, "load": ["--concurrency", 64, "--stream", "--duration-sec", d]},
            "S3": {"tokens": 16, "interval_ms": 20, "load": ["--concurrency", 64, "--stream", "--duration-sec", d]},
            "S4": {"tokens": 8, "interval_ms": 250, "streams": 200},
            "S5": {"tokens": 1000, "interval_ms": 20, "disconnect_after": 5,
                   "load": ["--concurrency", 8, "--stream", "--duration-sec", d]},
            "S6": {"tokens": 16, "interval_ms": 20, "paced": ["--concurrency", 64, "--stream", "--duration-sec", d],
                   "big": {"rate": 4, "concurrency": 8, "min": 100_000, "max": 400_000}},
            "S7": {"tokens": 256, "interval_ms": 0, "load": ["--concurrency", 64, "--stream", "--duration-sec", d]},
        }
    return {
        "S1": {"tokens": 16, "interval_ms": 0, "load": ["--concurrency", 64, "--no-stream", "--duration-sec", d]},
        "S2": {"tokens": 256, "interval_ms": 0, "load": ["--concurrency", 64, "--stream", "--duration-sec", d]},
        "S3": {"tokens": 64, "interval_ms": 20, "load": ["--concurrency", 256, "--stream", "--duration-sec", d]},
        "S4": {"tokens": 20, "interval_ms": 500, "streams": 1000},
        "S5": {"tokens": 1000, "interval_ms": 20, "disconnect_after": 5,
               "load": ["--concurrency", 32, "--stream", "--duration-sec", d]},
        "S6": {"tokens": 64, "interval_ms": 20, "paced": ["--concurrency", 256, "--stream", "--duration-sec", d],
               "big": {"rate": 4, "concurrency": 16, "min": 100_000, "max": 400_000}},
        "S7": {"tokens": 256, "interval_ms": 0, "load": ["--concurrency", 64, "--stream", "--duration-sec", d]},
    }


def describe(sid, p):
    """The parameters of a scenario in words (they differ with --quick)."""
    sid = base(sid)
    mock = "mock: %d tokens at %d ms" % (p["tokens"], p["interval_ms"])
    if p.get("burst", 1) > 1:
        mock += ", %d per write" % p["burst"]
    if p.get("token_bytes"):
        mock += " of %d bytes" % p["token_bytes"]
    if sid == "S4":
        api = " (--api %s)" % p["api"] if p.get("api") else ""
        return "%s; %d streams at once%s, RSS read each second while all are open (the median reading)" % (mock, p["streams"], api)
    if sid == "S5":
        return "%s; load: %s, each stream cut after %d tokens" % (mock, " ".join(map(str, p["load"])), p["disconnect_after"])
    if sid == "A1":
        return ("mock: %d tokens at %d ms, first token +%d ms on a cached prefix, +%d ms otherwise, %d prefixes "
                "remembered per target; %d targets of %d leases; load: %s (after %s s of warm-up)") % (
            p["tokens"], p["interval_ms"], p["hit_ms"], p["miss_ms"], p["entries"], p["targets"], p["capacity"],
            " ".join(map(str, p["load"])), p.get("warmup", 0))
    if sid == "S6":
        b = p["big"]
        return ("%s; paced: %s (after %s s of warm-up), then the same beside big: %d-%d KB prompts at %s/s over %d "
                "connections, --no-stream --max-tokens 1") % (
            mock, " ".join(map(str, p["paced"])), p.get("warmup", 0), b["min"] // 1000, b["max"] // 1000, b["rate"],
            b["concurrency"])
    return "%s; load: %s (after %s s of warm-up)" % (mock, " ".join(map(str, p["load"])), p.get("warmup", 0))


# S3's targets are margins of a fraction of a millisecond on p99s that move
# ±10-40% between rounds on a 2-core machine (direct's own TTFT p99 the
# most): at 3 rounds the verdict of one run flipped from run to run, so S3
# runs twice the rounds of the rest.
ROUND_FACTOR = {"S3": 2}


def rounds_of(sid, rounds):
    """How many rounds scenario `sid` runs when the run asks for `rounds`."""
    return rounds * ROUND_FACTOR.get(base(sid), 1)


def applies(sid, system):
    """Whether scenario `sid` means anything on `system`."""
    sid = base(sid)
    if (sid in AFFINITY_IDS) != (system in systems.AFFINITY_SYSTEMS):
        return False  # the affinity systems run the affinity scenario only
    if sid == "S5" and system == "iop-mock":
        return False  # no upstream connection to close
    if sid == "S7" and system == "direct":
        return False  # iop-mockprov has one thread
    return True


class Gen:
    """One iop-loadtest process, started now; `wait()` gives its JSON report
    and the CPU seconds it used (its own rusage, from wait4)."""

    def __init__(self, ctx, url, args, name, limit_sec):
        self.cmd = [ctx.bin("iop-loadtest"), "--url", url, "--model", "mock"] + [str(a) for a in args] + ["--json"]
        self.name = name
        self.out = tempfile.TemporaryFile()
        self.err_path = os.path.join(ctx.log_dir, name + ".log")
        self.err = open(self.err_path, "ab")
        self.p = subprocess.Popen(self.cmd, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL)
        self.timer = threading.Timer(limit_sec, self._kill)
        self.timer.daemon = True
        self.timer.start()
        self.killed = False

    def _kill(self):
        # Runs only before wait() has reaped the process (it joins this timer first).
        self.killed = True
        try:
            os.kill(self.p.pid, 9)
        except OSError:
            pass

    def command(self):
        return procs.quote(self.cmd)

    def wait(self):
        procs.wait_exit(self.p.pid, None)
        self.timer.cancel()
        self.timer.join()
        _, status, usage = os.wait4(self.p.pid, 0)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        self.timer.cancel()
        self.err.close()
        self.out.seek(0)
        text = self.out.read().decode(errors="replace")
        self.out.close()
        if self.killed:
            raise RuntimeError("%s ran past its time limit and was killed" % self.name)
        if self.p.returncode != 0:
            raise RuntimeError("%s exited with %s (log: %s)" % (self.name, self.p.returncode, self.err_path))
        return json.loads(text), round(usage.ru_utime + usage.ru_stime, 3)


def group_cpu(run):
    out = {}
    for group, pids in run.groups.items():
        values = [procs.cpu_seconds(p) if procs.alive(p) else None for p in pids]
        if any(v is None for v in values):
            raise RuntimeError("a %s process exited during the run (see its log)" % group)
        out[group] = sum(values)
    if run.mock and "mock" not in run.groups:
        out["_mock"] = procs.cpu_seconds(run.mock.pid) or 0.0
    return out


def group_sys(run):
    """Kernel CPU seconds of the system's processes (all groups)."""
    return sum(procs.sys_seconds(p) or 0.0 for pids in run.groups.values() for p in pids)


def cpu_delta(before, after):
    d = {k: round(after[k] - before[k], 3) for k in after}
    system = round(sum(v for k, v in d.items() if not k.startswith("_")), 3)
    return {"system": system, "by_group": {k: v for k, v in d.items() if not k.startswith("_")},
            "mock": d.get("_mock", d.get("mock", 0.0))}


def group_rss(run):
    out = {}
    for group, pids in run.groups.items():
        out[group] = {str(p): procs.rss_kib(p) for p in pids}
    return out


def percentile(sorted_values, q):
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not sorted_values:
        return None
    i = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def time_limit(load_args, extra=0):
    """Seconds a generator may take: its duration, its request timeout and slack."""
    args = [str(a) for a in load_args]
    d = int(args[args.index("--duration-sec") + 1]) if "--duration-sec" in args else 60
    return d + 120 + extra


def measure(sid, run, ctx, p, gens):
    """Measures scenario `sid` on the started system `run`; `gens` collects
    the generator commands. Returns the scenario's raw results."""
    sid = base(sid)
    if sid in ("S1", "S2", "S3", "S7"):
        warm_up(run, ctx, p, p["load"], gens)
        return closed_loop(run, ctx, p["load"], gens)
    if sid == "S4":
        return many_streams(run, ctx, p, gens)
    if sid == "S5":
        return disconnects(run, ctx, p, gens)
    if sid == "S6":
        return big_prompts(run, ctx, p, gens)
    if sid == "A1":
        return affinity(run, ctx, p, gens)
    raise ValueError(sid)


def with_duration(load, secs):
    args = list(load)
    args[args.index("--duration-sec") + 1] = secs
    return args


def warm_up(run, ctx, p, load, gens):
    """The same load for p["warmup"] seconds, not measured."""
    if p.get("warmup"):
        gen = Gen(ctx, run.url, with_duration(load, p["warmup"]), "warmup", time_limit(load))
        gens.append(gen.command())
        gen.wait()


def closed_loop(run, ctx, load, gens, name="loadtest"):
    before, sys_before = group_cpu(run), group_sys(run)
    gen = Gen(ctx, run.url, load, name, time_limit(load))
    gens.append(gen.command())
    report, gen_cpu = gen.wait()
    after, sys_after = group_cpu(run), group_sys(run)
    cpu = dict(cpu_delta(before, after), loadtest=gen_cpu, system_kernel=round(sys_after - sys_before, 3))
    return {"load": report, "cpu_sec": cpu}


# S4's readings: one a second, at most this many, while every stream is open.
RSS_SAMPLES = 6
RSS_STEP_SEC = 1.0


def many_streams(run, ctx, p, gens):
    """S4: RSS of every system process with `streams` streams open, minus
    before, per stream. Read once a second while every stream is open (at
    most RSS_SAMPLES readings, the first one interval after the last stream
    opened), and judged by the median reading: what a burst of openings
    freed stays in an allocator's dirty pages until its decay returns it
    (about a second with jemalloc as iop tunes it), and one reading just
    after the burst counted that as what an open stream holds. A reading
    counts only if every stream was open both just before and just after
    it (the mock's active streams, or the edge's leases for the in-process
    mock); with none that counts, the run fails."""
    n, tokens, interval = p["streams"], p["tokens"], p["interval_ms"]
    load = ["--concurrency", n, "--requests", n, "--stream", "--timeout-sec", 120]
    if p.get("api"):
        load += ["--api", p["api"]]
    before = group_rss(run)
    gen = Gen(ctx, run.url, load, "loadtest", 300)
    gens.append(gen.command())
    # The streams last (tokens - 1) intervals once open; leave one interval
    # (after all are open) for every stream to carry tokens, then read
    # until the first streams are about to end.
    stream_sec = max(tokens - 1, 1) * interval / 1000
    t_start, open_at, deadline = time.time(), None, time.time() + stream_sec
    while time.time() < deadline:
        if open_streams(run) >= n:
            open_at = time.time()
            break
        time.sleep(0.05)
    readings, open_at_samples = [], []
    if open_at is not None:
        time.sleep(interval / 1000)
        last = t_start + stream_sec - interval / 1000
        while True:
            open_before = open_streams(run)
            during = group_rss(run)
            open_after = open_streams(run)
            open_at_samples.append([open_before, open_after])
            if min(open_before, open_after) < n:
                break
            readings.append(during)
            if len(readings) >= RSS_SAMPLES or time.time() + RSS_STEP_SEC > last:
                break
            time.sleep(RSS_STEP_SEC)
    report, gen_cpu = gen.wait()

    def per_stream(reading):
        out = {}
        for group in before:
            b = sum(v or 0 for v in before[group].values())
            d = sum(v or 0 for v in reading[group].values())
            out[group] = round((d - b) / n, 2)
        return out

    each = [per_stream(r) for r in readings]
    median = {g: round(statistics.median(e[g] for e in each), 2) for g in before} if each else {}
    out = {"load": report, "rss_kib_before": before, "rss_kib_during": readings[0] if readings else None,
           "streams": n, "all_open_seen": open_at is not None,
           "all_open_after_sec": round(open_at - t_start, 3) if open_at is not None else None,
           "open_at_sample": open_at_samples[0] if open_at_samples else None, "open_at_samples": open_at_samples,
           "rss_kib_per_stream": median, "rss_kib_per_stream_readings": each,
           "rss_kib_per_stream_first": each[0] if each else {},
           "cpu_sec": {"loadtest": gen_cpu}}
    if not readings:
        raise MeasureError("S4: not all %d streams were open at any RSS reading (open before/after each: %s; "
                           "all open seen: %s)" % (n, open_at_samples, open_at is not None), out)
    return out


class MeasureError(RuntimeError):
    """A measurement that does not count; `partial` keeps what was read."""

    def __init__(self, msg, partial):
        super().__init__(msg)
        self.partial = partial


def open_streams(run):
    """Streams being served now: the mock's active streams, else the leases
    in use at the edge; -1 when unknown."""
    if run.mock:
        status, body = procs.http("GET", "http://%s/stats" % run.mock_addr)
        return json.loads(body)["active_streams"] if status == 200 else -1
    if run.admin:
        status, body = procs.http("GET", run.admin, token=systems.ADMIN_TOKEN)
        if status == 200:
            return sum(p["leases_in_use"] for node in json.loads(body)["nodes"] for p in node["providers"])
    return -1


def disconnects(run, ctx, p, gens):
    """S5: the client cuts each stream after a few tokens; the mock stamps
    when it sees the upstream connection close; both stamps are wall clock."""
    load = p["load"] + ["--disconnect-after", p["disconnect_after"]]
    out = closed_loop(run, ctx, load, gens)
    cut = out["load"].get("disconnects") or []
    want = {d["tag"]: d["unix_ns"] for d in cut}
    # Closes still travelling: wait until all arrived, or 3 s without news.
    seen, last_count, quiet_since = {}, -1, time.time()
    while True:
        status, body = procs.http("GET", "http://%s/closes" % run.mock_addr)
        if status == 200:
            seen = {c["tag"]: c["closed_unix_ns"] for c in json.loads(body)}
        if all(t in seen for t in want):
            break
        if len(seen) != last_count:
            last_count, quiet_since = len(seen), time.time()
        elif time.time() - quiet_since > 3:
            break
        time.sleep(0.05)
    lat = sorted((seen[t] - at) / 1e6 for t, at in want.items() if t in seen)
    out["disconnect"] = {
        "cut": len(want), "closed": len(lat), "never_closed": len(want) - len(lat),
        "p50_ms": percentile(lat, 0.50), "p90_ms": percentile(lat, 0.90), "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1] if lat else None, "min_ms": lat[0] if lat else None,
    }
    out["load"]["disconnects"] = "%d entries (dropped from the record)" % len(cut)
    return out


def big_prompts(run, ctx, p, gens):
    """S6: paced streams alone, then the same beside an open-loop stream of
    big prompts on the same processes; the paced gap p99 should not move."""
    warm_up(run, ctx, p, p["paced"], gens)
    alone = closed_loop(run, ctx, p["paced"], gens, name="paced-alone")
    b = p["big"]
    args = [str(a) for a in p["paced"]]
    d = int(args[args.index("--duration-sec") + 1])
    big_load = ["--rate", b["rate"], "--concurrency", b["concurrency"], "--no-stream", "--max-tokens", 1,
                "--prompt-bytes", b["min"], "--prompt-bytes-max", b["max"], "--duration-sec", d + 2]
    before = group_cpu(run)
    big = Gen(ctx, run.url, big_load, "big-prompts", time_limit(big_load))
    gens.append(big.command())
    paced = Gen(ctx, run.url, p["paced"], "paced-with-big", time_limit(p["paced"]))
    gens.append(paced.command())
    paced_report, paced_cpu = paced.wait()
    big_report, big_cpu = big.wait()
    after = group_cpu(run)
    return {"load": alone["load"], "cpu_sec": alone["cpu_sec"], "with_big": paced_report, "big": big_report,
            "cpu_sec_with_big": dict(cpu_delta(before, after), loadtest=round(paced_cpu + big_cpu, 3))}


def mock_counts(run):
    """Per target mock: (model requests, prefix hits, prefix misses)."""
    out = []
    for addr in run.mocks:
        status, body = procs.http("GET", "http://%s/stats" % addr)
        if status != 200:
            raise RuntimeError("mock %s: /stats answered %s" % (addr, status))
        v = json.loads(body)
        out.append((v["model_requests"], v.get("prefix_hits", 0), v.get("prefix_misses", 0)))
    return out


def affinity(run, ctx, p, gens):
    """A1: warm-up (every session's first request misses), then the
    closed loop; the mocks' prefix hits and requests per target in it."""
    warm_up(run, ctx, p, p["load"], gens)
    before = mock_counts(run)
    out = closed_loop(run, ctx, p["load"], gens)
    after = mock_counts(run)
    d = [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]
    hits, misses = sum(x[1] for x in d), sum(x[2] for x in d)
    out["prefix"] = {"hits": hits, "misses": misses, "requests_by_target": [x[0] for x in d],
                     "hit_pct": round(hits / (hits + misses) * 100, 1) if hits + misses else None}
    return out


def run_one(ctx, sid, system, round_no, workers, p, wait_idle, retries=1):
    """run_once, again (up to `retries` times) if it failed: a process
    killed from outside must not cost the benchmark its numbers. The record
    keeps the earlier attempts' errors."""
    failed = []
    while True:
        rec = run_once(ctx, sid, system, round_no, workers, p, wait_idle, attempt=len(failed))
        if "error" not in rec or len(failed) >= retries:
            break
        failed.append(rec["error"])
    if failed:
        rec["failed_attempts"] = failed
    return rec


def run_once(ctx, sid, system, round_no, workers, p, wait_idle, attempt=0):
    """Starts `system` fresh, measures `sid`, stops it; the record says what
    ran, how, and what else was busy."""
    if attempt:
        ctx.log_dir = ctx.log_dir.rstrip("/") + "-retry%d" % attempt
        os.makedirs(ctx.log_dir, exist_ok=True)
    waited = wait_for_builds(wait_idle)
    rec = {"scenario": sid, "system": system, "round": round_no, "workers": workers,
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "loadavg_before": procs.loadavg(), "builds_running_before": procs.builds_running(),
           "waited_for_builds_sec": waited, "params": p}
    gens = []
    t0 = time.time()
    run = None
    try:
        run = systems.start(system, ctx, p, workers)
        rec["configs"] = run.configs
        rec["pids"] = run.groups
        rec["driver"] = run.driver
        rec["notes"] = run.notes
        snap = procs.all_cpu()
        rec.update(measure(sid, run, ctx, p, gens))
        dead = [proc.name for proc in run.procs if not procs.alive(proc.pid)]
        dead += [g for g, pids in run.groups.items() if not all(procs.alive(pid) for pid in pids)]
        if dead:
            raise RuntimeError("exited during the run: %s (see the logs)" % ", ".join(sorted(set(dead))))
        ours = run.all_pids() | {os.getpid()}
        rec["other_cpu_sec"], rec["other_top"] = procs.others_busy(snap, procs.all_cpu(), ours)
        rows = systems.store_rows(run)
        if rows is not None:
            rec["store_rows"] = rows
    except Exception as e:  # one failed run must not end the benchmark
        if isinstance(e, MeasureError):
            rec["partial"] = e.partial
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if run:
            rec["commands"] = run.commands() + gens
            run.stop()
        else:
            rec["commands"] = gens
    rec["builds_running_after"] = procs.builds_running()
    rec["wall_sec"] = round(time.time() - t0, 2)
    return rec


def wait_for_builds(limit):
    """Waits up to `limit` seconds for cargo/rustc to finish; seconds waited."""
    t0 = time.time()
    while limit > 0 and procs.builds_running() and time.time() - t0 < limit:
        time.sleep(1)
    return round(time.time() - t0, 1)
