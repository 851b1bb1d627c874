"""MemoryManager: a drop-in for EurekaClaw's (eurekaclaw.memory.manager, v0.2.0), served by the daemon.

Rules kept here:
- Every public method has EurekaClaw's name, signature and return type, and answers what
  EurekaClaw's manager answers for the same calls (records as in client/_models.py: naive UTC
  timestamps, `updated_at` aware local). The socket protocol stays strict; this adapter translates
  what EurekaClaw accepts and the protocol does not (empty or over-long names, keys and tags, odd
  `n`/`depth`/`limit`, relations outside the four, unknown ids), and never raises where EurekaClaw's
  agents expect no exception: an error the daemon answers is logged and the call answers what
  EurekaClaw answers for "nothing there".
- The daemon unreachable never stops an agent: every call is bounded (`timeout`); after a failure
  the daemon is tried again only after a back-off (0.5 s doubling to 30 s), calls in between fail
  over at once; `log_event` and `remember` go to a bounded outbox, delivered in order (before any
  other call) once the daemon answers again, events with the ids and times already handed out, so
  a retried delivery adds nothing. `recent_events` also sees this manager's own last 500 events
  (EurekaClaw's ring is per manager too), so a daemon restart does not make an agent forget them.
- Where our answers differ from EurekaClaw's on purpose, the method's docstring says so.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
from eurekamem.protocol import CrossRunRecord as WireRecord
from eurekamem.protocol import EpisodicEntry as WireEntry
from eurekamem.protocol import KnowledgeNode as WireNode
from eurekamem.protocol import _methods as limits
from eurekamem.protocol._blocks import escape_block_tags, escape_entry_headings

from . import _common as C
from ._autostart import autostart_allowed, daemon_answers
from ._errors import ConnectionLost, EurekamemError, Timeout
from ._models import CrossRunRecord, EpisodicEntry, KnowledgeNode, from_wire
from ._paths import default_socket_path, eurekaclaw_dir, root_socket_path
from ._sync import Client

__all__ = ["MemoryManager"]

log = logging.getLogger("eurekamem.client")

MANAGER_TIMEOUT = 10.0  # seconds one call may take once connected
OUTBOX_LIMIT = 10_000  # buffered writes at most; past it the oldest are dropped (and counted)
RING = 500  # EurekaClaw's EpisodicMemory(max_entries=500)
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
_FLUSH_CHUNK = 256
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


def _enc_or_str(obj: Any) -> Any:
    try:
        return C._enc_hook(obj)
    except TypeError:
        return str(obj)


def _slug(domain: str) -> str:
    return _SLUG.sub("_", domain.lower())[:30] if domain else "general"


def _tokens(text: str) -> set[str]:
    return {t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS}


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
        self._lock = threading.RLock()  # one call at a time: the outbox goes out in order
        self._outbox: deque[tuple[str, dict[str, Any]]] = deque()
        self._outbox_limit = max(1, outbox_limit)
        self._pending_values: dict[str, Any] = {}  # remembered while away: recall still sees them
        self._ring: deque[EpisodicEntry] = deque(maxlen=RING)
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self.dropped = 0  # buffered writes dropped because the outbox was full
        self.delivered = 0  # buffered writes delivered after an outage
        self._down_since: float | None = None
        _managers.add(self)

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Deliver what is buffered (within one call's timeout), then close our connection."""
        with self._lock:
            if self._outbox:
                self._reach()
            if self._owns_client and self._shared is not None:
                self._shared.close()

    def __enter__(self) -> MemoryManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def buffered(self) -> int:
        """Writes waiting in the outbox for the daemon."""
        return len(self._outbox)

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

    def _reach(self) -> Client | None:
        """The client with the outbox delivered, or None while the daemon is unreachable."""
        if time.monotonic() < self._retry_at:
            return None
        try:
            client = self.client
            self._flush(client)
        except (ConnectionLost, Timeout) as exc:
            self._went_away(exc)
            return None
        if self._down_since is not None:
            log.info("eurekamem is back after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None
        self._backoff = BACKOFF_FIRST
        return client

    def _went_away(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            log.warning("eurekamem unreachable (%s); buffering writes, reads answer from what is at hand", exc)
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)

    def _flush(self, client: Client) -> None:
        while self._outbox:
            chunk = [self._outbox[i] for i in range(min(_FLUSH_CHUNK, len(self._outbox)))]
            results = client.call_many(chunk)
            for (method, params), result in zip(chunk, results):
                if isinstance(result, (ConnectionLost, Timeout)):
                    raise result
                self._outbox.popleft()
                if isinstance(result, EurekamemError):
                    log.error("a buffered %s was refused by the daemon, dropped: %s: %s", method, result.kind, result)
                    continue
                self.delivered += 1
                if method == "persistent.remember":
                    self._pending_values.pop(params["key"], None)

    def _buffer(self, method: str, params: dict[str, Any]) -> None:
        if len(self._outbox) >= self._outbox_limit:
            old_method, old = self._outbox.popleft()
            self.dropped += 1
            if old_method == "persistent.remember":
                self._pending_values.pop(old["key"], None)
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("eurekamem outbox full (%d): %d writes dropped so far", self._outbox_limit, self.dropped)
        self._outbox.append((method, params))

    def _call(self, method: str, params: dict[str, Any], result_type: Any = Any) -> tuple[bool, Any]:
        """(True, result), or (False, error) when unreachable or refused (the error is logged)."""
        with self._lock:
            client = self._reach()
            if client is None:
                return False, None
            try:
                return True, client._run(C.Op(method, params, result_type))
            except (ConnectionLost, Timeout) as exc:
                self._went_away(exc)
                return False, exc
            except EurekamemError as exc:
                if exc.kind != "not_found":
                    log.error("eurekamem refused %s: %s: %s", method, exc.kind, exc)
                return False, exc

    def _write(self, method: str, params: dict[str, Any], result_type: Any = Any) -> tuple[bool, Any]:
        """A buffered write: sent now if the outbox is empty and the daemon answers, else buffered."""
        with self._lock:
            client = self._reach()
            if client is not None:
                try:
                    return True, client._run(C.Op(method, params, result_type))
                except (ConnectionLost, Timeout) as exc:  # it may have run: the retry is harmless
                    self._went_away(exc)
                except EurekamemError as exc:
                    log.error("eurekamem refused %s: %s: %s", method, exc.kind, exc)
                    return False, exc
            self._buffer(method, params)
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
        comes back as its JSON form (as EurekaClaw's own do after a restart)."""
        params: dict[str, Any] = {"key": self._key(key), "value": C.to_wire(value)}
        fitted = self._tags(tags)
        if fitted:
            params["tags"] = fitted
        if source_session:
            params["source_session"] = self._names.fit(source_session, limits.MAX_ID)
        with self._lock:
            ok, _result = self._write("persistent.remember", params)
            if not ok and self._outbox and self._outbox[-1][1] is params:
                self._pending_values[params["key"]] = params["value"]

    def recall(self, key: str) -> Any | None:
        """The value stored under key, or None (also while the daemon is unreachable, unless this
        manager remembered the key meanwhile)."""
        fitted = self._key(key)
        ok, record = self._call("persistent.recall", {"key": fitted}, WireRecord | None)
        if ok:
            return None if record is None else record.value
        with self._lock:
            return self._pending_values.get(fitted)

    def recall_by_tag(self, tag: str) -> list[CrossRunRecord]:
        """Records carrying the tag, in the order their keys were first stored (EurekaClaw's dict
        order); [] while the daemon is unreachable."""
        ok, records = self._call("persistent.by_tag", {"tag": self._tag(tag)}, list[WireRecord])
        if not ok:
            return []
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
        """As EurekaClaw's (an empty theorem_name is fine). While the daemon is unreachable the node
        is made here and not stored (logged as an error), so the agent goes on."""
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
        ok, node = self._call("graph.add_theorem", params, WireNode)
        if ok:
            return self._node(node)
        log.error("theorem %r not stored: eurekamem unreachable", theorem_name[:80])
        return KnowledgeNode(
            node_id=str(uuid.uuid4()),
            theorem_name=theorem_name,
            formal_statement=formal_statement,
            domain=domain,
            session_id=session_id,
            tags=list(tags or []),
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
        self._call("graph.link", {"from_id": from_id, "to_id": to_id, "relation": name})

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[KnowledgeNode]:
        """As EurekaClaw's: nodes within depth hops either way, [] for an unknown id or depth < 1.
        Depth is capped at 16; the order is by distance (EurekaClaw's is a set's)."""
        if depth < 1 or not (0 < len(node_id) <= limits.MAX_ID):
            return []
        params = {"node_id": node_id, "depth": min(depth, limits.MAX_DEPTH)}
        ok, nodes = self._call("graph.related", params, list[WireNode])
        return [self._node(n) for n in nodes] if ok else []

    def retrieve_relevant_theorems(self, query: str, domain: str = "", limit: int = 5) -> list[KnowledgeNode]:
        """EurekaClaw's lexical retrieval, exactly: words of 3+ characters (stop words aside) shared
        by the query and the node's name and statement, +2 when the domain matches; best first,
        then oldest first. Candidates are the first 10,000 nodes of the domain (else of the graph)."""
        query_tokens = _tokens(query)
        if not query_tokens and not domain:
            return []
        candidates: list[KnowledgeNode] = []
        if domain:
            params = {"domain": self._names.fit(domain, limits.MAX_KEY), "limit": _ALL}
            ok, nodes = self._call("graph.search", params, list[WireNode])
            candidates = [self._node(n) for n in nodes] if ok else []
        if not candidates:
            ok, nodes = self._call("graph.search", {"limit": _ALL}, list[WireNode])
            candidates = [self._node(n) for n in nodes] if ok else []
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
        if not chosen:
            ok, page = self._call("memory.list", {"domain": domain_key, "limit": k if 0 < k <= _ALL else _ALL})
            memories = page.get("memories", []) if ok and isinstance(page, dict) else []
            chosen = memories[:k]
            if not memories and not (self.data_dir / "memories" / _slug(domain)).exists():
                return ""
        parts = ["<memories>"]
        for memory in chosen:  # stored text closes no block, starts no entry (protocol/_blocks.py)
            heading, newline, rest = escape_block_tags(self._body(memory)[:400]).partition("\n")
            parts.append(heading + newline + escape_entry_headings(rest))  # the file's own title line stays
        parts.append("</memories>")
        return "\n\n".join(parts)

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


# Deliver what managers buffered when the interpreter exits (each within its own call timeout).
_managers: weakref.WeakSet[MemoryManager] = weakref.WeakSet()


def _flush_at_exit() -> None:
    for manager in list(_managers):
        if manager.buffered:
            try:
                with manager._lock:
                    manager._retry_at = 0.0
                    manager._reach()
            except Exception as exc:  # at exit: report, never raise
                log.warning("eurekamem: %d buffered writes not delivered at exit: %s", manager.buffered, exc)


atexit.register(_flush_at_exit)
