"""memory.list's order and paging against a plain Python sort (it sorts only the newest offset +
limit now, issue 32's follow-up), and memory.domains' counts against a count of the memories: on
a seeded random corpus with ties, offsets, updates, purges and a snapshot's reload; then both
through a real daemon."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.client import AsyncClient
from eurekamem.daemon.memory.records import PurgeMemory, PutMemory
from eurekamem.daemon.memory.state import MemoryState
from eurekamem.daemon.retrieval.embed import make_embedder
from eurekamem.protocol import MEMORY_CATEGORIES, Memory, ProtocolError, domain_slug
from eurekamem.protocol import methods as m
from eurekamem.ui import Guard, make_app

DOMAINS = ["Bandits", "bandits", "graph theory", "Ops"]  # the first two are one domain (one slug)
CATEGORIES = list(MEMORY_CATEGORIES[:4]) + ["fact"]
# few distinct times, so that many memories tie; offsets and fractions, as imports keep them
TIMES = [
    "2026-01-01T00:00:00+00:00",
    "2026-01-01T00:00:00.500000+00:00",
    "2026-01-01T05:00:00+05:00",
    "2026-01-01T00:00:00-03:00",
    "2026-01-02T09:30:00+00:00",
    "2025-12-31T23:59:59.999999+00:00",
    "2026-01-01T00:00:00+00:00:30",
]


def _memory(rng: random.Random, n: int, created: str) -> Memory:
    domain = rng.choice(DOMAINS)
    return Memory(
        id=f"m{n:04d}", domain=domain, category=rng.choice(CATEGORIES), title=f"t{n}", content=f"c{n}",
        abstract="", overview="", confidence=0.5, fingerprint=f"fp{n}", created_at=created, updated_at=created,
        scope="global" if rng.random() < 0.15 else "local", status="archived" if rng.random() < 0.3 else "active",
        file=f"memories/{domain_slug(domain)}/m{n:04d}.md",
    )


def _corpus(seed: int, times: list[str]) -> tuple[MemoryState, list[str]]:
    """A state built by puts, re-puts (updates keep a memory's place) and purges, and the ids in
    the order they came (the ties' order)."""
    rng = random.Random(seed)
    state = MemoryState(make_embedder("usem3"))  # nothing is loaded: no memory is embedded here
    order: list[str] = []
    for n in range(500):
        memory = _memory(rng, n, rng.choice(times))
        state.apply(PutMemory(memory))
        order.append(memory.id)
        if rng.random() < 0.2:  # an update: status, category or scope changes, the place stays
            old = state.memories[rng.choice(order)]
            state.apply(PutMemory(msgspec.structs.replace(
                old, status=rng.choice(["active", "archived"]), category=rng.choice(CATEGORIES),
                scope=rng.choice(["local", "global"]))))
        if rng.random() < 0.05:
            gone = order.pop(rng.randrange(len(order)))
            state.apply(PurgeMemory(gone))
    return state, order


def _expected(state: MemoryState, order: list[str], p: m.MemoryList) -> dict[str, Any]:
    """memory.list as a plain sort: the matches in the order they came, newest created_at first."""
    slug = None if p.domain is None else domain_slug(p.domain)
    chosen = [
        state.memories[i] for i in order
        if (slug is None or domain_slug(state.memories[i].domain) == slug or (p.include_global and state.memories[i].scope == "global"))
        and (p.status == "any" or state.memories[i].status == p.status)
        and (p.category is None or state.memories[i].category == p.category)
    ]
    chosen.sort(key=lambda mem: mem.created_at, reverse=True)
    return {"total": len(chosen), "memories": [mem.id for mem in chosen[p.offset : p.offset + p.limit]]}


def _check_every_listing(state: MemoryState, order: list[str]) -> int:
    checked = 0
    for domain in [None, "bandits", "graph theory", "Ops", "nowhere"]:
        for include_global in ([False, True] if domain else [False]):
            for status in ["active", "archived", "any"]:
                for category in [None, "fact", CATEGORIES[0]]:
                    for offset, limit in [(0, 1), (0, 50), (3, 7), (40, 500), (0, 500), (480, 30), (1000, 5)]:
                        p = m.MemoryList(domain=domain, include_global=include_global, status=status,  # type: ignore[arg-type]
                                         category=category, offset=offset, limit=limit)
                        answer = state.do_list(p)
                        got = {"total": answer["total"], "memories": [mem.id for mem in answer["memories"]]}
                        assert got == _expected(state, order, p), p
                        checked += len(got["memories"])
    return checked


@pytest.mark.parametrize("times", [TIMES, TIMES + ["2026-01-01T00:00:00Z"]], ids=["isoformat", "a-legacy-Z"])
def test_list_pages_equal_a_plain_sort_with_ties_filters_and_offsets(times: list[str]) -> None:
    # "Z" is not how the daemon writes a time: text order then decides through the full sort
    state, order = _corpus(20261205, times)
    assert len(set(mem.created_at for mem in state.memories.values())) < 10  # ties everywhere
    assert _check_every_listing(state, order) > 1000
    reloaded = MemoryState(make_embedder("usem3"))
    reloaded.load_snapshot(state.snapshot_document(), None)  # the snapshot keeps the memories' order
    _check_every_listing(reloaded, [i for i in state.memories])


def test_strongest_first_equals_a_plain_sort_and_the_strength_outlook_solves_the_formula() -> None:
    from eurekamem.daemon.memory.strength import DAY, epoch, strength

    state, order = _corpus(11, TIMES)
    rng = random.Random(5)
    now = epoch("2026-03-01T00:00:00+00:00")
    state.wall = lambda: now
    for memory_id in order:  # strengths of every kind: confidences, uses, pins, equal strengths (ties)
        old = state.memories[memory_id]
        used = rng.choice([0, 0, 1, 3])
        state.apply(PutMemory(msgspec.structs.replace(
            old, confidence=rng.choice([0.2, 0.5, 0.9, 1.0]), pinned=rng.random() < 0.1, used_count=used,
            last_used="2026-02-20T00:00:00+00:00" if used else None)))
    settings = state.settings
    for domain, status, offset, limit in [(None, "any", 0, 500), ("bandits", "active", 0, 50), ("Ops", "any", 7, 9)]:
        p = m.MemoryList(domain=domain, status=status, offset=offset, limit=limit, order="strongest")  # type: ignore[arg-type]
        got = [mem.id for mem in state.do_list(p)["memories"]]
        chosen = [state.memories[i] for i in order if (domain is None or domain_slug(state.memories[i].domain) == domain_slug(domain))
                  and status in ("any", state.memories[i].status)]
        chosen.sort(key=lambda mem: mem.created_at, reverse=True)  # stable: as they came (MEMORY.md's order)
        chosen.sort(key=lambda mem: -strength(mem, now, settings))
        assert got == [mem.id for mem in chosen[offset : offset + limit]], p
    # memory.strength: the formula's parts, and the time it falls under archive_floor
    some = [state.memories[i] for i in order[:40]]
    for memory, seen in zip(some, state.do_strength(m.MemoryStrength(ids=[mem.id for mem in some]))):
        assert seen["id"] == memory.id and seen["strength"] == strength(memory, now, settings)
        if memory.pinned:
            assert seen["fades_at"] is None and seen["archivable_at"] is None and seen["strength"] == seen["importance"]
            continue
        fades = epoch(seen["fades_at"])
        if fades > epoch(seen["since"]):  # just before it: over the floor; just after: under it
            assert strength(memory, fades - DAY, settings) >= settings.archive_floor > strength(memory, fades + DAY, settings)
        assert epoch(seen["archivable_at"]) == max(fades, epoch(seen["since"]) + settings.archive_idle_days * DAY)
    used = next(mem for mem in some if mem.used_count == 3 and not mem.pinned)
    assert state.do_strength(m.MemoryStrength(ids=[used.id]))[0]["half_life_days"] == settings.half_life_days[used.category] * 3
    with pytest.raises(ProtocolError) as unknown:
        state.do_strength(m.MemoryStrength(ids=[order[0], "nope"]))
    assert unknown.value.kind == "not_found" and unknown.value.data == {"id": "nope"}


def _expected_counts(memories: list[Memory]) -> dict[str, Any]:
    by_category: Counter[tuple[str, str]] = Counter((mem.category, mem.status) for mem in memories)
    active = sum(mem.status == "active" for mem in memories)
    return {
        "total": len(memories), "active": active, "archived": len(memories) - active,
        "categories": {
            c: {"active": by_category[(c, "active")], "archived": by_category[(c, "archived")]}
            for c in MEMORY_CATEGORIES if by_category[(c, "active")] + by_category[(c, "archived")]
        },
    }


def test_domains_count_each_domain_by_category_and_status() -> None:
    state, _ = _corpus(7, TIMES)
    memories = list(state.memories.values())
    answer = state.do_domains(m.MemoryDomains())
    assert [d["slug"] for d in answer["domains"]] == ["bandits", "graph_theory", "ops"]
    for entry in answer["domains"]:
        mine = [mem for mem in memories if domain_slug(mem.domain) == entry["slug"]]
        assert {k: v for k, v in entry.items() if k not in ("domain", "slug")} == _expected_counts(mine)
        assert entry["domain"] in {mem.domain for mem in mine}
        assert state.do_domains(m.MemoryDomains(domain=entry["domain"].upper()))["domains"] == [entry]
    assert answer["global"] == _expected_counts([mem for mem in memories if mem.scope == "global"])
    assert answer["total"] == len(memories)
    assert state.do_domains(m.MemoryDomains(domain="nowhere"))["domains"] == []
    for mem in [mem for mem in memories if domain_slug(mem.domain) == "ops"]:  # a domain emptied is not listed
        state.apply(PurgeMemory(mem.id))
    assert [d["slug"] for d in state.do_domains(m.MemoryDomains())["domains"]] == ["bandits", "graph_theory"]


async def test_domains_through_a_daemon(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock, embedder="usem3"):
            conn = await RawConnection.open(sock)
            assert await conn.result("memory.domains") == {
                "domains": [], "global": {"total": 0, "active": 0, "archived": 0, "categories": {}}, "total": 0}
            items = [
                {"domain": "Bandits", "category": "fact", "title": "UCB", "content": "UCB1 explores by optimism."},
                {"domain": "Bandits", "category": "pitfalls", "title": "Peeling", "content": "Forgetting the union bound."},
                {"domain": "graphs", "category": "fact", "title": "Trees", "content": "A tree on n vertices has n - 1 edges.",
                 "scope": "global"},
            ]
            added = await conn.result("memory.add_many", {"items": items})
            await conn.result("memory.delete", {"id": added[1]["memory"]["id"]})  # archived
            answer = await conn.result("memory.domains")
            assert answer["total"] == 3
            assert answer["domains"] == [
                {"domain": "Bandits", "slug": "bandits", "total": 2, "active": 1, "archived": 1,
                 "categories": {"pitfalls": {"active": 0, "archived": 1}, "fact": {"active": 1, "archived": 0}}},
                {"domain": "graphs", "slug": "graphs", "total": 1, "active": 1, "archived": 0,
                 "categories": {"fact": {"active": 1, "archived": 0}}},
            ]
            assert answer["global"] == {"total": 1, "active": 1, "archived": 0, "categories": {"fact": {"active": 1, "archived": 0}}}
            one = await conn.result("memory.domains", {"domain": "bandits"})
            assert one["domains"] == answer["domains"][:1]
            assert await conn.error_kind("memory.domains", {"domain": "x" * (m.MAX_KEY + 1)}) == "too_large"
            assert await conn.error_kind("memory.domains", {"limit": 3}) == "invalid_params"
            await conn.aclose()
            await _check_the_ui_pages(sock)


async def _check_the_ui_pages(sock: Path) -> None:
    """The ui's home page lists the domains with their counts; a domain's page counts by category
    for the status asked, both from memory.domains."""
    guard = Guard(port=8124)
    base = "http://127.0.0.1:8124"
    async with AsyncClient(str(sock), timeout=IO_TIMEOUT) as daemon_client:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app(daemon_client, guard)), base_url=base) as web:
            assert (await web.get(guard.url().removeprefix(base))).status_code == 200
            home = (await web.get("/")).text
            assert re.search(r">Bandits</a> <span class=\"muted\">1 active, 1 archived</span>", home), home
            assert re.search(r">graphs</a> <span class=\"muted\">1 active, 0 archived</span>", home), home
            assert "3 memories in all" in home
            archived = (await web.get("/domain?name=bandits&status=archived")).text
            assert re.search(r">pitfalls</a> 1</li>", archived) and not re.search(r">fact</a>", archived), archived
            both = (await web.get("/domain?name=Bandits&status=any")).text
            assert re.search(r">pitfalls</a> 1</li>", both) and re.search(r">fact</a> 1</li>", both), both
