"""The files EurekaClaw reads are written in EurekaClaw's own shapes (issue 27, section 3).

The reference models (tests/eurekaclaw_reference.py) mirror EurekaClaw v0.2.0's pydantic types (eurekaclaw/types/memory.py:
field order, `created_at` from `datetime.utcnow` (naive), a record's `updated_at` from
`datetime.now().astimezone()` (aware)) and its writers (`json.dumps(model_dump(mode="json"),
indent=2)`). They are our own re-statement of what its code does, not its code. Before this, the
daemon wrote every timestamp aware, and EurekaClaw's `retrieve_relevant_theorems` (which sorts
nodes by created_at) raised `TypeError: can't compare offset-naive and offset-aware datetimes`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path

import pytest
from eurekaclaw_reference import pydantic_models

from daemon_process import DaemonProcess
from eurekamem.client import Client

pytest.importorskip("pydantic")  # the test extra brings it (the mcp SDK needs it); EurekaClaw's models are pydantic
TIMEOUT = 60.0


_MODELS = pydantic_models()
CrossRunRecord = _MODELS["CrossRunRecord"]
KnowledgeNode = _MODELS["KnowledgeNode"]


def _eurekaclaw_root(root: Path) -> None:
    """A data root as EurekaClaw v0.2.0 leaves it: one record (put), two nodes and an edge."""
    memory = root / "memory"
    memory.mkdir(parents=True)
    record = CrossRunRecord(record_id=str(uuid.uuid4()), key="theory.failed_strategies.hölder", value={"tried": 2**70},
                            tags=["théorie"], source_session="s1", updated_at=dt.datetime.now().astimezone())
    (memory / "persistent.json").write_text(json.dumps({record.key: record.model_dump(mode="json")}, indent=2))
    a = KnowledgeNode(node_id=str(uuid.uuid4()), theorem_name="Hölder", formal_statement="‖fg‖₁ ≤ ‖f‖ₚ‖g‖_q",
                      domain="analysis")
    b = KnowledgeNode(node_id=str(uuid.uuid4()), theorem_name="Young", formal_statement="ab ≤ aᵖ/p + b^q/q",
                      domain="analysis")
    graph = {"nodes": {n.node_id: n.model_dump(mode="json") for n in (a, b)}, "edges": [[a.node_id, b.node_id, "uses"]]}
    (memory / "knowledge_graph.json").write_text(json.dumps(graph, indent=2))


def _load(root: Path) -> tuple[dict[str, CrossRunRecord], dict[str, KnowledgeNode]]:
    """EurekaClaw's loaders (PersistentMemory._load, KnowledgeGraph._load)."""
    raw = json.loads((root / "memory" / "persistent.json").read_text())
    records = {k: CrossRunRecord.model_validate(v) for k, v in raw.items()}
    data = json.loads((root / "memory" / "knowledge_graph.json").read_text())
    nodes = {k: KnowledgeNode.model_validate(v) for k, v in data.get("nodes", {}).items()}
    return records, nodes


