#!/usr/bin/env python3
"""The team's job queue (store = postgres, daemon/postgres/jobqueue.py): claims and guarded
completions per second with 1 / 2 / 3 nodes on one database, beside a raw `SKIP LOCKED` loop (issue 26 §3).

    .venv/bin/python bench/bench_jobqueue.py [--quick] [--jobs N] [--workers W] [--out DIR]

Starts its own PostgreSQL (tests/pg_server.py). Each configuration gets a fresh database holding N
accepted jobs (AcceptJob mutations committed by the PostgresStore, as a daemon accepts them), then
runs 1, 2 or 3 node processes at once, each a TeamQueue on its own PostgresStore (pool of W) with W
workers, each worker claiming one job (`TeamQueue.claim`: SKIP LOCKED, the job's record and input
read from `jobs`, started by JobsState's rules, a PutJob through the feed, the lease) and then
completing it (`TeamQueue.commit`: the row lock, the lease checked, a CommitJob through the feed),
until the queue is empty; no LLM, no tier: the queue's own cost. The anchor, in the same run: as
many processes and workers on a bare table of the same N rows, each worker one transaction
`SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1` + `UPDATE` (the claim with its lease) and one `SELECT
... FOR UPDATE` + `UPDATE` (the completion), the least a leased queue can do. Reported: jobs/s
(each a claim and a completion), the ratio to the anchor, and that every job ran exactly once.

The machine is shared: read the ratios, not the absolute figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pg_server: the tests' PostgreSQL

from _common import log, machine, table, write_report  # noqa: E402


def fill(dsn: str, jobs: int) -> None:
    """`jobs` accepted session.extract jobs, as the daemon's accept writes them; and the anchor's bare rows."""
    import psycopg

    from eurekamem.daemon.jobs.state import AcceptJob, JobRecord, SessionInput
    from eurekamem.daemon.postgres.store import PostgresStore

    store = PostgresStore(dsn, pool_size=1)
    store.open()
    try:
        for start in range(0, jobs, 500):
            store._commit_sync([
                AcceptJob(
                    JobRecord(id=f"j{i:07d}", kind="session.extract", key=f"k{i}", state="queued", created_at="2026-12-05T00:00:00Z"),
                    SessionInput(session_id=f"s{i}", domain="bench"),
                )
                for i in range(start, min(jobs, start + 500))
            ])
    finally:
        store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE raw_queue (id bigint PRIMARY KEY, state text NOT NULL, node text, token text,"
            " lease_until timestamptz, body bytea)"
        )
        conn.execute("CREATE INDEX ON raw_queue (id) WHERE state = 'queued'")
        conn.execute("INSERT INTO raw_queue SELECT i, 'queued', NULL, NULL, NULL, NULL FROM generate_series(1, %s) i", (jobs,))
        conn.execute("ANALYZE")  # as autovacuum would have by then: the planner knows the tables


def team_node(dsn: str, name: str, workers: int, start: Any, out: Any) -> None:
    """One node: `workers` claim-and-complete loops until nothing is claimable; puts (name, done ids)."""
    import msgspec
    import trio

    from eurekamem.daemon.jobs.state import CommitJob
    from eurekamem.daemon.postgres.jobqueue import TeamQueue
    from eurekamem.daemon.postgres.store import PostgresStore

    store = PostgresStore(dsn, pool_size=workers)
    store.open()
    queue = TeamQueue(store, name, lease=30.0, renew=5.0)
    done: list[str] = []

    async def worker() -> None:
        while True:
            claim = await queue.claim(1, ["session.extract"], 5, lambda kind, job_input: None)
            if not claim.claimed:
                return
            [(record, _, token)] = claim.claimed
            finished = msgspec.structs.replace(record, state="done", result={"by": name})
            await queue.commit([CommitJob(finished)], record.id, token)
            done.append(record.id)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                nursery.start_soon(worker)

    start.wait()  # every node connected: the clock starts
    trio.run(main)
    store.close()
    out.put((name, done))


def raw_node(dsn: str, name: str, workers: int, start: Any, out: Any) -> None:
    """The anchor's node: `workers` threads, each its own connection, claim + complete on raw_queue."""
    import secrets
    import threading

    import psycopg

    done: list[int] = []
    lock = threading.Lock()

    conns = [psycopg.connect(dsn) for _ in range(workers)]

    def worker(conn: Any) -> None:
        with conn:
            while True:
                token = secrets.token_hex(8)
                with conn.transaction():
                    row = conn.execute(
                        "SELECT id FROM raw_queue WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
                    ).fetchone()
                    if row is None:
                        return
                    conn.execute(
                        "UPDATE raw_queue SET state = 'running', node = %s, token = %s,"
                        " lease_until = now() + interval '30 seconds' WHERE id = %s",
                        (name, token, row[0]),
                    )
                with conn.transaction():
                    held = conn.execute("SELECT node, token FROM raw_queue WHERE id = %s FOR UPDATE", (row[0],)).fetchone()
                    assert held == (name, token)
                    conn.execute("UPDATE raw_queue SET state = 'done', body = %s WHERE id = %s", (b"x" * 64, row[0]))
                with lock:
                    done.append(row[0])

    threads = [threading.Thread(target=worker, args=(conn,)) for conn in conns]
    start.wait()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((name, done))


