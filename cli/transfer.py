"""`eurekamem export` and `eurekamem import`: JSON Lines out of and into a running daemon, and EurekaClaw roots.

Rule kept here: both go through the daemon's socket, a page at a time; an import of a record,
node, edge, memory or skill that is already there changes nothing, so importing the same root or
export twice adds nothing the second time. "Already there": a persistent record with the same key,
value and tags; a graph node with the same id, else the same normalised statement
(daemon/tiers/graph.py; a node without a statement: the same name), its edges by the ids they map
to; a memory with the same id, else the same fingerprint (EurekaClaw's, of title and text) in the
same domain, active or archived; a skill with the same name and body.

`export --format eurekaclaw DIR` writes a data root in EurekaClaw's own shapes (persistent.json,
knowledge_graph.json, memories/<slug>/*.md and _index.json, skills/<name>/SKILL.md) with every id,
time and file name as the daemon holds them: EurekaClaw's own code reads it unchanged, and a daemon
started on it for the first time imports it with its history (daemon/recovery.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from .backup import segment_files
from .common import Progress, connect, fail

log = logging.getLogger("eurekamem.admin")


PAGE = 500  # items per pipelined batch of calls
MEMORY_PAGE = 32  # memories per memory.add_many: each is embedded, so a batch takes seconds; progress shows per batch


def _results(client: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    out = []
    for start in range(0, len(calls), PAGE):
        for result in client.call_many(calls[start : start + PAGE]):
            if isinstance(result, BaseException):
                raise result
            out.append(result)
    return out


def export_records(client: Any, progress_stream: TextIO | None = None) -> Iterator[dict[str, Any]]:
    """Every persistent record, graph node and edge, memory and skill, as {"tier": ..., **record}."""
    from ..protocol.methods import MAX_LIMIT

    keys = client.call("persistent.keys", {"limit": MAX_LIMIT})["keys"]
    if len(keys) >= MAX_LIMIT:
        log.warning("persistent.keys answers at most %d keys; the export holds the first %d", MAX_LIMIT, MAX_LIMIT)
    nodes_doc = client.call("graph.export", {"format": "node_link"})["data"]
    node_ids = [node["id"] for node in nodes_doc.get("nodes", [])]
    first = client.call("memory.list", {"status": "any", "limit": MAX_LIMIT, "offset": 0})
    progress = Progress(len(keys) + len(node_ids) + first["total"], "export", progress_stream)
    for start in range(0, len(keys), PAGE):
        chunk = keys[start : start + PAGE]
        for record in _results(client, [("persistent.recall", {"key": key}) for key in chunk]):
            if record is not None:
                yield {"tier": "persistent", **record}
        progress.add(len(chunk))
    for start in range(0, len(node_ids), PAGE):
        chunk = node_ids[start : start + PAGE]
        for node in _results(client, [("graph.get", {"node_id": node_id}) for node_id in chunk]):
            yield {"tier": "graph_node", **node}
        progress.add(len(chunk))
    for edge in nodes_doc.get("edges", []):
        yield {"tier": "graph_edge", "from_id": edge["source"], "to_id": edge["target"], "relation": edge.get("relation") or edge.get("key") or "uses"}
    page = first
    offset = 0
    while True:
        for memory in page["memories"]:
            yield {"tier": "memory", **memory}
        progress.add(len(page["memories"]))
        offset += len(page["memories"])
        if not page["memories"] or offset >= page["total"]:
            break
        page = client.call("memory.list", {"status": "any", "limit": MAX_LIMIT, "offset": offset})
    for skill in client.call("skills.list", {"status": "any"}):
        yield {"tier": "skill", **skill}
    progress.close()


def cmd_export(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError
    from ..daemon.storage.files import open_private

    if args.format == "eurekaclaw":
        return _export_eurekaclaw(args)
    if args.dir:
        return fail(f"{args.dir}: a folder is written only with --format eurekaclaw; JSON lines go to stdout or --out")
    out: IO[Any]
    counts: dict[str, int] = {}
    target = Path(args.out).expanduser() if args.out else None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp") if target else None
    try:
        with connect(args) as client:
            out = open_private(tmp, "w", encoding="utf-8") if tmp else sys.stdout  # 0600: it holds every memory
            try:
                for item in export_records(client):
                    out.write(json.dumps(item, ensure_ascii=False) + "\n")
                    counts[item["tier"]] = counts.get(item["tier"], 0) + 1
            finally:
                if tmp:
                    out.close()
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        if tmp:
            tmp.unlink(missing_ok=True)
        return fail(f"export failed: {exc}")
    if tmp and target:
        os.replace(tmp, target)
    summary = ", ".join(f"{n} {tier}" for tier, n in counts.items()) or "nothing"
    print(f"exported {summary}" + (f" to {target}" if target else ""), file=sys.stderr)
    return 0


def _export_eurekaclaw(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError

    where = args.out or args.dir
    if not where:
        return fail("export --format eurekaclaw needs the folder to write: eurekamem export --format eurekaclaw DIR")
    target = Path(where).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        return fail(f"{target} exists and is not an empty folder: an EurekaClaw root is written only into a new or empty one")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with connect(args) as client:
            counts = write_eurekaclaw_root(export_records(client), tmp)
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        _remove_tree(tmp)
        return fail(f"export failed: {exc}")
    if target.is_dir():
        target.rmdir()  # empty, checked above
    os.replace(tmp, target)
    summary = ", ".join(f"{n} {tier}" for tier, n in counts.items()) or "nothing"
    print(f"exported {summary} to {target} (an EurekaClaw data root)", file=sys.stderr)
    return 0


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)  # our own temporary folder, half written


def write_eurekaclaw_root(items: Iterator[dict[str, Any]], root: Path) -> dict[str, int]:
    """The exported items as an EurekaClaw data root at `root` (created 0700; files 0600: it holds
    every memory). Every id, created_at, updated_at and memory file name is the daemon's, so
    EurekaClaw's loaders, its load_for_injection's newest-first order and a first start of a daemon
    on the folder all see the history as it was."""
    import msgspec

    from ..daemon.memory.format import index_entry, render_markdown
    from ..daemon.skills.format import render_skill
    from ..daemon.skills.state import skill_file
    from ..daemon.storage import eurekaclaw
    from ..protocol import CrossRunRecord, KnowledgeNode, Memory, Skill

    records: dict[str, Any] = {}
    nodes: dict[str, Any] = {}
    edges: dict[tuple[str, str, str], None] = {}
    memories: list[Any] = []
    skills: list[Any] = []
    counts: dict[str, int] = {}
    for item in items:
        tier = item.pop("tier")
        counts[tier] = counts.get(tier, 0) + 1
        data = msgspec.to_builtins(item)
        if tier == "persistent":
            record = msgspec.convert(data, CrossRunRecord)
            records[record.key] = record
        elif tier == "graph_node":
            node = msgspec.convert(data, KnowledgeNode)
            nodes[node.node_id] = node
        elif tier == "graph_edge":
            edges[(str(data["from_id"]), str(data["to_id"]), str(data["relation"]))] = None
        elif tier == "memory":
            memories.append(msgspec.convert(data, Memory))
        elif tier == "skill":
            skills.append(msgspec.convert(data, Skill))
    root.mkdir(mode=0o700)
    _write_private(root / "memory" / "persistent.json", eurekaclaw.write_persistent(records))
    _write_private(root / "memory" / "knowledge_graph.json", eurekaclaw.write_graph(nodes, edges))
    indexes: dict[Path, dict[str, Any]] = {}
    for memory in sorted(memories, key=lambda m: m.created_at):
        path = root / memory.file
        _write_private(path, render_markdown(memory).encode())
        if memory.status == "active" and path.parent.parent == root / "memories":
            indexes.setdefault(path.parent, {})[path.name] = index_entry(memory)
    for folder, index in indexes.items():
        _write_private(folder / "_index.json", json.dumps(index, indent=2).encode())  # as EurekaClaw writes it
    for skill in skills:
        _write_private(root / skill_file(skill.name, skill.status), render_skill(skill).encode())
    return counts


def _write_private(path: Path, data: bytes) -> None:
    from ..daemon.storage.files import open_private

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open_private(path, "wb") as f:
        f.write(data)


_SKILL_FIELDS = ("name", "body", "version", "tags", "agent_roles", "pipeline_stages", "description", "source", "status",
                 "created_at", "usage_count", "success_rate")  # what skills.put takes: the whole skill
_MEMORY_FIELDS = ("domain", "category", "title", "content", "confidence", "tags", "source_session", "scope", "abstract", "overview",
                  "valid_from", "valid_until", "pinned", "raw",  # the lifecycle fields memory.add takes (issue 13)
                  "id", "created_at", "updated_at")  # and its history (issue 27): ids, times and file names kept
_RECORD_HISTORY = ("record_id", "created_at", "updated_at")
_NODE_HISTORY = ("node_id", "created_at")


def _history(item: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The ids and times an import hands on, those the item has."""
    return {k: str(item[k]) for k in fields if item.get(k)}


