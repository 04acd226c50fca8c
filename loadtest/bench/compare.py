"""`run.py compare`: per scenario, each system's numbers (the median over the
rounds) and iop's ratios against the targets of issue 8, met or not met;
with `--html`, the same runs as charts, the systems side by side (drawn by
`iop-loadtest report`)."""

import json
import os
import statistics
import subprocess
import tempfile

from scenarios import BURSTS, DIALECT_IDS, KNOWN, TITLES, base, describe

IOP = ["iop-tunnel", "iop-normalized"]
ORDER = ["direct", "nginx1", "nginx2", "haproxy1", "haproxy2", "iop-tunnel", "iop-normalized", "iop-mock",
         "iop-tunnel-nostore", "iop-normalized-nostore", "iop-affinity", "iop-affinity-off"]


def metrics(rec, cores=1):
    """The numbers of one run, flat; None when the run failed. `cores`: the
    machine's, for the share of it the run kept busy."""
    if "error" in rec or "load" not in rec:
        return None
    sid, load = base(rec["scenario"]), rec["load"]
    m = {"errors": load["errors"]["total"], "completed": load["completed"]}
    cpu = rec.get("cpu_sec", {})
    if load["completed"] and "system" in cpu:
        m["cpu_us_req"] = cpu["system"] / load["completed"] * 1e6
        if "system_kernel" in cpu:
            m["kernel_us_req"] = cpu["system_kernel"] / load["completed"] * 1e6
            m["user_us_req"] = m["cpu_us_req"] - m["kernel_us_req"]
    if "loadtest" in cpu and load["elapsed_sec"]:
        m["gen_cores"] = cpu["loadtest"] / load["elapsed_sec"]
    if "mock" in cpu and load["elapsed_sec"]:
        m["mock_cores"] = cpu["mock"] / load["elapsed_sec"]
    if load["elapsed_sec"]:
        # Each process of the system under test, in cores: with one worker a
        # process below 1.0 was not what limited the run.
        for group, sec in cpu.get("by_group", {}).items():
            m["cores_" + group] = sec / load["elapsed_sec"]
    if {"system", "loadtest"} <= set(cpu) and load["elapsed_sec"]:
        mock = cpu.get("mock", 0.0) if rec["system"] != "direct" else 0.0
        m["busy_pct"] = (cpu["system"] + mock + cpu["loadtest"]) / load["elapsed_sec"] / cores * 100
    lat = load["latency_us"]
    m["req_s"] = load["requests_per_sec"]
    if "store_rows" in rec:
        rows = rec["store_rows"]
        m["store_dropped"] = rows.get("dropped", 0)
        # The writer thread's CPU per row (one row a run), over the node's
        # life; against the system's CPU per request in the same run.
        if rows.get("written") and "thread_cpu_sec" in rows:
            m["store_us_row"] = rows["thread_cpu_sec"] / rows["written"] * 1e6
    if sid in ("S2", "S7"):
        m["events_s"] = load["events_per_sec"]
        m["mb_s"] = load["body_bytes_per_sec"] / 1e6
        m["tokens_s"] = load["tokens_per_sec"]
        m["events_req"] = load["events"] / load["completed"] if load["completed"] else None
        if load["events"] and "system" in cpu:
            # S7: with the same CPU per event on 1 and 2 workers, the second
            # worker costs nothing; the ratio is then the idle machine's to give.
            m["cpu_us_event"] = cpu["system"] / load["events"] * 1e6
    if sid == "S3":
        m["ttft_p50"], m["ttft_p99"] = lat["ttft"]["p50"] / 1000, lat["ttft"]["p99"] / 1000
        m["gap_p50"], m["gap_p99"] = lat["itl"]["p50"] / 1000, lat["itl"]["p99"] / 1000
    if sid == "S4":
        for group, v in rec["rss_kib_per_stream"].items():
            m["rss_" + group] = v
        m["all_open"] = rec.get("all_open_seen")
    if sid == "S5":
        d = rec["disconnect"]
        m["close_p50"], m["close_p99"], m["never_closed"], m["cut"] = d["p50_ms"], d["p99_ms"], d["never_closed"], d["cut"]
    if sid == "A1":
        m["ttft_p50"], m["ttft_p99"] = lat["ttft"]["p50"] / 1000, lat["ttft"]["p99"] / 1000
        m["total_p50"] = lat["total"]["p50"] / 1000
        m["hit_pct"] = rec["prefix"]["hit_pct"]
        by = rec["prefix"]["requests_by_target"]
        m["by_target"] = "/".join(str(n) for n in by)
    if sid == "S6":
        wb, big = rec["with_big"], rec["big"]
        m["gap_p99_alone"] = lat["itl"]["p99"] / 1000
        m["gap_p99_big"] = wb["latency_us"]["itl"]["p99"] / 1000
        m["gap_shift"] = m["gap_p99_big"] - m["gap_p99_alone"]
        m["big_done"], m["big_late"] = big["completed"], big["late_starts"]
        m["errors"] += wb["errors"]["total"] + big["errors"]["total"]
        m["big_total_p99"] = big["latency_us"]["total"]["p99"] / 1000
    return m


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values):
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / 2 / abs(mid) * 100 if mid else None


