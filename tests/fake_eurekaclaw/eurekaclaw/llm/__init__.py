"""eurekaclaw.llm: LLMClient and create_client. The stand-in's client answers every call with the
JSON in `LLMClient.answer` and records the calls (EurekaClaw's own extractor is the only caller here)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any


class _Messages:
    def __init__(self, owner: LLMClient) -> None:
        self._owner = owner

    async def create(self, **kwargs: Any) -> Any:
        self._owner.calls.append(kwargs)
        return SimpleNamespace(content=[SimpleNamespace(type="text", text=json.dumps(self._owner.answer))])


class LLMClient:
    answer: dict[str, Any] = {}

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.messages = _Messages(self)


def create_client(**kwargs: Any) -> LLMClient:
    return LLMClient()


__all__ = ["LLMClient", "create_client"]
