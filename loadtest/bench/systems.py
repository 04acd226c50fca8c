"""The systems under test, each started fresh for one run and stopped after it.

- direct:          the load generator against iop-mockprov
- nginx1:          nginx -> mock
- nginx2:          nginx -> nginx -> mock (two instances: the hop-count twin of edge + node)
- haproxy1:        HAProxy -> mock (HTTP mode, keep-alive both sides, http-reuse always,
                   option http-no-delay, one thread per core, no logging)
- haproxy2:        HAProxy -> HAProxy -> mock
- iop-tunnel:      iop-edge + iop-node (two processes), provider openai_compat -> the mock's /v1
                   (the Messages and Responses APIs too: native, tunnelled)
- iop-normalized:  iop-edge + iop-node, provider ollama -> the mock's /api/chat
                   (the Messages and Responses APIs translated onto it)
- iop-mock:        iop-edge + iop-node, the node's in-process mock provider (no upstream; extra row)
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import procs
from procs import Proc, children, free_port, wait_http

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMS = ["direct", "nginx1", "nginx2", "haproxy1", "haproxy2", "iop-tunnel", "iop-normalized", "iop-mock",
           "iop-tunnel-nostore", "iop-normalized-nostore", "iop-affinity", "iop-affinity-off"]
PROXIES = {"nginx1", "nginx2", "haproxy1", "haproxy2"}
# Scenario A1's: edge + node with three tunnel targets, each its own mock
# modelling a prefix cache; cache affinity on (the default) and off.
AFFINITY_SYSTEMS = ["iop-affinity", "iop-affinity-off"]
DEFAULT_SYSTEMS = ["direct", "nginx1", "nginx2", "haproxy1", "haproxy2", "iop-tunnel", "iop-normalized"]
# The node's run store is on in every iop system (its file in the run's
# directory); `-nostore` runs the same system with `store = false`, for the
# store's cost (issue 27: within 3%).
NOSTORE = "-nostore"
TOKEN = "bench-node-token"
ADMIN_TOKEN = "bench-admin-token"
# Every process logs warnings only: logging is not what is measured.
QUIET = {"IOP_LOG": "warn"}


class Ctx:
    """What every start needs: binaries, nginx, HAProxy, and where logs go."""

    def __init__(self, bin_dir, nginx, node_workers, fd_limit=65536, haproxy=None):
        self.bin_dir = bin_dir
        self.nginx = nginx
        self.haproxy = haproxy
        self.node_workers = node_workers
        # nginx workers raise their own limit to this (an unprivileged nginx
        # cannot go past the hard limit it inherits).
        self.fd_limit = fd_limit
        self.log_dir = None

    def bin(self, name):
        return os.path.join(self.bin_dir, name)


class Running:
    """One started system: the URL to load, its processes by group, the
    upstream mock (if any), and how it was started."""

    def __init__(self, name, workers, run_dir):
        self.name = name
        self.workers = workers
        self.url = None
        self.groups = {}
        self.mock = None
        self.mock_addr = None
        # Every upstream mock's address (A1 has one per target).
        self.mocks = []
        self.admin = None
        self.procs = []
        self.configs = {}
        self.driver = None
        self.notes = []
        # Configs and nginx prefixes stay beside the logs, so every recorded
        # command can be run again as it is.
        self.dir = run_dir
        # The node's metrics, when its run store is on.
        self.node_metrics = None
        os.makedirs(self.dir, exist_ok=True)
        os.chmod(self.dir, 0o755)

    def add(self, proc):
        self.procs.append(proc)
        return proc

    def commands(self):
        return [p.command() for p in self.procs]

    def system_pids(self):
        return [pid for pids in self.groups.values() for pid in pids]

    def all_pids(self):
        pids = set(self.system_pids())
        pids.update(p.pid for p in self.procs)
        return pids

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


def start(name, ctx, scen, workers):
    """Starts system `name` for scenario parameters `scen` (tokens,
    interval_ms) with `workers` workers per process; the caller stops it."""
    run = Running(name, workers, ctx.log_dir)
    try:
        if name in AFFINITY_SYSTEMS:
            start_affinity(run, ctx, name, scen, workers)
            return run
        if name != "iop-mock":
            shape = ["--burst", scen.get("burst", 1), "--token-bytes", scen.get("token_bytes", 0)]
            run.mock = run.add(Proc("mockprov", [ctx.bin("iop-mockprov"), "--listen", "127.0.0.1:0", "--tokens",
                                                 scen["tokens"], "--token-interval-ms", scen["interval_ms"], "--no-record"]
                                    + shape, ctx.log_dir, env=QUIET, ready=r"listening on (\S+)"))
            run.mock_addr = run.mock.match.group(1)
        if name == "direct":
            run.url = "http://" + run.mock_addr
            run.groups = {"mock": [run.mock.pid]}
        elif name in ("nginx1", "nginx2"):
            if not ctx.nginx:
                raise RuntimeError("nginx is not installed")
            back = start_nginx(run, ctx, "nginx-back" if name == "nginx2" else "nginx", run.mock_addr, workers)
            if name == "nginx2":
                front = start_nginx(run, ctx, "nginx-front", back, workers)
                run.url = "http://" + front
            else:
                run.url = "http://" + back
            wait_http("GET", run.url + "/healthz", what=name)
            for group, pids in run.groups.items():
                run.groups[group] = pids + children(pids[0])
        elif name in ("haproxy1", "haproxy2"):
            if not ctx.haproxy:
                raise RuntimeError("haproxy is not installed")
            back = start_haproxy(run, ctx, "haproxy-back" if name == "haproxy2" else "haproxy", run.mock_addr, workers)
            run.url = "http://" + (start_haproxy(run, ctx, "haproxy-front", back, workers) if name == "haproxy2" else back)
            wait_http("GET", run.url + "/healthz", what=name)
        elif name.startswith("iop-"):
            start_iop(run, ctx, name, scen, workers)
        else:
            raise RuntimeError("unknown system %r" % name)
    except BaseException:
        run.stop()
        raise
    return run


def start_nginx(run, ctx, group, upstream, workers):
    """One nginx instance proxying to `upstream`; returns its listen address."""
    prefix = os.path.join(run.dir, group)
    os.makedirs(prefix, exist_ok=True)
    os.chmod(prefix, 0o755)  # nginx workers may run as another user

    def conf(listen):
        return fill("nginx.conf.in", workers=workers, prefix=prefix, upstream=upstream, listen=listen,
                    nofile=min(ctx.fd_limit, 65536))

    def command(path):
        return [ctx.nginx, "-p", prefix, "-c", path, "-e", os.path.join(prefix, "error.log"), "-g", "daemon off;"]

    return start_proxy(run, ctx, group, "nginx.conf", conf, command, os.path.join(prefix, "error.log"))


def start_haproxy(run, ctx, group, upstream, workers):
    """One HAProxy instance (one process, `workers` threads) proxying to
    `upstream`; returns its listen address."""
    prefix = os.path.join(run.dir, group)
    os.makedirs(prefix, exist_ok=True)
    # Two descriptors a connection, within the limit it inherits.
    maxconn = max(1024, (min(ctx.fd_limit, 65536) - 256) // 2)

    def conf(listen):
        return fill("haproxy.cfg.in", workers=workers, prefix=prefix, upstream=upstream, listen=listen, maxconn=maxconn)

    # -db: in the foreground, its warnings on stderr (the log).
    return start_proxy(run, ctx, group, "haproxy.cfg", conf, lambda path: [ctx.haproxy, "-f", path, "-db"], None)


def fill(template, **fields):
    with open(os.path.join(HERE, template)) as f:
        return f.read().format(**fields)


def start_proxy(run, ctx, group, name, conf, command, error_log):
    """Starts a proxy of `group` on a free port (three tries: another
    process may take the port first): `conf(listen)` is its config, written
    as `name` in the group's directory, `command(path)` how to start it."""
    prefix = os.path.join(run.dir, group)
    last = None
    for _ in range(3):
        listen = "127.0.0.1:%d" % free_port()
        text = conf(listen)
        path = os.path.join(prefix, name)
        with open(path, "w") as f:
            f.write(text)
        proc = Proc(group, command(path), ctx.log_dir)
        host, port = listen.rsplit(":", 1)
        if wait_port(proc, host, int(port)):
            run.add(proc)
            run.configs[group + os.path.splitext(name)[1]] = text
            run.groups[group] = [proc.pid]
            return listen
        last = open(error_log).read()[-500:] if error_log and os.path.exists(error_log) else "see " + str(ctx.log_dir)
        proc.stop()
    raise RuntimeError("%s did not start: %s" % (group, last))


