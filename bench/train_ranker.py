#!/usr/bin/env python3
"""Train conversation.search's learned ranker (issue 31) on the LoCoMo development split, and write
the weights the daemon ships (daemon/conversation/ranker.json).

    .venv/bin/python bench/train_ranker.py [--data PATH] [--embed-cache /tmp/F.npz] [--out DIR]
                                           [--weights PATH] [--no-write] [--latency] [--latency-only]
                                           [--only conv-26,conv-30]

Every turn of each conversation is appended to the daemon's own ConversationState in-process
(exactly as bench/locomo.py's conversation levers do: id = dia_id, sender = speaker, session =
session_N, timestamp = the session's time), each turn's dense document embedded once (the
embeddings are cached in --embed-cache, outside the repo: e5-small does a few texts a second on
2 cores). For every question of categories 1-4, `ConversationState.candidate_signals` (the code
conversation.search runs) gives the candidates, in the old fusion's order, and their signals; the
evidence turns among them are the positives. Nothing reads the question's category but the
per-category report.

Models: a linear model over the signals z-scored per query (daemon/retrieval/ranker.py), fit with
numpy by Newton's method with an L2 penalty, either listwise (softmax over one query's candidates,
the evidence as the target) or pointwise (logistic, each query weighing the same). The model and
its L2 are chosen by leave-one-conversation-out (LOCO) MRR@10 only: train on four conversations,
rank the fifth. Reported next to it: in-sample (train and rank on all five) and the old fusion, as
any@1/5/10 and MRR@10, overall and per category, and each signal group removed (LOCO). The chosen
model, refit on all five conversations, is written as the weights file, with its LOCO figures and
a check set (seeded synthetic signals and the scores this script gives them; tests/test_ranker.py
checks that the daemon's scoring of the shipped file reproduces them). With --latency, the five
conversations are also put into one group (~2,760 turns) and each question searched there with the
fusion and with the ranker (in-process, the query vector given), both back to back on each question
for 3 rounds after a warm-up: p50 / p99 of each and the median per-question difference;
--latency-only does just that with the shipped weights.

The data is read from --data, else $EUREKAMEM_LOCOMO, else the shared data folder beside the repo;
it is never copied into the repo.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo import CATEGORIES, DEFAULT_DATA_DIR, append_in_process, conversation_sessions, load  # noqa: E402

import _common  # noqa: E402
from _common import HERE, ROOT, log, percentile  # noqa: E402

_common.set_log_prefix("train_ranker")

L2S = (1e-3, 1e-2, 1e-1, 1.0)
DEPTHS = (30, 50, 100, None)  # how many of the fusion's candidates the ranker reorders (None: all, up to ~200)
DEPTH_SLACK = 0.005  # the smallest depth whose LOCO MRR@10 and any@10 are each within this of the best is shipped (cost)
KINDS = ("listwise", "logistic")
LATENCY_ROUNDS = 3
CHECK_SEED = 31
CHECK_ROWS = 40
METRICS = ("any@1", "any@5", "any@10", "MRR@10")

# signal groups removed one at a time (LOCO) to show what each is worth
GROUPS = {
    "BM25 windows": [f for f in ("bm25_0_0", "bm25_1_0", "bm25_0_1", "bm25_2_1", "bm25_1_2", "bm25_2_2")],
    "BM25 session": ["bm25_session"],
    "fusion inputs": ["lexical", "lexical_rrf", "dense_rrf", "fusion"],
    "dense neighbours": ["cos_next", "cos_session_max"],
    "speaker / person": ["speaker", "names_person", "speaker_x_bm25"],
    "static": ["question", "log_length", "position"],
    "temporal (the turn's date)": ["date_match"],
    "temporal (dates the text names or implies)": ["text_date_match"],
    "asks when x time": ["when_x_time"],
}


# --- the data through the daemon's state ---------------------------------------------------------


def embedded_state(sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]],
                   cache: Path | None, group_of: Callable[[str], str] | None = None) -> tuple[Any, list[np.ndarray]]:
    """The daemon's ConversationState holding every turn with its vector, and each question's vector.
    `group_of`: sample_id -> the group its turns go to (default: its own)."""
    from eurekamem.daemon.config import config_default
    from eurekamem.daemon.conversation.state import ConversationState, Tuning
    from eurekamem.daemon.retrieval.embed import make_embedder

    emb = make_embedder("e5-small")
    vec_of = cached_vectors(cache, emb.name)
    known = len(vec_of)
    state = ConversationState(emb, Tuning(), session_gap=config_default("conversation_session_gap"))
    for sid, convo in sessions.items():
        group = group_of(sid) if group_of else sid
        for msgs in convo:
            if group != sid:
                msgs = [{**x, "id": f"{sid}:{x['id']}", "session": f"{sid}-{x['session']}"} for x in msgs]
            append_in_process(state, group, msgs)
    todo = state.take_to_embed(10**9)
    missing = list(dict.fromkeys(text for _, text, _ in todo if text not in vec_of))
    if missing:
        log(f"embedding {len(missing)} messages (cached: {known})")
        vec_of.update(zip(missing, emb.embed_passages(missing)))
    state.put_vectors(todo, np.stack([vec_of[text] for _, text, _ in todo]))
    qvecs = query_vectors(emb, questions, vec_of)
    if cache is not None and len(vec_of) != known:
        save_vectors(cache, emb.name, vec_of)
    return state, qvecs


def question_sets(state: Any, questions: list[dict[str, Any]], qvecs: list[np.ndarray]) -> tuple[list[dict[str, Any]], int]:
    """Per question: the candidates' signals (the fusion's order) and which are evidence; and for
    how many questions the candidates' first 20 are conversation.search's answer (all, or the
    rows are not the daemon's fusion)."""
    from eurekamem.protocol import methods as m

    out = []
    same = 0
    for q, qv in zip(questions, qvecs):
        p = m.ConversationSearch(group=q["sample_id"], query=q["question"], k=20)
        labels, x = state.candidate_signals(p, qv)
        fusion = m.ConversationSearch(group=q["sample_id"], query=q["question"], k=20, ranker="fusion")
        same += [h["message"].seq for h in state.search(fusion, qv)] == labels[:20]
        ids = [state.messages[lab].id for lab in labels]
        out.append({"x": x, "y": np.array([i in q["evidence"] for i in ids], dtype=np.float64),
                    "conv": q["sample_id"], "category": q["category"]})
    return out, same


# --- models --------------------------------------------------------------------------------------


def fit(sets: Sequence[dict[str, Any]], cols: Sequence[int], kind: str, l2: float, iters: int = 30) -> np.ndarray:
    """Weights over the z-scored signals `cols` (Newton's method with backtracking)."""
    from eurekamem.daemon.retrieval.ranker import zscored

    data = [(zscored(s["x"][:, cols]), s["y"]) for s in sets if s["y"].any()]
    f = len(cols)
    w = np.zeros(f)

    def loss_grad_hess(w: np.ndarray, need: bool) -> tuple[float, np.ndarray, np.ndarray]:
        loss, grad, hess = 0.0, np.zeros(f), np.zeros((f, f))
        for z, y in data:
            s = z @ w
            if kind == "listwise":
                s = s - s.max()
                p = np.exp(s)
                p /= p.sum()
                t = y / y.sum()
                loss -= float(t @ np.log(np.maximum(p, 1e-300)))
                if need:
                    grad += z.T @ (p - t)
                    zp = z.T @ p
                    hess += (z.T * p) @ z - np.outer(zp, zp)
            else:
                n = len(y)
                p = 1.0 / (1.0 + np.exp(-s))
                loss += float(-(y * np.log(np.maximum(p, 1e-300)) + (1 - y) * np.log(np.maximum(1 - p, 1e-300))).sum()) / n
                if need:
                    grad += z.T @ (p - y) / n
                    hess += (z.T * (p * (1 - p))) @ z / n
        q = len(data)
        return loss / q + 0.5 * l2 * float(w @ w), grad / q + l2 * w, hess / q + l2 * np.eye(f)

    loss, grad, hess = loss_grad_hess(w, True)
    for _ in range(iters):
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-4:
            new = loss_grad_hess(w - t * step, False)[0]
            if new <= loss - 1e-4 * t * float(grad @ step):
                break
            t *= 0.5
        w = w - t * step
        old = loss
        loss, grad, hess = loss_grad_hess(w, True)
        if old - loss < 1e-9:
            break
    return w


def ranked_metrics(order: np.ndarray, y: np.ndarray) -> dict[str, float]:
    hits = np.flatnonzero(y[order] > 0)
    first = int(hits[0]) if hits.size else None
    return {"any@1": float(first is not None and first < 1), "any@5": float(first is not None and first < 5),
            "any@10": float(first is not None and first < 10),
            "MRR@10": 1.0 / (first + 1) if first is not None and first < 10 else 0.0}


def rank_by(scores: np.ndarray) -> np.ndarray:
    """Best first, ties in the fusion's order (the candidates come in it)."""
    return np.lexsort((np.arange(scores.size), -scores))


def evaluate(sets: Sequence[dict[str, Any]], scorer: Callable[[dict[str, Any]], np.ndarray]) -> list[dict[str, float]]:
    return [ranked_metrics(rank_by(scorer(s)), s["y"]) for s in sets]


def summary(rows: Sequence[dict[str, float]], sets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def mean(sel: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(statistics.fmean(r[k] for r in sel), 4) if sel else float("nan") for k in METRICS}

    out: dict[str, Any] = {"all": mean(list(rows)), "n": len(rows), "by_category": {}}
    for cat, name in CATEGORIES.items():
        sel = [r for r, s in zip(rows, sets) if s["category"] == cat]
        out["by_category"][name] = {"n": len(sel), **mean(sel)}
    return out


def linear_scorer(cols: Sequence[int], w: np.ndarray) -> Callable[[dict[str, Any]], np.ndarray]:
    from eurekamem.daemon.retrieval.ranker import zscored

    return lambda s: zscored(s["x"][:, cols]) @ w


def loco(sets: Sequence[dict[str, Any]], cols: Sequence[int], kind: str, l2: float) -> list[dict[str, float]]:
    """Leave-one-conversation-out: each conversation ranked by a model fit on the others."""
    rows: list[dict[str, float] | None] = [None] * len(sets)
    for conv in sorted({s["conv"] for s in sets}):
        w = fit([s for s in sets if s["conv"] != conv], cols, kind, l2)
        score = linear_scorer(cols, w)
        for i, s in enumerate(sets):
            if s["conv"] == conv:
                rows[i] = ranked_metrics(rank_by(score(s)), s["y"])
    return [r for r in rows if r is not None]


def truncated(sets: Sequence[dict[str, Any]], depth: int | None) -> list[dict[str, Any]]:
    """The fusion's first `depth` candidates of each question (the rest keep the fusion's order, at
    places >= depth, so any@10 and MRR@10 are those of the head alone for depth >= 10)."""
    return [{**s, "x": s["x"][:depth], "y": s["y"][:depth]} for s in sets]


def check_set(features: Sequence[str], w: np.ndarray) -> dict[str, Any]:
    """Seeded synthetic signals and this script's scores of them (the test rebuilds the signals)."""
    x = np.random.default_rng(CHECK_SEED).normal(size=(CHECK_ROWS, len(features)))
    from eurekamem.daemon.retrieval.ranker import zscored

    return {"seed": CHECK_SEED, "rows": CHECK_ROWS, "generator": "numpy default_rng(seed).normal(size=(rows, features))",
            "scores": [round(float(v), 9) for v in zscored(x) @ w]}


# --- latency at one ~3,000-turn group ------------------------------------------------------------


def latency(sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]], cache: Path | None) -> dict[str, Any]:
    from eurekamem.protocol import methods as m

    state, qvecs = embedded_state(sessions, questions, cache, group_of=lambda sid: "all")
    times: dict[str, list[float]] = {"fusion": [], "learned": []}
    for round_ in range(LATENCY_ROUNDS + 1):  # the first round warms the caches and is not counted
        for q, qv in zip(questions, qvecs):
            # both rankers back to back on each question, in turn first: a burst of load on the
            # shared machine then weighs on both alike
            order = ("fusion", "learned") if (round_ + len(q["question"])) % 2 else ("learned", "fusion")
            for ranker in order:
                p = m.ConversationSearch(group="all", query=q["question"], k=10, ranker=ranker)  # type: ignore[arg-type]
                t0 = time.perf_counter()
                state.search(p, qv)
                if round_:
                    times[ranker].append(time.perf_counter() - t0)
    out = timing_summary(times, len(state.messages))
    out["query_embedding"] = query_embedding_anchor(state.embedder, questions)
    cache = state.terms
    size = sum(sys.getsizeof(c) + sum(sys.getsizeof(t) for t in c) for c, _ in cache.turns.values())
    size += sum(sys.getsizeof(c) for c, _ in cache.sessions.values())
    out["term_cache"] = {"turns": len(cache.turns), "sessions": len(cache.sessions), "bytes_approx": size,
                         "bytes_per_message": round(size / max(len(state.messages), 1))}
    return out


