#!/usr/bin/env python3
"""Several daemons on one PostgreSQL, and what a synchronous standby costs: durable writes/s beside raw psycopg in the same run (issue 26 §5, §4).

    .venv/bin/python bench/bench_nodes.py [--quick] [--seconds S] [--clients C] [--out DIR]

Starts its own PostgreSQL servers (tests/pg_server.py: the bundled server of the test extras, as
`nobody` when run as root) and its own daemons on fresh data roots under /tmp, and writes
DIR/report.md and report.json (default bench/results/nodes-<timestamp>/). Sections:

- nodes: 1, 2 and 3 daemons on one database (fsync on), each driven by its own C loadgen with C
  clients (`persistent.remember`, one write in flight per client, keys of its own), all at once for
  S seconds: the writes/s of all of them together. Anchor: raw psycopg INSERT + COMMIT from as many
  threads in all (bench_postgres.raw_psycopg), on the same server, measured next.
- standby: one daemon with C clients on a primary whose synchronous standby (tests/pg_server.py's
  ReplicatedPair: synchronous_standby_names = '*', so each COMMIT waits for the standby's flush)
  runs on the same machine, beside the same on a server without one; raw psycopg on each.

Without the change feed (issue 26 §1) each daemon writes its own rows and does not read the others':
this measures the shared database's share of a write. The machine is shared: read the ratios, not
the absolute figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pg_server: the tests' PostgreSQL

import run as foundation  # noqa: E402
from bench_postgres import _ratio, pg_flags, raw_psycopg  # noqa: E402

from _common import Daemon, fmt_ms, fmt_rate, log, machine, set_log_prefix, table, write_report  # noqa: E402


def nodes_writes(binary: str, daemons: list[Daemon], clients: int, seconds: float) -> dict[str, Any]:
    """Each daemon driven by its own loadgen (keys of its own), all at once; the sum of their writes/s."""
    results: list[dict[str, Any]] = [{} for _ in daemons]

    def drive(i: int, d: Daemon) -> None:
        params = {"key": f"bench.nodes.{len(daemons)}.{i}.{foundation.LOADGEN_COUNTER}", "value": foundation.DURABLE_VALUE}
        results[i] = foundation.loadgen(binary, d.sock, "persistent.remember", params, connections=clients, window=1,
                                        seconds=seconds, warm=3 * clients)

    threads = [threading.Thread(target=drive, args=(i, d)) for i, d in enumerate(daemons)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = sum(r.get("errors", 0) for r in results)
    return {
        "nodes": len(daemons), "clients_per_node": clients,
        "writes_per_s": round(sum(r["ops_per_s"] for r in results)) if not errors else None,
        "per_node": [round(r["ops_per_s"]) for r in results],
        "p50_ms": [round(r["p50_us"] / 1000, 3) for r in results], "errors": errors,
    }


def sec_nodes(ctx: dict[str, Any]) -> dict[str, Any]:
    from pg_server import PostgresServer

    server = PostgresServer()
    server.init()
    out: dict[str, Any] = {"daemons": {}, "raw_psycopg": {}}
    try:
        for n in (1, 2, 3):
            dsn = server.create_database()
            daemons = [ctx["launch"](Daemon(f"node{i}", ctx["tmp"] / f"n{n}-{i}", str(ctx["tmp"] / f"n{n}-{i}.sock"),
                                            extra=pg_flags(dsn))) for i in range(n)]
            log(f"nodes: {n} daemon(s) x {ctx['clients']} clients, {ctx['seconds']} s")
            out["daemons"][str(n)] = nodes_writes(ctx["binary"], daemons, ctx["clients"], ctx["seconds"])
            for d in daemons:
                d.stop()
            log(f"nodes: raw psycopg, {n * ctx['clients']} threads, {ctx['seconds']} s")
            out["raw_psycopg"][str(n)] = raw_psycopg(server.create_database(), n * ctx["clients"], ctx["seconds"])
    finally:
        server.destroy()
    return out


def sec_standby(ctx: dict[str, Any]) -> dict[str, Any]:
    from pg_server import PostgresServer, ReplicatedPair

    out: dict[str, Any] = {}
    single = PostgresServer()
    single.init()
    t0 = time.perf_counter()
    pair = ReplicatedPair()
    out["pair_setup_s"] = round(time.perf_counter() - t0, 2)
    try:
        for name, where in (("alone", single), ("synchronous standby", pair)):
            dsn = where.create_database()
            d = ctx["launch"](Daemon(f"standby-{name}", ctx["tmp"] / f"sb-{len(out)}", str(ctx["tmp"] / f"sb-{len(out)}.sock"),
                                     extra=pg_flags(dsn)))
            log(f"standby: {name}, 1 daemon x {ctx['clients']} clients, {ctx['seconds']} s")
            daemon = nodes_writes(ctx["binary"], [d], ctx["clients"], ctx["seconds"])
            d.stop()
            log(f"standby: {name}, raw psycopg, {ctx['clients']} threads, {ctx['seconds']} s")
            out[name] = {"daemon": daemon, "raw_psycopg": raw_psycopg(dsn, ctx["clients"], ctx["seconds"])}
    finally:
        pair.destroy()
        single.destroy()
    return out


def render(rep: dict[str, Any]) -> str:
    lines = [f"# Several daemons on one PostgreSQL; a synchronous standby ({rep['started']})", "",
             f"commit {rep['machine'].get('commit', '?')}, {rep['machine'].get('cpu', '?')}, "
             f"{rep['machine'].get('nproc', '?')} cores; load {rep['load_start']} → {rep.get('load_end')}. "
             f"{rep['clients']} clients per daemon (C loadgen, one persistent.remember in flight each), {rep['seconds']} s a run. "
             "A shared machine: read the ratios.", ""]
    nodes = rep.get("nodes")
    if nodes:
        rows = []
        for n in ("1", "2", "3"):
            d, r = nodes["daemons"].get(n, {}), nodes["raw_psycopg"].get(n, {})
            rows.append([n, fmt_rate(d.get("writes_per_s")), " / ".join(f"{x:,}" for x in d.get("per_node", [])),
                         fmt_rate(r.get("writes_per_s")), _ratio(r.get("writes_per_s"), d.get("writes_per_s")),
                         _ratio(d.get("writes_per_s"), nodes["daemons"].get("1", {}).get("writes_per_s"))])
        lines += ["## Durable writes/s with 1 / 2 / 3 daemons on one database", ""]
        lines += table(["daemons", "all together", "per daemon", "raw psycopg (as many threads)", "raw ÷ daemons", "÷ one daemon"], rows)
        lines.append("")
    sb = rep.get("standby")
    if sb:
        rows = []
        for name in ("alone", "synchronous standby"):
            d, r = sb[name]["daemon"], sb[name]["raw_psycopg"]
            rows.append([name, fmt_rate(d.get("writes_per_s")), fmt_ms(d["p50_ms"][0] if d.get("p50_ms") else None),
                         fmt_rate(r.get("writes_per_s")), fmt_ms(r.get("p50_ms"))])
        alone, standby = sb["alone"]["daemon"].get("writes_per_s"), sb["synchronous standby"]["daemon"].get("writes_per_s")
        lines += ["## One daemon on a server alone and on a primary with a synchronous standby", "",
                  f"Primary + standby set up (initdb, start, pg_basebackup -R, start) in {sb['pair_setup_s']} s.", ""]
        lines += table(["server", "daemon writes/s", "daemon p50", "raw psycopg writes/s", "raw p50"], rows)
        lines += ["", f"The standby costs the daemon {_ratio(alone, standby)} of its write rate.", ""]
    for name, err in rep.get("errors", {}).items():
        lines += [f"## {name}: failed", "", "```", err, "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke run)")
    ap.add_argument("--seconds", type=float, default=None, help="per run (default 3; quick 1)")
    ap.add_argument("--clients", type=int, default=8, help="clients per daemon (default 8)")
    ap.add_argument("--only", default="nodes,standby", help="sections: nodes, standby")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    set_log_prefix("nodes")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or HERE / "results" / f"nodes-{stamp}"
    tmp = Path(tempfile.mkdtemp(prefix="ems-nodes-", dir="/tmp"))
    binary, why_not = foundation.loadgen_binary(tmp)
    if binary is None:
        log(f"no C loadgen: {why_not}")
        return 1
    started: list[Daemon] = []

    def launch(d: Daemon) -> Daemon:
        started.append(d)
        return d.start(600)  # type: ignore[return-value]

    ctx = {"tmp": tmp, "binary": binary, "launch": launch, "clients": args.clients,
           "seconds": args.seconds or (1.0 if args.quick else 3.0)}
    rep: dict[str, Any] = {"started": stamp, "machine": machine(), "load_start": os.getloadavg()[0],
                           "clients": args.clients, "seconds": ctx["seconds"], "errors": {}}
    sections = {"nodes": sec_nodes, "standby": sec_standby}
    status = 0
    try:
        for name in args.only.split(","):
            try:
                rep[name] = sections[name](ctx)
            except Exception:
                rep["errors"][name] = traceback.format_exc()
                log(f"{name} failed:\n{rep['errors'][name]}")
                status = 1
            rep["load_end"] = os.getloadavg()[0]
            write_report(out_dir, "report", render(rep), rep)
    finally:
        for d in started:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"report: {out_dir / 'report.md'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
