#!/usr/bin/env python3
"""Soak test: edge + node + iop-mockprov under steady mixed load for a long
time, with node restarts and edge config reloads, watching the memory and
descriptors of the edge and the node for growth.

Setup (every file in --out): one iop-mockprov (--tokens 32 at 5 ms a token,
--no-record), one iop-edge with two models, `tun` (provider `openai_compat`
-> the mock's /v1: the tunnel path, Messages API native) and `oll` (provider
`ollama` -> the mock's /api/chat: the normalized path), and one iop-node
(its run store in --out, kept across its restarts).
Readiness comes from events, not sleeps: the edge's ready line, the node's
`node_ready` and the reload's `config_reloaded` on the edge's admin event
stream.

Load (Python client threads, one keep-alive connection each): --streams
threads of streamed requests and --plain threads of whole ones, each pausing
0-100 ms between requests; chat completions (4 in 5) or Anthropic Messages
(1 in 5), either model, max_tokens 4-32, and every answer's text checked
token by token. About 15 % of the streams are cut by the client (FIN or RST,
after 0 to a few events) and 5 % of the whole requests abandoned before the
answer.

Chaos: every --restart-every (default duration / 10) until --restarts-until
(default 60 % of the run) the node is stopped, SIGTERM and SIGKILL in turn,
and started again; the last incarnation then runs the rest of the run alone,
so its own growth can be judged. Half-way between restarts, the edge gets
SIGHUP after its config changed a harmless value (the tunnel provider's
capacity, 64 <-> 48, which also sends the node a ConfigRefresh).

Verdict (exit 0 = pass, 1 = fail):
  - no request error outside a restart window (from the signal until 3 s
    after the new node is ready; errors inside are counted, not failed);
  - every restart: the node exits (0 after SIGTERM) and the new one is ready
    within 60 s; every reload is confirmed by a `config_reloaded` event;
  - after the load: no lease, waiter, run, stream or tunnel left in the
    edge's admin API and the node's transport status;
  - edge, over the whole run: after the warm-up (10 % of the run, at least
    20 s) the median VmRSS of the last window (10 % of the run) is at most
    max(+RSS_PCT %, +RSS_MIB MiB) above that of the first window after the
    warm-up (defaults +20 %, +16 MiB), and the median count of open
    descriptors at most +FD_SLACK (default 8) above it;
  - node, its last (long) incarnation: the same bounds between the second
    quarter of its life (the first is its warm-up) and the last quarter;
  - node, across incarnations: the peak VmRSS and descriptors of the last
    short incarnation within the same bounds of the first short one that
    started after the warm-up.
VmRSS from /proc/PID/status, descriptors = entries of /proc/PID/fd, every
--sample-sec (default: duration / 600, 1 s to 5 s).

Output in --out: samples.csv (t_s, process, incarnation, pid, rss_kib, fds,
threads), events.csv (restarts, reloads), result.json, soak.svg (RSS and
descriptors over time, restarts and reloads marked), the configs and one log
per process.

Usage:
  python3 loadtest/soak.py [--duration 30m] [--profile release|debug | --bin-dir DIR] [--out DIR] [--seed N]
"""

import argparse
import csv
import http.client
import json
import os
import random
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "bench"))
from procs import Proc, alive, builds_running, loadavg, machine, rss_kib, wait_exit  # noqa: E402

NODE_TOKEN = "soak-node-token"
ADMIN_TOKEN = "soak-admin-token"
TOKENS = 32
TOKEN_INTERVAL_MS = 5
# After a restarted node is ready, errors of requests that started before are
# still expected for this long (queued requests draining onto it).
RESTART_MARGIN_S = 3.0
NODE_GRACE_S = 5
MODELS = ("tun", "oll")


# ---------------------------------------------------------------- options


def parse_duration(text):
    """'30m', '90s', '1h', '1h30m' or plain seconds -> seconds."""
    text = text.strip().lower()
    if text.replace(".", "", 1).isdigit():
        return float(text)
    total, num = 0.0, ""
    for ch in text:
        if ch.isdigit() or ch == ".":
            num += ch
        elif ch in "hms" and num:
            total += float(num) * {"h": 3600, "m": 60, "s": 1}[ch]
            num = ""
        else:
            raise argparse.ArgumentTypeError("bad duration %r (e.g. 30m, 90s, 1h)" % text)
    if num:
        raise argparse.ArgumentTypeError("bad duration %r: a number without a unit at the end" % text)
    return total


