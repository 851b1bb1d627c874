#!/usr/bin/env python3
"""Several daemons on one PostgreSQL: the change feed's costs and delays (issue 26).

    .venv/bin/python bench/bench_feed.py [--quick] [--seconds S] [--rate R] [--catchup N] [--only ...] [--out DIR]

Starts its own PostgreSQL (tests/pg_server.py) and its own daemons on fresh data roots under /tmp,
and writes DIR/report.md and report.json (default bench/results/feed-<timestamp>/). Sections:

- lock: what the feed adds to a commit, in this process, on PostgresStore's own transaction code:
  8 and 32 threads each committing a `persistent.remember`'s mutation in a loop, as part 1 did
  (no feed lock, no NOTIFY), with the feed's advisory lock, and with the lock and the NOTIFY; and
  as many trio tasks (tier actors) awaiting `PostgresStore.commit`, which puts the batches that
  wait into one transaction (the daemon's path); alternating, twice each; writes/s, ratios to part 1's.
- nodes: durable `persistent.remember` writes/s on node A (16 clients: the C loadgen where a
  compiler is there, else the Python client) with 1, 2 and 3 nodes on the database (the others
  following the feed), and how long the followers took to reach the head after.
- lag: node A written at a paced rate (--rate, default 1,000 writes/s, from 8 client threads), a
  reader on node B polling each key in turn: the delay from A's answer to the key's visibility on
  B (and from the write's send), p50 / p99.
- catchup: node B suspended (SIGSTOP) while N mutations (default 100,000 `persistent.remember`
  mutations, committed 300 a transaction by this process through PostgresStore) go into the feed;
  then resumed: how long it takes to apply them (mutations/s). Beside it, a new node loading the
  same tables (spawn to ready).

The machine is shared (two cores for the database, the daemons and the load): read the ratios.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run, _common (whose pg_bench finds tests/pg_server.py)

import run as foundation  # noqa: E402

import _common as common  # noqa: E402
from _common import Daemon, client, fmt_ms, fmt_rate, log  # noqa: E402

MODEL = "usem3"


def pg_flags(dsn: str, name: str) -> list[str]:
    return ["--store", "postgres", "--postgres-dsn", dsn, "--node-name", name, "--embedder", MODEL]


def record(key: str) -> Any:
    from eurekamem.daemon.tiers.persistent import PutRecord
    from eurekamem.protocol import CrossRunRecord

    at = "2026-01-01T00:00:00Z"
    return PutRecord(CrossRunRecord(record_id=key, key=key, value=foundation.DURABLE_VALUE, created_at=at, updated_at=at))


# --- lock: the commit's cost ---------------------------------------------------------------------------


def commits(dsn: str, threads: int, seconds: float, variant: str) -> dict[str, Any]:
    """`threads` threads committing one PutRecord each transaction through PostgresStore, for `seconds`."""
    from eurekamem.daemon.postgres import store as pg

    saved = pg._FEED_LOCK, pg._NOTIFY
    if variant != "lock+notify":
        pg._NOTIFY = "SELECT 1"
    if variant == "none":
        pg._FEED_LOCK = "SELECT 1"
    store = pg.PostgresStore(dsn, pool_size=threads)
    store.open()
    counts = [0] * threads
    stop = threading.Event()
    go = threading.Barrier(threads + 1)

    def write(t: int) -> None:
        store._commit_sync([record(f"warm.{t}")], 1)
        go.wait()
        i = 0
        while not stop.is_set():
            store._commit_sync([record(f"lock.{variant}.{t}.{i}")], 1)
            i += 1
        counts[t] = i

    workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
    try:
        for worker in workers:
            worker.start()
        go.wait()
        t0 = time.perf_counter()
        time.sleep(seconds)  # the run's length: the writers write meanwhile
        stop.set()
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - t0
    finally:
        store.close()
        pg._FEED_LOCK, pg._NOTIFY = saved
    return {"threads": threads, "variant": variant, "writes": sum(counts), "writes_per_s": round(sum(counts) / wall)}


def grouped(dsn: str, tasks: int, seconds: float) -> dict[str, Any]:
    """`tasks` trio tasks (as many tier actors) each awaiting PostgresStore.commit of one PutRecord in
    a loop, for `seconds`: the daemon's path, where the batches waiting go in one transaction."""
    import trio

    from eurekamem.daemon.postgres.store import PostgresStore

    store = PostgresStore(dsn, pool_size=4)
    store.open()
    counts = [0] * tasks

    async def main() -> None:
        async def write(t: int) -> None:
            while True:
                await store.commit([record(f"grouped.{t}.{counts[t]}")])
                counts[t] += 1

        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for t in range(tasks):
                    nursery.start_soon(write, t)

    t0 = time.perf_counter()
    try:
        trio.run(main)
    finally:
        store.close()
    return {"tasks": tasks, "writes": sum(counts), "writes_per_s": round(sum(counts) / (time.perf_counter() - t0))}


