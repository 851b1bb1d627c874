#!/usr/bin/env python3
"""eurekamem's benchmark: the real daemon, the real socket, the real client, against anchors
measured in the same run (a bare trio echo server, Redis, the disk's fdatasync).

    .venv/bin/python bench/run.py [--quick] [--out bench/results] [--no-redis]

Prints a markdown report and writes <out>/<timestamp>.json and .md. See bench/README.md for what
each figure means. Every loop is bounded (by a count or by a deadline); every process started here
is stopped (SIGTERM, then a wait, then SIGKILL) and every temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import csv
import io
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import (  # noqa: E402,F401  (profile_daemon.py and suite.py use some through this module)
    HERE,
    PY,
    ROOT,
    SEED,
    CpuMeter,
    Daemon,
    Server,
    fmt_rate,
    fmt_us,
    log,
    machine,
    mark,
    pct,
    proc_cpu_seconds,
    ratio,
    summarize_ns,
    wait_for_quiet,
)

TARGETS = {
    "rtt_p50_us": 100.0,  # unpipelined p50 below this
    "pipelined_log_ops": 100_000.0,  # pipelined episodic.log per second, at least
    "durable_writes": 30_000.0,  # durable persistent.remember per second with 32 clients, at least
}


class Sizes(msgspec.Struct):
    rtt_calls: int  # unpipelined calls per method
    rtt_warmup: int
    pipe_ops: int  # requests per pipelined run (raw sender/receiver)
    many_ops: int  # requests per call_many run
    durable_seconds: float  # length of each durable run
    fsync_loops: int
    redis_n: int  # requests per redis-benchmark run (unpipelined and pipelined)
    redis_durable_n: int  # requests per redis-benchmark durable SET run


FULL = Sizes(5000, 500, 100_000, 50_000, 5.0, 1000, 100_000, 50_000)
QUICK = Sizes(1000, 200, 20_000, 10_000, 2.0, 200, 20_000, 10_000)
WATCHDOG_SECONDS = {True: 600, False: 1800}  # --quick, full: the whole run is aborted (cleanly) after this

WINDOW = 64  # requests in flight for the pipelined runs
DURABLE_PROCS = 4
DURABLE_THREADS = 8  # per process: 32 clients

SESSION = "bench-session"
CONTENT_BYTES = 120  # episodic.log content length


def start_daemon(tmp: Path, name: str, fsync: str) -> tuple[Server, str]:
    sock = str(tmp / f"{name}.sock")
    daemon = Daemon(f"eurekamem[{name}, fsync {fsync}]", tmp / f"{name}-data", sock, fsync=fsync)
    return daemon.start(), sock


# --- clients ------------------------------------------------------------------------------------


def make_client(path: str) -> Any:
    """The real client as users get it by default (no timeout: the fast path, no poll per call).

    A hung daemon cannot hang the bench for ever: main() arms a SIGALRM watchdog, and the
    durable-write processes are waited for with a timeout and then terminated.
    """
    return _common.client(path)


class _Reply(msgspec.Struct):
    id: Any = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: Any = None


_request_encoder = msgspec.msgpack.Encoder()


def frame(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    payload = _request_encoder.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    return len(payload).to_bytes(4, "big") + payload


def log_params(i: int) -> dict[str, Any]:
    return {"session_id": SESSION, "agent_role": "theory", "content": CONTENT[i % len(CONTENT)]}


def recall_params(_i: int) -> dict[str, Any]:
    return {"key": RECALL_KEY}


def ping_params(_i: int) -> dict[str, Any]:
    return {}


RECALL_KEY = "bench.recall.theory.failed_strategies.concentration"
RECALL_VALUE = {"why": "Hoeffding too loose", "attempts": [1, 2, 3], "bound": "O(sqrt(T log T))"}
def _contents(count: int = 256) -> list[str]:
    rng = random.Random(SEED)
    alphabet = "abcdefghijklmnopqrstuvwxyz     "
    return ["".join(rng.choice(alphabet) for _ in range(CONTENT_BYTES)) for _ in range(count)]


CONTENT: list[str] = _contents()  # episodic.log contents: seeded, the same in every run

PARAMS: dict[str, Callable[[int], dict[str, Any]]] = {
    "sys.ping": ping_params,
    "persistent.recall": recall_params,
    "episodic.log": log_params,
}


def rtt_client(path: str, method: str, n: int, warmup: int, keep: list[int] | None = None) -> dict[str, Any]:
    """Unpipelined round trips with the real Client, one call at a time (`keep` gets the samples, ns)."""
    make = PARAMS[method]
    with contextlib.closing(make_client(path)) as client:
        call = client.call
        for i in range(warmup):
            call(method, make(i))
        samples = array.array("q")
        clock = time.perf_counter_ns
        for i in range(n):
            params = make(i)
            t0 = clock()
            call(method, params)
            samples.append(clock() - t0)
    if keep is not None:
        keep.extend(samples)
    return summarize_ns(samples)


def rtt_raw(path: str, method: str, n: int, warmup: int) -> dict[str, Any]:
    """Unpipelined round trips on a bare socket (pre-encoded frames, no Client): the client's share."""
    make = PARAMS[method]
    frames = [frame(i + 1, method, make(i)) for i in range(n + warmup)]
    decode = msgspec.msgpack.Decoder(_Reply).decode
    samples = array.array("q")
    clock = time.perf_counter_ns
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60.0)
        sock.connect(path)
        for i, data in enumerate(frames):
            t0 = clock()
            sock.sendall(data)
            header = _recv_exact(sock, 4)
            body = _recv_exact(sock, int.from_bytes(header, "big"))
            t1 = clock()
            reply = decode(body)
            if reply.error is not None:
                raise RuntimeError(f"{method} failed: {reply.error}")
            if i >= warmup:
                samples.append(t1 - t0)
    return summarize_ns(samples)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    left = n
    for _ in range(n + 1):  # at least one byte per recv
        if not left:
            break
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("server closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def pipelined_raw(path: str, method: str, n: int, window: int = WINDOW, timeout: float = 120.0) -> dict[str, Any]:
    """A sender thread keeps `window` requests outstanding on one socket; this thread receives.

    Frames are encoded before the clock starts; the sender tops the window up with one sendall of
    as many frames as there is room for, whenever the receiver has taken some answers.
    """
    make = PARAMS[method]
    frames = [frame(i + 1, method, make(i)) for i in range(n)]
    decode = msgspec.msgpack.Decoder(_Reply).decode
    cond = threading.Condition()
    state = {"outstanding": 0, "failed": None}
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.settimeout(timeout)

    def sender() -> None:
        i = 0
        try:
            while i < n:  # i grows every pass that does not time out; bounded by the deadline
                with cond:
                    while state["outstanding"] >= window:
                        if not cond.wait(max(0.0, deadline - time.monotonic())) or time.monotonic() > deadline:
                            raise TimeoutError("pipelined sender: no answers in time")
                    room = min(window - state["outstanding"], n - i)
                    state["outstanding"] += room
                sock.sendall(b"".join(frames[i : i + room]))
                i += room
        except BaseException as exc:  # noqa: BLE001 - reported by the receiver
            state["failed"] = exc

    received = 0
    errors = 0
    first_error = None
    buf = bytearray()
    t0 = time.perf_counter()
    thread = threading.Thread(target=sender, name="pipelined-sender", daemon=True)
    thread.start()
    try:
        while received < n:
            if state["failed"] is not None:
                raise RuntimeError(f"sender failed: {state['failed']!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pipelined {method}: {received}/{n} answers after {timeout}s")
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            buf += data
            pos = 0
            end = len(buf)
            got = 0
            while end - pos >= 4:
                size = int.from_bytes(buf[pos : pos + 4], "big")
                if end - pos - 4 < size:
                    break
                reply = decode(buf[pos + 4 : pos + 4 + size])
                if reply.error is not None:
                    errors += 1
                    first_error = first_error or reply.error
                pos += 4 + size
                got += 1
            if pos:
                del buf[:pos]
            if got:
                received += got
                with cond:
                    state["outstanding"] -= got
                    cond.notify()
        elapsed = time.perf_counter() - t0
    finally:
        sock.close()
        thread.join(5.0)
    return {"ops": n, "seconds": round(elapsed, 3), "ops_per_s": round(n / elapsed), "errors": errors,
            "first_error": first_error}


def with_cpu(result: dict[str, Any], meter: CpuMeter, server: str) -> dict[str, Any]:
    """Attach the cores busy during the run and the server's CPU time per operation."""
    result["cores"] = meter.cores
    ops_per_s = result.get("ops_per_s")
    if ops_per_s:
        result["server_cpu_us_per_op"] = round(meter.cores[server] * 1e6 / ops_per_s, 1)
    return result


def pipelined_call_many(path: str, method: str, n: int, window: int = WINDOW) -> dict[str, Any]:
    """The real client's call_many, `window` calls at a time (each batch waits for all its answers)."""
    make = PARAMS[method]
    from eurekamem.client import EurekamemError

    batches = [[(method, make(b * window + j)) for j in range(window)] for b in range(n // window)]
    errors = 0
    with contextlib.closing(make_client(path)) as client:
        client.call_many(batches[0])  # warm
        t0 = time.perf_counter()
        for batch in batches:
            for result in client.call_many(batch):
                if isinstance(result, (EurekamemError, Exception)):
                    errors += 1
        elapsed = time.perf_counter() - t0
    ops = len(batches) * window
    return {"ops": ops, "seconds": round(elapsed, 3), "ops_per_s": round(ops / elapsed), "errors": errors}


# --- durable writes: several processes of threads, each thread its own Client --------------------


class _EurekamemWriter:
    """persistent.remember through its own Client (own connection)."""

    def __init__(self, path: str) -> None:
        from eurekamem.client import EurekamemError

        self.errors = (EurekamemError,)
        self.client = make_client(path)

    def write(self, key: str, value: dict[str, Any]) -> None:
        self.client.call("persistent.remember", {"key": key, "value": value})

    def close(self) -> None:
        self.client.close()


class _SqliteWriter:
    """One row per transaction (autocommit INSERT OR REPLACE) on its own connection to a WAL database
    with synchronous=FULL: each commit is fsynced before it returns. Writers wait on SQLite's
    busy handler (timeout 60 s) for the single write lock."""

    def __init__(self, path: str) -> None:
        import sqlite3

        self.errors = (sqlite3.Error,)
        self.db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA synchronous=FULL")
        self.encode = msgspec.json.encode

    def write(self, key: str, value: dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (key, self.encode(value)))

    def close(self) -> None:
        self.db.close()


def sqlite_prepare(path: str) -> None:
    """A fresh WAL database with the kv table (journal_mode=WAL is persistent in the file)."""
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value BLOB)")
    db.close()


WRITERS = {"eurekamem": _EurekamemWriter, "sqlite": _SqliteWriter}
DURABLE_VALUE = {"why": "Hoeffding too loose", "attempts": 3, "tags_hint": "failed", "note": "x" * 40}


def durable_worker(
    proc_index: int, threads: int, path: str, seconds: float, barrier: Any, results: Any, value: dict[str, Any],
    kind: str = "eurekamem", warm: int = 20,
) -> None:
    """One load-generating process: `threads` threads, each with its own connection and its own keys."""
    writers = [WRITERS[kind](path) for _ in range(threads)]
    for t, writer in enumerate(writers):  # warm each connection (and the server's path)
        for i in range(warm):
            writer.write(f"bench.warm.{proc_index}.{t}.{i}", value)
    per_thread: list[dict[str, Any]] = [{} for _ in range(threads)]
    go = threading.Barrier(threads + 1, timeout=60)

    def run(t: int) -> None:
        writer = writers[t]
        write = writer.write
        failures = writer.errors
        samples = array.array("q")
        errors = 0
        clock = time.perf_counter_ns
        max_ops = 2_000_000  # a bound; the deadline ends the loop long before
        go.wait()
        deadline = time.monotonic() + seconds
        first = time.monotonic()
        for i in range(max_ops):
            if time.monotonic() >= deadline:
                break
            key = f"bench.durable.{proc_index}.{t}.{i}"
            t0 = clock()
            try:
                write(key, value)
            except failures:
                errors += 1
            samples.append(clock() - t0)
        last = time.monotonic()
        per_thread[t] = {"samples": samples.tobytes(), "errors": errors, "first": first, "last": last}

    workers = [threading.Thread(target=run, args=(t,), name=f"durable-{proc_index}-{t}") for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait(60)  # every process connected and warm: go
    cpu0 = os.times()
    go.wait()
    for w in workers:
        w.join(seconds + 120)
    cpu1 = os.times()
    for writer in writers:
        writer.close()
    results.put(
        {
            "proc": proc_index,
            "threads": per_thread,
            "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        }
    )


def durable_run(path: str, daemon_pid: int, seconds: float, procs: int = DURABLE_PROCS, threads: int = DURABLE_THREADS,
                kind: str = "eurekamem", warm: int = 20) -> dict[str, Any]:
    """`procs` processes x `threads` threads write for `seconds`; daemon_pid (0: none) is the server
    whose cores are measured (the daemon; SQLite runs inside the writers)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    value = DURABLE_VALUE
    workers = [
        ctx.Process(target=durable_worker, args=(p, threads, path, seconds, barrier, results, value, kind, warm), name=f"durable-{p}")
        for p in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        barrier.wait(120)
        cpu_daemon0 = proc_cpu_seconds(daemon_pid)
        t0 = time.perf_counter()
        got = [results.get(timeout=seconds + 180) for _ in range(procs)]
        wall = time.perf_counter() - t0
        cpu_daemon1 = proc_cpu_seconds(daemon_pid)
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.terminate()
                w.join(10)
    samples = array.array("q")
    errors = 0
    firsts, lasts = [], []
    for proc in got:
        for t in proc["threads"]:
            chunk = array.array("q")
            chunk.frombytes(t["samples"])
            samples.extend(chunk)
            errors += t["errors"]
            firsts.append(t["first"])
            lasts.append(t["last"])
    span = max(lasts) - min(firsts)
    out = summarize_ns(samples)
    out.update(
        {
            "clients": procs * threads,
            "processes": procs,
            "threads_per_process": threads,
            "writes": len(samples),
            "errors": errors,
            "seconds": round(span, 3),
            "writes_per_s": round(len(samples) / span),
            "cores": {
                "daemon": round((cpu_daemon1 - cpu_daemon0) / wall, 2),
                "load_generator": round(sum(p["cpu_s"] for p in got) / wall, 2),
            },
        }
    )
    return out


# --- the C load generator (bench/loadgen.c): as cheap as redis-benchmark ---------------------------

LOADGEN_SOURCE = HERE / "loadgen.c"
LOADGEN_ID = 2**64 - 1  # the template's id: loadgen.c writes each request's id over it (msgpack uint64)
LOADGEN_COUNTER = "#" * 16  # loadgen.c writes each request's number, zero-padded, over every such run
# The params field that loadgen.c makes distinct per request, where the Python generators vary it by i.
LOADGEN_COUNTED = {"episodic.log": "content", "persistent.remember": "key"}
_loadgen_built: dict[str, tuple[str | None, str]] = {}


def loadgen_binary(tmp: Path) -> tuple[str | None, str]:
    """loadgen.c compiled with `cc -O2` into `tmp` (once per folder): (its path, "") or (None, why not)."""
    if str(tmp) not in _loadgen_built:
        _loadgen_built[str(tmp)] = _compile_loadgen(tmp)
    return _loadgen_built[str(tmp)]


def _compile_loadgen(tmp: Path) -> tuple[str | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no C compiler on PATH (cc, gcc, clang; or set CC)"
    binary = tmp / "loadgen"
    argv = [cc, "-O2", "-std=c99", "-o", str(binary), str(LOADGEN_SOURCE)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`{' '.join(argv)}` failed: {exc}"
    if proc.returncode != 0 or not binary.exists():
        return None, f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-300:]}"
    log(f"compiled {LOADGEN_SOURCE.name}: {binary}")
    return str(binary), ""


def loadgen_params(method: str) -> dict[str, Any]:
    """PARAMS[method]'s params as a template: the counted field (if any) ends in the counter."""
    params = dict(PARAMS[method](0))
    field = LOADGEN_COUNTED.get(method)
    if field:
        text = str(params[field])
        params[field] = (text[: -len(LOADGEN_COUNTER)] if len(text) > 2 * len(LOADGEN_COUNTER) else text) + LOADGEN_COUNTER
    return params


def loadgen(binary: str, path: str, method: str, params: dict[str, Any], *, connections: int = 1, window: int = 1,
            requests: int = 0, seconds: float = 0.0, warm: int = 0, idle_timeout: float = 60.0) -> dict[str, Any]:
    """Run loadgen.c: `connections` connections keep `window` requests each in flight; `warm` answers,
    then `requests` answers or `seconds` counted. Its JSON result (requests, ok, errors, first_error,
    seconds, ops_per_s, p50_us, p99_us, mean_us, max_us, cpu_s), with the argv. Answers that were
    errors are in "errors" (its exit status 3); a failure (connection lost, no answers) raises."""
    body = _request_encoder.encode({"jsonrpc": "2.0", "id": LOADGEN_ID, "method": method, "params": params})
    template = Path(binary).parent / f"loadgen-{os.getpid()}-{time.perf_counter_ns()}.msgpack"
    template.write_bytes(body)
    argv = [binary, path, str(template), "-c", str(connections), "-P", str(window), "-w", str(warm),
            "-T", str(idle_timeout)]
    argv += ["-n", str(requests)] if requests else ["-t", str(seconds)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=idle_timeout + seconds + 120)
    finally:
        template.unlink(missing_ok=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, 3) or not lines:
        raise RuntimeError(f"loadgen {method} ({' '.join(argv[3:])}) exited with {proc.returncode}: "
                           f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}")
    result = json.loads(lines[-1])
    result["argv"] = " ".join(argv[3:])
    result["generator"] = "C loadgen"
    return result


def loadgen_pipelined(binary: str, path: str, method: str, n: int, window: int = WINDOW, warm: int = 2000,
                      params: dict[str, Any] | None = None) -> dict[str, Any]:
    """pipelined_raw's run driven by loadgen.c: one connection, `window` in flight, `n` answers counted
    after `warm`; params loadgen_params(method) unless given. Keys of pipelined_raw's result; ops_per_s
    is None when some answers were errors."""
    params = loadgen_params(method) if params is None else params
    s = loadgen(binary, path, method, params, window=window, requests=n, warm=min(warm, n))
    s.update({"ops": s["requests"], "ops_per_s": round(s["ops_per_s"]) if not s["errors"] else None,
              "seconds": round(s["seconds"], 3)})
    return s


def loadgen_durable(binary: str, path: str, clients: int, seconds: float, warm: int = 3) -> dict[str, Any]:
    """durable_run's writes driven by loadgen.c: `clients` connections, one persistent.remember in
    flight each, distinct keys, for `seconds` after `warm` writes per client. Keys of durable_run's
    result (cores: the load generator's only); writes_per_s is None when some answers were errors."""
    params = {"key": f"bench.durable.c{clients}.{LOADGEN_COUNTER}", "value": DURABLE_VALUE}
    s = loadgen(binary, path, "persistent.remember", params, connections=clients, window=1, seconds=seconds,
                warm=warm * clients)
    s.update({"clients": clients, "writes": s["requests"], "seconds": round(s["seconds"], 3),
              "writes_per_s": round(s["ops_per_s"]) if not s["errors"] else None,
              "cores": {"load_generator": round(s["cpu_s"] / max(s["seconds"], 1e-9), 2)}})
    return s


def journal_stats(path: str) -> dict[str, Any]:
    with contextlib.closing(make_client(path)) as client:
        stats = client.call("sys.stats")
    journal = stats.get("journal", {})
    batches = journal.get("batches") or 0
    records = journal.get("records") or 0
    return {
        "batches": batches,
        "records": records,
        "records_per_fsync_batch": round(records / batches, 1) if batches else None,
        "fsync_latency": journal.get("fsync_latency"),
    }


# --- fdatasync ----------------------------------------------------------------------------------


def fdatasync_cost(folder: Path, loops: int, block_bytes: int = 4096) -> dict[str, Any]:
    """Append `block_bytes` (4 KiB) and fdatasync, `loops` times, in a file on the data dirs' file system."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fdatasync.probe"
    block = random.Random(SEED).randbytes(block_bytes)
    samples = array.array("q")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        for i in range(loops + 10):
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fdatasync(fd)
            if i >= 10:
                samples.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
        path.unlink()
    out = summarize_ns(samples)
    ordered = sorted(samples)
    out["p90_us"] = round(pct(ordered, 0.90) / 1000, 1)
    out["block_bytes"] = block_bytes
    out["filesystem"] = filesystem_of(folder)
    out["serial_fsyncs_per_s"] = round(1e6 / out["mean_us"]) if out["mean_us"] else None
    return out


def filesystem_of(path: Path) -> str:
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) >= len(best[0]):
                    best = (parts[1], parts[2], parts[0])
    except OSError:
        pass
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


# --- Redis --------------------------------------------------------------------------------------


def ensure_redis(install: bool = True) -> str | None:
    """None when redis-server and redis-benchmark are usable, else why not. When missing they are
    installed with apt-get if `install` and this process is root with apt-get on PATH."""
    if shutil.which("redis-server") and shutil.which("redis-benchmark"):
        return None
    if not install:
        return "redis-server/redis-benchmark not on PATH (not installed in this mode; `apt-get install redis-server`)"
    if shutil.which("apt-get") is None:
        return "redis-server/redis-benchmark not on PATH and no apt-get to install them"
    if os.geteuid() != 0:
        return "redis-server/redis-benchmark not on PATH, and installing them with apt-get needs root"
    log("redis-server not found: apt-get install -y redis-server")
    attempts = [["apt-get", "install", "-y", "redis-server"], ["apt-get", "update"], ["apt-get", "install", "-y", "redis-server"]]
    for i, argv in enumerate(attempts):
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(argv)}` failed: {exc}"
        if i == 0 and proc.returncode == 0:
            break
        if i == 1 and proc.returncode != 0:
            return f"`apt-get update` failed: {proc.stderr.strip()[-300:]}"
        if i == 2 and proc.returncode != 0:
            return f"`apt-get install -y redis-server` failed: {proc.stderr.strip()[-300:]}"
    if shutil.which("redis-server") and shutil.which("redis-benchmark"):
        return None
    return "redis-server installed but redis-server/redis-benchmark still not on PATH"


def start_redis(tmp: Path, name: str, durable: bool) -> tuple[Server, str]:
    sock = str(tmp / f"{name}.sock")
    folder = tmp / f"{name}-dir"
    folder.mkdir(parents=True, exist_ok=True)
    argv = ["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
            "--dir", str(folder), "--daemonize", "no", "--loglevel", "notice"]
    argv += ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
    server = Server(f"redis[{name}]", argv, "ready to accept connections").start()
    return server, sock


def redis_command(sock: str, *args: str) -> bytes:
    """Send one RESP command and return the raw first reply line."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(sock)
        s.sendall(payload)
        return s.recv(4096)


def redis_benchmark(server: Server, sock: str, tests: str, n: int, clients: int, pipeline: int, value_bytes: int = 128,
                    random_keys: bool = False, timeout: float = 300) -> dict[str, dict[str, Any]]:
    """Run redis-benchmark --csv; {TEST: {rps, p50_us, p99_us, ..., cores}} (latency columns if present).

    `cores` (redis-server, redis-benchmark as "bench", others) covers all the tests of the call."""
    argv = ["redis-benchmark", "-s", sock, "-t", tests, "-n", str(n), "-c", str(clients), "-P", str(pipeline),
            "-d", str(value_bytes), "--csv", "-q"]
    if random_keys:
        argv += ["-r", "1000000"]
    with CpuMeter({"redis": server.pid}) as meter:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-300:]}")
    out: dict[str, dict[str, Any]] = {}
    rows = [line for line in proc.stdout.splitlines() if line.startswith('"')]
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        test = row.get("test", "?")
        entry: dict[str, Any] = {"argv": " ".join(argv[1:]), "cores": meter.cores}
        for key, value in row.items():
            if key == "test" or value is None:
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            if key == "rps":
                entry["rps"] = round(number)
            elif key.endswith("_latency_ms"):
                entry[key.replace("_latency_ms", "_us")] = round(number * 1000, 1)
        out[test] = entry
    if not out:
        raise RuntimeError(f"no CSV rows from {' '.join(argv)}: {proc.stdout[-300:]!r}")
    return out


# --- the report ---------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    r = report["results"]
    out: list[str] = []
    out.append(f"# eurekamem benchmark — {report['started']} ({'quick' if report['quick'] else 'full'})")
    out.append("")
    out.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['os']}")
    out.append(f"- python {m['python']}, msgspec {m['msgspec']}, trio {m['trio']}, redis {m['redis']}")
    if report.get("tree") and report["tree"] != str(ROOT):
        out.append(f"- eurekamem measured from the source tree {report['tree']} (--tree); the repo is at {m['commit']}")
    else:
        out.append(f"- eurekamem commit {m['commit']}")
    probes = r.get("fdatasync", {})
    if probes:
        out.append(f"- data dirs on: {next(iter(probes.values()))['filesystem']}")
    out.append(f"- seed {report['seed']}; sizes: {json.dumps(report['sizes'])}")
    quiet = report.get("quiet") or {}
    run_cores = report.get("run_cores") or {}
    if quiet or run_cores:
        out.append(
            f"- other processes on this machine (not ours): {quiet.get('others_cores_at_start', '?')} cores busy at the "
            f"start (after waiting {quiet.get('waited_s', 0)} s for quiet), {run_cores.get('others', '?')} on average during "
            f"the run, of {m['nproc']} — every figure below is slower when this is not near 0"
        )
    out.append("")

    rtt = r.get("rtt", {})
    raw = r.get("rtt_raw", {})
    echo = r.get("echo", {})
    redis = r.get("redis", {})
    redis_note = r.get("redis_skipped")
    rg1 = redis.get("unpipelined", {}).get("GET", {})
    rs1 = redis.get("unpipelined", {}).get("SET", {})

    out.append("## 1. Round trip, unpipelined, one client (real `Client.call`)")
    out.append("")
    out.append("| call | p50 | p99 | mean | p50 ÷ echo floor | p50 ÷ Redis | target p50 |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    echo_p50 = echo.get("client", {}).get("p50_us")
    for method, redis_anchor, rname in (("sys.ping", rg1, "GET"), ("persistent.recall", rg1, "GET"), ("episodic.log", rs1, "SET")):
        s = rtt.get(method)
        if not s:
            continue
        ok = s["p50_us"] < TARGETS["rtt_p50_us"]
        echo_cell = ratio(s["p50_us"], echo_p50) if method == "sys.ping" else "–"
        redis_cell = f"{ratio(s['p50_us'], redis_anchor.get('p50_us'))} (vs {rname})" if redis_anchor.get("p50_us") else "–"
        out.append(f"| eurekamem `{method}` | {fmt_us(s['p50_us'])} | {fmt_us(s['p99_us'])} | {fmt_us(s['mean_us'])} | {echo_cell} | {redis_cell} | < 100 µs{mark(ok)} |")
    if raw.get("sys.ping"):
        s = raw["sys.ping"]
        out.append(f"| eurekamem `sys.ping`, bare socket (no Client) | {fmt_us(s['p50_us'])} | {fmt_us(s['p99_us'])} | {fmt_us(s['mean_us'])} | {ratio(s['p50_us'], echo.get('raw', {}).get('p50_us'))} (vs bare echo) | | |")
    if echo.get("client"):
        s = echo["client"]
        out.append(f"| anchor: trio echo server, ping via `Client.call` | {fmt_us(s['p50_us'])} | {fmt_us(s['p99_us'])} | {fmt_us(s['mean_us'])} | 1.00× | {ratio(s['p50_us'], rg1.get('p50_us'))} (vs GET) | |")
    if echo.get("raw"):
        s = echo["raw"]
        out.append(f"| anchor: trio echo server, ping on a bare socket | {fmt_us(s['p50_us'])} | {fmt_us(s['p99_us'])} | {fmt_us(s['mean_us'])} | | | |")
    for name, s in (("GET", rg1), ("SET", rs1)):
        if s:
            out.append(f"| anchor: Redis {name}, redis-benchmark -c 1 -P 1 | {fmt_us(s.get('p50_us'))} | {fmt_us(s.get('p99_us'))} | {fmt_us(s.get('avg_us'))} | | 1.00× | |")
    out.append("")
    rc = r.get("rtt_cores")
    if rc:
        out.append(f"During our round trips: daemon {rc.get('daemon')} cores, bench {rc.get('bench')}, others {rc.get('others')}.")
        out.append("")

    pipe = r.get("pipelined", {})
    rp = redis.get("pipelined", {})
    rc64 = redis.get("c64", {})
    out.append(f"## 2. Throughput, {WINDOW} requests in flight on one connection")
    out.append("")
    out.append("| load | ops/s | ÷ anchor | anchor | server CPU per op | server cores busy | bench cores busy | others' cores | target |")
    out.append("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for key, label, anchor_name, anchor_val, target in (
        ("raw:sys.ping", "raw pipelined `sys.ping`", "echo server, same sender", pipe.get("echo:sys.ping", {}).get("ops_per_s"), None),
        ("raw:persistent.recall", "raw pipelined `persistent.recall`", "Redis GET -c 1 -P 64", rp.get("GET", {}).get("rps"), None),
        ("raw:episodic.log", "raw pipelined `episodic.log`", "Redis SET -c 1 -P 64", rp.get("SET", {}).get("rps"), TARGETS["pipelined_log_ops"]),
        ("many:persistent.recall", "`call_many` × 64 `persistent.recall`", "Redis GET -c 1 -P 64", rp.get("GET", {}).get("rps"), None),
        ("many:episodic.log", "`call_many` × 64 `episodic.log`", "Redis SET -c 1 -P 64", rp.get("SET", {}).get("rps"), TARGETS["pipelined_log_ops"]),
    ):
        s = pipe.get(key)
        if not s:
            continue
        tgt = f"≥ {target:,.0f}/s{mark(s['ops_per_s'] >= target)}" if target else ""
        err = f" ({s['errors']} errors)" if s.get("errors") else ""
        cores = s.get("cores", {})
        out.append(f"| {label} | {fmt_rate(s['ops_per_s'])}{err} | {ratio(s['ops_per_s'], anchor_val)} | {anchor_name}: {fmt_rate(anchor_val)} | {fmt_us(s.get('server_cpu_us_per_op'))} | {cores.get('daemon', '–')} | {cores.get('bench', '–')} | {cores.get('others', '–')} | {tgt} |")
    s = pipe.get("echo:sys.ping")
    if s:
        cores = s.get("cores", {})
        out.append(f"| anchor: echo server, raw pipelined ping | {fmt_rate(s['ops_per_s'])} | | | {fmt_us(s.get('server_cpu_us_per_op'))} | {cores.get('echo', '–')} | {cores.get('bench', '–')} | {cores.get('others', '–')} | |")
    for label, group in (("-c 1 -P 64", rp), ("-c 64 -P 1", rc64)):
        for name, s in group.items():
            c = s.get("cores", {})
            out.append(f"| anchor: Redis {name}, {label} | {fmt_rate(s.get('rps'))} | | | | {c.get('redis', '–')} (both tests) "
                       f"| {c.get('bench', '–')} | {c.get('others', '–')} | |")
    out.append("")

    dur = r.get("durable", {})
    rd = redis.get("durable", {})
    out.append(f"## 3. Durable `persistent.remember`, {DURABLE_PROCS * DURABLE_THREADS} clients ({DURABLE_PROCS} processes × {DURABLE_THREADS} threads, one Client each)")
    out.append("")
    out.append("| run | writes/s | p50 | p99 | ÷ Redis | Redis anchor | writes per journal batch | daemon's fsync p50 / p99 | daemon cores | load-gen cores | others' cores | target |")
    out.append("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for policy, rkey, rlabel in (("always", "always", "SET appendfsync always -c 32"), ("batch", "everysec", "SET appendfsync everysec -c 32")):
        s = dur.get(policy)
        if not s:
            continue
        anchor = rd.get(rkey, {})
        j = s.get("journal", {})
        tgt = f"≥ {TARGETS['durable_writes']:,.0f}/s{mark(s['writes_per_s'] >= TARGETS['durable_writes'])}" if policy == "always" else ""
        err = f" ({s['errors']} errors)" if s.get("errors") else ""
        anchor_text = f"{rlabel}: {fmt_rate(anchor.get('rps'))}, p50 {fmt_us(anchor.get('p50_us'))}" if anchor else "–"
        fl = j.get("fsync_latency") or {}
        fsync_cell = f"{fmt_us(fl.get('p50_us'))} / {fmt_us(fl.get('p99_us'))} ({fl.get('count', 0)} fsyncs)" if fl.get("count") else "–"
        out.append(
            f"| `--fsync {policy}` | {fmt_rate(s['writes_per_s'])}{err} | {fmt_us(s['p50_us'])} | {fmt_us(s['p99_us'])} | "
            f"{ratio(s['writes_per_s'], anchor.get('rps'))} | {anchor_text} | {j.get('records_per_fsync_batch', '–')} | "
            f"{fsync_cell} | {s['cores']['daemon']} | {s['cores']['load_generator']} | {s['cores'].get('others', '–')} | {tgt} |"
        )
    out.append("")
    if probes:
        clients = DURABLE_PROCS * DURABLE_THREADS
        out.append("## 4. The disk: append + fdatasync on the data dirs' file system, around section 3's runs")
        out.append("")
        out.append(f"| probe | p50 | p90 | p99 | mean | fdatasyncs/s, one after another | ceiling: {clients} writes per fdatasync |")
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for key, label in (("always", "4 KiB, before our `always` run"), ("small", "256 B, before our `always` run"),
                           ("always-between", "4 KiB, after our `always` run, before Redis's"),
                           ("batch", "4 KiB, before our `batch` run"),
                           ("batch-between", "4 KiB, after our `batch` run, before Redis's")):
            fs = probes.get(key)
            if not fs:
                continue
            ceiling = round(clients * 1e6 / fs["mean_us"]) if fs.get("mean_us") else None
            out.append(
                f"| {label} | {fmt_us(fs['p50_us'])} | {fmt_us(fs.get('p90_us'))} | {fmt_us(fs['p99_us'])} | "
                f"{fmt_us(fs['mean_us'])} | {fmt_rate(fs['serial_fsyncs_per_s'])} | {fmt_rate(ceiling)} |"
            )
        out.append("")
        out.append(
            f"The ceiling is the most `--fsync always` could reach with {clients} clients that each wait for their own "
            "write, if every fdatasync covered one write of each client and cost nothing else: clients ÷ mean."
        )
        out.append("")
    if redis_note:
        out.append(f"Redis anchors skipped: {redis_note}")
        out.append("")
    notes = report.get("notes") or []
    if notes:
        out.append("Notes:")
        out.extend(f"- {n}" for n in notes)
        out.append("")
    waited = (report.get("quiet") or {}).get("waited_s", 0)
    out.append(f"Total bench time {report['seconds']:.0f} s (of which {waited:.0f} s waiting for a quiet machine).")
    return "\n".join(out) + "\n"


# --- main ---------------------------------------------------------------------------------------


def use_tree(tree: Path) -> str:
    """Import eurekamem (here and in the daemon) from `tree`, ahead of the installed package: a shim
    folder holds one link, eurekamem -> the tree (the tree is the package). A tree from before that
    layout (its top package in eurekamem_pkg/) gets a link per folder, as its package-dir mapped them."""
    shim = Path(tempfile.mkdtemp(prefix="emb-tree-", dir="/tmp"))
    package = shim / "eurekamem"
    if (tree / "__init__.py").is_file():
        package.symlink_to(tree, target_is_directory=True)
    else:
        package.mkdir()
        (package / "__init__.py").symlink_to(tree / "eurekamem_pkg" / "__init__.py")
        for name in ("protocol", "client", "daemon"):
            (package / name).symlink_to(tree / name, target_is_directory=True)
    sys.path.insert(0, str(shim))
    _common.CHILD_ENV["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    import atexit

    atexit.register(shutil.rmtree, shim, True)
    import eurekamem.client

    if not str(Path(eurekamem.client.__file__).resolve()).startswith(str(tree)):
        raise SystemExit(f"--tree {tree}: eurekamem.client still comes from {eurekamem.client.__file__}")
    return str(tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and shorter runs (finishes in well under 90 s)")
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for <timestamp>.json and .md (default bench/results)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis anchors")
    parser.add_argument("--wait-quiet", type=float, default=None, metavar="SECONDS",
                        help="wait at most this long for other processes to leave the CPUs idle before starting "
                        "(default 20, --quick 5; 0: do not wait)")
    parser.add_argument("--tree", help="measure the eurekamem of another source tree laid out like this repo "
                        "(e.g. `git archive COMMIT | tar -x -C DIR`) instead of the installed one")
    args = parser.parse_args(argv)

    random.seed(SEED)
    sizes = QUICK if args.quick else FULL
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    t_start = time.perf_counter()
    tree_label = None
    if args.tree:
        tree_label = use_tree(Path(args.tree).resolve())
    report: dict[str, Any] = {
        "started": started,
        "quick": args.quick,
        "seed": SEED,
        "sizes": msgspec.to_builtins(sizes),
        "machine": machine(),
        "tree": tree_label or str(ROOT),
        "targets": TARGETS,
        "results": {},
        "notes": [],
    }
    results = report["results"]
    m = report["machine"]
    log(f"machine: {m['nproc']} CPUs, {m['cpu']}, python {m['python']}, kernel {m['kernel']}")

    def watchdog(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"the benchmark ran for more than {WATCHDOG_SECONDS[args.quick]} s; aborted")

    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(WATCHDOG_SECONDS[args.quick])
    wait = args.wait_quiet if args.wait_quiet is not None else (5.0 if args.quick else 20.0)
    report["quiet"] = wait_for_quiet(wait)
    log(f"other processes use {report['quiet']['others_cores_at_start']} cores at the start")
    tmp = Path(tempfile.mkdtemp(prefix="emb-", dir="/tmp"))
    whole = CpuMeter({})
    whole.__enter__()
    try:
        with contextlib.ExitStack() as stack:

            def launched(server_and_sock: tuple[Server, str]) -> tuple[Server, str]:
                stack.callback(server_and_sock[0].stop)
                return server_and_sock

            # --- 1 + 2 against one daemon (fsync always; none of these calls writes the journal
            # except the one remember that sets up the recalled key)
            daemon, sock = launched(start_daemon(tmp, "d1", "always"))
            with contextlib.closing(make_client(sock)) as client:
                client.call("persistent.remember", {"key": RECALL_KEY, "value": RECALL_VALUE, "tags": ["bench"]})
            results["rtt"] = {}
            with CpuMeter({"daemon": daemon.pid}) as meter:
                for method in ("sys.ping", "persistent.recall", "episodic.log"):
                    log(f"round trip {method} x {sizes.rtt_calls}")
                    results["rtt"][method] = rtt_client(sock, method, sizes.rtt_calls, sizes.rtt_warmup)
                log("round trip sys.ping on a bare socket")
                results["rtt_raw"] = {"sys.ping": rtt_raw(sock, "sys.ping", sizes.rtt_calls, sizes.rtt_warmup)}
            results["rtt_cores"] = meter.cores

            pipe: dict[str, Any] = {}
            results["pipelined"] = pipe
            for method in ("sys.ping", "persistent.recall", "episodic.log"):
                log(f"pipelined raw {method} x {sizes.pipe_ops}")
                pipelined_raw(sock, method, min(5000, sizes.pipe_ops))  # warm
                with CpuMeter({"daemon": daemon.pid}) as meter:
                    s = pipelined_raw(sock, method, sizes.pipe_ops)
                pipe[f"raw:{method}"] = with_cpu(s, meter, "daemon")
            for method in ("persistent.recall", "episodic.log"):
                log(f"pipelined call_many {method} x {sizes.many_ops}")
                with CpuMeter({"daemon": daemon.pid}) as meter:
                    s = pipelined_call_many(sock, method, sizes.many_ops)
                pipe[f"many:{method}"] = with_cpu(s, meter, "daemon")
            daemon.stop()

            # --- 4a. the echo floor
            echo, echo_sock = launched((
                Server("trio echo server", [PY, str(HERE / "echo_server.py"), str(tmp / "echo.sock")], "serving on").start(),
                str(tmp / "echo.sock"),
            ))
            log("echo floor: round trips and pipelined ping")
            results["echo"] = {
                "client": rtt_client(echo_sock, "sys.ping", sizes.rtt_calls, sizes.rtt_warmup),
                "raw": rtt_raw(echo_sock, "sys.ping", sizes.rtt_calls, sizes.rtt_warmup),
            }
            pipelined_raw(echo_sock, "sys.ping", min(5000, sizes.pipe_ops))
            with CpuMeter({"echo": echo.pid}) as meter:
                s = pipelined_raw(echo_sock, "sys.ping", sizes.pipe_ops)
            pipe["echo:sys.ping"] = with_cpu(s, meter, "echo")
            echo.stop()

            # --- 4b. Redis, in memory
            redis_ok = False
            if args.no_redis:
                results["redis_skipped"] = "--no-redis given"
            else:
                why_not = ensure_redis()
                if why_not:
                    results["redis_skipped"] = why_not
                    log(f"Redis skipped: {why_not}")
                else:
                    redis_ok = True
                    report["machine"]["redis"] = machine()["redis"]
                    results["redis"] = redis_in_memory(tmp, sizes, launched)

            # --- 3. durable writes, 32 clients; each of our runs right next to its Redis anchor and
            # right after a probe of the disk, whose speed drifts on shared machines (4c)
            results["durable"] = {}
            results["fdatasync"] = {}
            redis_durable: dict[str, Any] = {}
            if redis_ok:
                results["redis"]["durable"] = redis_durable
                rserver, rsock = launched(start_redis(tmp, "r2", durable=True))
            for policy, redis_policy in (("always", "always"), ("batch", "everysec")):
                log(f"fdatasync probes x {sizes.fsync_loops}")
                results["fdatasync"][policy] = fdatasync_cost(tmp / "fsync-probe", sizes.fsync_loops)
                if policy == "always":
                    results["fdatasync"]["small"] = fdatasync_cost(tmp / "fsync-probe", sizes.fsync_loops, 256)
                daemon, sock = launched(start_daemon(tmp, f"d-{policy}", policy))
                log(f"durable persistent.remember, fsync {policy}, {DURABLE_PROCS}x{DURABLE_THREADS} clients, {sizes.durable_seconds}s")
                with CpuMeter({"daemon": daemon.pid}) as meter:
                    s = durable_run(sock, daemon.pid, sizes.durable_seconds)
                s["cores"]["others"] = meter.cores["others"]
                s["journal"] = journal_stats(sock)
                results["durable"][policy] = s
                daemon.stop()
                if redis_ok:
                    # the disk again, between our run and Redis's: has it changed its mind?
                    results["fdatasync"][f"{policy}-between"] = fdatasync_cost(tmp / "fsync-probe", sizes.fsync_loops)
                    reply = redis_command(rsock, "CONFIG", "SET", "appendfsync", redis_policy)
                    if not reply.startswith(b"+OK"):
                        log(f"redis: CONFIG SET appendfsync {redis_policy} answered {reply!r}; skipped")
                        continue
                    log(f"redis: durable SET, appendfsync {redis_policy}, -c 32")
                    redis_durable[redis_policy] = redis_benchmark(
                        rserver, rsock, "set", sizes.redis_durable_n, clients=DURABLE_PROCS * DURABLE_THREADS, pipeline=1,
                        value_bytes=96, random_keys=True)["SET"]
            if redis_ok:
                rserver.stop()
    finally:
        signal.alarm(0)
        shutil.rmtree(tmp, ignore_errors=True)
        whole.__exit__(None, None, None)
    report["run_cores"] = whole.cores

    report["seconds"] = round(time.perf_counter() - t_start, 1)
    text = render(report)
    print(text)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stamp}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / f"{stamp}.md").write_text(text)
    log(f"wrote {out_dir / (stamp + '.json')} and .md")
    return 0


def redis_in_memory(tmp: Path, sizes: Sizes, launched: Callable[[tuple[Server, str]], tuple[Server, str]]) -> dict[str, Any]:
    """GET and SET on a Redis without persistence: unpipelined, 64 pipelined, 64 clients."""
    out: dict[str, Any] = {}
    server, sock = launched(start_redis(tmp, "r1", durable=False))
    log("redis: GET/SET unpipelined, -c 1 -P 1")
    out["unpipelined"] = redis_benchmark(server, sock, "set,get", sizes.redis_n // 5, clients=1, pipeline=1)
    log(f"redis: GET/SET -c 1 -P {WINDOW}")
    out["pipelined"] = redis_benchmark(server, sock, "set,get", sizes.redis_n * 5, clients=1, pipeline=WINDOW)
    log(f"redis: GET -c {WINDOW} -P 1")
    out["c64"] = redis_benchmark(server, sock, "get", sizes.redis_n, clients=WINDOW, pipeline=1)
    server.stop()
    return out


if __name__ == "__main__":
    sys.exit(main())