def run_nodes(target: Any, dsn: str, nodes: int, workers: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(nodes + 1)  # the nodes connected, then the clock starts
    out = context.Queue()
    procs = [context.Process(target=target, args=(dsn, f"node-{n}", workers, start, out)) for n in range(nodes)]
    for proc in procs:
        proc.start()
    start.wait()
    began = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - began
    for proc in procs:
        proc.join()
    every = [job for _, done in results for job in done]
    return {
        "nodes": nodes,
        "jobs": len(every),
        "distinct": len(set(every)),
        "per_node": sorted(len(done) for _, done in results),
        "seconds": round(wall, 3),
        "jobs_per_s": round(len(every) / wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs (a smoke run)")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2, help="claiming workers per node (jobs_concurrency)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    jobs = 300 if args.quick else args.jobs
    from pg_server import PostgresServer

    server = PostgresServer()
    server.init()
    results: list[dict[str, Any]] = []
    try:
        for nodes in (1, 2, 3):
            row: dict[str, Any] = {"nodes": nodes}
            for name, target in (("team", team_node), ("raw", raw_node)):
                dsn = server.create_database()
                fill(dsn, jobs)
                row[name] = run_nodes(target, dsn, nodes, args.workers)
                server.drop_database(dsn)
                log(f"{nodes} nodes, {name}: {row[name]}")
            results.append(row)
    finally:
        server.destroy()
    lines = [
        "# The team's job queue: claims and guarded completions per second",
        "",
        f"{jobs} jobs, {args.workers} workers per node; each job one claim (SKIP LOCKED + lease) and one "
        "guarded completion. Anchor: the bare SKIP LOCKED claim + locked completion on a table of the same rows.",
        "",
        *table(
            ["nodes", "team jobs/s", "raw jobs/s", "team / raw", "each job once", "per node (team)"],
            [
                [
                    r["nodes"], r["team"]["jobs_per_s"], r["raw"]["jobs_per_s"],
                    f"{r['team']['jobs_per_s'] / r['raw']['jobs_per_s']:.2f}x",
                    r["team"]["jobs"] == r["team"]["distinct"] == jobs, r["team"]["per_node"],
                ]
                for r in results
            ],
        ),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = args.out or HERE / "results" / f"jobqueue-{time.strftime('%Y%m%d-%H%M%S')}"
    write_report(out, "report", text, {"jobs": jobs, "workers": args.workers, "results": results, "machine": machine()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