def wait_port(proc, host, port, timeout=10):
    """Until `proc` accepts TCP connections on host:port (False if it exited)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not proc.alive():
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def edge_config(name, mock_addr, scen, workers):
    name = name.removesuffix(NOSTORE)
    provider = {
        "iop-tunnel": 'kind = "openai_compat"\nbase_url = "http://%s/v1"\nnative_apis = ["responses", "messages"]\n'
                      % mock_addr,
        "iop-normalized": 'kind = "ollama"\nbase_url = "http://%s"\n' % mock_addr,
        "iop-mock": 'kind = "mock"\n',
    }[name]
    text = 'workers = %d\nshutdown_grace_sec = 0\nadmin_token = "%s"\n' % (workers, ADMIN_TOKEN)
    # nginx runs with `access_log off`: so does iop, for a like-for-like hop.
    text += '[http]\nlisten = "127.0.0.1:0"\nmax_body_bytes = 1048576\naccess_log = false\n'
    text += '[node_listener]\nlisten = "127.0.0.1:0"\n'
    text += '[[nodes]]\nid = "bench-node"\ntoken = "%s"\n' % TOKEN
    text += '[[nodes.providers]]\nid = "p"\n' + provider + "capacity = 4096\n"
    if name == "iop-mock":
        text += "[nodes.providers.mock]\ntokens = %d\ntoken_interval_ms = %d\n" % (scen["tokens"], scen["interval_ms"])
    text += '[[models]]\nname = "mock"\nprovider = "p"\nmax_waiters = 4096\n'
    if name != "iop-mock":
        text += 'upstream_model = "mock"\n'
    return text


def node_config(edge_nodes, workers, with_workers, store_path=None):
    """`store_path`: the run store's file (None: `store = false`)."""
    text = 'edge = "%s"\ntoken = "%s"\nshutdown_grace_sec = 0\n' % (edge_nodes, TOKEN)
    if with_workers:
        text = "workers = %d\n" % workers + text
    if store_path is None:
        text += "store = false\n"
    else:
        # Its metrics say how many rows the store wrote and dropped.
        text += 'metrics_listen = "127.0.0.1:0"\n'
    text += "[reconnect]\nmax_attempts = 30\ninterval_sec = 1\n"
    if store_path is not None:
        text += '[store]\npath = "%s"\n' % store_path
    return text