def sec_lock(ctx: dict[str, Any]) -> dict[str, Any]:
    dsn = ctx["server"].create_database()
    out: dict[str, Any] = {}
    for threads in (8, 32):
        runs: dict[str, list[int]] = {"none": [], "lock": [], "lock+notify": [], "grouped": []}
        for _round in range(2):
            for variant in runs:
                log(f"lock: {threads} writers, {variant}, {ctx['seconds']} s")
                if variant == "grouped":
                    runs[variant].append(grouped(dsn, threads, ctx["seconds"])["writes_per_s"])
                else:
                    runs[variant].append(commits(dsn, threads, ctx["seconds"], variant)["writes_per_s"])
        best = {variant: max(rates) for variant, rates in runs.items()}
        out[str(threads)] = {"runs": runs, "best": best,
                             "ratio_lock": round(best["lock"] / best["none"], 3),
                             "ratio_notify": round(best["lock+notify"] / best["none"], 3),
                             "ratio_daemon": round(best["grouped"] / best["none"], 3)}
    return out


# --- nodes: durable writes with 1 / 2 / 3 nodes ------------------------------------------------------------


def applied(sock: str) -> int:
    c = client(sock, 30.0)
    try:
        return int(c.stats()["store"]["feed"]["applied_seq"])
    finally:
        c.close()


