"""Tier 4's categories have one definition (protocol/categories.py): every table keyed or listed by
category elsewhere must hold exactly those, so adding or renaming one cannot leave a copy behind."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest

from eurekamem.protocol import (
    ASSISTANT_CATEGORIES,
    MEMORY_CATEGORIES,
    RESEARCH_CATEGORIES,
    AssistantCategory,
    MemoryCategory,
    ResearchCategory,
)
from eurekamem.protocol import methods as m
from eurekamem.protocol.readable import CATEGORY_HEADINGS


def _literal_values(tp: object) -> set[str]:
    out: set[str] = set()
    for arg in get_args(tp):
        out |= _literal_values(arg) if get_args(arg) else {arg}  # type: ignore[arg-type]
    return out


def test_the_two_kinds_partition_the_categories() -> None:
    assert set(RESEARCH_CATEGORIES).isdisjoint(ASSISTANT_CATEGORIES)
    assert MEMORY_CATEGORIES == RESEARCH_CATEGORIES + ASSISTANT_CATEGORIES
    assert _literal_values(MemoryCategory) == set(MEMORY_CATEGORIES)
    assert _literal_values(ResearchCategory) == set(RESEARCH_CATEGORIES)
    assert _literal_values(AssistantCategory) == set(ASSISTANT_CATEGORIES)


def test_every_table_keyed_by_category_holds_exactly_the_categories() -> None:
    from eurekamem.cli.mcp_server import CATEGORIES as MCP_ENUM
    from eurekamem.daemon.config import MEMORY_HALF_LIFE_DAYS, MEMORY_IMPORTANCE
    from eurekamem.daemon.jobs.conversation_schema import MEMORY_TYPES
    from eurekamem.daemon.jobs.extract import CATEGORIES as SESSION_CATEGORIES
    from eurekamem.daemon.jobs.extract import SessionInsights

    categories = set(MEMORY_CATEGORIES)
    assert set(CATEGORY_HEADINGS) == categories
    assert set(MEMORY_HALF_LIFE_DAYS) == categories
    assert set(MEMORY_IMPORTANCE) == categories
    assert sorted(MCP_ENUM) == sorted(MEMORY_CATEGORIES)
    assert set(MEMORY_TYPES) == set(ASSISTANT_CATEGORIES)
    assert set(SESSION_CATEGORIES) == set(RESEARCH_CATEGORIES)
    assert set(SessionInsights.__struct_fields__) >= set(RESEARCH_CATEGORIES)  # the session extraction's answer


@pytest.mark.parametrize("category", MEMORY_CATEGORIES)
def test_the_wire_takes_every_category_and_nothing_else(category: str) -> None:
    decoded = msgspec.convert({"domain": "d", "category": category, "title": "t", "content": "c"}, m.MemoryAdd)
    assert decoded.category == category
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"domain": "d", "category": category + "x", "title": "t", "content": "c"}, m.MemoryAdd)
