"""MemoryManager: a drop-in for EurekaClaw's (eurekaclaw.memory.manager, v0.2.0), served by the daemon.

Rules kept here:
- Every public method has EurekaClaw's name, signature and return type, and answers what
  EurekaClaw's manager answers for the same calls (records as in client/_models.py: naive UTC
  timestamps, `updated_at` aware local). The socket protocol stays strict; this adapter translates
  what EurekaClaw accepts and the protocol does not (empty or over-long names, keys and tags, odd
  `n`/`depth`/`limit`, relations outside the four, unknown ids), and never raises where EurekaClaw's
  agents expect no exception: an error the daemon answers is logged and the call answers what
  EurekaClaw answers for "nothing there".
- The daemon unreachable never stops an agent. One circuit breaker per process and data root
  (shared by every manager, routed registry and conduit of that root): a call that has no answer
  after HANG_AFTER has the daemon pinged on a fresh connection (PING_BOUND); no pong and the call's
  connection is dropped, the breaker opens, and every call of that root goes straight to the
  fallback until a background probe gets a pong again (0.5 s doubling to 5 s). A busy daemon that
  pongs is waited for up to `timeout`. So a hung daemon (SIGSTOP) costs ~1 s once per process.
- Writes of every kind go to the root's spool (client/_spool.py: on disk before the call returns,
  delivered in order and once, with the ids and times already handed out, by the next process if
  this one exits first) while the daemon is away, and before any other call once it answers again.
  A spooled write carries what the daemon would have given it then (a node's id, made here for
  every node as EurekaClaw makes its own; a record's and a node's times, the call's), so a write
  delivered later makes the same record as one the daemon answered at once.
- Reads while the daemon is away answer from the root's files as EurekaClaw's own manager reads
  them (client/_files.py), with what this process has spooled on top. `recent_events` also sees
  this manager's own last 500 events (EurekaClaw's ring is per manager too).
- Where our answers differ from EurekaClaw's on purpose, the method's docstring says so.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import itertools
import logging
import math
import os
import re
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..protocol import CrossRunRecord as WireRecord
from ..protocol import EpisodicEntry as WireEntry
from ..protocol import KnowledgeNode as WireNode
from ..protocol import methods as limits
from ..protocol.blocks import escape_block_tags, escape_entry_headings
from . import _common as C
from ._autostart import autostart_allowed, daemon_answers
from ._errors import ConnectionLost, EurekamemError, Timeout
from ._files import RootFiles
from ._models import CrossRunRecord, EpisodicEntry, KnowledgeNode, from_wire, naive_utc
from ._paths import default_socket_path, eurekaclaw_dir, root_socket_path
from ._spool import SpoolEntry, spool_for, spools
from ._sync import Client
from ._views import GraphView, PersistentView, SessionView

__all__ = ["Breaker", "MemoryManager", "breaker_for"]

T = TypeVar("T")

log = logging.getLogger("eurekamem.client")

MANAGER_TIMEOUT = 10.0  # seconds one call may take once connected
OUTBOX_LIMIT = 10_000  # buffered writes at most; past it the oldest are dropped (and counted)
RING = 500  # EurekaClaw's EpisodicMemory(max_entries=500)
HANG_AFTER = 0.5  # seconds without an answer before the daemon is pinged on a fresh connection
PING_BOUND = 0.5  # seconds that ping may take: a hung daemon costs HANG_AFTER + PING_BOUND once
PROBE_FIRST = 0.5  # the open breaker's probe: every 0.5 s, doubling to 5 s
PROBE_MAX = 5.0
_ALL = limits.MAX_LIMIT
_RELATIONS = frozenset(limits.RELATIONS)
_STOPWORDS = frozenset({"theorem", "lemma", "proof", "result", "using", "show", "bound"})
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]{2,}")
_FRONTMATTER = re.compile(r"^---\n.*?---\n", re.DOTALL)
_SLUG = re.compile(r"[^\w]")


def _short(text: str) -> str:
    return "~" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class _Names:
    """EurekaClaw's names (keys, tags, roles, theorem names: any str) onto the protocol's (1 to N
    characters): an empty one becomes "~" + a hash, an over-long one its first characters + "~" +
    a hash of the whole, the same every time, so that what was stored is found again. The way
    back is known for the empty string and remembered for the names this process mapped."""

    def __init__(self) -> None:
        self._back: dict[str, str] = {_short(""): ""}
        self._lock = threading.Lock()

    def fit(self, name: str, limit: int) -> str:
        if 0 < len(name) <= limit:
            return name
        fitted = _short(name) if not name else name[: limit - 17] + _short(name)
        with self._lock:
            if len(self._back) < 100_000:
                self._back[fitted] = name
        return fitted

    def back(self, name: str) -> str:
        return self._back.get(name, name) if "~" in name else name


def _utcnow_naive() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC).replace(tzinfo=None)


def _lenient(value: Any) -> Any:
    """Metadata as JSON data; what has no JSON form is sent as its str() (EurekaClaw's episodic
    events live in RAM, so it accepts anything there)."""
    return msgspec.to_builtins(value, enc_hook=_enc_or_str, str_keys=True)


def _storable(key: str, value: Any) -> Any:
    """A value for persistent.remember as EurekaClaw's persistent.json keeps it (pydantic's JSON mode:
    tuples and sets as arrays, datetimes as ISO strings, NaN and the infinities as null); ValueError
    when eurekamem cannot keep it exactly (an integer outside -2**63 .. 2**64-1: MessagePack, the
    journal's framing, has no such integer; EurekaClaw's JSON file has)."""
    wire = _json_mode(C.to_wire(value), 0)
    problem = limits.value_problem(wire, "value")
    if problem is not None:
        raise ValueError(
            f"remember({key[:80]!r}): eurekamem cannot keep this value exactly ({problem}); "
            "store such an integer as a string (str(n)), and read it back with int()"
        )
    return wire


def _json_mode(value: Any, depth: int) -> Any:
    if type(value) is float:
        return value if math.isfinite(value) else None
    if depth > limits.MAX_VALUE_DEPTH:  # value_problem says so
        return value
    if isinstance(value, (list, tuple)):
        return [_json_mode(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _json_mode(v, depth + 1) for k, v in value.items()}
    return value


def _enc_or_str(obj: Any) -> Any:
    try:
        return C._enc_hook(obj)
    except TypeError:
        return str(obj)


def _slug(domain: str) -> str:
    return _SLUG.sub("_", domain.lower())[:30] if domain else "general"


def _tokens(text: str) -> set[str]:
    return {t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS}


def _unreachable(result: Any) -> bool:
    """A failed call's result that means "the daemon did not answer" (not a refusal)."""
    return result is None or isinstance(result, (ConnectionLost, Timeout))