# --- report --------------------------------------------------------------------------------------


def table(rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| ranking | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['all'][k]:.3f}" for k in METRICS) + " |")
    return lines


def category_table(rows: dict[str, dict[str, Any]], metric: str) -> list[str]:
    names = list(CATEGORIES.values())
    first = next(iter(rows.values()))
    lines = [f"| ranking ({metric}) | " + " | ".join(f"{c} (n={first['by_category'][c]['n']})" for c in names) + " |",
             "|---|" + "---|" * len(names)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['by_category'][c][metric]:.3f}" for c in names) + " |")
    return lines


# --- memory.search: every turn a memory, as bench/locomo.py stores them ---------------------------


# memory.search's signal groups removed one at a time (LOCO)
MEMORY_GROUPS = {
    "BM25 (exact)": ["bm25", "person_x_bm25"],
    "fusion inputs": ["lexical", "lexical_rrf", "dense_rrf", "fusion"],
    "cosine": ["cosine"],
    "coverage": ["coverage", "idf_coverage"],
    "RM3": ["rm3"],
    "person": ["person", "names_person", "person_x_bm25"],
    "static": ["question", "log_length"],
    "temporal": ["date_match"],
    "asks when x time": ["when_x_time"],
}


def memory_state(convs: list[dict[str, Any]], questions: list[dict[str, Any]], cache: Path | None) -> tuple[Any, list[np.ndarray]]:
    """The daemon's MemoryState holding every turn as a memory, exactly as bench/locomo.py adds them
    through memory.add_many (one domain per conversation, title and tag the dia_id, content "Speaker
    (date): text [image: caption]", attributed_to the speaker, dedup off), each passage embedded
    once (cached in `cache`); and each question's vector."""
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import methods as m

    emb = make_embedder("e5-small")
    vec_of = cached_vectors(cache, emb.name)
    known = len(vec_of)
    state = MemoryState(emb)
    adds = [[m.MemoryAdd(domain=c["sample_id"], category="context", title=dia, content=content, tags=[dia], dedup=False,
                         attributed_to=c["speakers"][dia]) for dia, content in c["turns"]] for c in convs]
    texts = [t for items in adds for a in items for t in state.passage_texts(a.title, a.content, a.abstract)]
    missing = list(dict.fromkeys(t for t in texts if t not in vec_of))
    if missing:
        log(f"embedding {len(missing)} memories (cached: {known})")
        vec_of.update(zip(missing, emb.embed_passages(missing)))
    for items in adds:
        prepared = Prepared()
        prepared.passages = {t: vec_of[t] for a in items for t in state.passage_texts(a.title, a.content, a.abstract)}
        state.run("memory.add_many", m.MemoryAddMany(items=items), prepared)
    qvecs = query_vectors(emb, questions, vec_of)
    if cache is not None and len(vec_of) != known:
        save_vectors(cache, emb.name, vec_of)
    return state, qvecs


