"""Dense and lexical search speed and recall: VectorStore against raw hnswlib, LexicalIndex.

    python bench/bench_vectors.py                 # 10k and 100k vectors, 100k documents
    python bench/bench_vectors.py --large         # adds 1M vectors (several GB of RAM, long build)
    python bench/bench_vectors.py --sizes 10000 --queries 200 --data clustered

For each size and data set: build time (VectorStore.add in batches of 10,000), p50 / p99 latency
of one more single add, of VectorStore.search (k=10) and of hnswlib's knn_query on the very same
index in the same process (their ratio is what the store's wrapping costs), recall@10 against
exact (numpy) search; then the same with an `allowed` filter of 5 % of the labels (the store's
own path choice), and, to tune the store's choice of path for filtered queries, each of its three
paths forced at several filter sizes (exact numpy / hnswlib's `filter=` callback / over-fetching
unfiltered results with ef scaled by 1 / selectivity and post-filtering); then
save and load times (the restart path). Then LexicalIndex on a synthetic corpus: Zipf-distributed
vocabulary, documents of ~30 tokens, 5-term queries drawn from the same distribution.

Two vector data sets:
- `uniform`: unit vectors uniformly random in 384-d. The worst case for any graph index: every
  pair is nearly orthogonal, the 10 "nearest" neighbours are barely nearer than the rest, and
  recall@10 at a practical ef is low. Shown because it is the textbook random input, not because
  embeddings look like it.
- `clustered`: embedding-like vectors (200 topic centres, a rank-32 latent part, isotropic noise;
  top-1 cosine about 0.6, median pair about 0), queries drawn from the same distribution. Sentence
  embeddings have low intrinsic dimension and topical clusters like these; recall targets are
  judged on this set.

Latencies are per call in this process (no daemon, no socket, no embedding), one query at a
time, hnswlib's search on one thread; build uses all cores. `--clock cpu` measures the calling
thread's CPU time instead of wall time: on a machine that other processes keep busy, wall-clock
p99 mostly measures the scheduler. Build, save and load times are always wall clock.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from eurekamem.daemon.retrieval import vectors as _vectors
from eurekamem.daemon.retrieval.lexical import LexicalIndex
from eurekamem.daemon.retrieval.vectors import VectorStore

DIM = 384


def uniform(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    for i in range(0, n, 100_000):
        x = rng.standard_normal((min(100_000, n - i), dim)).astype(np.float32)
        out[i : i + x.shape[0]] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


class Clustered:
    """Embedding-like unit vectors (see module docstring); one generator for data and queries."""

    def __init__(self, rng: np.random.Generator, dim: int = DIM, rank: int = 32, topics: int = 200) -> None:
        self.rng = rng
        self.basis = rng.standard_normal((rank, dim)).astype(np.float32) / np.sqrt(rank)
        self.centres = rng.standard_normal((topics, dim)).astype(np.float32)
        self.rank, self.dim = rank, dim

    def __call__(self, n: int) -> np.ndarray:
        out = np.empty((n, self.dim), dtype=np.float32)
        for i in range(0, n, 100_000):
            m = min(100_000, n - i)
            x = (
                0.7 * self.centres[self.rng.integers(0, self.centres.shape[0], m)]
                + self.rng.standard_normal((m, self.rank)).astype(np.float32) @ self.basis
                + 0.3 * self.rng.standard_normal((m, self.dim)).astype(np.float32)
            )
            out[i : i + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out


CLOCK = time.perf_counter  # --clock cpu: time.thread_time (immune to other processes' load)


def timed(fn: Callable[[], object], repeat: int) -> np.ndarray:
    """Per-call seconds of `repeat` calls."""
    clock = CLOCK
    out = np.empty(repeat)
    for i in range(repeat):
        t = clock()
        fn()
        out[i] = clock() - t
    return out


def lat(samples: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(samples, 50) * 1e3), float(np.percentile(samples, 99) * 1e3)


def recall(got: list[np.ndarray], truth: list[np.ndarray]) -> float:
    hits = sum(len(set(g.tolist()) & set(t.tolist())) for g, t in zip(got, truth))
    return hits / max(1, sum(len(t) for t in truth))


def ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def bench_vectors(n: int, data: str, n_queries: int, seed: int, rows: list[dict], tune: list[dict]) -> None:
    rng = np.random.default_rng(seed)
    if data == "uniform":
        x = uniform(rng, n)
        queries = uniform(rng, n_queries)
    else:
        gen = Clustered(rng)
        x = gen(n)
        queries = gen(n_queries)
    labels = np.arange(n, dtype=np.int64)
    store = VectorStore(DIM, model="bench")
    t = time.perf_counter()
    for i in range(0, n, 10_000):
        store.add(labels[i : i + 10_000], x[i : i + 10_000])
    build = time.perf_counter() - t
    index = store._index  # the raw hnswlib index the store searches

    # one more add, as memory.add does (then removed again so the store stays as built)
    extra = uniform(rng, 200) if data == "uniform" else gen(200)
    add_lat = np.empty(200)
    for i in range(200):
        t = CLOCK()
        store.add([n + i], extra[i])
        add_lat[i] = CLOCK() - t
    for i in range(200):
        store.remove(n + i)

    n_rec = min(n_queries, 200)
    truth = [store.exact_search(q, 10)[0] for q in queries[:n_rec]]
    got = [store.search(q, 10)[0] for q in queries[:n_rec]]
    raw_got = [index.knn_query(q, k=10, num_threads=1)[0][0] for q in queries[:n_rec]]
    it = iter(np.tile(np.arange(n_queries), 2))
    store_lat = timed(lambda: store.search(queries[next(it) % n_queries], 10), n_queries)
    it = iter(np.tile(np.arange(n_queries), 2))
    raw_lat = timed(lambda: index.knn_query(queries[next(it) % n_queries], k=10, num_threads=1), n_queries)
    row = {
        "n": n, "data": data, "filter": "none", "build_s": build, "add": lat(add_lat),
        "store": lat(store_lat), "raw": lat(raw_lat),
        "recall": recall(got, truth), "raw_recall": recall(raw_got, truth),
        "path": "hnsw" if len(store) > store.exact_max else "exact",
    }
    rows.append(row)

    # 5 % filter: the store's own choice against hnswlib's filter= callable
    allowed = np.sort(rng.choice(n, max(1, n // 20), replace=False))
    mask = np.zeros(n, dtype=bool)
    mask[allowed] = True
    ftruth = [store.exact_search(q, 10, allowed=allowed)[0] for q in queries[:n_rec]]
    fgot = [store.search(q, 10, allowed=allowed)[0] for q in queries[:n_rec]]
    allowed_fn = mask.__getitem__
    fraw_got = [index.knn_query(q, k=10, num_threads=1, filter=allowed_fn)[0][0] for q in queries[:n_rec]]
    it = iter(range(10**9))
    fstore_lat = timed(lambda: store.search(queries[next(it) % n_queries], 10, allowed=allowed), n_queries)
    it = iter(range(10**9))
    fraw_lat = timed(
        lambda: index.knn_query(queries[next(it) % n_queries], k=10, num_threads=1, filter=allowed_fn),
        min(n_queries, 300),
    )
    rows.append({
        "n": n, "data": data, "filter": "5 %", "build_s": None, "add": None,
        "store": lat(fstore_lat), "raw": lat(fraw_lat),
        "recall": recall(fgot, ftruth), "raw_recall": recall(fraw_got, ftruth),
        "path": "exact" if allowed.size <= max(1000, int(np.sqrt(1000.0 * n))) else "hnsw",
    })

    # tuning the filtered paths, each forced through the store: exact numpy, hnswlib's filter=
    # callback, over-fetching unfiltered results and post-filtering
    if data == "clustered":
        nq = min(n_queries, 200)
        for size in sorted({s for s in (1_000, 5_000, 20_000, 50_000, 200_000) if s < n} | {n // 20}):
            al = np.sort(rng.choice(n, size, replace=False))
            tr = [store.exact_search(q, 10, allowed=al)[0] for q in queries[:nq]]
            entry = {"n": n, "size": size}
            saved = store.filter_exact_max, _vectors.OVERFETCH_MIN_FRACTION
            for name, limit, frac in (("exact", 10**12, 0.2), ("callback", 0, 2.0), ("overfetch", 0, 0.0)):
                store.filter_exact_max, _vectors.OVERFETCH_MIN_FRACTION = limit, frac
                res = [store.search(q, 10, allowed=al)[0] for q in queries[:nq]]
                it = iter(range(10**9))
                entry[name] = (lat(timed(lambda it=it, al=al: store.search(queries[next(it) % nq], 10, allowed=al), nq)), recall(res, tr))
            store.filter_exact_max, _vectors.OVERFETCH_MIN_FRACTION = saved
            if size <= max(1000, int(np.sqrt(1000.0 * n))):
                entry["auto"] = "exact"
            else:
                entry["auto"] = "overfetch" if size >= _vectors.OVERFETCH_MIN_FRACTION * n else "callback"
            tune.append(entry)

    # restart path: save, then load (with the fingerprint check) and answer a first query
    folder = tempfile.mkdtemp(prefix="bench-vectors-")
    try:
        t = time.perf_counter()
        fp = store.save(folder, "bench")
        save_s = time.perf_counter() - t
        index = None  # free the graph (closures above hold the name, so not `del`)
        gc.collect()
        t = time.perf_counter()
        loaded = VectorStore.load(folder, "bench", dim=DIM, model="bench", expected_fingerprint=fp)
        assert loaded is not None
        loaded.search(queries[0], 10)
        load_s = time.perf_counter() - t
        size_mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e6
        del loaded
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    row["save_s"], row["load_s"], row["files_mb"] = save_s, load_s, size_mb
    store = None  # free it (closures above hold the name, so not `del`)
    gc.collect()


def bench_lexical(n_docs: int, n_queries: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    vocab_size = 50_000
    p = 1.0 / np.arange(1, vocab_size + 1) ** 1.07
    p /= p.sum()
    words = np.array([f"w{i}" for i in range(vocab_size)])
    lengths = rng.integers(20, 41, n_docs)
    flat = words[rng.choice(vocab_size, size=int(lengths.sum()), p=p)]
    texts = [" ".join(flat[a:b]) for a, b in zip(np.r_[0, np.cumsum(lengths)[:-1]], np.cumsum(lengths))]
    queries = [" ".join(words[rng.choice(vocab_size, size=5, p=p)]) for _ in range(n_queries)]
    ix = LexicalIndex()
    t = time.perf_counter()
    ix.add_many(enumerate(texts))
    build = time.perf_counter() - t
    extra = [" ".join(words[rng.choice(vocab_size, size=30, p=p)]) for _ in range(200)]
    it = iter(range(200))
    add_lat = timed(lambda: (lambda i: ix.add(n_docs + i, extra[i]))(next(it)), 200)
    it = iter(range(10**9))
    plain = timed(lambda: ix.search(queries[next(it) % n_queries], 10), n_queries)
    allowed = np.sort(rng.choice(n_docs, n_docs // 20, replace=False))
    it = iter(range(10**9))
    filtered = timed(lambda: ix.search(queries[next(it) % n_queries], 10, allowed=allowed), n_queries)
    return {
        "docs": n_docs, "build_s": build, "add": lat(add_lat), "plain": lat(plain),
        "filtered": lat(filtered), "stats": ix.stats(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", action="store_true", help="also 1,000,000 vectors")
    ap.add_argument("--sizes", type=int, nargs="*", help="vector counts (default 10000 100000)")
    ap.add_argument("--data", choices=["uniform", "clustered", "both"], default="both")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=100_000, help="lexical corpus size (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="latencies by wall clock, or by this thread's CPU time (for a machine others load)",
    )
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    sizes = args.sizes or ([10_000, 100_000] + ([1_000_000] if args.large else []))
    datas = ["clustered", "uniform"] if args.data == "both" else [args.data]

    import hnswlib

    print(f"# bench_vectors: {os.cpu_count()} CPUs, numpy {np.__version__}, hnswlib {getattr(hnswlib, '__version__', '0.8')}, "
          f"python {sys.version.split()[0]}; dim {DIM}, k=10, M=16, ef_construction=200, ef_search=64, "
          f"{args.queries} queries; latencies by {args.clock} clock; load average at start {os.getloadavg()[0]:.2f}\n", flush=True)
    rows: list[dict] = []
    tune: list[dict] = []
    for n in sizes:
        for data in datas:
            print(f"... {n} {data}", file=sys.stderr, flush=True)
            bench_vectors(n, data, args.queries, args.seed, rows, tune)

    print("## VectorStore.search vs raw hnswlib knn_query (same index, same process)\n")
    print("| n | data | filter | store path | build s | add p50/p99 ms | store p50 ms | store p99 ms | raw p50 ms | raw p99 ms | p50 ratio | store recall@10 | raw recall@10 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        raw_name = "" if r["filter"] == "none" else " (filter=)"
        build = "" if r["build_s"] is None else f"{r['build_s']:.1f}"
        add = "" if r["add"] is None else f"{ms(r['add'][0])} / {ms(r['add'][1])}"
        print(
            f"| {r['n']:,} | {r['data']} | {r['filter']} | {r['path']} | {build} | {add} | "
            f"{ms(r['store'][0])} | {ms(r['store'][1])} | {ms(r['raw'][0])}{raw_name} | {ms(r['raw'][1])} | "
            f"{r['store'][0] / r['raw'][0]:.2f} | {r['recall']:.3f} | {r['raw_recall']:.3f} |"
        )
    print("\nraw = hnswlib's knn_query(k=10) on the store's own index; with a filter, knn_query(filter=mask.__getitem__).")
    print("recall@10 against exact numpy search (with the same filter).\n")

    if tune:
        print("## Filtered search by path (clustered data): p50 / p99 ms, recall@10\n")
        print("| n | allowed | exact numpy | hnswlib filter= callback | hnswlib over-fetch + post-filter | store picks |")
        print("|---|---|---|---|---|---|")
        for e in tune:
            cells = [f"{ms(e[k][0][0])} / {ms(e[k][0][1])}, {e[k][1]:.3f}" for k in ("exact", "callback", "overfetch")]
            print(f"| {e['n']:,} | {e['size']:,} | " + " | ".join(cells) + f" | {e['auto']} |")
        print()

    print("## Restart path (save, then load with the fingerprint check and answer one query)\n")
    print("| n | data | save s | load + first query s | files MB |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "save_s" in r:
            print(f"| {r['n']:,} | {r['data']} | {r['save_s']:.2f} | {r['load_s']:.2f} | {r['files_mb']:.0f} |")
    print()

    print(f"load average after the vector runs: {os.getloadavg()[0]:.2f}\n")
    if args.docs:
        print("... lexical", file=sys.stderr, flush=True)
        lx = bench_lexical(args.docs, args.queries, args.seed)
        st = lx["stats"]
        print("## LexicalIndex (BM25), synthetic corpus: Zipf(1.07) over 50,000 words, 20-40 tokens a document, 5-term queries\n")
        print("| docs | terms | postings | add_many s | add p50/p99 ms | search p50 ms | search p99 ms | 5 % filter p50 ms | 5 % filter p99 ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        print(
            f"| {lx['docs']:,} | {st['terms']:,} | {st['postings']:,} | {lx['build_s']:.2f} | "
            f"{ms(lx['add'][0])} / {ms(lx['add'][1])} | {ms(lx['plain'][0])} | {ms(lx['plain'][1])} | "
            f"{ms(lx['filtered'][0])} | {ms(lx['filtered'][1])} |"
        )


if __name__ == "__main__":
    main()