def _memories_block(bodies: list[str]) -> str:
    """EurekaClaw's block: "<memories>", each body cut at 400 characters, "</memories>", joined by
    blank lines; stored text closes no block, starts no entry (protocol/blocks.py)."""
    parts = ["<memories>"]
    for body in bodies:
        heading, newline, rest = escape_block_tags(body[:400]).partition("\n")
        parts.append(heading + newline + escape_entry_headings(rest))  # the file's own title line stays
    parts.append("</memories>")
    return "\n\n".join(parts)


class Breaker:
    """The circuit breaker of one data root in this process (see the module's rules): closed, calls
    go to the daemon under the watchdog; open, they go to the fallback until the probe closes it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.open = False
        self.down_since: float | None = None
        self._backoff = PROBE_FIRST
        self._target: tuple[str, bool] | None = None  # the socket to probe, and autostart
        self._prober: threading.Thread | None = None
        self._watched: dict[int, tuple[float, Client]] = {}
        self._next_token = 0
        self._watchdog: threading.Thread | None = None
        self.opened = 0  # times it opened (tests and stats)

    # --- the watchdog: a call without an answer after HANG_AFTER ------------------------------

    def watch(self, client: Client) -> int:
        with self._lock:
            self._next_token += 1
            token = self._next_token
            self._watched[token] = (time.monotonic() + HANG_AFTER, client)
            if self._watchdog is None or not self._watchdog.is_alive():
                self._watchdog = threading.Thread(target=self._watch_loop, name="eurekamem-watchdog", daemon=True)
                self._watchdog.start()
            elif len(self._watched) == 1:
                self._cond.notify()
            return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    def _watch_loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    due = [(t, c) for t, (at, c) in self._watched.items() if at <= now]
                    if due:
                        break
                    nearest = min((at for at, _c in self._watched.values()), default=None)
                    self._cond.wait(None if nearest is None else nearest - now)
                for token, _client in due:
                    self._watched.pop(token, None)
            for client in {id(c): c for _t, c in due}.values():
                if not _pongs(client.path):
                    log.warning(
                        "eurekamem at %s does not answer (no pong within %.1f s): its calls fail over",
                        client.path,
                        PING_BOUND,
                    )
                    client.close()  # the calls waiting on it raise ConnectionLost now

    # --- open and closed ----------------------------------------------------------------------

    def allows(self) -> bool:
        return not self.open

    def failure(self, exc: BaseException, socket_path: str, autostart: bool) -> None:
        with self._lock:
            self._target = (socket_path, autostart)
            if self.open:
                return
            self.open = True
            self.opened += 1
            self.down_since = time.monotonic()
            self._backoff = PROBE_FIRST
            log.warning("eurekamem unreachable (%s); writes are spooled, reads answer from the files", exc)
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(target=self._probe_loop, name="eurekamem-probe", daemon=True)
                self._prober.start()

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the breaker is closed (the daemon answers again), at most `timeout` seconds."""
        with self._lock:
            return self._cond.wait_for(lambda: not self.open, timeout)

    def close_now(self) -> None:
        """Half-open at once: the next call tries the daemon itself (as after a successful probe)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self.open and self.down_since is not None:
            log.info("eurekamem is back after %.1f s", time.monotonic() - self.down_since)
        self.open = False
        self.down_since = None
        self._cond.notify_all()

    def _probe_loop(self) -> None:
        while True:
            with self._lock:
                if not self.open:
                    self._prober = None
                    return
                self._cond.wait(self._backoff)
                if not self.open or self._target is None:
                    continue
                socket_path, autostart = self._target
                self._backoff = min(self._backoff * 2, PROBE_MAX)
            if _pongs(socket_path, autostart, self.root):
                with self._lock:
                    self._close_locked()


def _pongs(socket_path: str, autostart: bool = False, root: Path | None = None) -> bool:
    """Does a daemon answer sys.ping on a fresh connection within PING_BOUND (started on demand
    first with autostart)?"""
    try:
        with Client(socket_path, timeout=PING_BOUND, autostart=autostart, data_dir=root) as probe:
            return bool(probe.ping())
    except (EurekamemError, OSError) as exc:
        log.debug("no pong from %s: %s", socket_path, exc)
        return False


_breakers: dict[Path, Breaker] = {}
_breakers_lock = threading.Lock()


def breaker_for(root: Path) -> Breaker:
    """This process's circuit breaker for a data root, shared by every manager of that root."""
    key = root.resolve()
    with _breakers_lock:
        breaker = _breakers.get(key)
        if breaker is None:
            breaker = _breakers[key] = Breaker(key)
        return breaker