class Agg:
    """Runs grouped by (scenario, system, workers), metrics by round."""

    def __init__(self, results):
        self.by = {}
        self.failed = []
        cores = results["meta"]["machine"].get("affinity") or results["meta"]["machine"].get("nproc") or 1
        for rec in results["runs"]:
            key = (rec["scenario"], rec["system"], rec.get("workers"))
            m = metrics(rec, cores)
            if m is None:
                self.failed.append(rec)
                continue
            self.by.setdefault(key, {})[rec["round"]] = m

    def rounds(self, sid, system, workers):
        return self.by.get((sid, system, workers), {})

    def value(self, sid, system, workers, name):
        return median([m.get(name) for m in self.rounds(sid, system, workers).values()])

    def values(self, sid, system, workers, name):
        return [m.get(name) for _, m in sorted(self.rounds(sid, system, workers).items())]

    def added(self, sid, system, workers, name):
        """Per round: the system's value minus direct's in the same round; the median."""
        base = self.rounds(sid, "direct", workers)
        diffs = [m.get(name) - base[r][name] for r, m in self.rounds(sid, system, workers).items()
                 if r in base and m.get(name) is not None and base[r].get(name) is not None]
        return median(diffs), diffs

    def group_cores(self, sid, system, workers):
        """"edge 0.26, node 0.35": each process's cores, median over rounds."""
        groups = sorted({k[6:] for m in self.rounds(sid, system, workers).values() for k in m if k.startswith("cores_")})
        return ", ".join("%s %s" % (g, fmt(self.value(sid, system, workers, "cores_" + g))) for g in groups)

    def systems(self, sid):
        present = {k[1] for k in self.by if k[0] == sid}
        return [s for s in ORDER if s in present] + sorted(present - set(ORDER))


def fmt(v, digits=2):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if abs(v) >= 1000:
        return "{:,.0f}".format(v).replace(",", " ")
    if abs(v) >= 100:
        return "%.0f" % v
    return ("%." + str(digits) + "f") % v


def cell(agg, sid, system, workers, name, digits=2):
    v = agg.value(sid, system, workers, name)
    s = spread(agg.values(sid, system, workers, name))
    return fmt(v, digits) + (" ±%.0f%%" % s if s is not None and s >= 0.5 else "")


