"""Tier 1: per-session ring buffers of the last 500 events, in RAM only, and the actor that owns them.

Rules kept here:
- Episodic events are never journaled (as in EurekaClaw). A session ends by `session.close`, by
  being idle (no event for `idle_close` seconds), by the bound on open sessions (a new session past
  `max_sessions` closes the one idle longest), or at shutdown; every end writes the session's events
  to runs/<session_id>/episodic.json, atomically, from the actor itself, merged with what an earlier
  end of the same session wrote there (a session that logs again after it ended appends; it never
  overwrites). A session id that holds a secret is kept as sent in the events, but its folder is
  runs/redacted-<16 hex digits of its SHA-256>/ and log lines show it redacted (daemon/redact.py).
- Only the actor's own run loop touches the state: the idle sweeper decides nothing itself, it
  queues an internal item that re-checks idleness when the actor runs it. A session evicted by the
  bound leaves the state at once (the bound is strict) and waits in `evicted` until the actor writes it.
- `session.close` first hands the session's events and TheoryState to the job queue, which journals
  them with the extraction job (daemon/jobs/extract.py): the answer's job_id is durable, and a
  session whose job could not be journaled (the daemon read-only) is not closed. An idle session's
  end does the same with its events (no TheoryState, no domain: "general"), before it is forgotten,
  so it queues its job exactly once (the same events are the same job's key; a refused job leaves
  the session open, tried again after WRITE_RETRY). The bound and shutdown queue no job.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import trio

from ...protocol import (
    Call,
    EpisodicEntry,
    ProtocolError,
    new_id,
)
from ...protocol import methods as m
from ..jobs.extract import KIND, capture, session_key
from ..memory.params import validate_domain
from ..paths import Paths
from ..redact import folder_name, shown
from ..storage.files import RealFiles, atomic_write
from ..storage.store import StoreUnavailable
from ..tier import TierActor, TierState, Undo, handles

log = logging.getLogger("eurekamem")

WRITE_RETRY = 30.0  # seconds before writing runs/ again after it failed


class EpisodicState(TierState):
    """Per-session ring buffers in RAM (never journaled, as in EurekaClaw), least recently active first."""

    name = "episodic"
    RING = 500
    changes_counts_inline = True  # episodic.log runs on the fast path: the actor publishes counts after it

    def __init__(self, max_sessions: int, clock: Callable[[], float] | None = None) -> None:
        """`max_sessions`: open sessions held in RAM at most (Config.max_open_sessions)."""
        super().__init__()
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self.clock = clock if clock is not None else trio.current_time
        self.sessions: OrderedDict[str, deque[EpisodicEntry]] = OrderedDict()
        self.last_event: dict[str, float] = {}  # session -> clock() of its last event
        self.evicted: list[tuple[str, list[EpisodicEntry]]] = []  # closed by the bound, not yet written
        self.logged = 0
        self._events = 0  # events held in all rings, so that counts() is O(1)
        self.closed_idle = 0
        self.closed_evicted = 0
        self.changed = trio.Event()  # set when a session opens or is evicted: the sweeper looks again
        self._batch_clock: float | None = None  # clock() of the batch in progress (begin_batch clears it)

    def begin_batch(self) -> None:
        super().begin_batch()
        self._batch_clock = None

    def batch_clock(self) -> float:
        """clock() once per batch (a fast-path read's calls share one): when its events came."""
        if self._batch_clock is None:
            self._batch_clock = self.clock()
        return self._batch_clock

    @handles("episodic.log")
    def do_log(self, p: m.EpisodicLog) -> EpisodicEntry:
        timestamp = _utc_timestamp(p.timestamp) if p.timestamp is not None else self.now()
        ring = self.sessions.get(p.session_id)
        if ring is not None and p.entry_id is not None:
            for old in reversed(ring):
                if old.entry_id == p.entry_id:
                    return old  # a retried delivery: the session has it already
        if ring is None:
            while len(self.sessions) >= self.max_sessions:
                self._evict_oldest()
            ring = self.sessions[p.session_id] = deque(maxlen=self.RING)
            self.changed.set()
        else:
            self.sessions.move_to_end(p.session_id)
        entry = EpisodicEntry(
            entry_id=p.entry_id if p.entry_id is not None else new_id(),
            session_id=p.session_id,
            agent_role=p.agent_role,
            content=p.content,
            metadata=p.metadata,
            timestamp=timestamp,
        )
        self._events += len(ring) < self.RING  # a full ring drops its oldest
        ring.append(entry)
        self.last_event[p.session_id] = self.batch_clock()
        self.logged += 1
        return entry

    def _evict_oldest(self) -> None:
        session_id, ring = self.sessions.popitem(last=False)
        self._events -= len(ring)
        self.last_event.pop(session_id, None)
        self.evicted.append((session_id, list(ring)))
        self.closed_evicted += 1
        self.changed.set()

    @handles("episodic.recent")
    def do_recent(self, p: m.EpisodicRecent) -> list[EpisodicEntry]:
        ring = self.sessions.get(p.session_id, ())
        if p.agent_role is not None:
            entries = [e for e in ring if e.agent_role == p.agent_role]
        else:
            entries = list(ring)
        return entries[-p.n :]

    @handles("episodic.search")
    def do_search(self, p: m.EpisodicSearch) -> list[EpisodicEntry]:
        needle = p.query.lower()
        hits = [e for e in self.sessions.get(p.session_id, ()) if needle in e.content.lower()]
        return hits[-p.n :]

    def close_session(self, session_id: str) -> list[EpisodicEntry]:
        """Drop a session's buffer and return its events (the caller writes them to runs/)."""
        self.last_event.pop(session_id, None)
        events = list(self.sessions.pop(session_id, ()))
        self._events -= len(events)
        return events

    def oldest_idle_deadline(self, idle: float) -> float | None:
        """When the least recently active session turns idle (clock time), or None without sessions."""
        for session_id in self.sessions:
            return self.last_event.get(session_id, -math.inf) + idle
        return None

    def idle_sessions(self, idle: float) -> list[str]:
        """Sessions without an event for `idle` seconds, least recently active first."""
        now = self.clock()
        out = []
        for session_id in self.sessions:
            if self.last_event.get(session_id, -math.inf) + idle > now:
                break  # ordered by activity: every later one is younger
            out.append(session_id)
        return out

    def take_evicted(self) -> list[tuple[str, list[EpisodicEntry]]]:
        out, self.evicted = self.evicted, []
        return out

    def apply(self, mutation: Any) -> Undo:  # pragma: no cover - episodic is never journaled
        raise TypeError("episodic state is not journaled")

    def counts(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "events": self._events,
            "closed_idle": self.closed_idle,
            "closed_evicted": self.closed_evicted,
        }


def _utc_timestamp(value: str) -> str:
    """A client's RFC 3339 timestamp in UTC (naive means UTC); invalid_params when it is not one."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ProtocolError(
            "invalid_params", f"invalid params: timestamp {value!r} is not RFC 3339", field="timestamp"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.UTC)
    return parsed.astimezone(_dt.UTC).isoformat()


class ExtractionQueue(Protocol):
    """What session.close asks of the job queue (the JobsActor): a session's extraction job."""

    async def accept(self, kind: str, key: str, job_input: Any) -> str: ...


class EpisodicActor(TierActor):
    """Tier 1: RAM only; every end of a session writes its events to runs/<session_id>/episodic.json.

    idle_close: seconds without an event after which a session is closed (0 or less: never;
    Config.session_idle_close).
    """

    state: EpisodicState

    def __init__(
        self,
        state: EpisodicState,
        store: None,
        paths: Paths,
        *,
        idle_close: float,
        run_io: Callable[..., Awaitable[Any]] = trio.to_thread.run_sync,
        jobs: ExtractionQueue | None = None,
    ) -> None:
        super().__init__(state, store, inline=True)
        self.paths = paths
        self.run_io = run_io  # how file writes run: a worker thread (tests pass one that runs them inline)
        self.idle_close = idle_close
        self.write_errors = 0
        self.jobs = jobs  # the job queue: session.close queues extractions (None: it queues none)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sweep)
            await super().run()
            nursery.cancel_scope.cancel()
        # The channel is closed (shutdown): write every session still open, as session.close would.
        await self._write_evicted()
        for session_id in list(self.state.sessions):
            await self._end(session_id, "shutdown")

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        result = fn(self.state)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _sweep(self) -> None:
        """Queue the writing of evicted sessions and the closing of idle ones; the actor does the work.

        After a failed write (a full disk, say) the next attempt waits WRITE_RETRY seconds.
        """
        state: EpisodicState = self.state
        retry_at = -math.inf
        while True:
            state.changed = trio.Event()
            if state.evicted:
                due = trio.current_time()
            else:
                deadline = state.oldest_idle_deadline(self.idle_close) if self.idle_close > 0 else None
                due = math.inf if deadline is None else deadline
            due = max(due, retry_at)
            if due <= trio.current_time():
                try:
                    all_written = await self.run_internal(lambda _state: self._maintain())
                except trio.ClosedResourceError:
                    return  # shutting down: run() writes what is left
                retry_at = -math.inf if all_written else trio.current_time() + WRITE_RETRY
                continue
            with trio.move_on_at(due):
                await state.changed.wait()

    async def _maintain(self) -> bool:
        """Write the evicted sessions, close the idle ones; False if a write failed."""
        ok = await self._write_evicted()
        if self.idle_close > 0:
            for session_id in self.state.idle_sessions(self.idle_close):
                if await self._end(session_id, "idle"):
                    self.state.closed_idle += 1
                else:
                    ok = False
        return ok

    async def _write_evicted(self) -> bool:
        state: EpisodicState = self.state
        failed = []
        for session_id, events in state.take_evicted():
            if not await self._write(session_id, events, "too many open sessions"):
                failed.append((session_id, events))
        if failed:
            state.evicted[:0] = failed  # retried first, in order
            while len(state.evicted) > state.max_sessions:  # still bounded while the disk refuses
                session_id, events = state.evicted.pop(0)
                log.error("session %s: %d events dropped, runs/ cannot be written", shown(session_id), len(events))
        return not failed

    async def _end(self, session_id: str, why: str) -> bool:
        events = list(self.state.sessions.get(session_id, ()))
        if why == "idle" and not await self._queue_idle_extraction(session_id, events):
            return False  # the job could not be journaled: the session stays open, tried again later
        written = await self._write(session_id, events, why) if events else True
        if written:
            self.state.close_session(session_id)
        return written

    async def _queue_idle_extraction(self, session_id: str, events: list[EpisodicEntry]) -> bool:
        """An idle session's extraction job, as session.close queues it (no domain, no TheoryState):
        journaled before the session is forgotten. False if the job queue refused it (read-only)."""
        if self.jobs is None or not _folder_name_ok(session_id):
            return True
        job_input = capture(session_id, "", None, events)
        if job_input is None:
            return True
        try:
            job_id = await self.jobs.accept(KIND, session_key(session_id, "", None, job_input.events), job_input)
        except StoreUnavailable as exc:
            log.error("session %s is idle; its extraction job cannot be journaled (%s): kept open", shown(session_id), exc)
            return False
        log.info("session %s idle: extraction job %s queued", shown(session_id), job_id)
        return True

    async def _write(self, session_id: str, events: list[EpisodicEntry], why: str) -> bool:
        if not _folder_name_ok(session_id):
            log.warning(
                "session %r ended (%s): its name cannot be a folder; %d events dropped", shown(session_id), why, len(events)
            )
            return True
        path = self.paths.runs / folder_name(session_id) / "episodic.json"
        try:
            await self.run_io(_write_run_file, path, events)
        except (OSError, ValueError) as exc:
            self.write_errors += 1
            log.error("could not write %s (session ended: %s): %s; the events stay in RAM", path, why, exc)
            return False
        log.info("session %s ended (%s): %d events written to %s", shown(session_id), why, len(events), path)
        return True

    @handles("session.close", "actor")  # writes a file: only the actor may wait for that (never inline)
    async def do_close(self, call: Call) -> Any:
        session_id = call.params.session_id
        if not _folder_name_ok(session_id):
            return ProtocolError(
                "invalid_params", f"invalid params: session_id {shown(session_id)!r} cannot name a folder", field="session_id"
            )
        p = call.params
        domain = p.domain or ""
        try:
            validate_domain(domain)
        except ProtocolError as exc:
            return exc
        await self._write_evicted()  # an evicted part of this session goes first, in order
        events = self.state.sessions.get(session_id)
        job_id = None
        job_input = capture(session_id, domain, p.theory_state, list(events or ())) if p.extract else None
        if job_input is not None and self.jobs is not None:
            key = session_key(session_id, domain, job_input.theory_state, job_input.events)
            try:
                job_id = await self.jobs.accept(KIND, key, job_input)
            except StoreUnavailable as exc:
                return exc.error()
        if not events:
            self.state.close_session(session_id)
            return {"job_id": job_id, "events_written": 0, "path": None}
        path = self.paths.runs / folder_name(session_id) / "episodic.json"
        try:
            await self.run_io(_write_run_file, path, list(events))
        except (OSError, ValueError) as exc:
            return ProtocolError("internal", f"could not write {path}: {exc}")
        self.state.close_session(session_id)
        return {"job_id": job_id, "events_written": len(events), "path": str(path)}


def _folder_name_ok(session_id: str) -> bool:
    return session_id not in (".", "..") and "/" not in session_id and "\x00" not in session_id


_entries = msgspec.json.Decoder(list[EpisodicEntry])


def _write_run_file(path: Path, events: list[EpisodicEntry]) -> None:
    """Write events to path, after the entries an earlier end of the session left there (by entry_id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = events
    try:
        previous = _entries.decode(path.read_bytes())
    except FileNotFoundError:
        previous = []
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path} exists and is not a list of episodic entries ({exc}); not overwritten") from None
    if previous:
        ours = {e.entry_id for e in events}
        merged = [e for e in previous if e.entry_id not in ours] + events
        merged.sort(key=_entry_time)  # stable: equal times keep their order
    data = msgspec.json.format(msgspec.json.encode(merged), indent=2)
    atomic_write(RealFiles(), str(path), data)


def _entry_time(entry: EpisodicEntry) -> _dt.datetime:
    try:
        parsed = _dt.datetime.fromisoformat(entry.timestamp.replace("Z", "+00:00"))
    except ValueError:
        return _dt.datetime.min.replace(tzinfo=_dt.UTC)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=_dt.UTC)