def options(argv):
    doc = __doc__.split("Usage:")[0]
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=parse_duration, default=1800.0, help="run time (default 30m)")
    p.add_argument("--profile", choices=["release", "debug"], default="release",
                   help="binaries from $CARGO_TARGET_DIR (else target/) /<profile>")
    p.add_argument("--bin-dir", help="binaries from this directory instead")
    p.add_argument("--out", help="output directory (default: a new one under /tmp)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the load (default 1)")
    p.add_argument("--streams", type=int, default=8, help="threads sending streamed requests (default 8)")
    p.add_argument("--plain", type=int, default=2, help="threads sending whole requests (default 2)")
    p.add_argument("--restart-every", type=parse_duration, help="node restart period (default duration / 10)")
    p.add_argument("--restarts-until", type=float, default=0.6,
                   help="no restart after this fraction of the run (default 0.6)")
    p.add_argument("--sample-sec", type=float, help="sampling period (default duration / 600, 1-5 s)")
    p.add_argument("--rss-pct", type=float, default=20.0, help="RSS growth bound, percent (default 20)")
    p.add_argument("--rss-mib", type=float, default=16.0, help="RSS growth bound, MiB (default 16; the larger wins)")
    p.add_argument("--fd-slack", type=int, default=8, help="descriptor growth bound (default 8)")
    a = p.parse_args(argv)
    if a.duration < 30:
        p.error("--duration must be at least 30 s")
    if a.streams < 1 or a.plain < 0:
        p.error("--streams must be at least 1 and --plain at least 0")
    if a.restart_every is None:
        a.restart_every = a.duration / 10
    if a.sample_sec is None:
        a.sample_sec = min(5.0, max(1.0, a.duration / 600))
    if a.bin_dir is None:
        root = os.path.dirname(HERE)
        a.bin_dir = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target"), a.profile)
    for b in ("iop-edge", "iop-node", "iop-mockprov"):
        if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
            p.error("%s not found in %s (cargo build %s-p iop-edge -p iop-node -p iop-loadtest --bins)"
                    % (b, a.bin_dir, "--release " if a.profile == "release" else ""))
    a.out = a.out or tempfile.mkdtemp(prefix="iop-soak-")
    os.makedirs(a.out, exist_ok=True)
    return a


# ---------------------------------------------------------------- processes


def edge_config(mock_addr, capacity):
    return f"""admin_token = "{ADMIN_TOKEN}"
shutdown_grace_sec = 0
[http]
listen = "127.0.0.1:0"
access_log = false
[node_listener]
listen = "127.0.0.1:0"
[[nodes]]
id = "soak-node"
token = "{NODE_TOKEN}"
[[nodes.providers]]
id = "tun"
kind = "openai_compat"
base_url = "http://{mock_addr}/v1"
native_apis = ["messages"]
capacity = {capacity}
[[nodes.providers]]
id = "oll"
kind = "ollama"
base_url = "http://{mock_addr}"
capacity = 64
[[models]]
name = "tun"
provider = "tun"
upstream_model = "mock"
max_waiters = 1024
[[models]]
name = "oll"
provider = "oll"
upstream_model = "mock"
max_waiters = 1024
"""


