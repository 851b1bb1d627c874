"""The figures protocol/PROTOCOL.md gives for search and dedup are the code's: the documentation is
read here and compared with the constants the daemon runs with, so neither can drift alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eurekamem.daemon.memory import params as memory_params
from eurekamem.daemon.memory import search as memory_search
from eurekamem.daemon.retrieval import fusion as retrieval_fusion
from eurekamem.daemon.retrieval.embed import DEFAULT_REMOTE_THRESHOLDS, E5_SMALL_THRESHOLDS, USEM3_THRESHOLDS
from eurekamem.daemon.retrieval.lexical import LexicalIndex

PROTOCOL = (Path(__file__).resolve().parent.parent / "protocol" / "PROTOCOL.md").read_text(encoding="utf-8")

pytestmark = pytest.mark.unit


def _fusion_table() -> dict[str, tuple[float, float, str]]:
    """The rows of the fusion table: model -> (dense weight, lexical weight, floor text)."""
    rows = re.findall(r"^\s*\| (e5-small|usem3|any other) \| ([\d.]+) \| ([\d.]+) \| ([^|]+) \|\s*$", PROTOCOL, re.M)
    return {model: (float(dense), float(lexical), floor.strip()) for model, dense, lexical, floor in rows}


def test_fusion_weights_and_floors_are_the_codes() -> None:
    table = _fusion_table()
    assert set(table) == {"e5-small", "usem3", "any other"}
    thresholds = {"e5-small": E5_SMALL_THRESHOLDS, "usem3": USEM3_THRESHOLDS}
    for model, (dense, lexical, floor) in table.items():
        fusion = memory_search.FUSION.get(model, memory_search.DEFAULT_FUSION)
        assert (dense, lexical) == (fusion["dense"], fusion["lexical"]), model
        if model == "any other":
            assert fusion["floor"] and f"{DEFAULT_REMOTE_THRESHOLDS.floor}" in floor
        elif floor == "none":
            assert not fusion["floor"], model
        else:
            assert fusion["floor"] and float(floor) == thresholds[model].floor, model
    assert memory_search.FUSION.keys() == {"e5-small", "usem3"}  # a new model needs a row


def test_rrf_k_depth_and_bm25_parameters_are_the_codes() -> None:
    assert "weighted reciprocal rank fusion with k = 60" in PROTOCOL and retrieval_fusion.RRF_K == 60
    assert "the 100 nearest memories" in PROTOCOL and "the top 100 with a positive score" in PROTOCOL
    assert retrieval_fusion.FETCH == 100
    index = LexicalIndex()
    assert f"k1 = {index.k1}, b = {index.b}" in PROTOCOL


def test_dedup_thresholds_are_the_codes() -> None:
    text = " ".join(PROTOCOL.split())  # the sentence wraps
    assert (
        f"(e5-small {E5_SMALL_THRESHOLDS.duplicate}, usem3 {USEM3_THRESHOLDS.duplicate}, "
        f"an OpenAI-compatible model {DEFAULT_REMOTE_THRESHOLDS.duplicate} unless calibrated)"
    ) in text
    assert f"`confidence` below {memory_params.MIN_CONFIDENCE}" in text


def test_the_io_layers_look_after_a_pass_is_the_documented_one() -> None:
    from eurekamem.daemon import io_layer

    assert re.search(r"`spins` \(times the layer went on looking for up to (\d+) µs", PROTOCOL).group(1) == str(
        io_layer.SPIN_NS // 1000
    )