def table(headers, rows, md, left=1):
    if md:
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda r: "  " + "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(headers)] + [line(r) for r in rows])


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def verdict(ok):
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def targets(agg, workers):
    """(scenario, target, system, value, verdict) for every target of issue 8."""
    out = []
    w = workers

    def at_least(sid, name, system, other, label, limit=1.0):
        r = ratio(agg.value(sid, system, w, name), agg.value(sid, other, w, name))
        out.append((sid, label, system, fmt(r) + "×" if r is not None else "n/a", verdict(None if r is None else r >= limit)))

    def cpu_at_most(sid, system, other):
        r = ratio(agg.value(sid, system, w, "cpu_us_req"), agg.value(sid, other, w, "cpu_us_req"))
        out.append((sid, "CPU/request ≤ " + other, system, fmt(r) + "×" if r is not None else "n/a",
                    verdict(None if r is None else r <= 1.0)))

    def added_p99s(sid, other):
        """The iop paths' added TTFT and gap p99 (over direct) ≤ `other`'s."""
        for name, what in (("ttft_p99", "TTFT"), ("gap_p99", "gap")):
            theirs, _ = agg.added(sid, other, w, name)
            for s in IOP:
                ours, _ = agg.added(sid, s, w, name)
                ok = None if ours is None or theirs is None else ours <= theirs
                out.append((sid, "added %s p99 ≤ %s's" % (what, other), s, "%s vs %s ms" % (fmt(ours), fmt(theirs)),
                            verdict(ok)))

    for s in IOP:
        at_least("S1", "req_s", s, "nginx2", "req/s ≥ 1.0× nginx2")
        cpu_at_most("S1", s, "nginx2")
    for s in IOP:
        at_least("S2", "events_s", s, "nginx2", "events/s ≥ 1.0× nginx2")
    at_least("S2", "events_s", "iop-tunnel", "nginx1", "events/s ≥ 1.0× nginx1")
    added_p99s("S3", "nginx2")
    for s in IOP:
        per = {g: agg.value("S4", s, w, "rss_" + g) for g in ("edge", "node")}
        worst = max((v for v in per.values() if v is not None), default=None)
        out.append(("S4", "≤ 8 KiB per stream per process", s,
                    "edge %s, node %s KiB" % (fmt(per["edge"]), fmt(per["node"])),
                    verdict(None if worst is None else worst <= 8.0)))
    for s in IOP:
        v = agg.value("S5", s, w, "close_p99")
        never = agg.value("S5", s, w, "never_closed")
        ok = None if v is None else (v <= 5.0 and not never)
        out.append(("S5", "upstream close p99 ≤ 5 ms", s, "%s ms" % fmt(v) + (", %s never closed" % fmt(never, 0) if never else ""),
                    verdict(ok)))
    for s in IOP:
        v = agg.value("S6", s, w, "gap_shift")
        out.append(("S6", "paced gap p99 moves ≤ 1 ms", s, "%+.2f ms" % v if v is not None else "n/a",
                    verdict(None if v is None else v <= 1.0)))
    for s in IOP:
        r = ratio(agg.value("S7", s, 2, "events_s"), agg.value("S7", s, 1, "events_s"))
        busy = agg.value("S7", s, 2, "busy_pct")
        busy1 = agg.value("S7", s, 1, "busy_pct")
        one = agg.group_cores("S7", s, 1)
        mock1, gen1 = agg.value("S7", s, 1, "mock_cores"), agg.value("S7", s, 1, "gen_cores")
        why = (["machine %.0f%% busy" % busy] if busy is not None else [])
        # With the CPU per event unchanged, more workers can only use the
        # idle rest of the machine: the ratio cannot pass 100 / busy % (1).
        if busy1:
            why.append("with 1 worker already %.0f%% busy: at most %s× here" % (busy1, fmt(100.0 / busy1)))
        if one:
            why.append("1 worker: %s, mock %s, generator %s cores" % (one, fmt(mock1), fmt(gen1)))
        ev1, ev2 = agg.value("S7", s, 1, "cpu_us_event"), agg.value("S7", s, 2, "cpu_us_event")
        if ev1 and ev2:
            why.append("CPU per event %s → %s µs" % (fmt(ev1, 3), fmt(ev2, 3)))
        value = (fmt(r) + "×" if r is not None else "n/a") + (" (%s)" % "; ".join(why) if why else "")
        out.append(("S7", "2 workers ≥ 1.6× 1 worker", s, value, verdict(None if r is None else r >= 1.6)))
    # Issue 29: against HAProxy, when it ran. The floor: two iop hops at
    # least as fast and as lean as two HAProxy hops; the goal: as fast as one.
    if any(agg.value(sid, "haproxy2", w, "completed") is not None for sid in ("S1", "S2", "S3")):
        for s in IOP:
            at_least("S1", "req_s", s, "haproxy2", "req/s ≥ 1.0× haproxy2")
            cpu_at_most("S1", s, "haproxy2")
            at_least("S2", "events_s", s, "haproxy2", "events/s ≥ 1.0× haproxy2")
        added_p99s("S3", "haproxy2")
    # The bursts (issue 29): the same floor on the bursty S2 and S3, and
    # 16 KiB bodies at ≥ 0.7× of S1's throughput.
    for sid in BURSTS:
        if agg.value(sid, "haproxy2", w, "completed") is None:
            continue
        if base(sid) == "S2":
            for s in IOP:
                at_least(sid, "events_s", s, "haproxy2", "events/s ≥ 1.0× haproxy2")
        else:
            added_p99s(sid, "haproxy2")
    for s in IOP:
        if agg.value("S1L", s, w, "req_s") is not None and agg.value("S1", s, w, "req_s") is not None:
            r = ratio(agg.value("S1L", s, w, "req_s"), agg.value("S1", s, w, "req_s"))
            out.append(("S1L", "16 KiB req/s ≥ 0.7× S1's", s, fmt(r) + "×" if r is not None else "n/a",
                        verdict(None if r is None else r >= 0.7)))
        if agg.value("S1L", "haproxy2", w, "req_s") is not None:
            at_least("S1L", "req_s", s, "haproxy2", "req/s ≥ 1.0× haproxy2")
    # S4 (issue 29): an open stream costs the two iop processes together no
    # more than it costs two HAProxy together (the floor), and each iop
    # process no more than one HAProxy's (the goal).
    two = [agg.value("S4", "haproxy2", w, "rss_haproxy-" + g) for g in ("back", "front")]
    one = agg.value("S4", "haproxy1", w, "rss_haproxy")
    for s in IOP:
        mine = [agg.value("S4", s, w, "rss_" + g) for g in ("edge", "node")]
        if None in mine:
            continue
        if None not in two:
            r = ratio(sum(mine), sum(two))
            out.append(("S4", "memory/stream, both processes ≤ haproxy2's", s,
                        "%s against %s KiB (%s×)" % (fmt(sum(mine)), fmt(sum(two)), fmt(r)), verdict(r <= 1.0)))
        if one is not None:
            r = ratio(max(mine), one)
            out.append(("S4", "goal: memory/stream, each process ≤ haproxy1's", s,
                        "%s against %s KiB (%s×)" % (fmt(max(mine)), fmt(one), fmt(r)), verdict(r <= 1.0)))
    if any(agg.value(sid, "haproxy1", w, "completed") is not None for sid in ("S1", "S2")):
        for s in IOP:
            at_least("S1", "req_s", s, "haproxy1", "goal: req/s ≥ 1.0× haproxy1")
            at_least("S2", "events_s", s, "haproxy1", "goal: events/s ≥ 1.0× haproxy1")
    # Issue 27: the node's run store (on in every iop system) costs at most
    # 3% against the same system with `store = false`; only when that ran.
    for s in IOP:
        off = s + "-nostore"
        for sid, name, label in (("S1", "req_s", "req/s"), ("S2", "events_s", "events/s")):
            if agg.value(sid, off, w, name) is not None:
                at_least(sid, name, s, off, "store on: %s ≥ 0.97× store off" % label, 0.97)
        if agg.value("S1", off, w, "cpu_us_req") is not None:
            r = ratio(agg.value("S1", s, w, "cpu_us_req"), agg.value("S1", off, w, "cpu_us_req"))
            out.append(("S1", "store on: CPU/request ≤ 1.03× store off", s, fmt(r) + "×" if r is not None else "n/a",
                        verdict(None if r is None else r <= 1.03)))
        # Measured apart from the noise of two systems' throughput: the
        # writer thread's CPU per run against the system's per request, in
        # the same runs (what the reactors add per run is counted apart,
        # loadtest/README.md).
        for sid in ("S1", "S2"):
            row, req = agg.value(sid, s, w, "store_us_row"), agg.value(sid, s, w, "cpu_us_req")
            if row is not None and req and agg.value(sid, off, w, "req_s") is not None:
                share = row / req * 100
                out.append((sid, "store on: writer thread CPU ≤ 3% of the system's", s,
                            "%.1f%% (%s µs a run)" % (share, fmt(row)), verdict(share <= 3.0)))
        # A store that kept pace by dropping rows would not count.
        for sid in ("S1", "S2"):
            dropped = [v for v in agg.values(sid, s, w, "store_dropped") if v is not None]
            if dropped and agg.value(sid, off, w, "req_s") is not None:
                out.append((sid, "store on: no row dropped (all rounds)", s, str(sum(dropped)),
                            verdict(sum(dropped) == 0)))
    return out