def memory_sets(state: Any, questions: list[dict[str, Any]], qvecs: list[np.ndarray]) -> tuple[list[dict[str, Any]], int]:
    """As question_sets, for memory.search (hybrid, the question's conversation as its domain)."""
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.protocol import methods as m

    out = []
    same = 0
    for q, qv in zip(questions, qvecs):
        p = m.MemorySearch(query=q["question"], domain=q["sample_id"], k=20, include_global=False, mode="hybrid")
        state._prepared = Prepared()
        state._prepared.queries[q["question"]] = qv
        labels, x = state.candidate_signals(p)
        hits = state.search(m.MemorySearch(**{**msgspec.structs.asdict(p), "ranker": "fusion"}))
        titles = [state.memories[state._id_of[lab]].title for lab in labels]
        same += [h["memory"].title for h in hits] == titles[:20]
        out.append({"x": x, "y": np.array([t in q["evidence"] for t in titles], dtype=np.float64),
                    "conv": q["sample_id"], "category": q["category"]})
    return out, same


def memory_latency(state: Any, questions: list[dict[str, Any]], qvecs: list[np.ndarray]) -> dict[str, Any]:
    """memory.search (hybrid, k=10) with each ranker, back to back per question, in-process with the
    query vector given; as latency() for conversation.search."""
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.protocol import methods as m

    state._prepared = Prepared()
    state._prepared.queries = {q["question"]: qv for q, qv in zip(questions, qvecs)}
    times: dict[str, list[float]] = {"fusion": [], "learned": []}
    for round_ in range(LATENCY_ROUNDS + 1):
        for q in questions:
            order = ("fusion", "learned") if (round_ + len(q["question"])) % 2 else ("learned", "fusion")
            for ranker in order:
                p = m.MemorySearch(query=q["question"], domain=q["sample_id"], k=10, include_global=False, ranker=ranker)  # type: ignore[arg-type]
                t0 = time.perf_counter()
                state.search(p)
                if round_:
                    times[ranker].append(time.perf_counter() - t0)
    out = timing_summary(times, len(state.memories))
    out["query_embedding"] = query_embedding_anchor(state.embedder, questions)
    return out