class MemoryManager:
    """Unified read/write interface across the memory tiers, backed by the eurekamem daemon.

    session_id, memory_dir: as EurekaClaw's. The data root is memory_dir's parent when given
        (EurekaClaw passes <root>/memory), else EurekaClaw's own setting: EUREKACLAW_DIR from the
        environment, else from `.env` in the working directory, else ~/.eurekaclaw.
    client: a Client to share (not closed by close()); else one is made for socket_path, else for
        $EUREKAMEM_SOCKET, else the default socket if the daemon there serves this data root,
        else <data root>/run/eurekamem.sock; with autostart (default: on for the configured data
        root unless $EUREKAMEM_NO_AUTOSTART=1; off for a memory_dir elsewhere) a daemon is started
        there on demand.
    timeout: seconds each call may take once connected.
    """

    def __init__(
        self,
        session_id: str,
        memory_dir: str | os.PathLike[str] | None = None,
        *,
        client: Client | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        timeout: float = MANAGER_TIMEOUT,
        autostart: bool | None = None,
        outbox_limit: int = OUTBOX_LIMIT,
    ) -> None:
        self.session_id = session_id
        self.memory_dir = Path(memory_dir).expanduser() if memory_dir is not None else None
        self.data_dir = self.memory_dir.parent if self.memory_dir is not None else eurekaclaw_dir()
        self.timeout = C.bounded_timeout(timeout)
        # a daemon is started on demand for the configured data root only, never by default for a
        # folder derived from memory_dir (a test's TemporaryDirectory(): its parent is $TMPDIR)
        configured = self.memory_dir is None or self.data_dir.resolve() == eurekaclaw_dir().resolve()
        self.autostart = autostart_allowed() and configured if autostart is None else autostart
        self._socket_path = os.fspath(socket_path) if socket_path is not None else None
        self._shared: Client | None = client
        self._owns_client = client is None
        self._names = _Names()
        self._wire_session = self._names.fit(session_id, limits.MAX_ID)
        self._lock = threading.RLock()
        self._outbox_limit = max(1, outbox_limit)
        self._ring: deque[EpisodicEntry] = deque(maxlen=RING)
        self._breaker = breaker_for(self.data_dir)
        self._spool = spool_for(self.data_dir, self.memory_dir)
        self._files = RootFiles(
            self.memory_dir if self.memory_dir is not None else self.data_dir / "memory", self.data_dir
        )
        self._token = next(_owner_tokens)  # its entries in the root's spool
        self._spool.rescan()  # files left by processes that exited: delivered on its first call
        _managers.add(self)

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Deliver what is spooled (if the daemon answers), then close our connection. What is not
        delivered stays in the spool: the next process on this root delivers it."""
        with self._lock:
            if self._spool.count():
                self._reach()
            if self._owns_client and self._shared is not None:
                self._shared.close()

    def __enter__(self) -> MemoryManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def buffered(self) -> int:
        """Writes of this manager waiting in the spool for the daemon."""
        return self._spool.count(self._token)

    @property
    def delivered(self) -> int:
        """Spooled writes of this manager delivered after an outage."""
        return self._spool.delivered[self._token]

    @property
    def dropped(self) -> int:
        """Spooled writes of this manager dropped because it had `outbox_limit` waiting."""
        return self._spool.dropped[self._token]

    @property
    def _retry_at(self) -> float:
        return float("inf") if self._breaker.open else 0.0

    @_retry_at.setter
    def _retry_at(self, value: float) -> None:
        if value <= time.monotonic():
            self._breaker.close_now()  # try the daemon on the next call, as the probe would

    # --- EurekaClaw's tier objects, as views of this manager (client/_views.py) --------------------

    @property
    def session(self) -> SessionView:
        """EurekaClaw's `MemoryManager.session` (its EpisodicMemory), answered by this manager."""
        return SessionView(self)

    @property
    def persistent(self) -> PersistentView:
        """EurekaClaw's `MemoryManager.persistent` (its PersistentMemory), answered by this manager."""
        return PersistentView(self)

    @property
    def graph(self) -> GraphView:
        """EurekaClaw's `MemoryManager.graph` (its KnowledgeGraph), answered by this manager."""
        return GraphView(self)

    @property
    def _memory_dir(self) -> Path:
        return self.memory_dir if self.memory_dir is not None else self.data_dir / "memory"

    def _export(self, record: Any) -> Any:
        """A record as this manager answers it (the routed manager: as EurekaClaw's pydantic type)."""
        return record

    # --- reaching the daemon --------------------------------------------------------------------

    def _choose_socket(self) -> str:
        if self._socket_path is not None:
            return self._socket_path
        env = os.environ.get("EUREKAMEM_SOCKET")
        if env:
            return os.path.expanduser(env)
        default = default_socket_path(self.data_dir)
        ours = root_socket_path(self.data_dir)
        if default != ours and daemon_answers(default):
            try:
                with Client(default, timeout=min(self.timeout, 5.0)) as probe:
                    served = probe.call("sys.stats").get("data_dir")
                if served and Path(served).resolve() == self.data_dir.resolve():
                    return default
            except (EurekamemError, OSError, AttributeError) as exc:
                log.debug("the daemon on %s could not say its data root: %s", default, exc)
        return ours

    @property
    def client(self) -> Client:
        """The Client this manager talks through (made on first use; connecting is lazy too)."""
        if self._shared is None:
            self._shared = Client(
                self._choose_socket(), timeout=self.timeout, autostart=self.autostart, data_dir=self.data_dir
            )
        return self._shared

    def _watched(self, client: Client, run: Callable[[], T]) -> T:
        token = self._breaker.watch(client)
        try:
            return run()
        finally:
            self._breaker.unwatch(token)

    def _run_many(self, client: Client, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        return self._watched(client, lambda: client.call_many(calls))

    def _reach(self) -> Client | None:
        """The client with the spool delivered, or None while the daemon is unreachable."""
        if not self._breaker.allows():
            return None
        client = self.client
        with self._spool.lock:
            try:
                self._spool.deliver(lambda calls: self._run_many(client, calls))
            except (ConnectionLost, Timeout) as exc:
                self._went_away(exc, client)
                return None
        return client

    def _went_away(self, exc: BaseException, client: Client | None = None) -> None:
        self._spool.rescan()
        self._breaker.failure(exc, (client or self.client).path, self.autostart)

    def _call(self, method: str, params: dict[str, Any], result_type: Any = Any) -> tuple[bool, Any]:
        """(True, result), or (False, error) when unreachable or refused (the error is logged):
        None or ConnectionLost/Timeout when unreachable."""
        with self._lock:
            client = self._reach()
            if client is None:
                return False, None
            try:
                return True, self._watched(client, lambda: client._run(C.Op(method, params, result_type)))
            except (ConnectionLost, Timeout) as exc:
                self._went_away(exc, client)
                return False, exc
            except EurekamemError as exc:
                if exc.kind != "not_found":
                    log.error("eurekamem refused %s: %s: %s", method, exc.kind, exc)
                return False, exc

    def _write(
        self,
        method: str,
        params: dict[str, Any],
        result_type: Any = Any,
        *,
        client_id: str | None = None,
        history: dict[str, Any] | None = None,
    ) -> tuple[bool, Any]:
        """A spooled write: sent now if the spool is delivered and the daemon answers, else spooled
        (on disk before this returns) with `history` added: the times the daemon would have given
        the record had it answered now, so that the write delivered later makes the same record."""
        with self._lock, self._spool.lock:
            client = self._reach()
            maybe_sent = False
            if client is not None:
                try:
                    return True, self._watched(client, lambda: client._run(C.Op(method, params, result_type)))
                except (ConnectionLost, Timeout) as exc:  # it may have run: the spool's rules
                    self._went_away(exc, client)
                    maybe_sent = True
                except EurekamemError as exc:
                    if not (exc.kind == "not_found" and method == "graph.link"):
                        log.error("eurekamem refused %s: %s: %s", method, exc.kind, exc)
                    return False, exc
            try:
                self._spool.add(
                    method,
                    {**params, **(history or {})},
                    owner=self._token,
                    maybe_sent=maybe_sent,
                    client_id=client_id,
                    limit=self._outbox_limit,
                )
            except OSError as exc:  # a full or read-only disk: the write is lost, say so
                log.error("eurekamem: a %s could not be spooled (%s): lost", method, exc)
            return False, None

    # --- names ------------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self._names.fit(key, limits.MAX_KEY)

    def _tag(self, tag: str) -> str:
        return self._names.fit(tag, limits.MAX_ID)

    def _tags(self, tags: list[str] | None) -> list[str]:
        fitted = [self._tag(t) for t in (tags or [])]
        if len(fitted) > limits.MAX_TAGS:
            log.warning("%d tags: only the first %d are kept", len(fitted), limits.MAX_TAGS)
        return fitted[: limits.MAX_TAGS]

    def _text(self, text: str, what: str) -> str:
        if len(text) > limits.MAX_TEXT:
            log.warning("%s of %d characters cut to %d", what, len(text), limits.MAX_TEXT)
            return text[: limits.MAX_TEXT]
        return text

    def _entry(self, wire: WireEntry) -> EpisodicEntry:
        entry: EpisodicEntry = from_wire(wire)
        entry.session_id = self._names.back(entry.session_id)
        entry.agent_role = self._names.back(entry.agent_role)
        return entry

    def _record(self, wire: WireRecord) -> CrossRunRecord:
        record: CrossRunRecord = from_wire(wire)
        record.key = self._names.back(record.key)
        record.tags = [self._names.back(t) for t in record.tags]
        record.source_session = self._names.back(record.source_session)
        return record

    def _node(self, wire: WireNode) -> KnowledgeNode:
        node: KnowledgeNode = from_wire(wire)
        node.theorem_name = self._names.back(node.theorem_name)
        node.domain = self._names.back(node.domain)
        node.session_id = self._names.back(node.session_id)
        node.tags = [self._names.back(t) for t in node.tags]
        return node

    # --- Tier 1: Episodic (session-scoped) --------------------------------------------------------

    def log_event(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> EpisodicEntry:
        """As EurekaClaw's: the entry, made here (its id and time are the daemon's record too).

        Content over 1 Mi characters is cut there (EurekaClaw keeps it whole); metadata the daemon
        keeps as JSON (values without a JSON form as their str()), while the returned entry holds
        the caller's objects, as EurekaClaw's does.
        """
        entry = EpisodicEntry(
            entry_id=str(uuid.uuid4()),
            session_id=self.session_id,
            agent_role=agent_role,
            content=content,
            metadata=dict(metadata) if metadata else {},
            timestamp=_utcnow_naive(),
        )
        params = {
            "session_id": self._wire_session,
            "agent_role": self._names.fit(agent_role, limits.MAX_ID),
            "content": self._text(content, "event content"),
            "metadata": _lenient(entry.metadata),
            "entry_id": entry.entry_id,
            "timestamp": entry.timestamp.replace(tzinfo=_dt.UTC).isoformat(),
        }
        with self._lock:
            self._ring.append(entry)
            self._write("episodic.log", params)
        return entry

    def recent_events(self, n: int = 20, agent_role: str | None = None) -> list[EpisodicEntry]:
        """As EurekaClaw's `entries[-n:]` (n = 0 gives every event, a negative n drops the first -n;
        an empty agent_role filters nothing): the session's events at the daemon, with this
        manager's own (those the daemon lost in a restart, or has not received yet)."""
        ask = n if 1 <= n <= limits.MAX_RECENT else limits.MAX_RECENT
        params: dict[str, Any] = {"session_id": self._wire_session, "n": ask}
        if agent_role:
            params["agent_role"] = self._names.fit(agent_role, limits.MAX_ID)
        ok, wire = self._call("episodic.recent", params, list[WireEntry])
        with self._lock:
            local = list(self._ring)
        entries = [self._entry(e) for e in wire] if ok else []
        if local:  # ours as handed out (the caller's metadata objects), with the daemon's others
            ours = {e.entry_id for e in local}
            entries = [e for e in entries if e.entry_id not in ours] + local
            entries.sort(key=lambda e: e.timestamp)
        if agent_role:
            entries = [e for e in entries if e.agent_role == agent_role]
        return entries[-n:]

    # --- Tier 2: Persistent key-value (cross-run) -------------------------------------------------

    def remember(self, key: str, value: Any, tags: list[str] | None = None, source_session: str = "") -> None:
        """As EurekaClaw's. Differences: overwriting a key keeps its record_id and created_at (EurekaClaw
        makes a new record); duplicate tags are kept once; keys over 1024 characters (tags, sessions
        over 256) are stored under a shortened form, found again by the same long name; a value
        comes back as its JSON form (as EurekaClaw's own do after a restart: NaN and the infinities
        as None, which is what EurekaClaw's persistent.json holds for them). A value eurekamem
        cannot keep exactly (an integer outside -2**63 .. 2**64-1, which EurekaClaw stores) raises
        ValueError naming the key and where in the value, and nothing is stored or spooled."""
        self._put(key, value, tags, source_session)

    def _put(self, key: str, value: Any, tags: list[str] | None, source_session: str) -> CrossRunRecord:
        """remember(), answering the record (EurekaClaw's PersistentMemory.put): the daemon's, or the
        one a spooled write will make (the daemon away; an old key's id and created_at then as
        this process last saw them)."""
        fitted_key = self._key(key)
        params: dict[str, Any] = {"key": fitted_key, "value": _storable(key, value)}
        fitted = self._tags(tags)
        if fitted:
            params["tags"] = fitted
        if source_session:
            params["source_session"] = self._names.fit(source_session, limits.MAX_ID)
        now = _dt.datetime.now(_dt.UTC)  # spooled: a new key's id and times are the call's (an old key keeps its own)
        history = {"record_id": str(uuid.uuid4()), "created_at": now.isoformat(), "updated_at": now.isoformat()}
        ok, record = self._write("persistent.remember", params, WireRecord, history=history)
        if ok:
            return self._record(record)
        at_hand = self._records_at_hand().get(key) if record is None else None  # spooled: on the file's record
        if at_hand is not None:
            return at_hand
        return CrossRunRecord(  # neither sent nor spooled (refused, or a disk that took nothing): logged
            record_id=history["record_id"],
            key=key,
            value=params["value"],
            tags=[self._names.back(t) for t in fitted],
            source_session=source_session,
            created_at=now.replace(tzinfo=None),
            updated_at=now.astimezone(),
        )

    def _forget(self, key: str) -> None:
        """persistent.forget (EurekaClaw's PersistentMemory.delete): spooled while the daemon is away."""
        self._write("persistent.forget", {"key": self._key(key)})

    def _stored_records(self, prefix: str = "") -> list[CrossRunRecord]:
        """The records whose key starts with prefix (EurekaClaw's PersistentMemory.search_keys; "" for
        all_records), first stored first (created_at: EurekaClaw's dict order), at most 10,000;
        while the daemon is unreachable, persistent.json's with this process's spooled writes."""
        ok, listed = self._call("persistent.keys", {"prefix": prefix[: limits.MAX_KEY], "limit": _ALL})
        if not ok:
            if not _unreachable(listed):
                return []
            return [r for r in self._records_at_hand().values() if r.key.startswith(prefix)]
        keys = listed.get("keys", []) if isinstance(listed, dict) else []
        answers = self._call_batch([("persistent.recall", {"key": k}) for k in keys])
        if answers is None:  # gone between the two calls: the files
            return [r for r in self._records_at_hand().values() if r.key.startswith(prefix)]
        out = [self._record(msgspec.convert(a, WireRecord)) for a in answers if isinstance(a, dict)]
        out = [r for r in out if r.key.startswith(prefix)]
        out.sort(key=lambda r: r.created_at)
        return out

    def _call_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Any] | None:
        """Read calls pipelined on one connection: each answer (or its error), None when unreachable."""
        if not calls:
            return []
        with self._lock:
            client = self._reach()
            if client is None:
                return None
            try:
                return self._run_many(client, calls)
            except (ConnectionLost, Timeout) as exc:
                self._went_away(exc, client)
                return None

    def recall(self, key: str) -> Any | None:
        """The value stored under key, or None. While the daemon is unreachable: what this process
        spooled for the key meanwhile, else persistent.json's (EurekaClaw's file)."""
        fitted = self._key(key)
        ok, record = self._call("persistent.recall", {"key": fitted}, WireRecord | None)
        if ok:
            return None if record is None else record.value
        if not _unreachable(record):
            return None
        records = self._records_at_hand()
        found = records.get(key) or records.get(fitted)
        return None if found is None else found.value

    def _records_at_hand(self) -> dict[str, CrossRunRecord]:
        """persistent.json's records with this process's spooled remembers and forgets on top, in
        order (the daemon away)."""
        records = self._files.records()
        for entry in self._spooled("persistent.remember", "persistent.forget"):
            p = entry.params
            key = self._names.back(p["key"])
            if entry.method == "persistent.forget":
                records.pop(key, None)
                continue
            old = records.get(key)
            at = _dt.datetime.fromisoformat(p.get("updated_at") or entry.at)
            records[key] = CrossRunRecord(
                record_id=old.record_id if old is not None else str(p.get("record_id", "")),
                key=key,
                value=p["value"],
                tags=[self._names.back(t) for t in p.get("tags", [])],
                source_session=self._names.back(p.get("source_session", "")),
                created_at=old.created_at if old is not None else at.replace(tzinfo=None),
                updated_at=at.astimezone(),
            )
        return records

    def _spooled(self, *methods: str) -> list[SpoolEntry]:
        with self._spool.lock:
            return [e for e in self._spool.pending if e.method in methods]

    def recall_by_tag(self, tag: str) -> list[CrossRunRecord]:
        """Records carrying the tag, in the order their keys were first stored (EurekaClaw's dict
        order); while the daemon is unreachable, persistent.json's and this process's spooled."""
        ok, records = self._call("persistent.by_tag", {"tag": self._tag(tag)}, list[WireRecord])
        if not ok:
            if not _unreachable(records):
                return []
            return [r for r in self._records_at_hand().values() if tag in r.tags]
        out = [self._record(r) for r in records]
        out.sort(key=lambda r: r.created_at)  # created_at is kept on overwrite: first-stored order
        return out

    # --- Tier 3: Knowledge graph ----------------------------------------------------------------

    def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> KnowledgeNode:
        """As EurekaClaw's (an empty theorem_name is fine). The node's id is made here, as
        EurekaClaw's KnowledgeNode makes its own, and the daemon takes it; while the daemon is
        unreachable the node is made here, its created_at the call's, and spooled: delivered later,
        it is the same node (id and time) that the caller was given."""
        params: dict[str, Any] = {
            "theorem_name": self._names.fit(theorem_name, limits.MAX_KEY),
            "formal_statement": self._text(formal_statement, "formal statement"),
        }
        if domain:
            params["domain"] = self._names.fit(domain, limits.MAX_KEY)
        if session_id:
            params["session_id"] = self._names.fit(session_id, limits.MAX_ID)
        fitted = self._tags(tags)
        if fitted:
            params["tags"] = fitted
        node_id = params["node_id"] = str(uuid.uuid4())
        made = _utcnow_naive()
        history = {"created_at": made.replace(tzinfo=_dt.UTC).isoformat()}
        ok, node = self._write("graph.add_theorem", params, WireNode, client_id=node_id, history=history)
        if ok:
            return self._node(node)
        return KnowledgeNode(
            node_id=node_id,
            theorem_name=theorem_name,
            formal_statement=formal_statement,
            domain=domain,
            session_id=session_id,
            tags=list(tags or []),
            created_at=made,
        )

    def link_theorems(self, from_id: str, to_id: str, relation: str = "uses") -> None:
        """As EurekaClaw's: an unknown id is ignored. A relation outside the four (uses, generalizes,
        specializes, contradicts; case and spaces aside) is ignored with a warning, where EurekaClaw
        stores any string."""
        name = relation.strip().lower() if isinstance(relation, str) else ""
        if name not in _RELATIONS:
            log.warning("link_theorems: relation %r is not one of %s; not linked", relation, sorted(_RELATIONS))
            return
        if not (0 < len(from_id) <= limits.MAX_ID and 0 < len(to_id) <= limits.MAX_ID):
            return  # no node has such an id
        ids = {"from_id": self._spool.node_id(from_id), "to_id": self._spool.node_id(to_id)}
        self._write("graph.link", {**ids, "relation": name})

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        """As EurekaClaw's: nodes within depth hops either way, [] for an unknown id or depth < 1.
        Depth is capped at 16; the order is by distance (EurekaClaw's is a set's)."""
        if depth < 1 or not (0 < len(node_id) <= limits.MAX_ID):
            return []
        node_id = self._spool.node_id(node_id)
        params = {"node_id": node_id, "depth": min(depth, limits.MAX_DEPTH)}
        ok, nodes = self._call("graph.related", params, list[WireNode])
        if ok:
            return [self._node(n) for n in nodes]
        if not _unreachable(nodes):
            return []
        graph, edges = self._graph_at_hand()
        visited = {node_id}
        frontier = [node_id]
        found: list[KnowledgeNode] = []
        for _ in range(depth):  # EurekaClaw's BFS over both directions, nearest first
            step: dict[str, None] = {}
            for nid in frontier:
                for a, b, _rel in edges:
                    if a == nid and b not in visited:
                        step[b] = None
                    elif b == nid and a not in visited:
                        step[a] = None
            visited.update(step)
            found += [graph[n] for n in step if n in graph]
            frontier = list(step)
            if not frontier:
                break
        return found

    def _graph_at_hand(self) -> tuple[dict[str, KnowledgeNode], list[tuple[str, str, str]]]:
        """knowledge_graph.json with this process's spooled nodes and links (the daemon away)."""
        nodes, edges = self._files.graph()
        for entry in self._spooled("graph.add_theorem"):
            p = entry.params
            if entry.client_id is None:
                continue
            nodes[entry.client_id] = KnowledgeNode(
                node_id=entry.client_id,
                theorem_name=self._names.back(p["theorem_name"]),
                formal_statement=p["formal_statement"],
                domain=self._names.back(p.get("domain", "")),
                session_id=self._names.back(p.get("session_id", "")),
                tags=[self._names.back(t) for t in p.get("tags", [])],
                created_at=naive_utc(p.get("created_at") or entry.at),
            )
        for entry in self._spooled("graph.link"):
            p = entry.params
            a, b = self._spool.node_id(p["from_id"]), self._spool.node_id(p["to_id"])
            if a in nodes and b in nodes:
                edges.append((a, b, p.get("relation", "uses")))
        return nodes, edges

    def _graph_nodes(self, domain: str | None = None, tag: str | None = None) -> list[KnowledgeNode]:
        """The nodes whose domain contains `domain` (case aside) and whose tags hold `tag`, in the
        order they were added, at most 10,000 (EurekaClaw's KnowledgeGraph.all_nodes,
        search_by_domain, search_by_tag); while the daemon is unreachable, the file's and this
        process's spooled ones."""
        params: dict[str, Any] = {"limit": _ALL}
        if domain:
            params["domain"] = domain[: limits.MAX_KEY]
        if tag is not None:
            params["tag"] = self._tag(tag)
        ok, nodes = self._call("graph.search", params, list[WireNode])
        if ok:
            return [self._node(n) for n in nodes]
        if not _unreachable(nodes):
            return []
        every = self._graph_at_hand()[0].values()
        return [n for n in every if (domain or "").lower() in n.domain.lower() and (tag is None or tag in n.tags)]

    def _graph_edges(self) -> list[tuple[str, str, str]]:
        """(from_id, to_id, relation) of every link (EurekaClaw's KnowledgeGraph edges); while the
        daemon is unreachable, the file's and this process's spooled ones."""
        ok, exported = self._call("graph.export", {"format": "node_link"})
        if ok and isinstance(exported, dict) and isinstance(exported.get("data"), dict):
            edges = exported["data"].get("edges", [])
            return [(str(e["source"]), str(e["target"]), str(e["key"])) for e in edges if isinstance(e, dict)]
        if not ok and _unreachable(exported):
            return self._graph_at_hand()[1]
        return []

    def _graph_stats(self) -> dict[str, int]:
        """{"nodes": n, "edges": n} (EurekaClaw's KnowledgeGraph.stats); the daemon unreachable, the files'."""
        ok, stats = self._call("graph.stats", {})
        if ok and isinstance(stats, dict):
            return {"nodes": int(stats.get("nodes", 0)), "edges": int(stats.get("edges", 0))}
        if not ok and _unreachable(stats):
            nodes, edges = self._graph_at_hand()
            return {"nodes": len(nodes), "edges": len(edges)}
        return {"nodes": 0, "edges": 0}

    def retrieve_relevant_theorems(self, query: str, domain: str = "", limit: int = 5) -> list[KnowledgeNode]:
        """EurekaClaw's lexical retrieval, exactly: words of 3+ characters (stop words aside) shared
        by the query and the node's name and statement, +2 when the domain matches; best first,
        then oldest first. Candidates are the first 10,000 nodes of the domain (else of the graph)."""
        query_tokens = _tokens(query)
        if not query_tokens and not domain:
            return []
        candidates: list[KnowledgeNode] = []
        away = False
        if domain:
            params = {"domain": self._names.fit(domain, limits.MAX_KEY), "limit": _ALL}
            ok, nodes = self._call("graph.search", params, list[WireNode])
            candidates = [self._node(n) for n in nodes] if ok else []
            away = not ok and _unreachable(nodes)
        if not candidates and not away:
            ok, nodes = self._call("graph.search", {"limit": _ALL}, list[WireNode])
            candidates = [self._node(n) for n in nodes] if ok else []
            away = not ok and _unreachable(nodes)
        if away:  # the daemon away: the file's nodes and ours, as EurekaClaw's search_by_domain
            every = list(self._graph_at_hand()[0].values())
            candidates = [n for n in every if domain.lower() in n.domain.lower()] if domain else []
            candidates = candidates or every
        domain_lower = domain.lower()
        scored: list[tuple[int, KnowledgeNode]] = []
        for node in candidates:
            overlap = len(query_tokens & _tokens(f"{node.theorem_name}\n{node.formal_statement}"))
            if domain_lower and domain_lower in node.domain.lower():
                overlap += 2
            if overlap > 0:
                scored.append((overlap, node))
        scored.sort(key=lambda item: (-item[0], item[1].created_at))
        return [node for _score, node in scored[:limit]]

    # --- Tier 4: Domain markdown memories -------------------------------------------------------

    def load_for_injection(
        self, domain: str, k: int = 4, query: str | None = None, *, token_budget: int | None = None
    ) -> str:
        """EurekaClaw's block: "<memories>", each chosen memory's file body (after the frontmatter,
        stripped, cut at 400 characters), "</memories>", joined by blank lines; "" when the domain
        has no memories and no folder. The k newest, or with a query the k the daemon's hybrid
        search ranks first (EurekaClaw: cosine of the MiniLM vectors it keeps in _index.json, which
        the daemon does not write, so EurekaClaw itself falls back to the newest on our files).
        With token_budget: the daemon's memory.inject instead (full texts, shortened to fit)."""
        if token_budget is not None:
            params: dict[str, Any] = {"domain": domain[: limits.MAX_KEY], "k": min(max(k, 1), limits.MAX_K)}
            if query:
                params["query"] = query[: limits.MAX_KEY * 4]
            params["token_budget"] = max(1, int(token_budget))
            ok, result = self._call("memory.inject", params)
            text = result.get("text") if ok and isinstance(result, dict) else None
            return text if isinstance(text, str) else ""
        domain_key = domain[: limits.MAX_KEY]
        chosen: list[dict[str, Any]] = []
        if query and k > 0:
            params = {"query": query[: limits.MAX_KEY * 4], "domain": domain_key, "k": min(k, limits.MAX_K)}
            ok, hits = self._call("memory.search", {**params, "include_global": False})
            if ok:
                chosen = [hit["memory"] for hit in hits]
            elif _unreachable(hits):
                return self._injection_from_files(domain, k)
        if not chosen:
            ok, page = self._call("memory.list", {"domain": domain_key, "limit": k if 0 < k <= _ALL else _ALL})
            if not ok and _unreachable(page):
                return self._injection_from_files(domain, k)
            memories = page.get("memories", []) if ok and isinstance(page, dict) else []
            chosen = memories[:k]
            if not memories and not (self.data_dir / "memories" / _slug(domain)).exists():
                return ""
        return _memories_block([self._body(memory) for memory in chosen])

    def _injection_from_files(self, domain: str, k: int) -> str:
        """The daemon away: EurekaClaw's own choice from memories/<slug>/_index.json, the newest k."""
        listed = self._files.domain_memories(_slug(domain))
        if listed is None:
            return ""
        listed.sort(key=lambda item: item[0], reverse=True)
        bodies = []
        for _created, path in listed[:k]:
            try:
                bodies.append(_FRONTMATTER.sub("", path.read_text(encoding="utf-8")).strip())
            except (OSError, UnicodeDecodeError) as exc:  # removed or rewritten meanwhile
                log.debug("memory file %s not readable: %s", path, exc)
        return _memories_block(bodies)

    def _body(self, memory: dict[str, Any]) -> str:
        """What EurekaClaw reads of the memory's file; its text to be, when not projected yet."""
        relative = memory.get("file")
        text = None
        if isinstance(relative, str) and relative:
            try:
                text = (self.data_dir / relative).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:  # not written yet, or moved meanwhile
                log.debug("memory file %s not readable (%s): its text from the daemon instead", relative, exc)
        if text is not None:
            return _FRONTMATTER.sub("", text).strip()
        return f"# {memory.get('title', '')}\n\n{memory.get('content', '')}".strip()


# At exit: deliver what is spooled if the daemon answers (bounded by the breaker), else say what
# stays in the spool for the next process on that root.


def _flush_at_exit() -> None:
    for spool in spools():
        if not spool.count():
            continue
        breaker = breaker_for(spool.root)
        managers = [m for m in list(_managers) if m.data_dir.resolve() == spool.root]
        if managers and breaker.allows():
            try:
                managers[0]._reach()
            except Exception as exc:  # at exit: report, never raise
                log.debug("delivery at exit failed: %s", exc)
        if spool.count():
            log.warning(
                "eurekamem: %d writes (%s) not delivered at exit, kept in %s: the next process on this data root delivers them",
                spool.count(),
                spool.summary(),
                spool.dir,
            )


_managers: weakref.WeakSet[MemoryManager] = weakref.WeakSet()
_owner_tokens = itertools.count(1)
atexit.register(_flush_at_exit)