def start_iop(run, ctx, name, scen, workers):
    store = None if name.endswith(NOSTORE) else os.path.join(run.dir, "iop.db")
    if store is not None:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(store + suffix):
                os.remove(store + suffix)
    start_edge_and_node(run, ctx, name, edge_config(name, run.mock_addr, scen, workers), workers, store)
    if not ctx.node_workers:
        run.notes.append("iop-node has no `workers` key: it ran with its default")


def start_edge_and_node(run, ctx, name, edge_text, workers, store):
    """An edge on `edge_text` and a node linked to it (its run store at
    `store`, none: off); returns when a request gets through."""
    edge_cfg = os.path.join(run.dir, "edge.toml")
    with open(edge_cfg, "w") as f:
        f.write(edge_text)
    run.configs["edge.toml"] = edge_text
    edge = run.add(Proc("edge", [ctx.bin("iop-edge"), "--config", edge_cfg], ctx.log_dir, env=QUIET,
                        ready=r"ready http=(\S+) nodes=(\S+) driver=(\S+)"))
    http_addr, nodes_addr, run.driver = edge.match.group(1), edge.match.group(2), edge.match.group(3)
    node_cfg = os.path.join(run.dir, "node.toml")
    text = node_config(nodes_addr, workers, ctx.node_workers, store)
    with open(node_cfg, "w") as f:
        f.write(text)
    run.configs["node.toml"] = text
    ready = r"iop-node metrics http=(\S+)" if store is not None else None
    node = run.add(Proc("node", [ctx.bin("iop-node"), "--config", node_cfg], ctx.log_dir, env=QUIET, ready=ready))
    if store is not None:
        run.node_metrics = "http://%s/metrics" % node.match.group(1)
    run.url = "http://" + http_addr
    probe = {"model": "mock", "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
    wait_http("POST", run.url + "/v1/chat/completions", probe, what=name)
    run.groups = {"edge": [edge.pid], "node": [node.pid]}
    run.admin = run.url + "/admin/v1/nodes"


def start_affinity(run, ctx, name, scen, workers):
    """Three mocks that model a prefix cache, one node with a provider on
    each, one model over the three; affinity off for `-off`."""
    for i in range(scen["targets"]):
        mock = run.add(Proc("mockprov%d" % i, [ctx.bin("iop-mockprov"), "--listen", "127.0.0.1:0", "--tokens",
                                               scen["tokens"], "--token-interval-ms", scen["interval_ms"], "--no-record",
                                               "--prefix-cache-ttft-ms", scen["hit_ms"], "--prefix-miss-ttft-ms",
                                               scen["miss_ms"], "--prefix-cache-entries", scen["entries"]],
                            ctx.log_dir, env=QUIET, ready=r"listening on (\S+)"))
        run.mocks.append(mock.match.group(1))
    text = 'workers = %d\nshutdown_grace_sec = 0\nadmin_token = "%s"\n' % (workers, ADMIN_TOKEN)
    text += '[http]\nlisten = "127.0.0.1:0"\nmax_body_bytes = 1048576\naccess_log = false\n'
    text += '[node_listener]\nlisten = "127.0.0.1:0"\n'
    text += '[[nodes]]\nid = "bench-node"\ntoken = "%s"\n' % TOKEN
    for i, addr in enumerate(run.mocks):
        text += '[[nodes.providers]]\nid = "p%d"\nkind = "openai_compat"\nbase_url = "http://%s/v1"\ncapacity = %d\n' % (
            i, addr, scen["capacity"])
    text += '[[models]]\nname = "mock"\nmax_waiters = 4096\n'
    for i in range(len(run.mocks)):
        text += '[[models.targets]]\nnode = "bench-node"\nprovider = "p%d"\nmodel = "mock"\n' % i
    if name.endswith("-off"):
        text += "[affinity]\nenabled = false\n"
    start_edge_and_node(run, ctx, name, text, workers, None)


def node_workers_supported(ctx):
    """Whether this iop-node accepts a top-level `workers` key (being added on main)."""
    tmp = tempfile.mkdtemp(prefix="iop-bench-probe-")
    try:
        path = os.path.join(tmp, "node.toml")
        with open(path, "w") as f:
            f.write(node_config("127.0.0.1:1", 1, True))
        r = subprocess.run([ctx.bin("iop-node"), "--check-config", "--config", path], capture_output=True, text=True)
        return r.returncode == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def store_rows(run):
    """The node's run store counters ({"written": n, "dropped": n, ...}), read
    from its metrics before it stops, and the CPU seconds its writer thread
    used since the node started ("thread_cpu_sec"); None when the store is
    off."""
    if not run.node_metrics:
        return None
    with urllib.request.urlopen(run.node_metrics, timeout=5) as r:
        text = r.read().decode()
    rows = {}
    for m in re.finditer(r'^iop_node_run_store_rows_total\{result="(\w+)"\} (\d+)', text, re.M):
        rows[m.group(1)] = int(m.group(2))
    rows["thread_cpu_sec"] = sum(procs.thread_cpu_seconds(pid, "iop-node-store") for pid in run.groups["node"])
    return rows