# --- choosing and fitting (either path) -----------------------------------------------------------


def cached_vectors(cache: Path | None, model: str) -> dict[str, np.ndarray]:
    if cache is not None and cache.exists():
        with np.load(cache, allow_pickle=False) as cached:
            if str(cached["model"]) == model:
                return dict(zip(cached["texts"].tolist(), cached["vectors"]))
    return {}


def save_vectors(cache: Path, model: str, vec_of: dict[str, np.ndarray]) -> None:
    texts = list(vec_of)
    np.savez(cache, model=np.array(model), texts=np.array(texts), vectors=np.stack([vec_of[t] for t in texts]))


def query_vectors(emb: Any, questions: list[dict[str, Any]], vec_of: dict[str, np.ndarray]) -> list[np.ndarray]:
    keys = ["query: " + q["question"] for q in questions]
    missing_q = [k for k in dict.fromkeys(keys) if k not in vec_of]
    if missing_q:
        log(f"embedding {len(missing_q)} questions")
        vec_of.update(zip(missing_q, emb.embed_queries([k[len("query: "):] for k in missing_q])))
    return [vec_of[k] for k in keys]


ANCHOR_QUERIES = 100  # questions embedded one at a time: the anchor the rankers' costs stand beside


def query_embedding_anchor(embedder: Any, questions: list[dict[str, Any]]) -> dict[str, float]:
    """p50 / p99 of embedding one question (what every search pays before it ranks), in the same run."""
    ts = []
    for q in questions[:: max(1, len(questions) // ANCHOR_QUERIES)][:ANCHOR_QUERIES]:
        t0 = time.perf_counter()
        embedder.embed_queries([q["question"]])
        ts.append(time.perf_counter() - t0)
    return {"p50_ms": round(1e3 * percentile(ts, 50), 3), "p99_ms": round(1e3 * percentile(ts, 99), 3), "n": len(ts)}


def timing_summary(times: dict[str, list[float]], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": size, "rounds": LATENCY_ROUNDS}
    for ranker, ts in times.items():
        out[ranker] = {"p50_ms": round(1e3 * percentile(ts, 50), 3), "p99_ms": round(1e3 * percentile(ts, 99), 3)}
    diffs = [b - a for a, b in zip(times["fusion"], times["learned"])]
    out["added_p50_ms_paired"] = round(1e3 * percentile(diffs, 50), 3)
    out["added_p50_ms"] = round(out["learned"]["p50_ms"] - out["fusion"]["p50_ms"], 3)
    out["ratio_p50"] = round(out["learned"]["p50_ms"] / out["fusion"]["p50_ms"], 3)
    return out


def choose_and_fit(sets: list[dict[str, Any]], features: Sequence[str], groups: dict[str, list[str]]) -> dict[str, Any]:
    """The model, L2 and depth chosen by LOCO MRR@10, fit on every set; the rows of the report."""
    all_cols = list(range(len(features)))
    rows: dict[str, dict[str, Any]] = {}
    rows["old fusion (ranker: fusion)"] = summary(evaluate(sets, lambda s: -np.arange(s["x"].shape[0], dtype=float)), sets)
    grid: dict[str, Any] = {}
    best: tuple[float, str, float] | None = None
    for kind in KINDS:
        for l2 in L2S:
            r = summary(loco(sets, all_cols, kind, l2), sets)
            grid[f"{kind} l2={l2:g}"] = r["all"]
            log(f"LOCO {kind} l2={l2:g}: {r['all']}")
            key = r["all"]["MRR@10"]
            if best is None or key > best[0]:
                best = (key, kind, l2)
    assert best is not None
    _, kind, l2 = best
    by_depth: dict[str, Any] = {}
    for depth in DEPTHS:
        by_depth[str(depth)] = summary(loco(truncated(sets, depth), all_cols, kind, l2), sets)["all"]
        log(f"LOCO depth {depth}: {by_depth[str(depth)]}")
    best_of = {k: max(r[k] for r in by_depth.values()) for k in ("MRR@10", "any@10")}
    depth = next(d for d in DEPTHS if all(by_depth[str(d)][k] >= best_of[k] - DEPTH_SLACK for k in best_of))
    sets = truncated(sets, depth)
    chosen = f"{kind}, L2 {l2:g}, depth {depth}"
    rows[f"learned, LOCO ({chosen})"] = summary(loco(sets, all_cols, kind, l2), sets)
    w = fit(sets, all_cols, kind, l2)
    rows[f"learned, in-sample ({chosen})"] = summary(evaluate(sets, linear_scorer(all_cols, w)), sets)
    removed: dict[str, Any] = {}
    for name, feats in groups.items():
        cols = [i for i, f in enumerate(features) if f not in feats]
        removed[name] = summary(loco(sets, cols, kind, l2), sets)["all"]
        log(f"LOCO without {name}: {removed[name]}")
    return {"rows": rows, "grid": grid, "by_depth": by_depth, "removed": removed, "w": w, "kind": kind, "l2": l2,
            "depth": depth, "chosen": chosen, "sets": sets}


def signal_rows(sets: list[dict[str, Any]], features: Sequence[str], groups: dict[str, list[str]],
                kind: str, l2: float, depth: int | None) -> dict[str, dict[str, Any]]:
    """bench/locomo.py's per-signal rows (issue 31 §4) at the shipped model, L2 and depth: the
    fusion; the fusion's score with each signal group added alone (LOCO); the ranker, LOCO and
    in-sample; the ranker with each group removed (LOCO)."""
    sets = truncated(sets, depth)
    fusion_col = list(features).index("fusion")
    all_cols = list(range(len(features)))
    rows: dict[str, dict[str, Any]] = {"fusion": summary(evaluate(sets, lambda s: -np.arange(s["x"].shape[0], dtype=float)), sets)}
    for name, feats in groups.items():
        cols = sorted({fusion_col, *(i for i, f in enumerate(features) if f in feats)})
        rows[f"fusion + {name} alone, LOCO"] = summary(loco(sets, cols, kind, l2), sets)
    rows["ranker, LOCO"] = summary(loco(sets, all_cols, kind, l2), sets)
    rows["ranker, in-sample"] = summary(evaluate(sets, linear_scorer(all_cols, fit(sets, all_cols, kind, l2))), sets)
    for name, feats in groups.items():
        cols = [i for i, f in enumerate(features) if f not in feats]
        rows[f"ranker − {name}, LOCO"] = summary(loco(sets, cols, kind, l2), sets)
    return rows


def main(argv: list[str] | None = None) -> int:
    from eurekamem.daemon.conversation import signals as conversation_signals
    from eurekamem.daemon.memory import signals as memory_signals
    from eurekamem.daemon.retrieval.ranker import LinearRanker

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", choices=("conversation", "memory"), default="conversation",
                    help="which search's ranker: conversation.search (default) or memory.search")
    ap.add_argument("--data", default=None)
    ap.add_argument("--embed-cache", default="/tmp/eurekamem-ranker-e5-small.npz",
                    help="a .npz of the embeddings, reused when it exists (outside the repo)")
    ap.add_argument("--out", default=None, help="the report's folder (default bench/results/<path>-ranker-<date>)")
    ap.add_argument("--weights", default=None, help="the weights file (default the package's, beside the path's signals)")
    ap.add_argument("--no-write", action="store_true", help="report only; leave the weights file alone")
    ap.add_argument("--latency", action="store_true", help="also time both rankers (conversation: one ~2,760-turn group)")
    ap.add_argument("--latency-only", action="store_true", help="time the shipped weights only (no training)")
    ap.add_argument("--only", default=None, help="comma-separated sample_ids (a quick look; LOCO needs at least two)")
    args = ap.parse_args(argv)
    memory = args.path == "memory"
    signals = memory_signals if memory else conversation_signals
    features = signals.FEATURES
    weights_path = Path(args.weights or ROOT / "daemon" / args.path / "ranker.json")
    prefix = "memory-ranker" if memory else "ranker"
    out = Path(args.out or HERE / "results" / f"{prefix}-{datetime.date.today().isoformat()}")
    data = Path(args.data or os.environ.get("EUREKAMEM_LOCOMO") or DEFAULT_DATA_DIR)
    if data.is_dir():
        data = data / "locomo-dev.json"
    cache = Path(args.embed_cache) if args.embed_cache else None
    t_start = time.perf_counter()
    only = args.only.split(",") if args.only else None
    convs, questions, _ = load(data, only=only)
    sessions = conversation_sessions(data, only=only)
    if memory:
        state, qvecs = memory_state(convs, questions, cache)
        if args.latency_only:
            print(json.dumps(memory_latency(state, questions, qvecs), indent=1))
            return 0
        sets, same = memory_sets(state, questions, qvecs)
        model_name = state.model
    else:
        if args.latency_only:
            print(json.dumps(latency(sessions, questions, cache), indent=1))
            return 0
        state, qvecs = embedded_state(sessions, questions, cache)
        sets, same = question_sets(state, questions, qvecs)
        model_name = state.model
    log(f"the candidates' first 20 are the search's (fusion) answer for {same} of {len(sets)} questions")
    log(f"{len(sets)} questions, {sum(s['x'].shape[0] for s in sets)} candidates, "
        f"{sum(1 for s in sets if s['y'].any())} with evidence among them ({time.perf_counter() - t_start:.0f} s)")
    got = choose_and_fit(sets, features, MEMORY_GROUPS if memory else GROUPS)
    rows, w, kind, l2, depth, chosen, sets = (got[k] for k in ("rows", "w", "kind", "l2", "depth", "chosen", "sets"))
    loco_row = rows[f"learned, LOCO ({chosen})"]
    search = "memory.search (hybrid)" if memory else "conversation.search"
    meta = {
        "trained_by": "bench/train_ranker.py" + (" --path memory" if memory else ""),
        "trained_on": "LoCoMo development split (conv-26, conv-30, conv-41, conv-42, conv-43), questions of categories 1-4, "
                      "evidence turns as positives; e5-small vectors"
                      + ("; every turn a memory, as bench/locomo.py stores them" if memory else ""),
        "embedder": model_name,  # the daemon ranks this way by default only with this embedder
        "model": kind, "l2": l2, "depth": depth,
        "loco": loco_row["all"], "in_sample": rows[f"learned, in-sample ({chosen})"]["all"],
        "fusion": rows["old fusion (ranker: fusion)"]["all"],
        "check": check_set(features, w),
    }
    model = LinearRanker(tuple(features), w, meta)
    result: dict[str, Any] = {"rows": rows, "grid": got["grid"], "by_depth": got["by_depth"], "removed": got["removed"],
                              "weights": dict(zip(features, [round(float(v), 6) for v in w])),
                              "chosen": {"kind": kind, "l2": l2, "depth": depth},
                              "questions": len(sets), "fusion_reproduced": same,
                              "seconds_to_train_and_evaluate": round(time.perf_counter() - t_start, 1)}
    if not args.no_write:
        weights_path.write_text(model.to_json(), encoding="utf-8")
        signals.shipped_ranker.cache_clear()  # the latency run below ranks with these weights (when the file is the package's)
        log(f"weights written to {weights_path}")
    if args.latency:
        result["latency"] = memory_latency(state, questions, qvecs) if memory else latency(sessions, questions, cache)
        log(f"latency: {result['latency']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranker.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    convs_ = sorted({s["conv"] for s in sets})
    if memory:
        how = ("the candidates are memory.search's (hybrid: the union of the BM25 top 100 with the person boost and the "
               "e5-small top 100, every turn a memory as bench/locomo.py stores them, one domain per conversation), "
               f"computed in-process by the daemon's MemoryState (its top 20 is memory.search's answer with ranker fusion "
               f"for {same} of {len(sets)} questions)")
    else:
        how = ("the candidates are the old fusion's (union of the BM25 and e5-small top 100), computed in-process by the "
               f"daemon's ConversationState (its top 20 is conversation.search's fusion answer for {same} of {len(sets)} questions)")
    lines = [f"# {search}'s learned ranker on the LoCoMo dev split (issue 31)", "",
             f"{len(sets)} questions of categories 1-4 over {len(convs_)} conversations ({', '.join(convs_)}); {how}; "
             "metrics over the candidates' ranking. Model and L2 chosen by leave-one-conversation-out MRR@10 only; "
             "a question whose evidence is not among the candidates counts as a miss everywhere.", "", *table(rows), "",
             "Per category (any@10):", "", *category_table(rows, "any@10"), "", "Per category (MRR@10):", "",
             *category_table(rows, "MRR@10"), "",
             "LOCO grid (model, L2):", "", "| model | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    lines += [f"| {name} | " + " | ".join(f"{r[k]:.3f}" for k in METRICS) + " |" for name, r in got["grid"].items()]
    lines += ["", f"LOCO by depth (how many of the fusion's candidates are reordered; {kind}, L2 {l2:g}; the smallest "
              f"within {DEPTH_SLACK} of the best MRR@10 and of the best any@10 is shipped):", "", "| depth | " + " | ".join(METRICS) + " |",
              "|---|" + "---|" * len(METRICS)]
    lines += [f"| {d} | " + " | ".join(f"{r[k]:.3f}" for k in METRICS) + " |" for d, r in got["by_depth"].items()]
    lines += ["", "LOCO with one signal group removed:", "", "| removed | " + " | ".join(METRICS) + " |",
              "|---|" + "---|" * len(METRICS)]
    lines += [f"| {name} | " + " | ".join(f"{r[k]:.3f}" for k in METRICS) + " |" for name, r in got["removed"].items()]
    lines += ["", "Weights (over per-query z-scores):", "", "| signal | weight |", "|---|---|"]
    lines += [f"| {f} | {v:+.4f} |" for f, v in zip(features, w)]
    if "latency" in result:
        lat = result["latency"]
        lines += ["", f"Query cost in-process (the query vector given), {lat['messages']} {'memories' if memory else 'turns'}"
                      f"{'' if memory else ' in one group'}, {len(sets)} questions: fusion p50 {lat['fusion']['p50_ms']:.2f} ms / "
                      f"p99 {lat['fusion']['p99_ms']:.2f} ms; learned p50 {lat['learned']['p50_ms']:.2f} ms / p99 "
                      f"{lat['learned']['p99_ms']:.2f} ms (+{lat['added_p50_ms']:.2f} ms p50, ×{lat['ratio_p50']:.2f}; the median of "
                      f"the per-question differences, both rankers back to back, {lat['rounds']} rounds: "
                      f"+{lat['added_p50_ms_paired']:.2f} ms). The anchor, in the same run: embedding one question "
                      f"with e5-small, p50 {lat['query_embedding']['p50_ms']:.2f} ms / p99 {lat['query_embedding']['p99_ms']:.2f} ms."]
        if "term_cache" in lat:
            lines[-1] += (f" The ranker's term cache after it: {lat['term_cache']['turns']} turns, "
                          f"{lat['term_cache']['sessions']} sessions, about {lat['term_cache']['bytes_per_message']} bytes a message.")
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
