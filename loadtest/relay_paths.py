#!/usr/bin/env python3
"""The tunnel path next to the normalized one, on the same scenario.

One edge, one node, one `iop-mockprov --tokens 32 --no-record`; the node
has three providers and the edge one model per provider:

- `tun`:  openai_compat -> the mock's /v1/chat/completions (the tunnel)
- `oll`:  ollama        -> the mock's /api/chat (normalized, over HTTP)
- `mock`: the in-process mock (normalized, no upstream)

Each (model, mode) runs `iop-loadtest --concurrency 64 --requests 20000`,
interleaved, ROUNDS times, with the CPU seconds (user + system) each
process used during the run. Prints a markdown table for
loadtest/README.md.

Usage: loadtest/relay_paths.py [BIN_DIR (default target/release)] [ROUNDS (default 2)]
                               [MODELS (default tun,oll,mock)] [GATEWAY_BIN_DIR (default BIN_DIR)]

GATEWAY_BIN_DIR runs another build's iop-edge and iop-node against the same
mock and load generator (an A/B; an older build may know fewer kinds, so
MODELS then names only those it has).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
MODELS = (sys.argv[3] if len(sys.argv) > 3 else "tun,oll,mock").split(",")
GATEWAY = sys.argv[4] if len(sys.argv) > 4 else BIN
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(args, ready):
    """Starts a process; returns it and the first stdout/stderr line matching `ready`."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    for line in p.stdout:
        m = re.search(ready, line)
        if m:
            # Keep reading its output so a full pipe never stalls it.
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return p, m
        if time.time() > deadline:
            break
    raise SystemExit("%s did not come up" % args[0])


def main():
    tmp = tempfile.mkdtemp(prefix="iop-paths-")
    mock, m = start([BIN + "/iop-mockprov", "--listen", "127.0.0.1:0", "--tokens", "32", "--no-record"],
                    r"listening on (\S+)")
    upstream = m.group(1)
    edge_cfg = os.path.join(tmp, "edge.toml")
    providers = {
        "tun": f'kind = "openai_compat"\nbase_url = "http://{upstream}/v1"\ncapacity = 64\n',
        "oll": f'kind = "ollama"\nbase_url = "http://{upstream}"\ncapacity = 64\n',
        "mock": 'kind = "mock"\ncapacity = 64\n[nodes.providers.mock]\ntokens = 32\n',
    }
    text = '[http]\nlisten = "127.0.0.1:0"\n[node_listener]\nlisten = "127.0.0.1:0"\n'
    text += '[[nodes]]\nid = "n1"\ntoken = "paths-token"\n'
    for m in MODELS:
        text += f'[[nodes.providers]]\nid = "{m}"\n' + providers[m]
    for m in MODELS:
        upstream_model = '' if m == "mock" else 'upstream_model = "mock"\n'
        text += f'[[models]]\nname = "{m}"\nprovider = "{m}"\n' + upstream_model
    with open(edge_cfg, "w") as f:
        f.write(text)
    edge, m = start([GATEWAY + "/iop-edge", "--config", edge_cfg], r"ready http=(\S+) nodes=(\S+)")
    http, nodes = m.group(1), m.group(2)
    node_cfg = os.path.join(tmp, "node.toml")
    with open(node_cfg, "w") as f:
        f.write(f'edge = "{nodes}"\ntoken = "paths-token"\n')
    node = subprocess.Popen([GATEWAY + "/iop-node", "--config", node_cfg], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    body = json.dumps({"model": MODELS[0], "messages": [{"role": "user", "content": "x"}]}).encode()
    for _ in range(200):
        try:
            req = urllib.request.Request("http://%s/v1/chat/completions" % http, body,
                                         {"content-type": "application/json"})
            if urllib.request.urlopen(req, timeout=2).status == 200:
                break
        except Exception:
            time.sleep(0.05)
    procs = {"edge": edge.pid, "node": node.pid, "mockprov": mock.pid}
    rows = {}
    try:
        for _ in range(ROUNDS):
            for mode in ["--stream", "--no-stream"]:
                for model in MODELS:
                    before = {k: cpu_seconds(p) for k, p in procs.items()}
                    out = subprocess.run([BIN + "/iop-loadtest", "--url", "http://" + http, "--model", model,
                                          "--concurrency", "64", "--requests", "20000", "--duration-sec", "60",
                                          mode, "--json"], capture_output=True, text=True, check=True).stdout
                    cpu = {k: cpu_seconds(p) - before[k] for k, p in procs.items()}
                    r = json.loads(out)
                    assert r["errors"]["total"] == 0 and r["completed"] == 20000, r["errors"]
                    rows.setdefault((mode, model), []).append((r, cpu))
    finally:
        for p in (node, edge, mock):
            p.kill()
    names = {"tun": "tunnel (`openai_compat` → mock `/v1`)", "oll": "normalized (`ollama` → mock `/api/chat`)",
             "mock": "normalized (in-process `mock`)"}
    print("| Mode | Path | req/s | total p50 / p99 (ms) | edge CPU s | node CPU s | mockprov CPU s |")
    print("|---|---|---|---|---|---|---|")
    for (mode, model), runs in rows.items():
        rps = ", ".join("{:,}".format(round(r["requests_per_sec"])).replace(",", " ") for r, _ in runs)
        lat = ", ".join("%.1f / %.1f" % (r["latency_us"]["total"]["p50"] / 1000, r["latency_us"]["total"]["p99"] / 1000)
                        for r, _ in runs)
        cpu = lambda k: ", ".join("%.2f" % c[k] for _, c in runs)
        print(f"| `{mode}` | {names[model]} | {rps} | {lat} | {cpu('edge')} | {cpu('node')} | {cpu('mockprov')} |")


main()
