"""Tier 1: per-session ring buffers of the last 500 events, in RAM only, and the actor that owns them.

Rule kept here: episodic events are never journaled (as in EurekaClaw); `session.close` writes the
session's events to runs/<session_id>/episodic.json, atomically, from the actor itself.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import trio
from eurekamem.daemon import systemd as systemd
from eurekamem.daemon.paths import Paths
from eurekamem.daemon.storage import eurekaclaw as eurekaclaw
from eurekamem.daemon.storage.files import RealFiles, atomic_write
from eurekamem.daemon.tier import TierActor, TierState, Undo
from eurekamem.protocol import (
    Call,
    EpisodicEntry,
    ProtocolError,
    new_id,
)
from eurekamem.protocol import _methods as m

log = logging.getLogger("eurekamem")


class EpisodicState(TierState):
    """Per-session ring buffers in RAM (never journaled, as in EurekaClaw)."""

    name = "episodic"
    RING = 500

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[str, deque[EpisodicEntry]] = {}
        self.logged = 0

    def do_log(self, p: m.EpisodicLog) -> EpisodicEntry:
        entry = EpisodicEntry(
            entry_id=new_id(),
            session_id=p.session_id,
            agent_role=p.agent_role,
            content=p.content,
            metadata=p.metadata,
            timestamp=self.now(),
        )
        ring = self.sessions.get(p.session_id)
        if ring is None:
            ring = self.sessions[p.session_id] = deque(maxlen=self.RING)
        ring.append(entry)
        self.logged += 1
        return entry

    def do_recent(self, p: m.EpisodicRecent) -> list[EpisodicEntry]:
        entries = self.sessions.get(p.session_id, ())
        if p.agent_role is not None:
            entries = [e for e in entries if e.agent_role == p.agent_role]
        else:
            entries = list(entries)
        return entries[-p.n :]

    def do_search(self, p: m.EpisodicSearch) -> list[EpisodicEntry]:
        needle = p.query.lower()
        hits = [e for e in self.sessions.get(p.session_id, ()) if needle in e.content.lower()]
        return hits[-p.n :]

    def close_session(self, session_id: str) -> list[EpisodicEntry]:
        """Drop a session's buffer and return its events (the caller writes them to runs/)."""
        return list(self.sessions.pop(session_id, ()))

    def apply(self, mutation: Any) -> Undo:  # pragma: no cover - episodic is never journaled
        raise TypeError("episodic state is not journaled")

    def counts(self) -> dict[str, int]:
        return {"sessions": len(self.sessions), "events": sum(len(r) for r in self.sessions.values())}


class EpisodicActor(TierActor):
    """Tier 1: RAM only; session.close writes the session's events to runs/<session_id>/episodic.json."""

    NOT_INLINE = frozenset({"session.close"})  # writes a file: only the actor may wait for that

    def __init__(self, state: EpisodicState, journal: None, paths: Paths) -> None:
        super().__init__(state, journal, inline=True)
        self.paths = paths

    async def handle(self, call: Call) -> Any:
        if call.spec.name != "session.close":
            return await super().handle(call)
        session_id = call.params.session_id
        if session_id in (".", "..") or "/" in session_id or "\x00" in session_id:
            return ProtocolError(
                "invalid_params", f"invalid params: session_id {session_id!r} cannot name a folder", field="session_id"
            )
        events = self.state.sessions.get(session_id)
        if not events:
            self.state.close_session(session_id)
            return {"job_id": None, "events_written": 0, "path": None}
        path = self.paths.runs / session_id / "episodic.json"
        data = msgspec.json.format(msgspec.json.encode(list(events)), indent=2)
        try:
            await trio.to_thread.run_sync(_write_run_file, path, data)
        except OSError as exc:
            return ProtocolError("internal", f"could not write {path}: {exc}")
        self.state.close_session(session_id)
        return {"job_id": None, "events_written": len(events), "path": str(path)}


def _write_run_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(RealFiles(), str(path), data)