def test_a_start_and_stop_leave_eurekaclaws_files_as_they_were(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _eurekaclaw_root(root)
    files = [root / "memory" / "persistent.json", root / "memory" / "knowledge_graph.json"]
    before = [(f.read_bytes(), os.stat(f).st_ino, os.stat(f).st_mtime_ns) for f in files]
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    with Client(daemon.socket_path, timeout=TIMEOUT) as client:
        client.call("sys.snapshot", {})
    assert daemon.terminate() == 0
    assert [(f.read_bytes(), os.stat(f).st_ino, os.stat(f).st_mtime_ns) for f in files] == before


def test_what_the_daemon_writes_eurekaclaws_own_code_reads_and_compares(tmp_path: Path) -> None:
    from eurekamem.client._manager import _Names
    from eurekamem.protocol.methods import MAX_KEY

    root = tmp_path / "root"
    _eurekaclaw_root(root)
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            client.call("persistent.remember", {"key": "theory.proven.young", "value": "yes", "tags": ["é"]})
            client.call("graph.add_theorem", {"theorem_name": "Minkowski", "formal_statement": "‖f+g‖ₚ ≤ ‖f‖ₚ+‖g‖ₚ",
                                              "domain": "analysis"})
            client.call("graph.add_theorem", {"theorem_name": _Names().fit("", MAX_KEY), "formal_statement": "unnamed"})
            client.call("persistent.remember", {"key": "theory.proven.later", "value": 1})
            client.call("persistent.remember", {"key": "theory.proven.young", "value": "again"})  # keeps its place
            client.call("skills.put", {"name": "peeling", "body": "Peel.", "created_at": "2025-05-01T08:00:00"})
            client.call("sys.snapshot", {})
    finally:
        assert daemon.terminate() == 0
    # EurekaClaw's dict: an overwritten key keeps its place (before: it moved to the end of the file)
    assert list(json.loads((root / "memory" / "persistent.json").read_text())) == [
        "theory.failed_strategies.hölder", "theory.proven.young", "theory.proven.later"]
    # a skill's created_at as EurekaClaw's upsert writes its utcnow(): naive (before: "+00:00", aware
    # once EurekaClaw's loader read it back, beside its own naive ones)
    assert "\ncreated_at: '2025-05-01T08:00:00'\n" in (root / "skills" / "peeling" / "SKILL.md").read_text()
    for name in ("persistent.json", "knowledge_graph.json"):
        text = (root / "memory" / name).read_bytes()
        assert text.isascii(), name  # json.dumps' ASCII escapes, as EurekaClaw writes
        assert json.dumps(json.loads(text), indent=2).encode() == text  # its separators and indent
    records, nodes = _load(root)
    assert len(records) == 3 and len(nodes) == 4
    # EurekaClaw's add_theorem("", ...) through the drop-in: "" in the file, as EurekaClaw wrote it
    assert [n.theorem_name for n in nodes.values() if n.formal_statement == "unnamed"] == [""]
    for record in records.values():
        assert record.created_at.tzinfo is None and record.updated_at.tzinfo is not None
    assert records["theory.failed_strategies.hölder"].value == {"tried": 2**70}
    assert all(node.created_at.tzinfo is None for node in nodes.values())
    # retrieve_relevant_theorems' sort, over EurekaClaw's nodes and the daemon's together
    ordered = sorted(nodes.values(), key=lambda node: node.created_at)
    assert [node.theorem_name for node in ordered[-2:]] == ["Minkowski", ""]
    assert list(json.loads((root / "memory" / "persistent.json").read_text())["theory.proven.young"]) == list(
        CrossRunRecord.model_fields
    )


def test_an_integer_eurekaclaw_stored_is_kept_and_a_binary_client_gets_an_error_not_a_closed_connection(
    tmp_path: Path,
) -> None:
    """EurekaClaw stores any Python int (`remember(2**70)`); the protocol refuses such integers at
    the door, but one already in its files is kept, read exactly over NDJSON, and a MessagePack
    client asking for it gets an error answer on a connection that stays open."""
    import socket

    from eurekamem.client import EurekamemError

    root = tmp_path / "root"
    _eurekaclaw_root(root)
    key = "theory.failed_strategies.hölder"
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            with pytest.raises(EurekamemError, match="NDJSON framing carries it exactly"):
                client.call("persistent.recall", {"key": key})
            assert client.call("sys.ping", {}) == {"pong": True}  # the same connection
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(str(daemon.socket_path))
            request = {"jsonrpc": "2.0", "id": 1, "method": "persistent.recall", "params": {"key": key}}
            sock.sendall(json.dumps(request).encode() + b"\n")
            line = b""
            while not line.endswith(b"\n"):
                line += sock.recv(65536)
        assert json.loads(line)["result"]["value"] == {"tried": 2**70}
    finally:
        assert daemon.terminate() == 0
    assert json.loads((root / "memory" / "persistent.json").read_text())[key]["value"] == {"tried": 2**70}


def _eurekaclaw_memory(folder: Path, title: str, content: str, when: dt.datetime) -> str:
    """A memory as EurekaClaw's extractor saves it (learning/memory_extractor.py): the file, then
    its _index.json entry with its own `datetime.now().astimezone()` (a little later than the
    file's), the fingerprint of title + content and the embedding's floats."""
    import hashlib

    folder.mkdir(parents=True, exist_ok=True)
    name = f"{when.strftime('%Y%m%d')}_{title.lower().replace(' ', '_')}.md"
    (folder / name).write_text(f"---\ncategory: proof_strategy\ntitle: {title}\ndomain: analysis\nconfidence: 0.90\n"
                               f"created_at: {when.isoformat()}\n---\n\n# {title}\n\n{content}\n", encoding="utf-8")
    index_path = folder / "_index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index[name] = {"fingerprint": hashlib.sha256((title + content).strip().lower().encode()).hexdigest()[:16],
                   "created_at": (when + dt.timedelta(microseconds=317)).isoformat(),
                   "embedding": [0.25, -0.5, 0.125], "category": "proof_strategy"}
    index_path.write_text(json.dumps(index, indent=2))
    return name