# Issue 25's speed targets. "Within noise" is taken as 1.1×: the spread
# of one system's rounds on this 2-core machine is ±5-15%.
NOISE = 1.1


def dialect_targets(agg, workers):
    """(scenario, target, system, value, verdict) for the Messages and
    Responses scenarios: native passthrough (iop-tunnel) costs what the chat
    tunnel costs; translation (iop-normalized) at most 1.1× the chat tunnel's
    CPU per request (x1) and per event (x2), and against the chat normalized
    path it rides on; memory per open translated stream (x4) ≤ 8 KiB."""
    out, w = [], workers

    def cost(sid, system, name, other_sid, other_system, label, limit):
        r = ratio(agg.value(sid, system, w, name), agg.value(other_sid, other_system, w, name))
        out.append((sid, label, system, fmt(r) + "×" if r is not None else "n/a", verdict(None if r is None else r <= limit)))

    for sid in DIALECT_IDS:
        shape = base(sid)
        if shape in ("S1", "S2"):
            name, per = ("cpu_us_req", "request") if shape == "S1" else ("cpu_us_event", "event")
            cost(sid, "iop-tunnel", name, shape, "iop-tunnel", "native: CPU/%s ≤ %.1f× chat tunnel" % (per, NOISE), NOISE)
            cost(sid, "iop-normalized", name, shape, "iop-tunnel", "translated: CPU/%s ≤ 1.1× chat tunnel" % per, 1.1)
            cost(sid, "iop-normalized", name, shape, "iop-normalized",
                 "translated: CPU/%s ≤ 1.1× chat normalized" % per, 1.1)
            rate = "req_s" if shape == "S1" else "events_s"
            for s in ("iop-tunnel", "iop-normalized"):
                r = ratio(agg.value(sid, s, w, rate), agg.value(sid, "nginx2", w, rate))
                out.append((sid, "%s ≥ 1.0× nginx2" % rate.replace("_s", "/s"), s, fmt(r) + "×" if r is not None else "n/a",
                            verdict(None if r is None else r >= 1.0)))
        if shape == "S4":
            for s in ("iop-tunnel", "iop-normalized"):
                per = {g: agg.value(sid, s, w, "rss_" + g) for g in ("edge", "node")}
                worst = max((v for v in per.values() if v is not None), default=None)
                out.append((sid, "≤ 8 KiB per stream per process", s,
                            "edge %s, node %s KiB" % (fmt(per["edge"]), fmt(per["node"])),
                            verdict(None if worst is None else worst <= 8.0)))
    return out


