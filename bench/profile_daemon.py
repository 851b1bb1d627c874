#!/usr/bin/env python3
"""Where the daemon's time goes: profile a real daemon under one of the bench's loads.

    .venv/bin/python bench/profile_daemon.py --load ping     # unpipelined sys.ping, one Client
    .venv/bin/python bench/profile_daemon.py --load log      # episodic.log, 64 in flight, raw socket
    .venv/bin/python bench/profile_daemon.py --load recall   # persistent.recall, 64 in flight
    .venv/bin/python bench/profile_daemon.py --load durable --fsync always   # 32 clients, remember

    --tool py-spy    (default when py-spy is on PATH or given with --py-spy) samples the running
                     daemon from outside: little overhead, own time per Python function, C calls
                     counted in the Python function that made them. `pip install py-spy`.
    --tool cprofile  runs the daemon under cProfile (python -m cProfile -m eurekamem.daemon serve):
                     exact call counts and builtins (socket send, epoll) as their own rows, but every
                     Python call costs extra, so small functions look bigger than they are.

Prints the top functions by own ("self") time and writes the table and the raw profile
(py-spy's collapsed stacks, or the cProfile .prof file) to --out (default bench/results).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (bench/run.py: the same daemon start-up, clients and loads)

LOADS = ("ping", "log", "recall", "durable")


def load_ping(sock: str, seconds: float) -> str:
    with contextlib.closing(bench.make_client(sock)) as client:
        deadline = time.monotonic() + seconds
        n = 0
        for n in range(1, 10_000_000):
            client.call("sys.ping")
            if n % 256 == 0 and time.monotonic() > deadline:
                break
    return f"{n} unpipelined sys.ping calls in {seconds:.0f} s ({n / seconds:,.0f}/s)"


def load_pipelined(method: str):
    def load(sock: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        ops = 0
        for _ in range(10_000):
            ops += bench.pipelined_raw(sock, method, 10_000)["ops"]
            if time.monotonic() > deadline:
                break
        return f"{ops} pipelined {method} ({bench.WINDOW} in flight) in {seconds:.0f} s ({ops / seconds:,.0f}/s)"

    return load


def load_durable(daemon_pid: int):
    def load(sock: str, seconds: float) -> str:
        result = bench.durable_run(sock, daemon_pid, seconds)
        journal = bench.journal_stats(sock)
        return (
            f"{result['writes']} durable remembers from {result['clients']} clients in {result['seconds']} s "
            f"({result['writes_per_s']:,}/s, p50 {result['p50_us']} us, {journal['records_per_fsync_batch']} per journal batch)"
        )

    return load


def warm(sock: str, load: str) -> None:
    if load == "ping":
        with contextlib.closing(bench.make_client(sock)) as client:
            for _ in range(1000):
                client.call("sys.ping")
    elif load in ("log", "recall"):
        bench.pipelined_raw(sock, "episodic.log" if load == "log" else "persistent.recall", 5000)


# --- py-spy -------------------------------------------------------------------------------------


IDLE_LEAVES = ("epoll_wait (", "EpollIOManager.get_events (")  # the event loop waiting for work


def self_time_table(collapsed: Path, top: int) -> tuple[str, dict[str, Any]]:
    """Own and inclusive samples per function of the main thread (the event loop), from py-spy's
    raw collapsed stacks; samples waiting in epoll are counted apart, as idle. Other threads (trio's
    worker threads: the journal's write + fdatasync) get a short table of their own."""
    per_thread: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        thread = "?"
        while frames and frames[0].startswith(("thread (", "process ")):
            if frames[0].startswith("thread ("):
                thread = frames[0]
            frames = frames[1:]
        if frames:
            per_thread[thread].append((frames, int(count_text)))
    totals = {t: sum(c for _, c in rows) for t, rows in per_thread.items()}
    main = next((t for t in per_thread if "MainThread" in t), max(totals, key=totals.get) if totals else "?")
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    idle = 0
    for frames, count in per_thread.get(main, []):
        if frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        own[frames[-1]] += count
        for name in set(frames):
            incl[name] += count
    busy = sum(own.values()) or 1
    lines = [
        f"Main thread (the event loop): {totals.get(main, 0)} samples, {idle} of them waiting in epoll "
        f"({100 * idle / max(totals.get(main, 1), 1):.0f} %), {busy} busy. Percentages below are of the busy samples.",
        "",
        "| # | function (file) — own time | own % | own samples | incl. % |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for i, (name, count) in enumerate(own.most_common(top), 1):
        lines.append(f"| {i} | `{name}` | {100 * count / busy:.1f} | {count} | {100 * incl[name] / busy:.1f} |")
    lines += ["", "Inclusive time of the main thread's busy samples (a function and all it calls):", "",
              "| function (file) | incl. % |", "| --- | ---: |"]
    shown = 0
    for name, count in incl.most_common():
        if count >= busy * 0.99:  # run(), main(), <module>, the thread start: everything
            continue
        lines.append(f"| `{name}` | {100 * count / busy:.1f} |")
        shown += 1
        if shown >= top:
            break
    for thread, rows in per_thread.items():
        if thread == main:
            continue
        leaves: collections.Counter[str] = collections.Counter()
        for frames, count in rows:
            leaves[frames[-1]] += count
        lines += ["", f"Other thread {thread}: {totals[thread]} samples; own time by leaf:", "",
                  "| leaf | samples |", "| --- | ---: |"]
        lines += [f"| `{name}` | {count} |" for name, count in leaves.most_common(8)]
    return "\n".join(lines), {"samples": sum(totals.values()), "threads": totals, "idle": idle, "busy": busy}


def run_py_spy(py_spy: str, args: argparse.Namespace, tmp: Path, out_dir: Path, stamp: str) -> str:
    daemon, sock = bench.start_daemon(tmp, "prof", args.fsync)
    try:
        if args.load == "recall":
            with contextlib.closing(bench.make_client(sock)) as client:
                client.call("persistent.remember", {"key": bench.RECALL_KEY, "value": bench.RECALL_VALUE})
        warm(sock, args.load)
        raw = out_dir / f"profile-{args.load}-py-spy-{stamp}.txt"
        argv = [py_spy, "record", "--pid", str(daemon.pid), "--rate", str(args.rate), "--duration", str(int(args.seconds)),
                "--format", "raw", "--nolineno", "--threads", "-o", str(raw)]
        if args.native:
            argv.append("--native")
        spy = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.3)  # let py-spy attach
        cpu0 = bench.proc_cpu_seconds(daemon.pid)
        t0 = time.perf_counter()
        described = loader(args, daemon)(sock, args.seconds)
        wall = time.perf_counter() - t0
        cores = (bench.proc_cpu_seconds(daemon.pid) - cpu0) / wall
        spy_out, _ = spy.communicate(timeout=args.seconds + 60)
    finally:
        daemon.stop()
    table, meta = self_time_table(raw, args.top)
    expected = args.rate * args.seconds
    return (
        f"Load: {described}; daemon busy {cores:.2f} cores.\n\n"
        f"py-spy {'--native ' if args.native else ''}at {args.rate} Hz for {args.seconds:.0f} s: {meta['samples']} samples "
        f"(~{expected:.0f} per thread possible); samples per thread: {meta['threads']}.\n"
        f"py-spy: {spy_out.strip().splitlines()[-2] if spy_out.strip() else ''}\n\n"
        f"Own time by function:\n\n{table}\n\nRaw stacks: {raw}\n"
    )


# --- cProfile -----------------------------------------------------------------------------------


REPO = str(Path(__file__).resolve().parent.parent)  # this checkout: paths in it are shown relative


def short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    for marker in ("site-packages/", REPO + "/", "lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{name} ({filename}:{line})"


def run_cprofile(args: argparse.Namespace, tmp: Path, out_dir: Path, stamp: str) -> str:
    prof = out_dir / f"profile-{args.load}-cprofile-{stamp}.prof"
    data = tmp / "prof-data"
    sock = str(tmp / "prof.sock")
    argv = [bench.PY, "-m", "cProfile", "-o", str(prof), "-m", "eurekamem.daemon", "serve", "--data-dir", str(data),
            "--socket", sock, "--fsync", args.fsync]
    daemon = bench.Server(f"eurekamem under cProfile (fsync {args.fsync})", argv, "serving on").start()
    try:
        if args.load == "recall":
            with contextlib.closing(bench.make_client(sock)) as client:
                client.call("persistent.remember", {"key": bench.RECALL_KEY, "value": bench.RECALL_VALUE})
        warm(sock, args.load)
        described = loader(args, daemon)(sock, args.seconds)
    finally:
        daemon.stop(60)
    stats = pstats.Stats(str(prof))
    total = stats.total_tt
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # (cc, nc, tt, ct, callers)
    lines = ["| # | function | calls | own s | own % | own µs/call | cumulative s |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for i, (func, (_cc, nc, tt, ct, _callers)) in enumerate(rows[: args.top], 1):
        lines.append(f"| {i} | `{short(func)}` | {nc} | {tt:.3f} | {100 * tt / total:.1f} | {1e6 * tt / max(nc, 1):.2f} | {ct:.3f} |")
    return (
        f"Load: {described}.\n\ncProfile of the daemon's main thread over its whole life ({total:.2f} s of own time in "
        f"all functions, idle time in epoll included as its own row):\n\n" + "\n".join(lines) + f"\n\nRaw profile: {prof}\n"
    )


def loader(args: argparse.Namespace, daemon: bench.Server):
    if args.load == "ping":
        return load_ping
    if args.load == "log":
        return load_pipelined("episodic.log")
    if args.load == "recall":
        return load_pipelined("persistent.recall")
    return load_durable(daemon.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=LOADS, default="ping")
    parser.add_argument("--tool", choices=("py-spy", "cprofile"), default=None)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="path of the py-spy binary")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--no-native", dest="native", action="store_false",
                        help="without py-spy --native (then C calls count as own time of their Python caller)")
    parser.add_argument("--fsync", default="always", choices=("always", "batch", "off"))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--tree", help="profile the eurekamem of another source tree (as run.py --tree)")
    args = parser.parse_args(argv)
    if args.tree:
        bench.use_tree(Path(args.tree).resolve())
    tool = args.tool or ("py-spy" if args.py_spy else "cprofile")
    if tool == "py-spy" and not args.py_spy:
        parser.error("py-spy not found: `pip install py-spy`, or pass --py-spy PATH, or use --tool cprofile")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="emp-", dir="/tmp"))
    try:
        body = run_py_spy(args.py_spy, args, tmp, out_dir, stamp) if tool == "py-spy" else run_cprofile(args, tmp, out_dir, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = bench.machine()
    text = (
        f"# Profile of the daemon: load `{args.load}`, {tool}, fsync {args.fsync}\n\n"
        f"{m['nproc']} CPUs ({m['cpu']}), python {m['python']}, kernel {m['kernel']}, "
        f"{'tree ' + args.tree if args.tree else 'commit ' + m['commit']}\n\n{body}"
    )
    print(text)
    (out_dir / f"profile-{args.load}-{tool}-{stamp}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