class Importer:
    """Adds exported or EurekaClaw records through the socket with their history (ids, created_at,
    updated_at: the methods take them for an import); a node matched to another id maps its edges,
    so it keeps a map. What the daemon already holds (see the module's rule) is read first and skipped."""

    def __init__(self, client: Any, progress: Progress) -> None:
        self.client = client
        self.progress = progress
        self.node_map: dict[str, str] = {}
        self.counts: dict[str, int] = {"persistent": 0, "graph_node": 0, "graph_edge": 0, "memory": 0}  # "skill" once there are some
        self.skipped: dict[str, int] = dict.fromkeys(self.counts, 0)
        self.failed: list[str] = []
        self._nodes: set[str] = set()  # the daemon's node ids
        self._statements: dict[str, str] = {}  # normalised statement (or "name:" + name) -> node id
        self._edges: set[tuple[str, str, str]] = set()
        self._memory_ids: set[str] = set()
        self._fingerprints: set[tuple[str, str]] = set()  # (domain slug, fingerprint), active or archived

    def read_existing(self, memories: bool = True) -> None:
        """What the daemon holds now: its graph (one graph.export) and its memories' ids and fingerprints."""
        from ..daemon.memory.format import fingerprint
        from ..protocol import domain_slug
        from ..protocol.methods import MAX_LIMIT

        data = self.client.call("graph.export", {"format": "node_link"})["data"]
        for node in data.get("nodes", []):
            self._know_node(str(node["id"]), str(node.get("theorem_name") or ""), str(node.get("formal_statement") or ""))
        for edge in data.get("edges", []):
            self._edges.add((str(edge["source"]), str(edge["target"]), str(edge.get("relation") or edge.get("key") or "uses")))
        offset = 0
        while memories:
            page = self.client.call("memory.list", {"status": "any", "limit": MAX_LIMIT, "offset": offset})
            for memory in page["memories"]:
                self._memory_ids.add(memory["id"])
                self._fingerprints.add((domain_slug(memory["domain"]), fingerprint(memory["title"], memory["content"])))
            offset += len(page["memories"])
            if not page["memories"] or offset >= page["total"]:
                break

    def _know_node(self, node_id: str, name: str, statement: str) -> None:
        from ..daemon.tiers.graph import normalise_statement

        self._nodes.add(node_id)
        key = normalise_statement(statement) or ("name:" + name.strip().casefold())
        self._statements.setdefault(key, node_id)  # the oldest such node, as graph.export lists them

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed.append(f"{what}: {getattr(exc, 'message', exc)}")

    def persistent(self, records: list[dict[str, Any]]) -> None:
        have = self._call_all([("persistent.recall", {"key": r["key"]}) for r in records])
        todo = []
        for record, existing in zip(records, have):
            tags = list(dict.fromkeys(record.get("tags") or []))
            if isinstance(existing, dict) and existing.get("value") == record.get("value") and existing.get("tags") == tags:
                self.skipped["persistent"] += 1
            else:
                todo.append(record)
        self.progress.add(len(records) - len(todo))
        records = todo
        calls = [("persistent.remember", {"key": r["key"], "value": r.get("value"), "tags": list(r.get("tags") or []),
                                          "source_session": str(r.get("source_session") or ""), **_history(r, _RECORD_HISTORY)})
                 for r in records]
        for record, result in zip(records, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"persistent {record.get('key')!r}", result)
            else:
                self.counts["persistent"] += 1
        self.progress.add(len(records))

    def nodes(self, nodes: list[dict[str, Any]]) -> None:
        from ..daemon.tiers.graph import normalise_statement

        todo = []
        for n in nodes:
            source_id = str(n.get("node_id"))
            name = str(n.get("theorem_name") or n.get("node_id") or "untitled")
            key = normalise_statement(str(n.get("formal_statement") or "")) or ("name:" + name.strip().casefold())
            same = source_id if source_id in self._nodes else self._statements.get(key)
            if same is not None:
                self.node_map[source_id] = same
                self.skipped["graph_node"] += 1
            else:
                todo.append(n)
        self.progress.add(len(nodes) - len(todo))
        nodes = todo
        calls = []
        for n in nodes:
            tags = n.get("tags") or []
            calls.append(("graph.add_theorem", {
                "theorem_name": n.get("theorem_name") or n.get("node_id") or "untitled",
                "formal_statement": n.get("formal_statement") or "",
                "domain": n.get("domain") or "", "session_id": n.get("session_id") or "",
                "tags": tags.split(",") if isinstance(tags, str) else list(tags),
                **_history(n, _NODE_HISTORY),
            }))
        for node, result in zip(nodes, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"graph node {node.get('node_id')!r}", result)
            else:
                self.node_map[str(node.get("node_id"))] = result["node_id"]
                self._know_node(result["node_id"], result["theorem_name"], result["formal_statement"])
                self.counts["graph_node"] += 1
        self.progress.add(len(nodes))

    def edges(self, edges: list[tuple[str, str, str]]) -> None:
        calls = []
        todo = []
        for edge in edges:
            from_id, to_id, relation = edge
            mapped = (self.node_map.get(from_id, from_id), self.node_map.get(to_id, to_id),
                      relation if relation in ("uses", "generalizes", "specializes", "contradicts") else "uses")
            if mapped in self._edges:
                self.skipped["graph_edge"] += 1
                continue
            self._edges.add(mapped)
            todo.append(edge)
            calls.append(("graph.link", {"from_id": mapped[0], "to_id": mapped[1], "relation": mapped[2]}))
        for edge, result in zip(todo, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"graph edge {edge}", result)
            else:
                self.counts["graph_edge"] += 1
        self.progress.add(len(edges))

    def memories(self, memories: list[dict[str, Any]]) -> None:
        """memory.add_many (dedup off) in batches; an archived memory is archived again after. One
        the daemon holds (same id, else same fingerprint in its domain) is skipped."""
        from ..daemon.memory.format import fingerprint
        from ..protocol import domain_slug

        todo = []
        for memory in memories:
            key = (domain_slug(str(memory.get("domain") or "general")), fingerprint(str(memory.get("title") or "").strip(), str(memory.get("content") or "").strip()))
            if memory.get("id") in self._memory_ids or key in self._fingerprints:
                self.skipped["memory"] += 1
            else:
                todo.append(memory)
        self.progress.add(len(memories) - len(todo))
        memories = todo
        for start in range(0, len(memories), MEMORY_PAGE):
            chunk = memories[start : start + MEMORY_PAGE]
            items = [self._memory_item(m) for m in chunk]
            try:
                results: list[Any] = self.client.call("memory.add_many", {"items": items})
            except Exception:  # one bad item fails the batch: add them one by one to find it
                results = self.client.call_many([("memory.add", item) for item in items])
            archive = []
            for memory, result in zip(chunk, results):
                if isinstance(result, BaseException):
                    self._fail(f"memory {memory.get('title')!r}", result)
                    continue
                self.counts["memory"] += 1
                if memory.get("status") == "archived":
                    archive.append(("memory.delete", {"id": result["memory"]["id"]}))
            for result in self._call_all(archive):
                if isinstance(result, BaseException):
                    self._fail("archiving a memory", result)
            self.progress.add(len(chunk))

    @staticmethod
    def _memory_item(memory: dict[str, Any]) -> dict[str, Any]:
        item = {k: memory[k] for k in _MEMORY_FIELDS if memory.get(k) is not None}
        item.setdefault("domain", "general")
        if not item.get("abstract"):
            item.pop("abstract", None)
        if not item.get("overview"):
            item.pop("overview", None)
        item["dedup"] = False
        return item

    def skills(self, skills: list[dict[str, Any]]) -> None:
        """skills.put of each skill with its own created_at, counts and status; one the daemon holds
        with the same name and body is skipped."""
        if not skills:
            return
        self.counts.setdefault("skill", 0)
        self.skipped.setdefault("skill", 0)
        have = {skill["name"]: skill for skill in self.client.call("skills.list", {"status": "any"})}
        calls, todo = [], []
        for skill in skills:
            held = have.get(skill.get("name"))
            if held is not None and str(held["body"]).strip() == str(skill.get("body") or "").strip():
                self.skipped["skill"] += 1
                continue
            todo.append(skill)
            calls.append(("skills.put", {k: skill[k] for k in _SKILL_FIELDS if skill.get(k) is not None}))
        for skill, result in zip(todo, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"skill {skill.get('name')!r}", result)
            else:
                self.counts["skill"] += 1
        self.progress.add(len(skills))

    def _call_all(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(calls), PAGE):
            out.extend(self.client.call_many(calls[start : start + PAGE]))
        return out


