"""Processes and what /proc says about them: start and stop the benchmark's
servers, CPU seconds, RSS, children, the machine and what else is busy."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
# Processes whose presence means a build or test run shares the machine.
BUILD_COMMS = {"cargo", "rustc", "rustdoc", "clippy-driver", "cc1", "cc1plus", "ld", "ld.lld", "lld", "collect2"}


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name; None once gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid):
    """utime + stime (fields 14 and 15 of /proc/PID/stat) in seconds; None once gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICK


def sys_seconds(pid):
    """stime alone (field 15): the kernel's share of `cpu_seconds`."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[12]) / TICK


def thread_cpu_seconds(pid, comm):
    """utime + stime of `pid`'s threads named `comm`, in seconds (0.0: none)."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                text = f.read()
        except OSError:
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        if name == comm:
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def alive(pid):
    """Whether `pid` runs (a zombie that is not reaped yet does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def rss_kib(pid):
    """VmRSS from /proc/PID/status, in KiB; None once gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    """Pids whose parent is `pid` (nginx workers of a master)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return sorted(out)


def all_cpu():
    """{pid: (start time, comm, cpu seconds)} of every process on the machine
    (the start time tells a reused pid apart; a kworker's comm changes)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[int(entry)] = (int(fields[19]), comm, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def others_busy(before, after, ours):
    """CPU seconds used between two all_cpu() snapshots by processes not in
    `ours`, and the three busiest of them."""
    used = []
    for pid, (start, comm, cpu) in after.items():
        if pid in ours:
            continue
        prev = before.get(pid)
        delta = cpu - prev[2] if prev and prev[0] == start else cpu
        if delta > 0:
            used.append((delta, comm, pid))
    used.sort(reverse=True)
    return round(sum(u[0] for u in used), 3), [{"comm": c, "pid": p, "cpu_sec": round(d, 3)} for d, c, p in used[:3]]


def builds_running():
    """Names of the build processes (cargo, rustc, ...) running now."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % entry) as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in BUILD_COMMS or comm.startswith("build-script"):
            found.append(comm)
    return sorted(found)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def free_port():
    """A port that was free a moment ago (for servers that cannot take port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quote(args):
    return " ".join(shlex.quote(str(a)) for a in args)


class Proc:
    """A started server: its own session (so its children can be stopped
    with it), stderr to a log file, stdout read line by line."""

    def __init__(self, name, args, log_dir, env=None, ready=None, timeout=30):
        self.name = name
        self.args = [str(a) for a in args]
        self.log_path = os.path.join(log_dir, name + ".log")
        self.lines = []
        self._ready = threading.Event()
        self._pattern = re.compile(ready) if ready else None
        self.match = None
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.env = env or {}
        self.log = open(self.log_path, "ab")
        self.p = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                                  env=full_env, start_new_session=True, text=True)
        self.pid = self.p.pid
        threading.Thread(target=self._read, daemon=True).start()
        if self._pattern and not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError("%s did not print its ready line within %d s (log: %s)" % (name, timeout, self.log_path))
        if self._pattern and self.match is None:
            self.stop()
            raise RuntimeError("%s exited before it was ready (log: %s)" % (name, self.log_path))

    def _read(self):
        for line in self.p.stdout:
            if len(self.lines) < 1000:
                self.lines.append(line.rstrip("\n"))
            if self._pattern and self.match is None:
                m = self._pattern.search(line)
                if m:
                    self.match = m
                    self._ready.set()
        self._ready.set()

    def command(self):
        env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + quote(self.args)

    def alive(self):
        return alive(self.pid)

    def stop(self, grace=3.0):
        """SIGTERM to its process group, SIGKILL after `grace` seconds, then
        SIGKILL to whatever is left of the group (nginx workers of a killed
        master). Signals go out only while the leader is not reaped, so its
        pid (and group id) cannot belong to anyone else yet."""
        if self.p.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not wait_exit(self.pid, grace):
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                wait_exit(self.pid, None)
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.p.wait()
        self.log.close()


def wait_exit(pid, timeout):
    """Waits until child `pid` has exited, without reaping it (so its pid
    stays ours); False on timeout (`None`: no limit)."""
    deadline = None if timeout is None else time.time() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | (os.WNOHANG if deadline else 0))
        except ChildProcessError:
            return True
        if info is not None:
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.01)


def http(method, url, body=None, timeout=5, token=None):
    """(status, body bytes); status 0 when the connection failed."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = "Bearer " + token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def wait_http(method, url, body=None, timeout=30, what="server"):
    """Until `url` answers 200."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        status, answer = http(method, url, body, timeout=2)
        if status == 200:
            return answer
        last = (status, answer[:200])
        time.sleep(0.05)
    raise RuntimeError("%s at %s never answered 200 (last: %r)" % (what, url, last))


def machine():
    info = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "kernel": os.uname().release}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        info["cpu"] = m.group(1).strip() if m else "unknown"
        m = re.search(r"^cpu MHz\s*:\s*(.+)$", text, re.M)
        info["cpu_mhz"] = float(m.group(1)) if m else None
    except OSError:
        info["cpu"] = "unknown"
    with open("/proc/meminfo") as f:
        m = re.search(r"^MemTotal:\s*(\d+) kB", f.read(), re.M)
        info["ram_gib"] = round(int(m.group(1)) / 1048576, 1) if m else None
    return info


def output(args, cwd=None):
    """stdout + stderr of a command, stripped; None when it cannot run."""
    try:
        r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout + r.stderr).strip()