def more_rounds(results):
    """" (S3: 6)": the scenarios that ran more rounds than the run's count."""
    most = {}
    for r in results["runs"]:
        most[r["scenario"]] = max(most.get(r["scenario"], 0), r["round"])
    more = ["%s: %d" % (sid, n) for sid, n in sorted(most.items()) if n > results["meta"]["rounds"]]
    return " (%s)" % ", ".join(more) if more else ""


def header(results, md):
    meta = results["meta"]
    mc, v = meta["machine"], meta["versions"]
    runs = results["runs"]
    loads = [r["loadavg_before"][0] for r in runs if "loadavg_before" in r]
    built = sum(1 for r in runs if r.get("builds_running_before") or r.get("builds_running_after"))
    other = [r["other_cpu_sec"] / max(r.get("wall_sec", 1), 0.001) for r in runs if "other_cpu_sec" in r]
    lines = [
        "machine   nproc=%s kernel=%s cpu=%r %s MHz ram=%s GiB" % (mc["nproc"], mc["kernel"], mc["cpu"], mc.get("cpu_mhz"), mc["ram_gib"]),
        "versions  git %s%s, %s, %s, %s" % (v["git"], " (dirty tree)" if v.get("dirty") else "", v["rustc"], v["nginx"], v["iop_edge"]),
        "binaries  %s (newest built %s)" % (meta["bin_dir"], max(meta.get("binaries_built", {}).values(), default="?")),
        "command   %s" % meta["command"],
        "date      %s to %s; %d rounds%s%s; %d runs, %d failed" % (
            meta["started_at"], results.get("finished_at", "(unfinished)"), meta["rounds"],
            more_rounds(results), " (--quick)" if meta["quick"] else "", len(runs), sum(1 for r in runs if "error" in r)),
        "busy      1-min load average before runs %s–%s; a build (cargo/rustc) ran during %d of %d runs; "
        "other processes used at most %.2f cores" % (fmt(min(loads, default=None)), fmt(max(loads, default=None)), built, len(runs),
                                                       max(other, default=0.0)),
        "iop-node  `workers` key: %s" % (
            "applied" if meta.get("node_workers") else "n/a (no iop system ran)" if meta.get("node_workers") is None
            else "not supported by this build, S7 scaled the edge only"),
    ]
    if md:
        return "\n".join("- %s: %s" % tuple(l.split(None, 1)) for l in lines).replace(meta["command"], "`%s`" % meta["command"])
    return "\n".join(lines)


