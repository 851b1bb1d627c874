"""The routed classes: EurekaClaw's MemoryManager, SkillRegistry, SkillInjector and
SessionMemoryExtractor as subclasses of EurekaClaw's own (made by `make`), served by the daemon.

Rules kept here:
- One link per data root (EurekaClaw's `settings.eurekaclaw_dir`, or the parent of a memory_dir /
  skills_dir passed in): one Client shared by every routed object of that root, and one conduit (a
  client MemoryManager) whose bounded calls, circuit breaker and durable spool the registry and the
  extractor use. EurekaClaw makes a MemoryManager per prompt (SkillInjector.render_for_prompt):
  with the shared Client that costs no connection.
- A daemon is started on demand only for the configured data root (EurekaClaw's settings,
  EUREKACLAW_DIR, ~/.eurekaclaw), never for a folder derived from an argument: EurekaClaw's tests
  pass `tempfile.TemporaryDirectory()` folders, whose parent is $TMPDIR. A MemoryManager or
  SkillRegistry given another folder is routed only to a daemon that already serves exactly that
  folder (its sys.stats `data_dir`); without one it is EurekaClaw's own class on that folder's files.
- A routed MemoryManager answers EurekaClaw's own records (eurekaclaw.types.memory's pydantic
  EpisodicEntry, CrossRunRecord, KnowledgeNode), built from the drop-in's with the same values;
  its `.session`, `.persistent` and `.graph` answer EurekaClaw's EpisodicMemory, PersistentMemory
  and KnowledgeGraph calls through the manager (client/_views.py), never over a copy of the files.
- Never an exception where EurekaClaw expects none. With the daemon away, the registry reads the
  SKILL.md files (the daemon writes them in EurekaClaw's format) with EurekaClaw's own loader, skill
  writes wait in the spool and go out in order once it is back (a use whose answer was lost may
  then count twice), and the post-run extraction falls back to EurekaClaw's own extractor.
- The post-run extraction never blocks the agent's event loop: session.close and the wait for the
  job (at most EXTRACT_WAIT seconds) run in a worker thread (asyncio's or trio's); the LLM work is
  the daemon's job. A session always becomes memories: when the daemon says it has no LLM, or its
  job fails or does not finish within the bound, EurekaClaw's own extraction call runs here with
  the agent's LLM client and session.learned completes the job with its items (exactly once).
- What a session learned reaches the next one (the routed methods, set on EurekaClaw's classes in
  place): every prompt BaseAgent.build_system_prompt builds carries the brief's domain memories
  (`load_for_injection(domain, k=4, query=<the task's description>)`, EurekaClaw's documented
  session-start injection, inside its own block after the skills); the theory loop's prover is told
  the failed strategies the daemon keeps for the lemma at hand (theory.failed_strategies.<domain
  slug>.<lemma id>) among its "previous failed approaches"; a "Tool X: ..." event (EurekaClaw's tool
  loop logs no metadata) goes out with metadata `tool` and `success`, what skill distillation reads.
  Each only when the agent's memory is a routed MemoryManager; otherwise EurekaClaw's own code runs.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib
import inspect
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

from ...client import (
    Client,
    ConnectionLost,
    EurekamemError,
    Job,
    Skill,
    SkillHit,
    SkillsInjection,
    Timeout,
    current_async_library,
    daemon_answers,
    default_socket_path,
    root_socket_path,
)
from ...client import MemoryManager as ClientMemoryManager
from ...client import eurekaclaw_dir as eurekaclaw_dir_from_env
from ...protocol import domain_slug
from ...protocol import methods as limits
from ...protocol.blocks import skill_element, skills_block
from ._options import current as options

__all__ = [
    "BUS_KEY", "CONDUIT_SESSION", "close_links", "configured_link", "eurekaclaw_root", "link_for", "make",
    "routed_method", "unrouted_methods",
]

log = logging.getLogger("eurekamem.integrations.eurekaclaw")

SKILLS_FOLDER = "skills"  # the folder of a data root that the daemon's skills tier serves (EurekaClaw's skills_dir)
CONDUIT_SESSION = "eurekamem.integrations.eurekaclaw"  # the conduit's session: it logs no events
BUS_KEY = "eurekamem_extraction"  # on the KnowledgeBus after post-run learning: session.close's answer

T = TypeVar("T")


# --- where EurekaClaw keeps its data, and the link to the daemon serving it -------------------


def eurekaclaw_root() -> Path:
    """EurekaClaw's data root as EurekaClaw's own settings say (eurekaclaw.config.settings), else
    as the client reads them (EUREKACLAW_DIR, `.env`, ~/.eurekaclaw)."""
    try:
        settings = importlib.import_module("eurekaclaw.config").settings
        return Path(settings.eurekaclaw_dir).expanduser()
    except Exception as exc:  # EurekaClaw's settings not importable: its documented default
        log.debug("EurekaClaw's settings not readable (%s): EUREKACLAW_DIR, .env or ~/.eurekaclaw", exc)
        return eurekaclaw_dir_from_env()


class Link:
    """One data root's way to the daemon (see the module's rules). `socket_path` is given for a
    root that is not the configured one: the socket of the daemon found serving it (no autostart)."""

    def __init__(self, data_dir: Path, socket_path: str | None = None) -> None:
        opts = options()
        extra: dict[str, Any] = {} if opts.timeout is None else {"timeout": opts.timeout}
        self.data_dir = data_dir
        self.configured = socket_path is None
        self.autostart = opts.autostart if self.configured else False
        self.conduit = ClientMemoryManager(
            CONDUIT_SESSION,
            data_dir / "memory",
            socket_path=opts.socket_path if self.configured else socket_path,
            autostart=self.autostart,
            **extra,
        )

    @property
    def client(self) -> Client:
        return self.conduit.client

    def call(self, method: str, params: dict[str, Any], result_type: Any = Any) -> tuple[bool, Any]:
        """(True, result), or (False, None / the error): bounded, backed off, logged (the conduit's)."""
        return self.conduit._call(method, params, result_type)

    def write(self, method: str, params: dict[str, Any], result_type: Any = Any) -> tuple[bool, Any]:
        """A write through the conduit's spool: sent now, or delivered in order once the daemon answers."""
        return self.conduit._write(method, params, result_type)

    def wire_session(self, session_id: str) -> str:
        """The session id as the routed MemoryManagers send it (long or empty ids shortened alike)."""
        return self.conduit._names.fit(session_id, limits.MAX_ID)


_links: dict[Path, Link] = {}
_links_lock = threading.Lock()
_managers: weakref.WeakSet[ClientMemoryManager] = weakref.WeakSet()  # routed managers alive


_PROBE_TIMEOUT = 2.0  # seconds to ask a daemon which data root it serves


def _serving_socket(root: Path) -> str | None:
    """The socket of a daemon that serves exactly `root` (its sys.stats data_dir), among those a
    routed object could reach: install()'s, $EUREKAMEM_SOCKET, the default and the root's own."""
    candidates = [options().socket_path, os.environ.get("EUREKAMEM_SOCKET"), default_socket_path(root), root_socket_path(root)]
    for path in dict.fromkeys(os.path.expanduser(c) for c in candidates if c):
        if not daemon_answers(path, timeout=_PROBE_TIMEOUT):
            continue
        try:
            with Client(path, timeout=_PROBE_TIMEOUT, autostart=False) as probe:
                served = probe.call("sys.stats").get("data_dir")
        except (EurekamemError, OSError, AttributeError) as exc:
            log.debug("the daemon on %s could not say its data root: %s", path, exc)
            continue
        if served and Path(served).resolve() == root:
            return path
    return None


def link_for(data_dir: Path | None) -> Link | None:
    """The link for a data root: the configured one (data_dir None, or the configured root itself;
    started on demand) or another folder that a running daemon serves; None for another folder no
    daemon serves (its routed object is EurekaClaw's own class then: the module's rules)."""
    configured = eurekaclaw_root().expanduser()
    root = data_dir.expanduser() if data_dir is not None else configured
    key = root.resolve()
    with _links_lock:
        link = _links.get(key)
        if link is not None:
            return link
    socket_path = None
    if key != configured.resolve():
        socket_path = _serving_socket(key)
        if socket_path is None:
            log.info("%s is not the configured data root (%s) and no daemon serves it: EurekaClaw's own class", root, configured)
            return None
    with _links_lock:
        link = _links.get(key)
        if link is None:
            link = _links[key] = Link(root, socket_path)
        return link




def configured_link() -> Link:
    """The configured data root's link (there always is one)."""
    link = link_for(None)
    assert link is not None, "the configured root always has a link"
    return link


def close_links() -> None:
    """Deliver what the conduits buffered and close the shared clients (uninstall())."""
    with _links_lock:
        links = list(_links.values())
        _links.clear()
    for link in links:
        link.conduit.close()


def _unreachable(result: Any) -> bool:
    return result is None or isinstance(result, (ConnectionLost, Timeout))


def _plain(value: Any) -> str:
    """A role or stage as EurekaClaw passes it (a str, or its AgentRole enum) as the string it means."""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _ident(text: str) -> bool:
    return 0 < len(text) <= limits.MAX_ID


# --- the classes ------------------------------------------------------------------------------


def make(class_name: str, original: type) -> type:
    """The routed subclass of EurekaClaw's `original` class named `class_name`."""
    mixin = _MIXINS[class_name]
    return type(
        class_name,
        (mixin, original),
        {"__module__": __name__, "__qualname__": class_name, "__doc__": mixin.__doc__, "_original": original},
    )


def unrouted_methods(original: type, routed: type) -> list[str]:
    """Public methods of `original` that `routed` inherits unchanged (an EurekaClaw version newer
    than this integration): they would still use EurekaClaw's files."""
    through: frozenset[str] = getattr(routed, "_routed_through_others", frozenset())
    return sorted(
        name
        for name, value in vars(original).items()
        if not name.startswith("_")
        and name not in through
        and callable(value)
        and getattr(routed, name, None) is getattr(original, name)
    )


class RoutedMemoryManager(ClientMemoryManager):
    """EurekaClaw's MemoryManager(session_id, memory_dir=None), served by the daemon: eurekamem's
    drop-in (client/_manager.py: EurekaClaw's methods, signatures and answers), on the data root
    EurekaClaw's settings name, over the link's shared Client."""

    _original: type
    _link: Link

    def __new__(cls, session_id: str, memory_dir: Any = None) -> Any:
        given = Path(memory_dir).expanduser() if memory_dir is not None else None
        link = link_for(given.parent if given is not None else None)
        if link is None:  # another folder than the configured root, no daemon serving it
            return cls._original(session_id, memory_dir)
        self = super().__new__(cls)
        self._link = link
        return self

    def __init__(self, session_id: str, memory_dir: Any = None) -> None:
        given = Path(memory_dir).expanduser() if memory_dir is not None else None
        link = self._link
        opts = options()
        extra: dict[str, Any] = {} if opts.timeout is None else {"timeout": opts.timeout}
        super().__init__(
            session_id,
            given if given is not None else link.data_dir / "memory",
            client=link.client,
            autostart=link.autostart,
            **extra,
        )
        _managers.add(self)

    def log_event(self, agent_role: str, content: str, metadata: dict[str, Any] | None = None) -> Any:
        """EurekaClaw's log_event; a tool result as its tool loop logs it ("Tool <name>: <result>",
        no metadata) also says which tool and whether it succeeded (EurekaClaw's ToolRegistry.call
        answers "Error..." for a failure), in the metadata skill distillation reads."""
        return eurekaclaws(super().log_event(agent_role, content, tool_metadata(content, metadata)))

    # The records, as EurekaClaw's own pydantic types (eurekaclaw.types.memory): what its callers
    # get from its manager (isinstance, validators, pydantic's whole API), built from ours.

    def recent_events(self, n: int = 20, agent_role: str | None = None) -> list[Any]:
        return [eurekaclaws(e) for e in super().recent_events(n, agent_role)]

    def recall_by_tag(self, tag: str) -> list[Any]:
        return [eurekaclaws(r) for r in super().recall_by_tag(tag)]

    def add_theorem(
        self,
        theorem_name: str,
        formal_statement: str,
        domain: str = "",
        session_id: str = "",
        tags: list[str] | None = None,
    ) -> Any:
        return eurekaclaws(super().add_theorem(theorem_name, formal_statement, domain, session_id, tags))

    def find_related_theorems(self, node_id: str, depth: int = 2) -> list[Any]:
        return [eurekaclaws(n) for n in super().find_related_theorems(node_id, depth)]

    def retrieve_relevant_theorems(self, query: str, domain: str = "", limit: int = 5) -> list[Any]:
        return [eurekaclaws(n) for n in super().retrieve_relevant_theorems(query, domain, limit)]

    def _export(self, record: Any) -> Any:
        """Records of `.persistent` and `.graph` (the drop-in's views) as EurekaClaw's own types."""
        return eurekaclaws(record)


def eurekaclaws(record: Any) -> Any:
    """One of our records (client/_models.py) as EurekaClaw's pydantic model of the same name, with
    the fields that model declares (the same values: the caller's metadata objects too); ours
    when EurekaClaw's types cannot be imported."""
    try:
        model = getattr(importlib.import_module("eurekaclaw.types.memory"), type(record).__name__)
    except (ImportError, AttributeError) as exc:
        log.debug("EurekaClaw's %s not importable (%s): ours", type(record).__name__, exc)
        return record
    declared = model.model_fields
    return model.model_validate({f: getattr(record, f) for f in record.__struct_fields__ if f in declared})


class RoutedSkillRegistry:
    """EurekaClaw's SkillRegistry(skills_dir=None), served by the daemon's skills.* (the active
    skills of <data root>/skills, the folder EurekaClaw reads). Differences: load_all() rewrites no
    file (EurekaClaw's upserts every skill); upsert() with success_rate None keeps the daemon's
    rate; drafts are never answered (they live outside EurekaClaw's folder). search() is ours."""

    _original: type

    _link: Link

    def __new__(cls, skills_dir: Any = None) -> Any:
        given = Path(skills_dir).expanduser() if skills_dir is not None else None
        link = link_for(given.parent if given is not None else None)
        if link is None:  # another folder than the configured root, no daemon serving it
            return cls._original(skills_dir)
        if given is not None and given.resolve() != (link.data_dir / SKILLS_FOLDER).expanduser().resolve():
            # the daemon serves <root>/skills only: a folder beside it is EurekaClaw's own registry's
            log.info("%s is not %s/%s: EurekaClaw's own SkillRegistry", given, link.data_dir, SKILLS_FOLDER)
            return cls._original(skills_dir)
        self = super().__new__(cls)
        self._link = link
        return self

    def __init__(self, skills_dir: Any = None) -> None:
        self._skills_dir = Path(skills_dir).expanduser() if skills_dir is not None else self._link.data_dir / "skills"
        # EurekaClaw's own attributes, for its loader while the daemon is away
        self._extra_dirs: list[Path] = []
        self._skills: dict[str, Any] = {}
        self._loaded = False

    # --- records ----------------------------------------------------------------------------

    def _record(self, skill: Skill) -> Any:
        types = importlib.import_module("eurekaclaw.types.skills")
        created = _dt.datetime.fromisoformat(skill.created_at)
        if created.tzinfo is not None:  # EurekaClaw's own are naive UTC (utcnow)
            created = created.astimezone(_dt.UTC).replace(tzinfo=None)
        meta = types.SkillMeta.model_validate(
            {
                "name": skill.name,
                "version": skill.version,
                "tags": list(skill.tags),
                "agent_roles": list(skill.agent_roles),
                "pipeline_stages": list(skill.pipeline_stages),
                "description": skill.description,
                "source": skill.source,
                "created_at": created,
                "usage_count": skill.usage_count,
                "success_rate": skill.success_rate,
            }
        )
        return types.SkillRecord(meta=meta, content=skill.body, file_path=str(self._skills_dir / skill.name / "SKILL.md"))

    def _from_files(self) -> list[Any]:
        """EurekaClaw's own loader over the SKILL.md files (which the daemon writes): the daemon away."""
        try:
            cast(Any, super())._load()
        except Exception as exc:  # EurekaClaw's loader fails on a folder without SKILL.md, say
            log.warning("skills not readable from %s while eurekamem is away: %s", self._skills_dir, exc)
            return []
        return list(self._skills.values())

    def _ensure_loaded(self) -> None:
        """EurekaClaw's registry reads skills/ on its first access and on the first after reload():
        the daemon is asked to scan the folder then (skills.scan), so a SKILL.md written by hand
        just before is seen at once, as EurekaClaw's own registry sees it. Asked once per load, as
        EurekaClaw reads once; the daemon away (or not watching skills/), its own scan will do."""
        if self._loaded:
            return
        ok, counts = self._link.call("skills.scan", {})
        if ok or not _unreachable(counts):  # answered (a refusal too): loaded, as EurekaClaw's _load
            self._loaded = True

    def _active(self, **filters: Any) -> list[Any]:
        self._ensure_loaded()
        ok, skills = self._link.call("skills.list", {"status": "active", **filters}, list[Skill])
        if ok:
            return [self._record(s) for s in skills]
        return self._from_files() if _unreachable(skills) else []

    # --- EurekaClaw's methods ---------------------------------------------------------------

    def add_skills_dir(self, path: Path) -> None:
        """As EurekaClaw's: remembered, and (as in EurekaClaw 0.2.0, whose loader skips them) not read."""
        if path not in self._extra_dirs:
            self._extra_dirs.append(path)

    def load_all(self) -> list[Any]:
        return self._active()

    def get(self, name: str) -> Any | None:
        if not isinstance(name, str) or not _ident(name):
            return None
        self._ensure_loaded()
        ok, skill = self._link.call("skills.get", {"name": name}, Skill)
        if ok:
            return self._record(skill) if skill.status == "active" else None
        if _unreachable(skill):
            return next((s for s in self._from_files() if s.meta.name == name), None)
        return None

    def get_by_tags(self, tags: list[str]) -> list[Any]:
        wanted = set(tags)
        return [s for s in self._active() if wanted & set(s.meta.tags)]

    def get_by_role(self, role: str) -> list[Any]:
        role = _plain(role)
        found = self._active(agent_role=role) if _ident(role) else self._active()
        return [s for s in found if role in s.meta.agent_roles]

    def get_by_pipeline_stage(self, stage: str) -> list[Any]:
        stage = _plain(stage)
        return [s for s in self._active() if stage in s.meta.pipeline_stages]

    def upsert(self, skill: Any) -> None:
        """skills.put of the record (buffered while the daemon is away); sets its file_path, as EurekaClaw's."""
        meta = skill.meta
        created = meta.created_at
        params: dict[str, Any] = {
            "name": meta.name,
            "body": skill.content,
            "version": meta.version,
            "tags": list(meta.tags),
            "agent_roles": list(meta.agent_roles),
            "pipeline_stages": list(meta.pipeline_stages),
            "description": meta.description,
            "source": meta.source,
            "created_at": created.isoformat() if isinstance(created, _dt.datetime) else str(created),
            "usage_count": meta.usage_count,
        }
        if meta.success_rate is not None:
            params["success_rate"] = meta.success_rate
        self._link.write("skills.put", params, Skill)
        skill.file_path = str(self._skills_dir / meta.name / "SKILL.md")

    def update_stats(self, name: str, success: bool) -> None:
        """skills.record_use (EurekaClaw's moving average, kept by the daemon); an unknown name is ignored."""
        if self.get(name) is None:
            return
        self._link.write("skills.record_use", {"name": name, "success": bool(success)}, Skill)

    def reload(self) -> None:
        """As EurekaClaw's: the next access reads skills/ again (the daemon scans it first)."""
        self._loaded = False

    # --- ours -------------------------------------------------------------------------------

    def search(self, query: str, k: int = 10) -> list[Any]:
        """skills.search (hybrid: BM25 and the embedder's vectors), best first: the active skills."""
        return self._search(query, k) or []

    def _search(self, query: str, k: int) -> list[Any] | None:
        query = query.strip()[: limits.MAX_KEY * 4]
        if not query:
            return None
        params = {"query": query, "k": min(max(k, 1), limits.MAX_K)}
        ok, hits = self._link.call("skills.search", params, list[SkillHit])
        return [self._record(hit.skill) for hit in hits] if ok else None

    def _inject_names(self, agent_role: str, pipeline_stage: str, k: int, query: str = "") -> list[str] | None:
        """skills.inject's choice and order for a role (and stage, and query); None if it cannot answer."""
        if not _ident(agent_role):
            return None
        params: dict[str, Any] = {"agent_role": agent_role, "k": min(max(k, 1), limits.MAX_K)}
        if _ident(pipeline_stage):
            params["pipeline_stage"] = pipeline_stage
        query = query.strip()[: limits.MAX_KEY * 4]
        if query:
            params["query"] = query
        ok, result = self._link.call("skills.inject", params, SkillsInjection)
        return list(result.names) if ok else None


RANKING_ENV = "EUREKAMEM_SKILL_RANKING"  # "hybrid": the daemon's ranking and block; else EurekaClaw's


def skill_ranking() -> str:
    """The injector's ranking: "eurekaclaw" (the default: EurekaClaw's own order and block) or
    "hybrid" ($EUREKAMEM_SKILL_RANKING=hybrid: skills.inject with the task's text as the query)."""
    return "hybrid" if os.environ.get(RANKING_ENV, "").strip().lower() == "hybrid" else "eurekaclaw"


class _SkillsView:
    """One skills.list answer with the three lookups EurekaClaw's tag retrieval makes (one call
    instead of one per skill), in the order EurekaClaw's loader meets the folders."""

    def __init__(self, records: list[Any], skills_dir: Path) -> None:
        try:
            order = {name: at for at, name in enumerate(os.listdir(skills_dir))}
        except OSError:
            order = {}
        records = sorted(records, key=lambda r: order.get(r.meta.name, len(order)))
        self._by_name = {r.meta.name: r for r in records}

    def get(self, name: str) -> Any | None:
        return self._by_name.get(name)

    def get_by_role(self, role: str) -> list[Any]:
        return [r for r in self._by_name.values() if role in r.meta.agent_roles]

    def get_by_pipeline_stage(self, stage: str) -> list[Any]:
        return [r for r in self._by_name.values() if stage in r.meta.pipeline_stages]


class RoutedSkillInjector:
    """EurekaClaw's SkillInjector(registry, selected_skills=None) over a routed registry. By default
    top_k is EurekaClaw's own ranking (its tag retrieval run over one skills.list answer: the same
    skills in the same order) and render_for_prompt EurekaClaw's exact <skills> block; the semantic
    strategy asks skills.search (no model loaded in the agent). With $EUREKAMEM_SKILL_RANKING=hybrid
    the tag strategy asks skills.inject with the task's name and description as the query (role and
    stage, then BM25 and vectors, then use; the selected skills first) and the block is the
    daemon's (the note marking the skills as reference material, tags in bodies escaped). For a
    domain, render_for_prompt adds the memories block of the routed MemoryManager; given none inside
    a routed BaseAgent.build_system_prompt, the brief's domain's (the task's description the query).
    Over any other registry, or with the daemon unable to answer, EurekaClaw's own retrieval runs."""

    _original: type
    registry: Any
    selected_skills: list[Any]
    _injected: set[str]

    def top_k(self, task: Any, role: str, k: int = 5, strategy: str = "tag") -> list[Any]:
        registry = self.registry
        if skill_ranking() == "hybrid" and strategy != "semantic" and isinstance(registry, RoutedSkillRegistry):
            role, task_role = _plain(role), _plain(task.agent_role)
            must = [s for s in self.selected_skills if role in s.meta.agent_roles or task_role in s.meta.pipeline_stages]
            query = f"{task.name} {task.description}"
            names = registry._inject_names(role, task_role, k + len(must), query)
            if names is not None:
                current = {s.meta.name: s for s in registry.load_all()}
                taken = {s.meta.name for s in must}
                chosen = [current.get(s.meta.name, s) for s in must]
                chosen += [current[n] for n in names if n not in taken and n in current]
                return chosen[:k]
        return cast(list[Any], cast(Any, super()).top_k(task, role, k, strategy))

    def _tag_retrieval(self, task_role: str, role: str, k: int) -> list[Any]:
        registry = self.registry
        if isinstance(registry, RoutedSkillRegistry):  # EurekaClaw's own code, over one answer
            view = _SkillsView(registry._active(), registry._skills_dir)
            me = SimpleNamespace(registry=view, selected_skills=self.selected_skills)
            return cast(list[Any], cast(Any, self._original)._tag_retrieval(me, task_role, role, k))
        return cast(list[Any], cast(Any, super())._tag_retrieval(task_role, role, k))

    def _semantic_retrieval(self, query: str, role: str, k: int) -> list[Any]:
        registry = self.registry
        if isinstance(registry, RoutedSkillRegistry):
            role = _plain(role)
            must = [s for s in self.selected_skills if role in s.meta.agent_roles]
            hits = registry._search(query, k + len(must))
            if hits is not None:
                taken = {s.meta.name for s in must}
                return (must + [h for h in hits if h.meta.name not in taken])[:k]
        return cast(list[Any], cast(Any, super())._semantic_retrieval(query, role, k))

    def render_for_prompt(self, skills: list[Any], domain: str = "") -> str:
        parts: list[str] = []
        if skills and skill_ranking() == "hybrid":
            parts.append(skills_block([skill_element(s.meta.name, s.content) for s in skills]))
            self._injected.update(s.meta.name for s in skills)
        elif skills:  # EurekaClaw's own block (no domain: the memories are added below)
            parts.append(cast(str, cast(Any, self._original).render_for_prompt(self, skills)))
        query = None
        asked = _prompt_memories.get()
        if not domain and asked is not None:  # inside a routed build_system_prompt: the brief's domain
            domain, query = asked
        if domain:
            try:  # looked up where EurekaClaw looks it up: the routed class once installed
                manager = importlib.import_module("eurekaclaw.memory.manager").MemoryManager
                block = manager(session_id="injector").load_for_injection(domain, k=4, query=query)
                if block:
                    parts.append(block)
            except Exception as exc:  # as EurekaClaw: memories never block a prompt
                log.warning("memories for %r not injected: %s", domain, exc)
        return "\n".join(parts)


class RoutedSessionMemoryExtractor:
    """EurekaClaw's SessionMemoryExtractor(client=None), served by the daemon: extract_and_save(bus,
    domain) closes the session (session.close with the bus's TheoryState and domain), which queues
    the daemon's session.extract job, and waits at most EXTRACT_WAIT seconds for the job; it returns
    [] (the memories are the job's) and puts session.close's answer on the bus under BUS_KEY.
    When the daemon cannot extract (no LLM: the job's waiting_reason says so at once; the job
    failed) or has not within the bound, EurekaClaw's own extraction call runs here, with the
    agent's LLM client (its prompt, model, token cap and parser), and session.learned hands the
    items to the job: the daemon's rules and one commit make them memories, lemma nodes and failed
    strategies, and the job is done, so it never runs again (a WARNING, once per process, says why
    and how to give the daemon an LLM). Difference: an empty domain is the research brief's
    (EurekaClaw's loop passes `bus.domain`, which its KnowledgeBus does not have, so its memories all
    went to "general"). The daemon unreachable or refusing: EurekaClaw's own extractor runs instead
    (with the client given)."""

    _original: type

    def __init__(self, client: Any = None) -> None:
        self.client = client  # EurekaClaw's LLM client: for its extraction call when the daemon cannot
        self.last_close: dict[str, Any] | None = None
        self.last_learned: Any = None  # session.learned's answer (the Job), when this process extracted
        self._fallback: Any = None

    async def extract_and_save(self, bus: Any, domain: str = "") -> list[dict[str, Any]]:
        domain = domain or _brief_domain(bus)
        theory_state = bus.get_theory_state()
        dump = getattr(theory_state, "model_dump", None)  # here, not in the worker: the bus is the loop's
        state = dump(mode="json") if callable(dump) else theory_state
        closed = await _in_worker_thread(close_session, str(bus.session_id), domain, state)
        if closed is not None:
            self.last_close = closed
            bus.put(BUS_KEY, closed)
            job_id = closed.get("job_id")
            log.info("session %s closed: extraction job %s queued by eurekamem", bus.session_id, job_id)
            why = await _in_worker_thread(_why_not_extracted, str(job_id)) if job_id else None
            if why is not None:
                await self._extract_here(str(job_id), why, theory_state, domain)
            return []
        log.warning("eurekamem could not close session %s: EurekaClaw's own extractor runs instead", bus.session_id)
        if self._fallback is None:
            self._fallback = self._original(client=self.client)
        return cast(list[dict[str, Any]], await self._fallback.extract_and_save(bus, domain=domain))


    async def _extract_here(self, job_id: str, why: tuple[str, str], theory_state: Any, domain: str) -> None:
        """EurekaClaw's extraction call with the agent's LLM client, its items delivered to the job."""
        cause, text = why
        _warn_once(cause, text)
        client = self.client
        try:
            if client is None:
                client = self.client = importlib.import_module("eurekaclaw.llm").create_client()
            items = await _eurekaclaw_extraction(self, client, theory_state, domain)
        except Exception as exc:  # as EurekaClaw's own: an extraction that fails never fails the run
            log.warning("the extraction in this process failed (%s): job %s stays queued for the daemon", exc, job_id)
            return
        if items is None:
            log.warning("no insights in EurekaClaw's shape (no TheoryState, or an answer not in its JSON): "
                        "job %s stays queued for the daemon", job_id)
            return
        self.last_learned = await _in_worker_thread(deliver_learned, job_id, items)


EXTRACT_WAIT_VARIABLE = "EUREKAMEM_EXTRACT_WAIT"
EXTRACT_WAIT = 60.0  # seconds the post-run learning waits for the daemon's job before extracting itself
_CATEGORIES = ("domain_knowledge", "proof_strategy", "open_problems", "pitfalls")
_FIX = (  # names the config keys (and variables) the daemon accepts: a config [llm] table is refused
    "give the daemon an LLM (ANTHROPIC_API_KEY in the daemon's environment, or llm_provider = \"openai\", "
    "llm_base_url and llm_model in its config file, EUREKAMEM_LLM_PROVIDER, EUREKAMEM_LLM_BASE_URL and "
    "EUREKAMEM_LLM_MODEL in its environment, for an OpenAI-compatible server), then restart it or run "
    "`eurekamem call sys.resume`"
)
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(cause: str, text: str) -> None:
    """A WARNING the first time per process for each cause; INFO after."""
    with _warned_lock:
        first = cause not in _warned
        _warned.add(cause)
    log.log(logging.WARNING if first else logging.INFO, "%s; extracting this session's memories in this process "
            "with EurekaClaw's own LLM client", text)


def _extract_wait() -> float:
    raw = os.environ.get(EXTRACT_WAIT_VARIABLE, "")
    try:
        return min(max(float(raw), 0.0), limits.MAX_WAIT) if raw.strip() else EXTRACT_WAIT
    except ValueError:
        log.warning("%s=%r is not a number of seconds: %g s", EXTRACT_WAIT_VARIABLE, raw, EXTRACT_WAIT)
        return EXTRACT_WAIT


def _why_not_extracted(job_id: str) -> tuple[str, str] | None:
    """None when the daemon extracts the session (or did, or cannot be asked: the job is journaled);
    else (cause, what to warn): it has no LLM, the job failed, or it did not finish within the bound."""
    link = configured_link()
    ok, job = link.call("jobs.get", {"id": job_id}, Job)
    if not ok:
        return None
    wait = _extract_wait()
    if job.state in ("queued", "running") and not (job.waiting_reason or "").startswith("no LLM") and wait > 0:
        try:
            job = link.client.wait_job(job_id, timeout=wait)
        except EurekamemError as exc:
            log.warning("eurekamem did not answer jobs.wait for job %s (%s): it stays the daemon's", job_id, exc)
            return None
    reason = job.waiting_reason or ""
    if job.state in ("done", "cancelled"):
        return None
    if job.state == "failed":
        return "failed", f"the daemon's extraction job {job_id} failed ({job.error})"
    if reason.startswith("no LLM"):
        return "no_llm", f"the eurekamem daemon cannot extract session memories, it has {reason}: {_FIX}"
    return "slow", f"the eurekamem daemon did not finish extraction job {job_id} within {wait:g} s ({reason or job.state})"


async def _eurekaclaw_extraction(
    extractor: Any, client: Any, theory_state: Any, domain: str
) -> list[dict[str, Any]] | None:
    """EurekaClaw's own extraction call (learning/memory_extractor.py: its prompt, filled as it fills
    it, its model and token cap, its system line, its JSON parser), made with the agent's client:
    the items as session.learned takes them, or None when the answer is not in its shape."""
    if not theory_state:  # EurekaClaw's own extracts nothing then: the job waits for the daemon's LLM
        return None
    module = importlib.import_module(extractor._original.__module__)
    settings = importlib.import_module("eurekaclaw.config").settings
    lemmas = "\n".join(
        f"- [{lid}] (verified={r.verified}): {r.proof_text[:120]}" for lid, r in list(theory_state.proven_lemmas.items())[:8]
    )
    failures = "\n".join(f"- [{f.lemma_id}]: {f.failure_reason[:100]}" for f in theory_state.failed_attempts[:5]) or "(none)"
    response = await client.messages.create(
        model=settings.fast_model,
        max_tokens=settings.max_tokens_formalizer,
        system="You extract lasting research insights from proof sessions. Be concise and precise.",
        messages=[{"role": "user", "content": module._EXTRACT_PROMPT.format(
            domain=domain or "mathematical research",
            conjecture=(theory_state.informal_statement or theory_state.formal_statement or "")[:300],
            outcome=theory_state.status,
            lemmas=lemmas or "(none)",
            failures=failures,
        )}],
    )
    text = response.content[0].text if response.content else "{}"
    data = extractor._parse_json(text)  # EurekaClaw's own (the routed class inherits it)
    if not isinstance(data, dict) or not any(category in data for category in _CATEGORIES):
        return None
    items: list[dict[str, Any]] = []
    for category in _CATEGORIES:
        entries = data.get(category) or []
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            try:  # read as EurekaClaw reads it: "untitled", the content stripped, confidence 0.8 by default
                confidence = float(entry.get("confidence", 0.8))
            except (TypeError, ValueError):
                continue
            if confidence != confidence:  # NaN
                continue
            items.append({
                "category": category,
                "title": str(entry.get("title", "untitled"))[:200],
                "content": str(entry.get("content", "")).strip()[:4000],
                "confidence": min(max(confidence, 0.0), 1.0),
            })
    return items[: limits.MAX_LEARNED]


def deliver_learned(job_id: str, items: list[dict[str, Any]]) -> Job | None:
    """session.learned: the items complete the job (the daemon's rules, one commit); the Job, or None
    when the daemon did not take them (logged; the job stays queued for the daemon's own LLM)."""
    ok, job = configured_link().call("session.learned", {"job_id": job_id, "items": items}, Job)
    if not ok:
        return None
    extracted_by = job.result.get("extracted_by") if isinstance(job.result, dict) else None
    log.info("job %s is %s (extracted by %s)", job_id, job.state, extracted_by or "nobody")
    return cast(Job, job)


def _brief_domain(bus: Any) -> str:
    get_brief = getattr(bus, "get_research_brief", None)
    brief = get_brief() if callable(get_brief) else None
    return str(getattr(brief, "domain", "") or "")


def close_session(session_id: str, domain: str, theory_state: Any) -> dict[str, Any] | None:
    """session.close for an EurekaClaw session (after delivering what its managers buffered), with
    its TheoryState as JSON (`model_dump(mode="json")`): session.close's answer, or None if the
    daemon did not give one (logged)."""
    link = configured_link()
    for manager in list(_managers):
        if manager.session_id == session_id and manager.buffered:
            with manager._lock:
                manager._reach()
    params: dict[str, Any] = {"session_id": link.wire_session(session_id), "extract": True}
    if domain:
        params["domain"] = domain[: limits.MAX_KEY]
    if theory_state is not None:
        params["theory_state"] = theory_state
    ok, result = link.call("session.close", params)
    return result if ok and isinstance(result, dict) else None


async def _in_worker_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a worker thread of the running event loop (asyncio or trio), so that a slow
    socket never stalls the agent's other tasks; called directly outside an event loop."""
    try:
        library = current_async_library()
    except RuntimeError:
        return fn(*args)
    if library == "trio":
        import trio

        return await trio.to_thread.run_sync(fn, *args)
    import asyncio

    return await asyncio.to_thread(fn, *args)


# --- what a session learned, in the next one's prompts (the routed methods) ---------------------

_prompt_memories: ContextVar[tuple[str, str | None] | None] = ContextVar("eurekamem_prompt_memories", default=None)
_lemma_lessons: ContextVar[tuple[Any, str] | None] = ContextVar("eurekamem_lemma_lessons", default=None)
_TOOL_RESULT = re.compile(r"Tool (\S+?): ", re.DOTALL)  # EurekaClaw's tool loop: f"Tool {name}: {result[:200]}"
_TOOL_KEYS = ("tool", "tool_name", "action")  # what skill distillation reads as the tool (daemon/jobs/distill.py)
FAILURES_SHOWN = 3  # EurekaClaw's prover shows the first three past failures


def tool_metadata(content: str, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The metadata of an event, with `tool` and `success` added for EurekaClaw's tool-result line
    when the metadata names no tool."""
    found = _TOOL_RESULT.match(content) if isinstance(content, str) else None
    if found is None or (metadata and any(metadata.get(k) for k in _TOOL_KEYS)):
        return metadata
    result = content[found.end():]
    return {**(metadata or {}), "tool": found.group(1), "success": not result.startswith("Error")}


def _routed_build_system_prompt(own: Callable[..., str]) -> Callable[..., str]:
    def build_system_prompt(self: Any, task: Any) -> str:
        """EurekaClaw's prompt; with a routed memory, the research brief's domain memories in it
        (EurekaClaw's injector block, queried with the task's description)."""
        brief = self.bus.get_research_brief() if isinstance(getattr(self, "memory", None), RoutedMemoryManager) else None
        domain = str(getattr(brief, "domain", "") or "")
        if not domain:
            return own(self, task)
        query = str(getattr(task, "description", "") or getattr(brief, "query", "") or "") or None
        if not isinstance(getattr(self, "skill_injector", None), RoutedSkillInjector):
            block = self.memory.load_for_injection(domain, k=4, query=query)
            prompt = own(self, task)
            return f"{prompt}\n\n{block}" if block else prompt
        token = _prompt_memories.set((domain, query))
        try:
            return own(self, task)
        finally:
            _prompt_memories.reset(token)

    return build_system_prompt


def _routed_run_iterative(own: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(own)

    async def run_iterative(self: Any, *args: Any, **kwargs: Any) -> Any:
        """EurekaClaw's lemma loop; with a routed memory its prover learns the lemma's earlier failures."""
        memory = getattr(self, "memory", None)
        if not isinstance(memory, RoutedMemoryManager):
            return await own(self, *args, **kwargs)
        domain = str(signature.bind(self, *args, **kwargs).arguments.get("domain", "") or "")
        token = _lemma_lessons.set((memory, domain))
        try:
            return await own(self, *args, **kwargs)
        finally:
            _lemma_lessons.reset(token)

    return run_iterative


def _routed_attempt(own: Callable[..., Any]) -> Callable[..., Any]:
    async def attempt(
        self: Any, state: Any, lemma_id: str, past_failures: list[str] | None = None,
        cross_session_hint: str | None = None, skill_context: str = "",
    ) -> Any:
        """EurekaClaw's proof attempt; inside a routed lemma loop, the failed strategies the daemon
        keeps for this lemma follow this session's own failures (freshest first)."""
        lessons = _lemma_lessons.get()
        if lessons is not None:
            memory, domain = lessons
            earlier = await _in_worker_thread(failed_strategies, memory, domain, lemma_id)
            known = list(past_failures or [])
            past_failures = (known + [r for r in earlier if r not in known]) or None
        return await own(self, state, lemma_id, past_failures, cross_session_hint, skill_context)

    return attempt


def failed_strategies(memory: Any, domain: str, lemma_id: str) -> list[str]:
    """The reasons the daemon's theory.failed_strategies record for (domain, lemma) holds, newest
    first (also a record EurekaClaw itself wrote there: a reason, or a text)."""
    try:
        value = memory.recall(f"theory.failed_strategies.{domain_slug(domain)}.{lemma_id}")
    except Exception as exc:  # as EurekaClaw's: memory never blocks a proof attempt
        log.warning("failed strategies for %r not read: %s", lemma_id, exc)
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if not isinstance(value, dict):
        return []
    attempts = value.get("attempts")
    reasons = [str(a.get("reason", "")) for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []
    if isinstance(value.get("reason"), str):
        reasons.append(value["reason"])
    return list(dict.fromkeys(r for r in reversed(reasons) if r.strip()))[:FAILURES_SHOWN]


_METHOD_ROUTES: dict[tuple[str, str], Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    ("BaseAgent", "build_system_prompt"): _routed_build_system_prompt,
    ("LemmaDeveloper", "run_iterative"): _routed_run_iterative,
    ("Prover", "attempt"): _routed_attempt,
}


def routed_method(class_name: str, method: str, own: Callable[..., Any]) -> Callable[..., Any]:
    """The routed function for EurekaClaw's `class_name.method` (its own function `own`)."""
    return functools.wraps(own)(_METHOD_ROUTES[(class_name, method)](own))


_MIXINS: dict[str, type] = {
    "MemoryManager": RoutedMemoryManager,
    "SkillRegistry": RoutedSkillRegistry,
    "SkillInjector": RoutedSkillInjector,
    "SessionMemoryExtractor": RoutedSessionMemoryExtractor,
}
