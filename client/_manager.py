"""MemoryManager: EurekaClaw's memory facade, served by the daemon.

Same method names and signatures as eurekaclaw.memory.manager.MemoryManager, so an agent swaps
one import. Records come back as EurekaClaw's pydantic models when the `eurekaclaw` package is
importable, else as eurekamem.protocol's msgspec Structs (same field names; timestamps as RFC 3339
strings).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import msgspec

from eurekamem.protocol import CrossRunRecord, EpisodicEntry, KnowledgeNode

from ._errors import EurekamemError
from ._paths import default_socket_path
from ._sync import Client

__all__ = ["MemoryManager"]


@functools.lru_cache(maxsize=1)
def _eurekaclaw_models() -> dict[type, Any] | None:
    """EurekaClaw's record models by our Struct type, or None when eurekaclaw is not installed."""
    try:
        from eurekaclaw.types import memory as models  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        return {
            EpisodicEntry: models.EpisodicEntry,
            CrossRunRecord: models.CrossRunRecord,
            KnowledgeNode: models.KnowledgeNode,
        }
    except AttributeError:
        return None


def _convert(record: Any) -> Any:
    models = _eurekaclaw_models()
    if models is None or record is None:
        return record
    model = models.get(type(record))
    if model is None:
        return record
    return model.model_validate(msgspec.structs.asdict(record))


class MemoryManager:
    """Unified read/write interface across the memory tiers, backed by the eurekamem daemon.

    session_id: the session that log_event and recent_events use.
    memory_dir: accepted for compatibility with EurekaClaw; when given (EurekaClaw passes
        <data root>/memory), its parent is the data root used to find the socket.
    client: a Client to share (it is not closed by close()); else one is made for socket_path,
        or for default_socket_path(...).
    """

    def __init__(
        self,
        session_id: str,
        memory_dir: str | os.PathLike[str] | None = None,
        *,
        client: Client | None = None,
        socket_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.session_id = session_id
        self.memory_dir = Path(memory_dir).expanduser() if memory_dir is not None else None
        if client is None:
            if socket_path is None:
                data_dir = self.memory_dir.parent if self.memory_dir is not None else None
                socket_path = default_socket_path(data_dir)
            client = Client(socket_path)
            self._owns_client = True
        else:
            self._owns_client = False
        self.client = client

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "MemoryManager":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --- Tier 1: Episodic (session-scoped) ----------------------------------------------------

    def log_event(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> Any:
        return _convert(self.client.log_event(self.session_id, agent_role, content, metadata))

    def recent_events(self, n: int = 20, agent_role: str | None = None) -> list[Any]:
        return [_convert(e) for e in self.client.recent(self.session_id, n, agent_role)]

    # --- Tier 2: Persistent key-value (cross-run) ---------------------------------------------

    def remember(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> None:
        self.client.remember(key, value, tags=tags, source_session=source_session)

    def recall(self, key: str) -> Any | None:
        """The value stored under key (not the record), or None, as EurekaClaw's recall does."""
        record = self.client.recall(key)
        return None if record is None else record.value

    def recall_by_tag(self, tag: str) -> list[Any]:
        return [_convert(r) for r in self.client.by_tag(tag)]

    # --- Tier 3: Knowledge graph ----------------------------------------------------------------

    def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> Any:
        return _convert(self.client.add_theorem(theorem_name, formal_statement, domain, session_id, tags))

    def link_theorems(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        self.client.link(from_id, to_id, relation)

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[Any]:
        return [_convert(n) for n in self.client.related(node_id, depth)]

    # --- Tier 4: Domain markdown memories -------------------------------------------------------

    def load_for_injection(self, domain: str, k: int = 4, query: str | None = None) -> str:
        """Top-k domain memories as a block for prompt injection (the k most similar to `query`
        when one is given, else the newest); "" when there are none or on error (EurekaClaw's
        behaviour)."""
        try:
            result = self.client.inject(domain, k=k, query=query)
        except EurekamemError:
            return ""
        text = result.get("text") if isinstance(result, dict) else None
        return text if isinstance(text, str) else ""