def _section_s1(agg, w, sid, section, results):
    section(sid, ["system", "req/s", "CPU µs/req", "of it user / kernel", "mock cores", "gen cores", "machine busy %",
                  "errors"],
            [[s, cell(agg, sid, s, w, "req_s"), cell(agg, sid, s, w, "cpu_us_req", 1),
              "%s / %s" % (fmt(agg.value(sid, s, w, "user_us_req"), 1), fmt(agg.value(sid, s, w, "kernel_us_req"), 1)),
              cell(agg, sid, s, w, "mock_cores"),
              cell(agg, sid, s, w, "gen_cores"), cell(agg, sid, s, w, "busy_pct", 0), fmt(agg.value(sid, s, w, "errors"), 0)]
             for s in agg.systems(sid)])


def _section_s2(agg, w, sid, section, results):
    section(sid, ["system", "events/s", "MB/s", "tokens/s", "events/req", "CPU µs/req", "gen cores", "machine busy %",
                  "errors"],
            [[s, cell(agg, sid, s, w, "events_s"), cell(agg, sid, s, w, "mb_s"), cell(agg, sid, s, w, "tokens_s"),
              cell(agg, sid, s, w, "events_req", 0), cell(agg, sid, s, w, "cpu_us_req", 0), cell(agg, sid, s, w, "gen_cores"),
              cell(agg, sid, s, w, "busy_pct", 0), fmt(agg.value(sid, s, w, "errors"), 0)] for s in agg.systems(sid)])


def _section_s3(agg, w, sid, section, results):
    rows = []
    for s in agg.systems(sid):
        added = [agg.added(sid, s, w, n)[0] if s != "direct" else None for n in ("ttft_p50", "ttft_p99", "gap_p50", "gap_p99")]
        rows.append([s, cell(agg, sid, s, w, "ttft_p50"), cell(agg, sid, s, w, "ttft_p99"), cell(agg, sid, s, w, "gap_p50"),
                     cell(agg, sid, s, w, "gap_p99")] + [fmt(a) for a in added] + [fmt(agg.value(sid, s, w, "errors"), 0)])
    section(sid, ["system", "TTFT p50", "TTFT p99", "gap p50", "gap p99", "+TTFT p50", "+TTFT p99", "+gap p50", "+gap p99",
                  "errors"], rows, "ms; + = added over direct in the same round (median over rounds)")


def _section_s4(agg, w, sid, section, results):
    rows = []
    for s in agg.systems(sid):
        groups = sorted({k[4:] for m in agg.rounds(sid, s, w).values() for k in m if k.startswith("rss_")})
        rows.append([s, ", ".join("%s %s" % (g, cell(agg, sid, s, w, "rss_" + g)) for g in groups),
                     fmt(agg.value(sid, s, w, "completed"), 0), fmt(agg.value(sid, s, w, "errors"), 0)])
    section(sid, ["system", "RSS KiB per stream (VmRSS with all open − before, ÷ streams; the median reading)", "streams done", "errors"], rows)


