#!/usr/bin/env python3
"""Tier 4's decisions across nodes (issue 26 §2): what checking memory.add's dedup against the committed rows costs.

    .venv/bin/python bench/bench_dedup_nodes.py [--seconds S] [--clients C] [--out DIR]

Starts its own PostgreSQL (tests/pg_server.py) and daemons on fresh data roots under /tmp, and
writes DIR/report.md and report.json (default bench/results/dedup-nodes-<timestamp>/). Sections:

- adds: memory.add (dedup on, texts of their own) from C client threads per daemon for S seconds:
  the journal store's one daemon (the anchor: a daemon alone, as before the change), one node on
  PostgreSQL, two nodes adding in one domain, two nodes adding in a domain each; the adds/s of all
  together, and how many batches were decided again after another node's commit (`decided_again`).
- shapes: the transaction a memory batch commits, from 2 threads on 2 connections, raw psycopg,
  the shapes in turn for S/ROUNDS seconds each, ROUNDS times (the median): the feed's lock and one insert (the anchor: a batch of a tier without a
  check), plus the check daemon/memory/concurrency.py chose (the feed's tail read after the lock),
  plus a per-domain advisory lock before that read, plus row locks on 3 candidate rows.

The machine is shared: read the ratios, not the absolute figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # pg_server, daemon_process: the tests' own

from pg_server import PostgresServer  # noqa: E402

from daemon_process import DaemonProcess  # noqa: E402
from eurekamem.client import Client  # noqa: E402

WORDS = [f"w{i}" for i in range(5000)]


def drive(procs: list[DaemonProcess], domains: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """C client threads per daemon adding memories for `seconds`; adds/s of all together."""
    counts: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(proc: DaemonProcess, domain: str, seed: int) -> None:
        rng = random.Random(seed)
        done = 0
        with Client(proc.socket_path, timeout=60) as client:
            while time.monotonic() < stop:
                words = rng.sample(WORDS, 12)
                client.add_memory(domain, "fact", " ".join(words[:3]), " ".join(words) + ".")
                done += 1
        with lock:
            counts.append(done)

    threads = [
        threading.Thread(target=run, args=(proc, domain, 1000 * i + c))
        for i, (proc, domain) in enumerate(zip(procs, domains))
        for c in range(clients)
    ]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    again = 0
    for proc in procs:
        with Client(proc.socket_path, timeout=60) as client:
            again += client.stats()["memory"].get("decided_again", 0)
    return {"adds": sum(counts), "adds_per_s": sum(counts) / elapsed, "decided_again": again}


def sec_adds(pg: PostgresServer, work: Path, clients: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    cases = [
        ("journal, 1 daemon (anchor)", "journal", 1, ["solo"]),
        ("postgres, 1 node", "postgres", 1, ["solo"]),
        ("postgres, 2 nodes, one domain", "postgres", 2, ["shared", "shared"]),
        ("postgres, 2 nodes, a domain each", "postgres", 2, ["left", "right"]),
    ]
    for name, store, count, domains in cases:
        dsn = pg.create_database() if store == "postgres" else ""
        base = work / name.replace(" ", "_").replace(",", "")
        extra = ["--store", "postgres", "--postgres-dsn", dsn] if dsn else []
        procs = [DaemonProcess(base / f"n{i}", base / f"n{i}.sock", *extra) for i in range(count)]
        try:
            for proc in procs:
                proc.start()
            drive(procs, domains, 1, 1.0)  # warm: the model loaded, the first batches
            result = drive(procs, domains, clients, seconds)
        finally:
            for proc in procs:
                proc.kill()
            if dsn:
                pg.drop_database(dsn)
        rows.append({"case": name, **result})
        print(f"  {name}: {result['adds_per_s']:.1f} adds/s, decided again {result['decided_again']}", flush=True)
    return rows


ROUNDS = 5  # the shapes measured in turn, this many times each (the machine is shared: the median)
SHAPES = {
    "feed lock + insert (anchor)": [],
    "+ feed tail read (chosen)": ["tail"],
    "+ per-domain advisory lock + tail read": ["domain", "tail"],
    "+ row locks on 3 candidates + tail read": ["rows", "tail"],
}


def sec_shapes(pg: PostgresServer, seconds: float) -> list[dict[str, Any]]:
    import psycopg

    from eurekamem.daemon.postgres.store import take_feed_lock

    dsn = pg.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE feed (seq bigserial PRIMARY KEY, node text, body bytea)")
        conn.execute("CREATE TABLE mems (id bigint PRIMARY KEY, body bytea)")
        conn.execute("INSERT INTO mems SELECT g, 'x' FROM generate_series(1, 1000) g")
    rates: dict[str, list[float]] = {name: [] for name in SHAPES}
    try:
        for _round, (name, steps) in ((r, shape) for r in range(ROUNDS) for shape in SHAPES.items()):
            counts = [0, 0]
            seen = [0, 0]  # the last seq each thread wrote
            stop = time.monotonic() + seconds

            def run(t: int, steps: list[str] = steps, stop: float = stop, counts: list[int] = counts, seen: list[int] = seen) -> None:
                rng = random.Random(t)
                with psycopg.connect(dsn) as conn:
                    while time.monotonic() < stop:
                        with conn.transaction():
                            if "domain" in steps:
                                conn.execute("SELECT pg_advisory_xact_lock(727010, hashtext(%s))", (f"d{rng.randrange(4)}",))
                            take_feed_lock(conn.cursor())
                            if "rows" in steps:
                                ids = [rng.randrange(1, 1001) for _ in range(3)]
                                conn.execute("SELECT id FROM mems WHERE id = ANY(%s) FOR UPDATE", (ids,)).fetchall()
                            if "tail" in steps:  # after the seq this thread saw last, less a few: a range of the key
                                conn.execute("SELECT seq, node, body FROM feed WHERE seq > %s ORDER BY seq", (seen[t] - 3,)).fetchall()
                            seen[t] = conn.execute(
                                "INSERT INTO feed (node, body) VALUES (%s, %s) RETURNING seq", (f"t{t}", b"x" * 400)
                            ).fetchone()[0]
                        counts[t] += 1

            threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
            began = time.monotonic()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            rates[name].append(sum(counts) / (time.monotonic() - began))
    finally:
        pg.drop_database(dsn)
    rows = [{"shape": name, "commits_per_s": statistics.median(found), "rounds": found} for name, found in rates.items()]
    for row in rows:
        print(f"  {row['shape']}: {row['commits_per_s']:.0f} commits/s (median of {ROUNDS})", flush=True)
    return rows


def render(adds: list[dict[str, Any]], shapes: list[dict[str, Any]]) -> str:
    out = ["# Tier 4's decisions across nodes (bench/bench_dedup_nodes.py)", "", "## memory.add (dedup on)", ""]
    out += ["| case | adds/s | vs anchor | decided again |", "|---|---|---|---|"]
    anchor = adds[0]["adds_per_s"] or 1.0
    for row in adds:
        out.append(f"| {row['case']} | {row['adds_per_s']:.1f} | {row['adds_per_s'] / anchor:.2f} | {row['decided_again']} |")
    out += ["", "## a memory batch's transaction, raw psycopg, 2 connections", ""]
    out += ["| shape | commits/s | vs anchor |", "|---|---|---|"]
    anchor = shapes[0]["commits_per_s"] or 1.0
    for row in shapes:
        out.append(f"| {row['shape']} | {row['commits_per_s']:.0f} | {row['commits_per_s'] / anchor:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or HERE / "results" / f"dedup-nodes-{time.strftime('%Y%m%d-%H%M%S')}"
    work = Path(tempfile.mkdtemp(prefix="eurekamem-dedup-bench-"))
    pg = PostgresServer()
    pg.init()
    try:
        print("shapes:", flush=True)
        shapes = sec_shapes(pg, args.seconds / ROUNDS)
        print("adds:", flush=True)
        adds = sec_adds(pg, work, args.clients, args.seconds)
    finally:
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    text = render(adds, shapes)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({"adds": adds, "shapes": shapes}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