def read_jsonl(path: Path) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": [], "skill": []}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            tier = item.pop("tier", None) if isinstance(item, dict) else None
            if tier not in groups:
                raise ValueError(f"{path}:{number}: no known \"tier\" (persistent, graph_node, graph_edge, memory, skill)")
            if tier == "graph_edge":
                item = (str(item["from_id"]), str(item["to_id"]), str(item.get("relation") or "uses"))
            groups[tier].append(item)
    return groups


def read_eurekaclaw_root(root: Path) -> tuple[dict[str, list[Any]], list[str]]:
    """A plain EurekaClaw data root: persistent.json, knowledge_graph.json, memories/*/*.md, skills/*/SKILL.md."""
    from ..daemon.memory.format import memory_files, parse_markdown
    from ..daemon.memory.projection import frontmatter_flag
    from ..daemon.storage import eurekaclaw
    from ..protocol import MEMORY_CATEGORIES

    notes: list[str] = []
    groups: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": [], "skill": []}
    persistent = root / "memory" / "persistent.json"
    if persistent.is_file():
        for record in eurekaclaw.read_persistent(persistent.read_bytes(), str(persistent)).values():
            groups["persistent"].append({"key": record.key, "value": record.value, "tags": record.tags, "source_session": record.source_session,
                                         "record_id": record.record_id, "created_at": record.created_at, "updated_at": record.updated_at})
    graph = root / "memory" / "knowledge_graph.json"
    if graph.is_file():
        nodes, edges = eurekaclaw.read_graph(graph.read_bytes(), str(graph))
        for node in nodes.values():
            groups["graph_node"].append({"node_id": node.node_id, "theorem_name": node.theorem_name, "formal_statement": node.formal_statement,
                                         "domain": node.domain, "session_id": node.session_id, "tags": node.tags, "created_at": node.created_at})
        groups["graph_edge"].extend(edges)
    journal = root / "memory" / "journal"
    if segment_files(root) and any(p.stat().st_size > 26 for p in segment_files(root)):
        notes.append(f"{journal} holds journal records: if a daemon ran there, stop it cleanly first so its snapshots are current")
    base = root / "memories"
    paths = memory_files(base) if base.is_dir() else []  # not MEMORY.md / GLOBAL.md (the readable projection)
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            notes.append(f"could not read {path}: {exc}")
            continue
        fields, content, heading = parse_markdown(text)
        if not content.strip():
            notes.append(f"{path}: no text, skipped")
            continue
        title = str(fields.get("title") or heading or path.stem[9:].replace("_", " ") or "untitled")
        category = str(fields.get("category") or "domain_knowledge")
        try:
            confidence = min(1.0, max(0.0, float(fields.get("confidence", 0.8))))
        except (TypeError, ValueError):
            confidence = 0.8
        if confidence != confidence:
            confidence = 0.8
        tags = fields.get("tags")
        folder = (path.parent.parent if path.parent.name == "_archive" else path.parent).name
        groups["memory"].append({
            **({"id": str(fields["id"])} if fields.get("id") else {}),  # a root the daemon wrote: matched by id, kept
            **_file_times(fields),
            "domain": str(fields.get("domain") or folder),  # no domain field: the folder's slug
            "category": category if category in MEMORY_CATEGORIES else "domain_knowledge",
            "title": title[:1024],
            "content": content,
            "confidence": round(confidence, 4),
            "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
            "source_session": str(fields.get("source_session") or "")[:256],
            "scope": "global" if fields.get("scope") == "global" else "local",
            "status": "archived" if path.parent.name == "_archive" else "active",
            "raw": frontmatter_flag(fields.get("raw")),  # EurekaClaw's insights: curated; a daemon's root: its flag
        })
    groups["skill"] = _read_skills(root, notes)
    return groups, notes