def head(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT coalesce(max(seq), 0) FROM mutations").fetchone()[0])


def wait_applied(socks: list[str], target: int, timeout: float = 600.0) -> float:
    """Seconds until every node's follower applied up to `target` (sys.stats, every 10 ms)."""
    t0 = time.perf_counter()
    for sock in socks:
        while applied(sock) < target:
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{sock} did not reach seq {target} in {timeout:.0f} s")
            time.sleep(0.01)
    return time.perf_counter() - t0


# part 1's commit (issue 25: no feed lock, no NOTIFY), for the paired runs: the daemon started with
# its statements replaced in this bench only (the daemon has no such setting)
PART_1 = ("import sys; from eurekamem.daemon.postgres import store; store._FEED_LOCK = store._NOTIFY = 'SELECT 1'; "
          "from eurekamem.daemon.__main__ import main; sys.exit(main(sys.argv[1:]))")


def node(ctx: dict[str, Any], name: str, dsn: str, part_1: bool = False) -> Daemon:
    tmp: Path = ctx["tmp"]
    d = Daemon(name, tmp / name, str(tmp / f"{name}.sock"), extra=pg_flags(dsn, name))
    if part_1:
        d.argv[1:3] = ["-c", PART_1]  # [PY, "-m", "eurekamem.daemon", ...] -> [PY, "-c", PART_1, ...]
    result: Daemon = ctx["launch"](d)
    return result


def durable(ctx: dict[str, Any], d: Daemon, clients: int) -> dict[str, Any]:
    binary, _why_not = foundation.loadgen_binary(ctx["tmp"])
    if binary:
        return foundation.loadgen_durable(binary, d.sock, clients, ctx["seconds"])
    return foundation.durable_run(d.sock, d.pid, ctx["seconds"], 4, max(1, clients // 4), warm=3)


def sec_nodes(ctx: dict[str, Any]) -> dict[str, Any]:
    """Durable writes/s on one node, part 1's commit against the feed's (alternating, twice, each on
    a fresh database), at 8 and 32 clients; then with 2 and 3 nodes on the database (32 clients on a)."""
    binary, why_not = foundation.loadgen_binary(ctx["tmp"])
    out: dict[str, Any] = {"driver": "C loadgen" if binary else f"Python client ({why_not})", "paired": {}, "nodes": {}}
    runs = 0
    for clients in (8, 32):
        rates: dict[str, list[Any]] = {"part 1": [], "feed": []}
        for _round in range(2):
            for variant in rates:
                runs += 1
                d = node(ctx, f"w{runs}", ctx["server"].create_database(), part_1=variant == "part 1")
                log(f"nodes: 1 node, {variant}'s commit, {clients} clients, {ctx['seconds']} s")
                rates[variant].append(durable(ctx, d, clients).get("writes_per_s"))
                d.stop()
        best = {variant: max(r or 0 for r in rs) for variant, rs in rates.items()}
        out["paired"][str(clients)] = {"runs": rates, "best": best, "ratio": round(best["feed"] / best["part 1"], 3)}
    for n in (1, 2, 3):
        dsn = ctx["server"].create_database()
        nodes = [node(ctx, f"n{n}{name}", dsn) for name in "abc"[:n]]
        log(f"nodes: {n} on the database, 32 clients on node a, {ctx['seconds']} s")
        s = durable(ctx, nodes[0], 32)
        settle = wait_applied([d.sock for d in nodes[1:]], head(dsn))
        out["nodes"][str(n)] = {"writes_per_s": s.get("writes_per_s"), "writes": s.get("writes"), "errors": s.get("errors"),
                                "followers_settled_s": round(settle, 3)}
        for d in nodes:
            d.stop()
    return out


# --- lag: a write on A, visible on B ------------------------------------------------------------------


def sec_lag(ctx: dict[str, Any]) -> dict[str, Any]:
    """Node a written at a paced rate from 16 client threads; node b's follower measures each write's
    visibility (from the row's writing, under the feed's lock, to its application on b: sys.stats →
    store.feed.visibility_ms, the same machine's clock)."""
    dsn = ctx["server"].create_database()
    a, b = node(ctx, "lag-a", dsn), node(ctx, "lag-b", dsn)
    rate, seconds, writers = ctx["rate"], ctx["seconds"] * 2, 16
    total = int(rate * seconds)
    latency = [0.0] * total
    t0 = time.perf_counter() + 0.5

    def write(w: int) -> None:
        c = client(a.sock, 30.0)
        try:
            for i in range(w, total, writers):  # key i is due at t0 + i / rate
                pause = t0 + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                sent = time.perf_counter()
                c.remember(f"lag.{i}", i)
                latency[i] = time.perf_counter() - sent
        finally:
            c.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    log(f"lag: {total} writes on a at {rate}/s, b follows")
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    span = time.perf_counter() - t0
    wait_applied([b.sock], head(dsn))
    c = client(b.sock, 30.0)
    try:
        feed = c.stats()["store"]["feed"]
    finally:
        c.close()
    a.stop()
    b.stop()
    return {"rate_asked": rate, "rate_done": round(total / span), "writes": total, "visibility_ms": feed["visibility_ms"],
            "applied": feed["mutations"], "write_latency": common.summarize_s(latency)}


# --- catch-up ------------------------------------------------------------------------------------------


def sec_catchup(ctx: dict[str, Any]) -> dict[str, Any]:
    from eurekamem.daemon.postgres.migrate import commit_all
    from eurekamem.daemon.postgres.store import PostgresStore

    tmp: Path = ctx["tmp"]
    dsn = ctx["server"].create_database()
    n = ctx["catchup"]
    b = node(ctx, "catchup-b", dsn)
    start = applied(b.sock)
    os.kill(b.pid, signal.SIGSTOP)
    store = PostgresStore(dsn, pool_size=1)
    store.open()
    try:
        log(f"catchup: {n} mutations while b is suspended")
        t0 = time.perf_counter()
        commit_all(store, (record(f"cu.{i}") for i in range(n)))
        written = time.perf_counter() - t0
    finally:
        store.close()
        os.kill(b.pid, signal.SIGCONT)
    target = head(dsn)
    took = wait_applied([b.sock], target, timeout=1800.0)
    log(f"catchup: applied {target - start} in {took:.1f} s; a new node loads the same tables")
    c = Daemon("catchup-c", tmp / "cu-c", str(tmp / "cu-c.sock"), extra=pg_flags(dsn, "c"))
    ready = ctx["launch"](c).wait_ready(600)
    out = {"mutations": target - start, "write_seconds": round(written, 2), "seconds": round(took, 2),
           "mutations_per_s": round((target - start) / took), "new_node_ready_s": round(ready, 2)}
    b.stop()
    c.stop()
    return out


# --- the report ------------------------------------------------------------------------------------------


def render(rep: dict[str, Any]) -> str:
    lines = [f"# The change feed — {rep['started']}", "", f"Machine: {rep['machine'].get('cpu', '?')}, "
             f"{rep['machine'].get('cores', '?')} cores; load {rep['load_start']:.2f} at start, {rep.get('load_end', 0):.2f} at end.", ""]
    if "lock" in rep:
        lines += ["## What the feed adds to a commit (PostgresStore, best of 2)", ""]
        lines += common.table(["writers", "part 1 (no lock, no NOTIFY)", "feed lock", "lock + NOTIFY", "lock + NOTIFY, grouped (the daemon)",
                               "lock / part 1", "+ NOTIFY / part 1", "grouped / part 1"],
                              [[t, fmt_rate(r["best"]["none"]), fmt_rate(r["best"]["lock"]), fmt_rate(r["best"]["lock+notify"]),
                                fmt_rate(r["best"]["grouped"]), f"{r['ratio_lock']:.2f}x", f"{r['ratio_notify']:.2f}x",
                                f"{r['ratio_daemon']:.2f}x"] for t, r in rep["lock"].items()])
        lines.append("")
    if "nodes" in rep:
        nodes = rep["nodes"]
        lines += [f"## Durable writes/s, one node: part 1's commit against the feed's (best of 2, {nodes['driver']})", ""]
        lines += common.table(["clients", "part 1", "feed", "feed / part 1"],
                       [[c, fmt_rate(r["best"]["part 1"]), fmt_rate(r["best"]["feed"]), f"{r['ratio']:.2f}x"]
                        for c, r in nodes["paired"].items()])
        lines += ["", "## Durable writes/s on node a (32 clients) with the other nodes following", ""]
        lines += common.table(["nodes", "writes/s", "followers at the head after"],
                       [[n, fmt_rate(r["writes_per_s"]), f"{r['followers_settled_s']:.2f} s"] for n, r in nodes["nodes"].items()])
        lines.append("")
    if "lag" in rep:
        lag = rep["lag"]
        vis = lag["visibility_ms"]
        lines += [f"## Visibility on node b of writes on node a ({lag['writes']} writes, asked {lag['rate_asked']}/s, "
                  f"done {lag['rate_done']}/s)", ""]
        lines += common.table(["", "p50", "p99", "max"],
                       [["b applied it (from the row's writing)", fmt_ms(vis["p50"]), fmt_ms(vis["p99"]), fmt_ms(vis["max"])],
                        ["(a's write latency)", fmt_ms(lag["write_latency"]["p50_ms"]), fmt_ms(lag["write_latency"]["p99_ms"]),
                         fmt_ms(lag["write_latency"]["max_ms"])]])
        lines.append("")
    if "catchup" in rep:
        cu = rep["catchup"]
        lines += ["## Catch-up", "", f"Node b, suspended while {cu['mutations']:,} mutations were committed "
                  f"({cu['write_seconds']} s to write), applied them in {cu['seconds']} s after it woke: "
                  f"{fmt_rate(cu['mutations_per_s'])}. A new node loading the same tables: ready in {cu['new_node_ready_s']} s.", ""]
    for name, err in rep["errors"].items():
        lines += [f"## {name} failed", "", "```", err.strip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--seconds", type=float, default=None, help="per run (default 3; quick 1)")
    ap.add_argument("--rate", type=int, default=1000, help="lag: writes/s on node a")
    ap.add_argument("--catchup", type=int, default=None, help="catchup: mutations (default 100,000; quick 5,000)")
    ap.add_argument("--only", default="lock,nodes,lag,catchup")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    with common.pg_bench("feed", args.out) as ctx:
        ctx.update(rate=args.rate, seconds=args.seconds or (1.0 if args.quick else 3.0),
                   catchup=args.catchup or (5000 if args.quick else 100_000))
        rep: dict[str, Any] = {"started": ctx["stamp"], "machine": common.machine(), "load_start": os.getloadavg()[0], "errors": {}}
        sections = {"lock": sec_lock, "nodes": sec_nodes, "lag": sec_lag, "catchup": sec_catchup}
        status = common.run_sections(rep, {name: functools.partial(fn, ctx) for name, fn in sections.items()}, args.only,
                              ctx["out_dir"], render)
    log(f"report: {ctx['out_dir'] / 'report.md'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
