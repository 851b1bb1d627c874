"""Tier 4's categories, defined here once: the params, the config's per-category settings, the
extraction schemas, the MCP tools' enums and the CLI's help are all derived from these.

Rule kept here: only `typing`, so the CLI's parser offers the categories without importing the
records (protocol/_records.py) or msgspec.
"""

from __future__ import annotations

from typing import Literal, get_args

ResearchCategory = Literal["domain_knowledge", "proof_strategy", "open_problems", "pitfalls"]  # EurekaClaw's insights
AssistantCategory = Literal["fact", "preference", "skill", "goal", "context"]  # assistant memories (NanoClaw kind)
MemoryCategory = Literal[ResearchCategory, AssistantCategory]
RESEARCH_CATEGORIES: tuple[str, ...] = get_args(ResearchCategory)
ASSISTANT_CATEGORIES: tuple[str, ...] = get_args(AssistantCategory)
MEMORY_CATEGORIES: tuple[str, ...] = RESEARCH_CATEGORIES + ASSISTANT_CATEGORIES