def _read_skills(root: Path, notes: list[str]) -> list[dict[str, Any]]:
    """skills/<name>/SKILL.md (and a daemon's drafts), read as the daemon reads them at start."""
    from ..daemon.skills.format import name_problem, parse_skill
    from ..daemon.skills.state import DRAFTS_FOLDER, SKILLS_FOLDER

    out = []
    for folder, draft in ((SKILLS_FOLDER, False), (DRAFTS_FOLDER, True)):
        base = root / folder
        for path in sorted(base.glob("*/SKILL.md")) if base.is_dir() else []:
            name = path.parent.name
            problem = name_problem(name)
            if problem is not None:
                notes.append(f"{path}: the name {name!r} {problem}, skipped")
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
                mtime = path.stat().st_mtime
            except OSError as exc:
                notes.append(f"could not read {path}: {exc}")
                continue
            skill, _extra, problems = parse_skill(text, name, mtime=mtime, draft=draft)
            notes.extend(f"{path}: {what}" for what in problems)
            out.append(skill.to_dict())
    return out


def _file_times(fields: dict[str, Any]) -> dict[str, str]:
    """A memory file's created_at and updated_at, those that are timestamps (the daemon's rule)."""
    from ..protocol import normalize_timestamp

    out = {}
    for name in ("created_at", "updated_at"):
        try:
            out[name] = normalize_timestamp(fields.get(name))
        except (TypeError, ValueError):
            continue
    return out