def _section_s5(agg, w, sid, section, results):
    section(sid, ["system", "close p50 ms", "close p99 ms", "cut", "never closed", "errors"],
            [[s, cell(agg, sid, s, w, "close_p50", 3), cell(agg, sid, s, w, "close_p99", 3), fmt(agg.value(sid, s, w, "cut"), 0),
              fmt(agg.value(sid, s, w, "never_closed"), 0), fmt(agg.value(sid, s, w, "errors"), 0)] for s in agg.systems(sid)],
            "from the client's close to the mock seeing its upstream connection close (wall clock, per tagged request)")


def _section_s6(agg, w, sid, section, results):
    section(sid, ["system", "gap p99 alone", "gap p99 beside big", "shift", "big done", "big late", "big total p99", "errors"],
            [[s, cell(agg, sid, s, w, "gap_p99_alone"), cell(agg, sid, s, w, "gap_p99_big"), cell(agg, sid, s, w, "gap_shift"),
              fmt(agg.value(sid, s, w, "big_done"), 0), fmt(agg.value(sid, s, w, "big_late"), 0),
              cell(agg, sid, s, w, "big_total_p99", 1), fmt(agg.value(sid, s, w, "errors"), 0)] for s in agg.systems(sid)], "ms")


def _section_s7(agg, w, sid, section, results):
    rows = []
    for s in agg.systems(sid):
        one, two = agg.value(sid, s, 1, "events_s"), agg.value(sid, s, 2, "events_s")
        rows.append([s, cell(agg, sid, s, 1, "events_s"), cell(agg, sid, s, 2, "events_s"), fmt(ratio(two, one)) + "×",
                     agg.group_cores(sid, s, 1), agg.group_cores(sid, s, 2), cell(agg, sid, s, 1, "mock_cores"), cell(agg, sid, s, 2, "mock_cores"),
                     cell(agg, sid, s, 1, "gen_cores"), cell(agg, sid, s, 2, "gen_cores"), cell(agg, sid, s, 1, "busy_pct", 0),
                     cell(agg, sid, s, 2, "busy_pct", 0),
                     "%s → %s" % (fmt(agg.value(sid, s, 1, "cpu_us_event"), 3), fmt(agg.value(sid, s, 2, "cpu_us_event"), 3)),
                     fmt((agg.value(sid, s, 1, "errors") or 0) + (agg.value(sid, s, 2, "errors") or 0), 0)])
    section(sid, ["system", "events/s 1 worker", "events/s 2 workers", "ratio", "cores by process (1)",
                  "cores by process (2)", "mock cores (1)", "mock cores (2)", "gen cores (1)", "gen cores (2)", "busy % (1)",
                  "busy % (2)", "CPU µs/event (1 → 2)", "errors"], rows,
            "the load generator and the mock share the machine (%s cores): where busy %% (2) is near 100, "
            "the machine is the limit, not the binary; a process well below 1.0 core with 1 worker "
            "was not the limit either" % results["meta"]["machine"]["nproc"])


def _section_a1(agg, w, sid, section, results):
    rows = []
    for s in agg.systems(sid):
        last = agg.values(sid, s, w, "by_target")
        rows.append([s, cell(agg, sid, s, w, "req_s"), cell(agg, sid, s, w, "ttft_p50"), cell(agg, sid, s, w, "ttft_p99"),
                     cell(agg, sid, s, w, "total_p50"), cell(agg, sid, s, w, "hit_pct", 1), last[-1] if last else "n/a",
                     fmt(agg.value(sid, s, w, "errors"), 0)])
    section(sid, ["system", "req/s", "TTFT p50", "TTFT p99", "total p50", "prefix hits %", "requests by target (last round)",
                  "errors"], rows, "ms; hits as the mocks counted them")


# The table of each scenario shape (the dialects' M2 and R2 draw S2's).
SECTIONS = {"S1": _section_s1, "S2": _section_s2, "S3": _section_s3, "S4": _section_s4, "S5": _section_s5,
            "S6": _section_s6, "S7": _section_s7, "A1": _section_a1}