def test_eurekaclaws_index_entries_keep_the_values_it_wrote(tmp_path: Path) -> None:
    """memories/<slug>/_index.json: EurekaClaw's values stay as it wrote them (its created_at, which
    its load_for_injection sorts by, its fingerprint, category and embedding; before, the daemon put
    the file's created_at, normalised, in their place), our keys merged in and our entries beside
    them, in EurekaClaw's json.dumps(indent=2)."""
    from eurekaclaw_reference import ReferenceManager

    root = tmp_path / "root"
    folder = root / "memories" / "analysis"
    earlier = dt.datetime(2024, 3, 1, 10, 0, 0, 123456).astimezone()
    _eurekaclaw_memory(folder, "Holder first", "Apply Hölder before Minkowski.", earlier)
    _eurekaclaw_memory(folder, "Young split", "Split the product with Young.", earlier + dt.timedelta(days=1))
    index_path = folder / "_index.json"
    written = index_path.read_bytes()
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            client.call("sys.snapshot", {})
            assert client.call("memory.list", {"domain": "analysis"})["total"] == 2
            client.call("memory.add", {"domain": "analysis", "category": "pitfalls", "title": "Endpoint",
                                       "content": "Hölder fails at p = 1 without care.", "dedup": False})
            client.call("sys.snapshot", {})
    finally:
        assert daemon.terminate() == 0
    index = json.loads(index_path.read_text())
    for name, entry in json.loads(written).items():
        assert {k: index[name][k] for k in entry} == entry  # as EurekaClaw wrote it, created_at to the microsecond
        assert list(index[name])[: len(entry)] == list(entry) and index[name]["id"]  # its keys first, ours after
    assert len(index) == 3
    injected = ReferenceManager("s", root).load_for_injection("analysis", k=4)
    order = [part.split("\n", 1)[0] for part in injected.split("\n\n") if part.startswith("# ")]
    assert order == ["# Endpoint", "# Young split", "# Holder first"]
    text = index_path.read_bytes()
    assert text.isascii() and json.dumps(json.loads(text), indent=2).encode() == text  # EurekaClaw's json.dumps(indent=2)


