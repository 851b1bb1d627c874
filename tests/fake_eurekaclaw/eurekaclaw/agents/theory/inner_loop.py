"""eurekaclaw.agents.theory.inner_loop: imports MemoryManager from the package, as EurekaClaw's does."""

from __future__ import annotations

from eurekaclaw.memory import MemoryManager


class TheoryInnerLoop:
    def __init__(self, memory: MemoryManager | None = None) -> None:
        self.memory = memory

    def prior_attempt(self, statement_key: str) -> object | None:
        return self.memory.recall(statement_key) if self.memory else None