def import_groups(client: Any, groups: dict[str, list[Any]], progress_stream: TextIO | None = None) -> Importer:
    total = sum(len(v) for v in groups.values())
    progress = Progress(total, "import", progress_stream, lines=True)
    importer = Importer(client, progress)
    importer.read_existing(memories=bool(groups["memory"]))
    importer.persistent(groups["persistent"])
    importer.nodes(groups["graph_node"])
    importer.edges(groups["graph_edge"])
    memories = groups["memory"]
    memories.sort(key=lambda m: str(m.get("created_at") or ""))  # oldest first, as they were written
    importer.memories(memories)
    importer.skills(groups.get("skill", []))
    progress.close()
    return importer


def cmd_import(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError
    from ..daemon.storage.eurekaclaw import SnapshotReadError

    source = Path(args.source).expanduser()
    notes: list[str] = []
    try:
        if source.is_dir():
            groups, notes = read_eurekaclaw_root(source)
        elif source.is_file():
            groups = read_jsonl(source)
        else:
            return fail(f"{source} does not exist")
    except (ValueError, KeyError, OSError, SnapshotReadError) as exc:
        return fail(f"cannot read {source}: {exc}")
    for note in notes:
        print(f"eurekamem: note: {note}", file=sys.stderr)
    try:
        with connect(args) as client:
            importer = import_groups(client, groups)
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return fail(f"import failed: {exc}")
    summary = ", ".join(f"{n} {tier}" for tier, n in importer.counts.items())
    print(f"imported {summary} from {source}")
    if any(importer.skipped.values()):
        print("already there, skipped: " + ", ".join(f"{n} {tier}" for tier, n in importer.skipped.items()))
    for failure in importer.failed[:20]:
        print(f"  failed: {failure}", file=sys.stderr)
    if importer.failed:
        print(f"eurekamem: {len(importer.failed)} items could not be imported", file=sys.stderr)
        return 1
    return 0