def test_empty_and_over_long_keys_round_trip_to_what_eurekaclaw_looks_up(tmp_path: Path) -> None:
    """EurekaClaw stores any str as a key ("" and 2,000 characters included); the protocol's keys
    are 1 to MAX_KEY characters, and the drop-in sends such keys fitted (client/_manager.py,
    _Names.fit). The daemon reads EurekaClaw's file into the fitted keys, so the drop-in finds
    them, and writes the keys EurekaClaw gave, so its own PersistentMemory.get finds them after an
    uninstall: before, the drop-in found neither, and a remember("") through it wrote "~<hash>"."""
    from eurekamem.client._manager import _Names
    from eurekamem.daemon.storage.eurekaclaw import protocol_key
    from eurekamem.protocol.methods import MAX_KEY

    long_key = "theory." + "x" * 1993
    fit = _Names().fit
    for key in ("", long_key, "é" * (MAX_KEY + 1), "k" * MAX_KEY, "plain"):  # the daemon's rule is the drop-in's
        assert protocol_key(key) == fit(key, MAX_KEY)
    root = tmp_path / "root"
    (root / "memory").mkdir(parents=True)
    records = {key: CrossRunRecord(record_id=str(uuid.uuid4()), key=key, value=value, updated_at=dt.datetime.now().astimezone())
               for key, value in (("", "empty"), (long_key, {"long": True}), ("plain", 1))}
    (root / "memory" / "persistent.json").write_text(json.dumps({k: r.model_dump(mode="json") for k, r in records.items()}, indent=2))
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            assert client.call("persistent.recall", {"key": fit("", MAX_KEY)})["value"] == "empty"
            assert client.call("persistent.recall", {"key": fit(long_key, MAX_KEY)})["value"] == {"long": True}
            client.call("persistent.remember", {"key": fit("", MAX_KEY), "value": "changed through the drop-in"})
            client.call("sys.snapshot", {})
    finally:
        assert daemon.terminate() == 0
    raw = json.loads((root / "memory" / "persistent.json").read_text())
    assert set(raw) == {"", long_key, "plain"}  # PersistentMemory._data, as EurekaClaw keys it
    loaded = {k: CrossRunRecord.model_validate(v) for k, v in raw.items()}
    assert all(record.key == key for key, record in loaded.items())
    assert loaded[""].value == "changed through the drop-in" and loaded[long_key].value == {"long": True}
    assert loaded[long_key].record_id == records[long_key].record_id
    # and a second start reads the daemon's own file the same way
    daemon = DaemonProcess(root, tmp_path / "s.sock").start()
    try:
        with Client(daemon.socket_path, timeout=TIMEOUT) as client:
            assert client.call("persistent.recall", {"key": fit("", MAX_KEY)})["value"] == "changed through the drop-in"
            assert client.call("persistent.recall", {"key": fit(long_key, MAX_KEY)})["value"] == {"long": True}
    finally:
        assert daemon.terminate() == 0


def test_duplicate_edges_eurekaclaw_kept_are_written_back_as_many_times(tmp_path: Path) -> None:
    """EurekaClaw's add_edge appends without checking, so its knowledge_graph.json may list an edge
    twice. The daemon's graph holds it once (graph.link twice is harmless), but the file it writes
    lists it as often as EurekaClaw's did, also after a restart; before, the copy was dropped at
    the first rewrite of the file."""
    root = tmp_path / "root"
    (root / "memory").mkdir(parents=True)
    a, b, c = (KnowledgeNode(node_id=str(uuid.uuid4()), theorem_name=name, formal_statement=f"{name} holds")
               for name in ("A", "B", "C"))
    edges = [[a.node_id, b.node_id, "uses"], [b.node_id, c.node_id, "generalizes"], [a.node_id, b.node_id, "uses"]]
    graph = {"nodes": {n.node_id: n.model_dump(mode="json") for n in (a, b, c)}, "edges": edges}
    (root / "memory" / "knowledge_graph.json").write_text(json.dumps(graph, indent=2))
    for theorem in ("D", "E"):  # each start changes the graph, so the file is written again
        daemon = DaemonProcess(root, tmp_path / "s.sock").start()
        try:
            with Client(daemon.socket_path, timeout=TIMEOUT) as client:
                client.call("graph.link", {"from_id": a.node_id, "to_id": b.node_id, "relation": "uses"})  # harmless
                client.call("graph.add_theorem", {"theorem_name": theorem, "formal_statement": f"{theorem} holds"})
                assert client.call("sys.stats", {})["tiers"]["graph"]["edges"] == 2
                client.call("sys.snapshot", {})
        finally:
            assert daemon.terminate() == 0
        written = json.loads((root / "memory" / "knowledge_graph.json").read_text())
        assert sorted(written["edges"]) == sorted(edges)
        assert {KnowledgeNode.model_validate(n).theorem_name for n in written["nodes"].values()} >= {"A", "B", "C", theorem}
