"""eurekaclaw.knowledge_bus.bus.KnowledgeBus: the session's artifact store (no `domain` attribute, as EurekaClaw's)."""

from __future__ import annotations

from typing import Any

from eurekaclaw.types.artifacts import ResearchBrief, TheoryState
from eurekaclaw.types.tasks import TaskPipeline


class KnowledgeBus:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._store: dict[str, Any] = {}

    def put_research_brief(self, brief: ResearchBrief) -> None:
        self._store["research_brief"] = brief

    def get_research_brief(self) -> ResearchBrief | None:
        return self._store.get("research_brief")

    def put_theory_state(self, state: TheoryState) -> None:
        self._store["theory_state"] = state

    def get_theory_state(self) -> TheoryState | None:
        return self._store.get("theory_state")

    def put_pipeline(self, pipeline: TaskPipeline) -> None:
        self._store["pipeline"] = pipeline

    def get_pipeline(self) -> TaskPipeline | None:
        return self._store.get("pipeline")

    def put(self, key: str, value: Any) -> None:
        self._store[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return self._store.get(key, default)