def render(results, md=False):
    agg = Agg(results)
    w = results["meta"]["workers"]
    out = ["iop vs nginx and HAProxy (issues 8, 29 benchmark)", "", header(results, md), ""]

    def section(sid, headers, rows, note=None):
        if not rows:
            return
        title = "%s  %s" % (sid, TITLES[sid])
        text = describe(sid, results["meta"]["params"][sid]) + ("; " + note if note else "")
        if md:
            out.extend(["**%s**" % title, "", text, "", table(headers, rows, md), ""])
        else:
            out.extend([title, text, table(headers, rows, md), ""])

    ran = [sid for sid in KNOWN if sid in results["meta"]["scenarios"]]
    for sid in ran:
        SECTIONS[base(sid)](agg, w, sid, section, results)

    out.append(("**%s**\n" if md else "%s") % "Targets (iop, ratios within this run)")
    out.append(table(["scenario", "target", "system", "value", "verdict"],
                     [t for t in targets(agg, w) + dialect_targets(agg, w)
                      if t[0] in ran and t[2] in results["meta"]["systems"]], md, left=3))
    if agg.failed:
        out.append("")
        out.append("failed runs:")
        for r in agg.failed:
            out.append("  %s %s round %s workers %s: %s" % (r["scenario"], r["system"], r["round"], r.get("workers"),
                                                           r.get("error", "no load report")))
    retried = [r for r in results["runs"] if r.get("failed_attempts")]
    if retried:
        out.append("")
        out.append("runs measured on a second attempt (the first failed): " + ", ".join(
            "%s/%s/r%s/w%s (%s)" % (r["scenario"], r["system"], r["round"], r.get("workers"), r["failed_attempts"][0])
            for r in retried))
    errs = [(k, m["errors"]) for k, rounds in agg.by.items() for m in rounds.values() if m.get("errors")]
    if errs:
        out.append("")
        out.append("runs with request errors (their numbers are suspect): " +
                   ", ".join("%s/%s/w%s: %d" % (k[0], k[1], k[2], e) for k, e in errs))
    return "\n".join(out) + "\n"


def report_set(results):
    """The runs as an `iop-loadtest report` set: a section per scenario, a line
    per system (S7: per system and workers), each with its rounds' load
    reports, which the report pools. S6 draws the paced streams beside the
    big prompts (the load its targets are about)."""
    sections = []
    ran = [sid for sid in KNOWN if sid in results["meta"]["scenarios"]]
    for sid in ran:
        by_label = {}
        for rec in results["runs"]:
            if rec["scenario"] != sid or "error" in rec or "load" not in rec:
                continue
            load = rec.get("with_big", rec["load"]) if base(sid) == "S6" else rec["load"]
            key = (ORDER.index(rec["system"]) if rec["system"] in ORDER else len(ORDER), rec["system"], rec.get("workers") or 0)
            by_label.setdefault(key, []).append(load)
        runs = [{"label": system + (" w%d" % workers if base(sid) == "S7" else ""), "reports": reports}
                for (_, system, workers), reports in sorted(by_label.items())]
        note = describe(sid, results["meta"]["params"][sid])
        if base(sid) == "S6":
            note += "; charts: the paced streams beside the big prompts"
        sections.append({"title": "%s  %s" % (sid, TITLES[sid]), "note": note, "runs": runs})
    return {"title": "iop vs nginx and HAProxy (issues 8, 29 benchmark)", "intro": header(results, False).split("\n"), "sections": sections}


def write_html(results, out, loadtest):
    """Writes the charts page of `results` to `out` with the `iop-loadtest`
    binary at `loadtest`; raises SystemExit when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="iop-report-set-", delete=False) as f:
        json.dump(report_set(results), f)
    try:
        done = subprocess.run([loadtest, "report", "--html", out, f.name], capture_output=True, text=True)
    except OSError as e:
        raise SystemExit("cannot run %s: %s" % (loadtest, e))
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise SystemExit("%s report failed: %s" % (loadtest, done.stderr.strip()))