def node_config(edge_nodes, store):
    # The run store in --out (its default is iop.db in the working directory),
    # kept across restarts as a deployed node's would be.
    return (f'edge = "{edge_nodes}"\ntoken = "{NODE_TOKEN}"\nshutdown_grace_sec = {NODE_GRACE_S}\n'
            f"[store]\npath = {json.dumps(store)}\n[reconnect]\nmax_attempts = 0\ninterval_sec = 1\n")


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def threads(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Events:
    """The edge's /admin/v1/events, read by a thread: every event but
    run_terminal kept (those counted by outcome), waitable."""

    def __init__(self, host, port):
        self.cond = threading.Condition()
        self.events = []
        self.terminal = {}
        self.lagged = 0
        self.closed = None
        self.conn = http.client.HTTPConnection(host, port, timeout=None)
        self.conn.request("GET", "/admin/v1/events", headers={"authorization": "Bearer " + ADMIN_TOKEN})
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            raise RuntimeError("admin events answered %d" % self.resp.status)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                ev = json.loads(line[6:])
                with self.cond:
                    if ev.get("type") == "run_terminal":
                        key = ev.get("outcome") or "?"
                        self.terminal[key] = self.terminal.get(key, 0) + 1
                    else:
                        if ev.get("type") == "lagged":
                            self.lagged += ev.get("dropped", 0)
                        ev["_t"] = time.monotonic()
                        self.events.append(ev)
                    self.cond.notify_all()
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.closed = repr(e)
        with self.cond:
            self.closed = self.closed or "end of stream"
            self.cond.notify_all()

    def mark(self):
        with self.cond:
            return len(self.events)

    def wait(self, since, pred, timeout):
        """The first event after index `since` matching `pred`; None on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for ev in self.events[since:]:
                    if pred(ev):
                        return ev
                since = len(self.events)
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self.cond.wait(left)

    def close(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.conn.close()


def admin_get(host, port, path):
    conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        conn.request("GET", path, headers={"authorization": "Bearer " + ADMIN_TOKEN})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# ---------------------------------------------------------------- load


def expected_text(n):
    return "".join("tok%d " % i for i in range(n))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []  # (t0, t1, what, detail)

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def error(self, t0, what, detail):
        with self.lock:
            self.errors.append((t0, time.monotonic(), what, detail[:300]))


class Client(threading.Thread):
    """One keep-alive connection sending requests one after another."""

    def __init__(self, host, port, stream, rng, stats, stop):
        super().__init__(daemon=True)
        self.host, self.port, self.stream = host, port, stream
        self.rng, self.stats, self.stop = rng, stats, stop
        self.conn = None

    def run(self):
        while not self.stop.is_set():
            self.one()
            self.stop.wait(self.rng.uniform(0, 0.1))
        self.drop(False)

    def drop(self, rst):
        if self.conn is None:
            return
        if rst and self.conn.sock is not None:
            try:
                self.conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        elif self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()
        self.conn = None

    def one(self):
        rng = self.rng
        model = rng.choice(MODELS)
        api = "messages" if rng.random() < 0.2 else "chat"
        n = rng.randint(4, TOKENS)
        what = "%s %s %s" % (model, api, "stream" if self.stream else "whole")
        msgs = [{"role": "user", "content": "soak %d" % rng.randint(0, 1 << 30)}]
        body = {"model": model, "messages": msgs, "max_tokens": n, "stream": self.stream}
        path = "/v1/messages" if api == "messages" else "/v1/chat/completions"
        # Streams cut after `cut` events (0: right after the head); whole
        # requests abandoned before their answer.
        cut = None
        if self.stream and rng.random() < 0.15:
            cut = rng.randint(0, 6)
        elif not self.stream and rng.random() < 0.05:
            cut = -1
        t0 = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
            if cut == -1:
                time.sleep(rng.uniform(0, 0.05))
                self.drop(rng.random() < 0.5)
                self.stats.count("cut whole")
                return
            r = self.conn.getresponse()
            if r.status != 200:
                detail = r.read()[:200].decode("utf-8", "replace")
                self.drop(False)
                self.stats.error(t0, what, "status %d %s" % (r.status, detail))
                return
            if self.stream:
                text, done = self.read_stream(r, api, cut)
                if cut is not None and not done:
                    self.drop(rng.random() < 0.5)
                    self.stats.count("cut stream")
                    return
            else:
                text, done = self.read_whole(r, api), True
            if not done:
                self.drop(False)
                self.stats.error(t0, what, "stream ended without its terminal event")
                return
            if text != expected_text(n):
                self.drop(False)
                self.stats.error(t0, what, "text %r, not tok0..tok%d" % (text[:80], n - 1))
                return
            if r.will_close:
                self.drop(False)
            self.stats.count("ok " + what)
        except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as e:
            self.drop(False)
            self.stats.error(t0, what, repr(e))

    def read_stream(self, r, api, cut):
        text, events = [], 0
        while True:
            if cut is not None and events >= cut:
                return "".join(text), False
            line = r.readline()
            if not line:
                return "".join(text), False
            if not line.startswith(b"data:"):
                continue
            events += 1
            data = line[5:].strip()
            if api == "chat":
                if data == b"[DONE]":
                    r.read()
                    return "".join(text), True
                for c in json.loads(data).get("choices", []):
                    text.append((c.get("delta") or {}).get("content") or "")
            else:
                ev = json.loads(data)
                if ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                    text.append(ev["delta"]["text"])
                elif ev.get("type") == "message_stop":
                    r.read()
                    return "".join(text), True
                elif ev.get("type") == "error":
                    raise ValueError("error event %s" % data[:200])

    @staticmethod
    def read_whole(r, api):
        doc = json.loads(r.read())
        if api == "chat":
            return doc["choices"][0]["message"]["content"]
        return "".join(b["text"] for b in doc["content"] if b.get("type") == "text")


# ---------------------------------------------------------------- sampling


class Sampler(threading.Thread):
    def __init__(self, period, t_start, procs, stop):
        super().__init__(daemon=True)
        self.period, self.t_start, self.procs, self.stop = period, t_start, procs, stop
        self.rows = []  # (t, process, incarnation, pid, rss_kib, fds, threads)

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic() - self.t_start
            for name, (inc, pid) in list(self.procs.items()):
                rss, fds, thr = rss_kib(pid), fd_count(pid), threads(pid)
                if rss is not None and fds is not None and alive(pid):
                    self.rows.append((round(t, 2), name, inc, pid, rss, fds, thr))
            self.stop.wait(self.period)


# ---------------------------------------------------------------- verdict


def bound(first, rss_pct, rss_mib):
    return first + max(first * rss_pct / 100, rss_mib * 1024)


def growth_check(label, rows, warm_end, win, end, a):
    """Medians of the first window after warm_end and of the last window
    before end; a list of failures and the numbers."""
    first = [r for r in rows if warm_end <= r[0] < warm_end + win]
    last = [r for r in rows if end - win <= r[0] <= end]
    if len(first) < 3 or len(last) < 3:
        return ["%s: too few samples (%d in the first window, %d in the last)" % (label, len(first), len(last))], {}
    f_rss, l_rss = statistics.median(r[4] for r in first), statistics.median(r[4] for r in last)
    f_fd, l_fd = statistics.median(r[5] for r in first), statistics.median(r[5] for r in last)
    lim = bound(f_rss, a.rss_pct, a.rss_mib)
    windows = [[round(warm_end, 1), round(warm_end + win, 1)], [round(end - win, 1), round(end, 1)]]
    info = {"what": label, "windows_s": windows,
            "rss_mib": [round(f_rss / 1024, 1), round(l_rss / 1024, 1)], "rss_limit_mib": round(lim / 1024, 1),
            "fds": [f_fd, l_fd], "fd_limit": f_fd + a.fd_slack}
    fails = []
    if l_rss > lim:
        fails.append("%s: RSS median %.1f MiB in the last window > %.1f MiB (first window %.1f MiB)"
                     % (label, l_rss / 1024, lim / 1024, f_rss / 1024))
    if l_fd > f_fd + a.fd_slack:
        fails.append("%s: %g descriptors (median) in the last window > %g + %d" % (label, l_fd, f_fd, a.fd_slack))
    return fails, info


def peak_check(label, first_rows, last_rows, a):
    f_rss, l_rss = max(r[4] for r in first_rows), max(r[4] for r in last_rows)
    f_fd, l_fd = max(r[5] for r in first_rows), max(r[5] for r in last_rows)
    lim = bound(f_rss, a.rss_pct, a.rss_mib)
    info = {"what": label, "rss_mib": [round(f_rss / 1024, 1), round(l_rss / 1024, 1)],
            "rss_limit_mib": round(lim / 1024, 1), "fds": [f_fd, l_fd], "fd_limit": f_fd + a.fd_slack}
    fails = []
    if l_rss > lim:
        fails.append("%s: peak RSS %.1f MiB > %.1f MiB" % (label, l_rss / 1024, lim / 1024))
    if l_fd > f_fd + a.fd_slack:
        fails.append("%s: peak descriptors %d > %d + %d" % (label, l_fd, f_fd, a.fd_slack))
    return fails, info


# ---------------------------------------------------------------- plot


def svg_plot(path, rows, marks, duration, warm_end, win, title):
    """RSS (MiB) and open descriptors over time, edge and node (one line per
    incarnation); restarts as dashed lines (red: SIGKILL, grey: SIGTERM),
    reloads as green ticks, warm-up shaded, the compared windows tinted."""
    W, H, L, R, T = 900, 560, 70, 130, 40
    ph = 200
    panels = [("VmRSS (MiB)", 4, lambda v: v / 1024, T), ("open descriptors", 5, lambda v: v, T + ph + 60)]
    colors = {"edge": "#1f77b4", "node": "#ff7f0e"}
    pw = W - L - R
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="13">%s</text>' % (L, esc(title))]

    def x(t):
        return L + pw * min(max(t, 0), duration) / duration

    for label, col, conv, top in panels:
        vals = [conv(r[col]) for r in rows if r[1] in colors]
        vmax = max(vals) if vals else 1
        vmax = nice(vmax * 1.1)

        def y(v):
            return top + ph - ph * v / vmax

        out.append('<rect x="%g" y="%d" width="%g" height="%d" fill="#eee"/>' % (L, top, x(warm_end) - L, ph))
        for w0 in (warm_end, duration - win):
            out.append('<rect x="%g" y="%d" width="%g" height="%d" fill="#e6f0ff"/>'
                       % (x(w0), top, x(w0 + win) - x(w0), ph))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>' % (L, top, pw, ph))
        for i in range(5):
            v = vmax * i / 4
            out.append('<text x="%d" y="%g" text-anchor="end">%s</text>' % (L - 6, y(v) + 4, fmt(v)))
            out.append('<line x1="%d" x2="%d" y1="%g" y2="%g" stroke="#ddd"/>' % (L, L + pw, y(v), y(v)))
        out.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>'
                   % (top + ph // 2, top + ph // 2, label))
        for t, kind, _ in marks:
            if kind == "reload":
                out.append('<line x1="%g" x2="%g" y1="%d" y2="%d" stroke="green" stroke-width="2"/>'
                           % (x(t), x(t), top, top + 8))
            else:
                out.append('<line x1="%g" x2="%g" y1="%d" y2="%d" stroke="%s" stroke-dasharray="4 3"/>'
                           % (x(t), x(t), top, top + ph, "red" if kind == "SIGKILL" else "#777"))
        series = {}
        for r in rows:
            if r[1] in colors:
                series.setdefault((r[1], r[2]), []).append(r)
        for (name, _), rs in sorted(series.items()):
            pts = " ".join("%.1f,%.1f" % (x(r[0]), y(conv(r[col]))) for r in rs)
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (colors[name], pts))
        for i in range(6):
            t = duration * i / 5
            out.append('<text x="%g" y="%d" text-anchor="middle">%s</text>' % (x(t), top + ph + 14, fmt_t(t)))
    ly = T + 10
    for name, c in colors.items():
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (W - R + 12, W - R + 32, ly, ly, c))
        out.append('<text x="%d" y="%d">%s</text>' % (W - R + 36, ly + 4, "iop-" + name))
        ly += 18
    for text, style in (("node SIGTERM", 'stroke="#777" stroke-dasharray="4 3"'),
                        ("node SIGKILL", 'stroke="red" stroke-dasharray="4 3"'),
                        ("edge SIGHUP", 'stroke="green" stroke-width="2"')):
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" %s/>' % (W - R + 12, W - R + 32, ly, ly, style))
        out.append('<text x="%d" y="%d">%s</text>' % (W - R + 36, ly + 4, text))
        ly += 18
    for text, fill in (("warm-up", "#eee"), ("edge: compared", "#e6f0ff")):
        out.append('<rect x="%d" y="%d" width="20" height="10" fill="%s"/>' % (W - R + 12, ly - 5, fill))
        out.append('<text x="%d" y="%d">%s</text>' % (W - R + 36, ly + 4, text))
        ly += 18
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice(v):
    """The next of 1, 2, 2.5, 5 x 10^k at or above v."""
    if v <= 0:
        return 1
    k = 10 ** len(str(int(v))) / 10 if v >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if m * k >= v:
            return m * k
    return 10 * k


def fmt(v):
    return ("%d" % v) if v == int(v) else ("%.1f" % v)


def fmt_t(t):
    return "%d:%02d" % (t // 60, t % 60)


# ---------------------------------------------------------------- main


def main(argv):
    a = options(argv)
    rng = random.Random(a.seed)
    out = a.out
    b = lambda name: os.path.join(a.bin_dir, name)  # noqa: E731
    quiet = {"IOP_LOG": "warn"}
    fails, notes, marks = [], [], []
    procs, started = [], []
    stop_load, stop_sample = threading.Event(), threading.Event()
    print("soak: %s, binaries %s, output %s, seed %d" % (fmt_t(a.duration), a.bin_dir, out, a.seed), flush=True)

    mock = Proc("mockprov", [b("iop-mockprov"), "--listen", "127.0.0.1:0", "--tokens", TOKENS,
                             "--token-interval-ms", TOKEN_INTERVAL_MS, "--no-record"], out, env=quiet,
                ready=r"listening on (\S+)")
    procs.append(mock)
    edge = node = events = None
    clients = []
    try:
        mock_addr = mock.match.group(1)
        edge_cfg = os.path.join(out, "edge.toml")
        capacity = 64
        with open(edge_cfg, "w") as f:
            f.write(edge_config(mock_addr, capacity))
        edge = Proc("edge", [b("iop-edge"), "--config", edge_cfg], out, env=quiet,
                    ready=r"ready http=(\S+) nodes=(\S+)")
        procs.append(edge)
        host, port = edge.match.group(1).rsplit(":", 1)
        port = int(port)
        node_cfg = os.path.join(out, "node.toml")
        with open(node_cfg, "w") as f:
            f.write(node_config(edge.match.group(2), os.path.join(out, "node-runs.db")))
        events = Events(host, port)

        def start_node(inc, since):
            p = Proc("node-%d" % inc, [b("iop-node"), "--config", node_cfg], out, env=quiet)
            ev = events.wait(since, lambda e: e["type"] == "node_ready", 60)
            if ev is None:
                p.stop()
                raise RuntimeError("node incarnation %d not ready within 60 s (log %s)" % (inc, p.log_path))
            return p, ev

        node, _ = start_node(1, events.mark())
        beside = {"loadavg_start": loadavg(), "builds_start": builds_running()}
        t_start = time.monotonic()
        watched = {"edge": (0, edge.pid), "node": (1, node.pid), "mockprov": (0, mock.pid)}
        sampler = Sampler(a.sample_sec, t_start, watched, stop_sample)
        sampler.start()
        stats = Stats()
        for i in range(a.streams + a.plain):
            c = Client(host, port, i < a.streams, random.Random(rng.random()), stats, stop_load)
            clients.append(c)
            c.start()

        # The schedule: restarts at k * R up to restarts_until, reloads half-way between.
        R = a.restart_every
        plan = []
        k = 1
        while k * R <= a.restarts_until * a.duration + 1e-6:
            plan.append((k * R, "restart"))
            k += 1
        k = 0
        while (k + 0.5) * R < a.duration - 1:
            plan.append(((k + 0.5) * R, "reload"))
            k += 1
        plan.sort()
        windows = []  # [signal, ready + margin] of each restart (monotonic)
        inc, kills = 1, 0
        incarnations = [{"n": 1, "pid": node.pid, "start_s": 0.0}]
        for at, kind in plan + [(a.duration, "end")]:
            while True:
                left = t_start + at - time.monotonic()
                for p in (mock, edge, node):
                    if not p.alive():
                        raise RuntimeError("%s exited unexpectedly (log %s)" % (p.name, p.log_path))
                if events.closed:
                    raise RuntimeError("the admin event stream ended: %s" % events.closed)
                if left <= 0:
                    break
                time.sleep(min(left, 1.0))
            now = time.monotonic() - t_start
            if kind == "end":
                break
            if kind == "reload":
                capacity = 48 if capacity == 64 else 64
                with open(edge_cfg, "w") as f:
                    f.write(edge_config(mock_addr, capacity))
                since = events.mark()
                os.kill(edge.pid, signal.SIGHUP)
                ev = events.wait(since, lambda e: e["type"] in ("config_reloaded", "config_rejected"), 30)
                if ev is None or ev["type"] != "config_reloaded":
                    fails.append("reload at %s: %s" % (fmt_t(now), ev or "no config_reloaded within 30 s"))
                marks.append((now, "reload", "capacity %d, revision %s" % (capacity, ev and ev.get("revision"))))
                print("  %s reload: tun capacity %d (%s)" % (fmt_t(now), capacity, ev and ev["type"]), flush=True)
                continue
            sig = signal.SIGTERM if kills % 2 == 0 else signal.SIGKILL
            kills += 1
            t_sig = time.monotonic()
            window = [t_sig, None]
            windows.append(window)
            since = events.mark()
            # Not sampled until the new one runs: the old pid, once reaped, may be reused.
            watched.pop("node", None)
            os.kill(node.pid, sig)
            if not wait_exit(node.pid, NODE_GRACE_S + 10):
                fails.append("restart at %s: node did not exit within %d s of %s"
                             % (fmt_t(now), NODE_GRACE_S + 10, sig.name))
            node.stop(grace=0)
            code = node.p.returncode
            if sig == signal.SIGTERM and code != 0:
                fails.append("restart at %s: node exited %s after SIGTERM" % (fmt_t(now), code))
            incarnations[-1]["end_s"] = time.monotonic() - t_start
            incarnations[-1]["exit"] = code
            inc += 1
            node, ev = start_node(inc, since)
            window[1] = ev["_t"] + RESTART_MARGIN_S
            watched["node"] = (inc, node.pid)
            incarnations.append({"n": inc, "pid": node.pid, "start_s": time.monotonic() - t_start})
            marks.append((now, sig.name, "down %.2f s" % (ev["_t"] - t_sig)))
            print("  %s restart %d: %s, exit %s, ready again after %.2f s" % (fmt_t(now), inc - 1, sig.name, code,
                                                                          ev["_t"] - t_sig), flush=True)

        stop_load.set()
        for c in clients:
            c.join(70)
        end_s = time.monotonic() - t_start
        stop_sample.set()
        sampler.join(10)
        incarnations[-1]["end_s"] = end_s

        # Nothing left behind by the load: leases, waiters, runs, streams.
        left = settled(host, port)
        if left:
            fails.append("after the load: " + left)

        # Errors: expected only inside a restart window.
        counts = dict(stats.counts)
        outside, excused = [], []
        for t0, t1, what, detail in stats.errors:
            inside = any(t0 <= (w[1] if w[1] is not None else float("inf")) and t1 >= w[0] for w in windows)
            key = "error (restart window) " if inside else "error "
            counts[key + what] = counts.get(key + what, 0) + 1
            (excused if inside else outside).append("%.2f %s: %s" % (t0 - t_start, what, detail))
        if outside:
            fails.append("%d request errors outside restart windows, e.g. %s" % (len(outside), "; ".join(outside[:5])))
        ok = sum(v for k, v in counts.items() if k.startswith("ok "))
        for m in MODELS:
            for api in ("chat", "messages"):
                if not any(k.startswith("ok %s %s" % (m, api)) for k in counts):
                    fails.append("no successful %s request on %s" % (api, m))
        if not counts.get("cut stream"):
            fails.append("no stream was cut by its client")

        rows = sampler.rows
        warm = max(0.1 * a.duration, 20.0)
        win = 0.1 * a.duration
        checks = []
        f, info = growth_check("edge", [r for r in rows if r[1] == "edge"], warm, win, end_s, a)
        fails += f
        checks.append(info)
        last = incarnations[-1]
        life = last["end_s"] - last["start_s"]
        f, info = growth_check("node incarnation %d" % last["n"],
                               [r for r in rows if r[1] == "node" and r[2] == last["n"]],
                               last["start_s"] + life / 4, life / 4, last["end_s"], a)
        fails += f
        checks.append(info)
        short = [i for i in incarnations[:-1] if i["start_s"] >= warm]
        by_inc = lambda n: [r for r in rows if r[1] == "node" and r[2] == n]  # noqa: E731
        short = [i for i in short if len(by_inc(i["n"])) >= 3]
        if len(short) >= 2:
            f, info = peak_check("node incarnations %d vs %d" % (short[-1]["n"], short[0]["n"]),
                                 by_inc(short[0]["n"]), by_inc(short[-1]["n"]), a)
            fails += f
            checks.append(info)
        else:
            notes.append("fewer than two short node incarnations after the warm-up: no peak comparison")
        for i in incarnations:
            rs = by_inc(i["n"])
            if rs:
                i["peak_rss_mib"] = round(max(r[4] for r in rs) / 1024, 1)
                i["peak_fds"] = max(r[5] for r in rs)

        with open(os.path.join(out, "samples.csv"), "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["t_s", "process", "incarnation", "pid", "rss_kib", "fds", "threads"])
            w.writerows(rows)
        with open(os.path.join(out, "events.csv"), "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["t_s", "event", "detail"])
            w.writerows((round(t, 2), k, d) for t, k, d in marks)
        result = {
            "pass": not fails, "failures": fails, "notes": notes, "duration_s": round(end_s, 1),
            "machine": machine(), **beside, "loadavg_end": loadavg(), "builds_end": builds_running(),
            "bin_dir": a.bin_dir, "seed": a.seed, "bounds": {"rss_pct": a.rss_pct, "rss_mib": a.rss_mib,
                                                             "fd_slack": a.fd_slack},
            "warmup_s": warm, "window_s": win, "restart_every_s": R, "sample_sec": a.sample_sec,
            "requests": dict(sorted(counts.items())), "requests_ok": ok,
            "errors_outside_windows": outside[:50], "errors_in_windows": excused[:50],
            "edge_run_terminal": dict(events.terminal), "events_lagged": events.lagged,
            "restarts": [m for m in marks if m[1] != "reload"], "reloads": sum(1 for m in marks if m[1] == "reload"),
            "incarnations": incarnations, "checks": checks, "samples": len(rows),
            "run_store_bytes": sum(file_size(os.path.join(out, f)) for f in os.listdir(out)
                                   if f.startswith("node-runs.db")),
        }
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        title = "iop soak %s: %s (%d requests ok, %d node restarts, %d reloads)" % (
            fmt_t(end_s), "pass" if not fails else "FAIL", ok, len(result["restarts"]), result["reloads"])
        svg_plot(os.path.join(out, "soak.svg"), rows, marks, end_s, warm, win, title)
        report(result, out)
    except (RuntimeError, OSError) as e:
        fails.append(str(e))
        print("soak: FAIL: %s" % e, flush=True)
    finally:
        stop_load.set()
        stop_sample.set()
        if events:
            events.close()
        for p in reversed(procs + ([node] if node else [])):
            p.stop()
    return 0 if not fails else 1


def settled(host, port):
    """'' once the edge holds no lease or waiter and the node no run, stream
    or tunnel (within 15 s); else what is left."""
    deadline = time.monotonic() + 15
    what = ""
    while time.monotonic() < deadline:
        what = ""
        status, body = admin_get(host, port, "/admin/v1/nodes")
        if status != 200:
            what = "admin nodes answered %d" % status
        else:
            doc = json.loads(body)
            for m in doc.get("models", []):
                if m.get("waiters"):
                    what += " model %s waiters %d;" % (m["name"], m["waiters"])
            for n in doc.get("nodes", []):
                for p in n.get("providers", []):
                    for key in ("leases_in_use", "live_leases", "waiters"):
                        if p.get(key):
                            what += " %s/%s %s %d;" % (n["id"], p["id"], key, p[key])
                    in_use = (p.get("normal") or {}).get("in_use")
                    if in_use:
                        what += " %s/%s in_use %d;" % (n["id"], p["id"], in_use)
            status, body = admin_get(host, port, "/admin/v1/nodes/soak-node/transport")
            if status != 200:
                what += " transport answered %d;" % status
            else:
                t = json.loads(body)
                for key in ("streams", "runs", "tunnels", "waiting_for_credit"):
                    if t.get(key):
                        what += " node %s %d;" % (key, t[key])
        if not what:
            return ""
        time.sleep(0.2)
    return what.strip()


def report(r, out):
    print("soak: %s after %s, output in %s" % ("PASS" if r["pass"] else "FAIL", fmt_t(r["duration_s"]), out))
    print("  requests: %s" % ", ".join("%s %d" % kv for kv in r["requests"].items()))
    print("  edge run_terminal events: %s" % r["edge_run_terminal"])
    for c in r["checks"]:
        print("  %s: RSS %s MiB (limit %s), fds %s (limit %s)" % (c["what"], " -> ".join(map(str, c["rss_mib"])),
                                                                  c["rss_limit_mib"], " -> ".join(map(str, c["fds"])),
                                                                  c["fd_limit"]))
    for i in r["incarnations"]:
        print("  node %d: %.0f-%.0f s, exit %s, peak RSS %s MiB, peak fds %s" % (
            i["n"], i["start_s"], i.get("end_s", 0), i.get("exit", "-"), i.get("peak_rss_mib"), i.get("peak_fds")))
    for n in r["notes"]:
        print("  note: " + n)
    for f in r["failures"]:
        print("  FAIL: " + f)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
