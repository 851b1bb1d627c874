"""The MemoryManager drop-in against a model of EurekaClaw's (tests/eurekaclaw_reference.py), method
by method, over a real daemon subprocess; then the daemon going away, coming back, and being started
on demand."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from eurekaclaw_reference import ReferenceManager

from daemon_process import DaemonProcess, shared_daemon, wait_gone
from eurekamem.client import AsyncClient, Client, MemoryManager, Timeout
from eurekamem.client._autostart import daemon_answers
from eurekamem.client._paths import eurekaclaw_dir

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with shared_daemon("em-dropin-") as proc:
        yield proc


_counter = iter(range(10**9))


def unique() -> str:
    return f"u{os.getpid()}x{next(_counter)}"


def ours(daemon: DaemonProcess, session: str, **kw: Any) -> MemoryManager:
    return MemoryManager(session, daemon.data_dir / "memory", socket_path=daemon.socket_path, autostart=False, **kw)


# --- comparing records ------------------------------------------------------------------------

EURKACLAW_TYPES = {"RefEntry": "EpisodicEntry", "RefRecord": "CrossRunRecord", "RefNode": "KnowledgeNode"}
IDS = {"entry_id", "record_id", "node_id"}


def shape(value: Any) -> Any:
    """What must agree: field names, values, and of ids and timestamps their kind (naive UTC or
    aware local, and recent), not the random ids and exact instants themselves."""
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, tuple):
        return tuple(shape(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = EURKACLAW_TYPES[type(value).__name__]
        fields = dataclasses.asdict(value)
    elif hasattr(value, "model_dump"):
        name = type(value).__name__
        fields = value.model_dump()
    else:
        return value
    out: dict[str, Any] = {"__type__": name}
    for key, item in fields.items():
        if key in IDS:
            assert isinstance(item, str) and len(item) == 36, (key, item)
            out[key] = "<id>"
        elif isinstance(item, dt.datetime):
            if item.tzinfo is None:
                recent = abs(item - dt.datetime.now(dt.UTC).replace(tzinfo=None)) < dt.timedelta(minutes=5)
                out[key] = ("naive UTC", recent)
            else:
                local = item.utcoffset() == dt.datetime.now().astimezone().utcoffset()
                recent = abs(item - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)
                out[key] = ("aware local", local, recent)
        else:
            out[key] = item
    return out


def by_name(nodes: list[Any]) -> list[Any]:
    return sorted(shape(nodes), key=lambda n: n["theorem_name"])


Script = Callable[[Any, str], Any]


def same(daemon: DaemonProcess, script: Script, tmp_root: Path | None = None) -> tuple[Any, Any]:
    u = unique()
    with ours(daemon, f"s-{u}") as mm:
        got = script(mm, u)
    ref = ReferenceManager(f"s-{u}", tmp_root if tmp_root is not None else daemon.data_dir)
    want = script(ref, u)
    return got, want


# --- the tables ---------------------------------------------------------------------------------

LOG_EVENT: dict[str, Script] = {
    "plain": lambda m, u: m.log_event("theory", "tried Bernstein"),
    "metadata": lambda m, u: m.log_event("survey", "found 3 papers", {"papers": ["a", "b"], "n": 3}),
    "metadata None": lambda m, u: m.log_event("theory", "x", None),
    "empty content": lambda m, u: m.log_event("theory", ""),
    "empty role": lambda m, u: m.log_event("", "no role"),
    "role of 300 characters": lambda m, u: m.log_event("r" * 300, "long role"),
    "unicode": lambda m, u: m.log_event("theory", "Hoeffding: P(|X̄−μ|≥t) ≤ 2e^{−2nt²} 中文"),
}


@pytest.mark.parametrize("case", LOG_EVENT, ids=list(LOG_EVENT))
def test_log_event_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, LOG_EVENT[case])
    assert shape(got) == shape(want)


def _many_events(m: Any, u: str) -> None:
    for i in range(30):
        m.log_event("theory" if i % 3 else "survey", f"event {i}", {"i": i})


RECENT_EVENTS: dict[str, Script] = {
    "default n": lambda m, u: (_many_events(m, u), m.recent_events())[1],
    "n = 6, role theory (analysis_stages)": lambda m, u: (
        _many_events(m, u), m.recent_events(6, agent_role="theory"))[1],
    "n = 0: all": lambda m, u: (_many_events(m, u), m.recent_events(0))[1],
    "n = 600: all": lambda m, u: (_many_events(m, u), m.recent_events(600))[1],
    "n = -3: all but the first 3": lambda m, u: (_many_events(m, u), m.recent_events(-3))[1],
    "empty role filters nothing": lambda m, u: (_many_events(m, u), m.recent_events(5, agent_role=""))[1],
    "unknown role": lambda m, u: (_many_events(m, u), m.recent_events(5, agent_role="writer"))[1],
    "empty session": lambda m, u: m.recent_events(),
    "700 events: the last 500": lambda m, u: ([m.log_event("t", str(i)) for i in range(700)], m.recent_events(0))[1],
    "role of 300 characters": lambda m, u: (m.log_event("r" * 300, "a"), m.log_event("t", "b"),
                                            m.recent_events(5, agent_role="r" * 300))[2],
}


@pytest.mark.parametrize("case", RECENT_EVENTS, ids=list(RECENT_EVENTS))
def test_recent_events_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, RECENT_EVENTS[case])
    assert shape(got) == shape(want)
    assert [e.content for e in got] == [e.content for e in want]


def test_recent_events_are_the_daemons_too(daemon: DaemonProcess) -> None:
    """Two managers of one session (two agent processes) see each other's events, oldest first."""
    u = unique()
    with ours(daemon, u) as a, ours(daemon, u) as b:
        a.log_event("theory", "from a")
        b.log_event("theory", "from b")
        assert [e.content for e in a.recent_events()] == ["from a", "from b"]


REMEMBER_RECALL: dict[str, Script] = {
    "returns None": lambda m, u: m.remember(f"{u}.k", {"tried": [1, 2]}),
    "recall": lambda m, u: (m.remember(f"{u}.k", {"approach": "peeling"}), m.recall(f"{u}.k"))[1],
    "recall absent": lambda m, u: m.recall(f"{u}.absent"),
    "overwrite": lambda m, u: (m.remember(f"{u}.k", 1), m.remember(f"{u}.k", 2), m.recall(f"{u}.k"))[2],
    "None value": lambda m, u: (m.remember(f"{u}.k", None), m.recall(f"{u}.k"))[1],
    "empty key": lambda m, u: (m.remember("", f"empty {u}"), m.recall(""))[1],
    "key of 2000 characters": lambda m, u: (m.remember(u + "k" * 2000, 5), m.recall(u + "k" * 2000))[1],
    "key of 2000 characters does not collide": lambda m, u: (
        m.remember(u + "k" * 2000, 5), m.recall(u + "k" * 1999 + "j"))[1],
    "proof_hint (inner_loop_yaml)": lambda m, u: (
        m.remember(key=f"proof_hint.{u}.L1", value="induct on n"[:400], tags=[u, "proof_hint"], source_session="s"),
        m.recall(f"proof_hint.{u}.L1"))[1],
    "tuple comes back as JSON after a restart": lambda m, u: (
        m.remember(f"{u}.t", (1, 2)), getattr(m, "reload", lambda: None)(), m.recall(f"{u}.t"))[2],
}


@pytest.mark.parametrize("case", REMEMBER_RECALL, ids=list(REMEMBER_RECALL))
def test_remember_and_recall_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, REMEMBER_RECALL[case])
    assert shape(got) == shape(want)


RECALL_BY_TAG: dict[str, Script] = {
    "records": lambda m, u: (m.remember(f"{u}.a", 1, tags=[u]), m.remember(f"{u}.b", 2, tags=[u, "x"]),
                             m.recall_by_tag(u))[2],
    "first-stored order survives an overwrite": lambda m, u: (
        m.remember(f"{u}.a", 1, tags=[u]), m.remember(f"{u}.b", 2, tags=[u]), m.remember(f"{u}.a", 3, tags=[u]),
        [(r.key, r.value) for r in m.recall_by_tag(u)])[3],
    "overwrite drops the tag": lambda m, u: (m.remember(f"{u}.a", 1, tags=[u]), m.remember(f"{u}.a", 1),
                                             m.recall_by_tag(u))[2],
    "unknown tag": lambda m, u: m.recall_by_tag(f"{u}-none"),
    "empty tag, as inner_loop_yaml writes with no domain": lambda m, u: (
        m.remember(f"proof_hint..{u}", "h", tags=["", "proof_hint"]),
        [(r.key, r.tags) for r in m.recall_by_tag("") if r.key.endswith(u)])[1],
    "tag of 300 characters": lambda m, u: (m.remember(f"{u}.a", 1, tags=[u + "t" * 300]),
                                           [r.key for r in m.recall_by_tag(u + "t" * 300)])[1],
    "analysis_stages: [:4] of a domain tag": lambda m, u: (
        [m.remember(f"{u}.{i}", i, tags=[u]) for i in range(6)], [r.value for r in m.recall_by_tag(u)[:4]])[1],
}


@pytest.mark.parametrize("case", RECALL_BY_TAG, ids=list(RECALL_BY_TAG))
def test_recall_by_tag_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, RECALL_BY_TAG[case])
    if isinstance(want, list) and want and hasattr(want[0], "created_at"):
        # documented: overwriting keeps record_id and created_at; the timestamps' kinds still agree
        assert [shape(r) for r in got] == [shape(r) for r in want]
    else:
        assert shape(got) == shape(want)


def test_overwrite_keeps_record_id_and_created_at(daemon: DaemonProcess) -> None:
    """The documented difference: EurekaClaw makes a new record on every put; we keep the first's id
    and created_at and move updated_at (so the tag order is the first-stored order, as EurekaClaw's)."""
    u = unique()
    with ours(daemon, u) as mm:
        mm.remember(f"{u}.k", 1, tags=[u])
        first = mm.recall_by_tag(u)[0]
        mm.remember(f"{u}.k", 2, tags=[u])
        second = mm.recall_by_tag(u)[0]
    assert second.record_id == first.record_id and second.created_at == first.created_at
    assert second.updated_at > first.updated_at and second.value == 2


def _chain(m: Any, u: str) -> list[Any]:
    a = m.add_theorem("UCB regret", "R_T <= O(sqrt(K T log T))", domain=f"bandits {u}", session_id="s", tags=["lemma"])
    b = m.add_theorem("Hoeffding", "P(|X - EX| > t) <= 2 exp(-2 n t^2)", domain=f"concentration {u}")
    c = m.add_theorem("Chernoff", "moment generating function bound", domain=f"concentration {u}")
    d = m.add_theorem("Unrelated", "nothing")
    m.link_theorems(a.node_id, b.node_id, "uses")
    m.link_theorems(b.node_id, c.node_id, relation="generalizes")
    return [a, b, c, d]


ADD_THEOREM: dict[str, Script] = {
    "plain": lambda m, u: m.add_theorem("UCB regret", "R_T <= ..."),
    "all fields (theory agent)": lambda m, u: m.add_theorem(
        theorem_name="L1", formal_statement="x", domain="bandits", session_id="s1", tags=["bandits", "lemma"]),
    "empty name": lambda m, u: m.add_theorem("", "statement of an untitled direction"),
    "name of 2000 characters": lambda m, u: m.add_theorem("n" * 2000, "s"),
    "empty statement": lambda m, u: m.add_theorem("T", ""),
}


@pytest.mark.parametrize("case", ADD_THEOREM, ids=list(ADD_THEOREM))
def test_add_theorem_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, ADD_THEOREM[case])
    assert shape(got) == shape(want)


LINK_AND_RELATED: dict[str, Script] = {
    "link returns None": lambda m, u: (lambda n: m.link_theorems(n[0].node_id, n[3].node_id))(_chain(m, u)),
    "depth 1": lambda m, u: by_name((lambda n: m.find_related_theorems(n[0].node_id, 1))(_chain(m, u))),
    "depth 2 (default)": lambda m, u: by_name((lambda n: m.find_related_theorems(n[0].node_id))(_chain(m, u))),
    "depth 0": lambda m, u: (lambda n: m.find_related_theorems(n[0].node_id, 0))(_chain(m, u)),
    "depth -1": lambda m, u: (lambda n: m.find_related_theorems(n[0].node_id, -1))(_chain(m, u)),
    "depth 50": lambda m, u: by_name((lambda n: m.find_related_theorems(n[2].node_id, 50))(_chain(m, u))),
    "unknown id": lambda m, u: m.find_related_theorems("no-such-node"),
    "empty id": lambda m, u: m.find_related_theorems(""),
    "link to an unknown id is ignored": lambda m, u: (lambda n: (
        m.link_theorems(n[3].node_id, "no-such-node"), m.link_theorems("no-such", n[3].node_id),
        m.find_related_theorems(n[3].node_id)))(_chain(m, u))[2],
    "link twice": lambda m, u: by_name((lambda n: (
        m.link_theorems(n[0].node_id, n[3].node_id), m.link_theorems(n[0].node_id, n[3].node_id),
        m.find_related_theorems(n[3].node_id, 1)))(_chain(m, u))[2]),
}


@pytest.mark.parametrize("case", LINK_AND_RELATED, ids=list(LINK_AND_RELATED))
def test_link_and_find_related_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, LINK_AND_RELATED[case])
    assert shape(got) == shape(want)


def test_a_relation_outside_the_four_is_not_linked(daemon: DaemonProcess, caplog: pytest.LogCaptureFixture) -> None:
    """The documented difference: EurekaClaw stores any relation string (its docstring names four)."""
    u = unique()
    with ours(daemon, u) as mm:
        a, b = mm.add_theorem("A", "a"), mm.add_theorem("B", "b")
        assert mm.link_theorems(a.node_id, b.node_id, "depends_on") is None  # no exception
        assert mm.find_related_theorems(a.node_id) == []
        mm.link_theorems(a.node_id, b.node_id, " Specializes ")  # case and spaces aside: one of the four
        assert [n.theorem_name for n in mm.find_related_theorems(a.node_id)] == ["B"]
    assert "depends_on" in caplog.text


RETRIEVE: dict[str, Script] = {
    "query and domain (analysis_stages)": lambda m, u: (
        _chain(m, u), shape(m.retrieve_relevant_theorems("regret of UCB with Hoeffding", domain=f"bandits {u}")))[1],
    "domain only": lambda m, u: (_chain(m, u), shape(m.retrieve_relevant_theorems("", domain=f"concentration {u}")))[1],
    "no words and no domain": lambda m, u: (_chain(m, u), m.retrieve_relevant_theorems("a of", ""))[1],
    "stop words only": lambda m, u: (_chain(m, u), m.retrieve_relevant_theorems("theorem lemma proof", ""))[1],
    "limit 1": lambda m, u: (_chain(m, u), shape(m.retrieve_relevant_theorems("bound", domain=f"concentration {u}",
                                                                                limit=1)))[1],
    "limit 0": lambda m, u: (
        _chain(m, u), m.retrieve_relevant_theorems("Hoeffding", domain=f"bandits {u}", limit=0))[1],
    "limit -1": lambda m, u: (_chain(m, u), shape(m.retrieve_relevant_theorems("x", domain=f"concentration {u}",
                                                                                 limit=-1)))[1],
    "unknown domain falls back to every node": lambda m, u: (
        _chain(m, u), [n.theorem_name for n in m.retrieve_relevant_theorems(f"Chernoff {u}", domain=f"nowhere {u}",
                                                                           limit=10**6) if n.domain.endswith(u)])[1],
}


@pytest.mark.parametrize("case", RETRIEVE, ids=list(RETRIEVE))
def test_retrieve_relevant_theorems_table(daemon: DaemonProcess, case: str) -> None:
    u = unique()
    with ours(daemon, f"s-{u}") as mm:
        got = RETRIEVE[case](mm, u)
    # the reference holds only this case's nodes; the daemon's graph has every case's: the domains are unique
    want = RETRIEVE[case](ReferenceManager(f"s-{u}", daemon.data_dir), u)
    assert got == want


# --- .persistent and .graph: EurekaClaw's PersistentMemory and KnowledgeGraph calls ---------------


def _put_three(m: Any, u: str) -> None:
    m.persistent.put(f"{u}.b", 1, [u])
    m.persistent.put(f"{u}.a", {"x": [1.5, None]}, [u, "y"], "s")
    m.remember(f"{u}.c", "via remember", tags=[u])


PERSISTENT_VIEW: dict[str, Script] = {
    "put answers the record": lambda m, u: m.persistent.put(f"{u}.k", {"a": 1}, [u], "s1"),
    "put then get": lambda m, u: (m.persistent.put(f"{u}.k", [1, "x"]), m.persistent.get(f"{u}.k"))[1],
    "get absent": lambda m, u: m.persistent.get(f"{u}.none"),
    "remember and put are one store": lambda m, u: (m.remember(f"{u}.k", 7), m.persistent.get(f"{u}.k"))[1],
    "get_by_tag": lambda m, u: (_put_three(m, u), m.persistent.get_by_tag("y") and m.persistent.get_by_tag(u))[1],
    "search_keys, first stored first": lambda m, u: (_put_three(m, u), m.persistent.search_keys(f"{u}."))[1],
    "search_keys after an overwrite": lambda m, u: (
        _put_three(m, u), m.persistent.put(f"{u}.b", 2), [(r.key, r.value) for r in m.persistent.search_keys(u)])[2],
    "search_keys of nothing": lambda m, u: m.persistent.search_keys(f"{u}.none"),
    "delete": lambda m, u: (_put_three(m, u), m.persistent.delete(f"{u}.a"), m.persistent.get(f"{u}.a"),
                            [r.key for r in m.persistent.search_keys(u)], [r.key for r in m.recall_by_tag("y")
                                                                         if r.key.startswith(u)])[2:],
    "delete absent": lambda m, u: m.persistent.delete(f"{u}.none"),
    "all_records holds ours": lambda m, u: (
        _put_three(m, u), [r.key for r in m.persistent.all_records() if r.key.startswith(u)])[1],
    "empty key": lambda m, u: (m.persistent.put("", f"e{u}"), [r.value for r in m.persistent.search_keys("")
                                                              if r.key == "" and r.value == f"e{u}"])[1],
}


@pytest.mark.parametrize("case", PERSISTENT_VIEW, ids=list(PERSISTENT_VIEW))
def test_persistent_view_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, PERSISTENT_VIEW[case])
    assert shape(got) == shape(want)


def _graph_three(m: Any, u: str) -> list[str]:
    a = m.graph.add_theorem("Hoeffding", "P(|X-EX|>t) <= 2exp(-2t^2)", f"Probability {u}", "s", [u, "concentration"])
    b = m.add_theorem("Bernstein", "variance-aware concentration", f"probability {u}", "s", [u])
    c = m.graph.add_theorem("UCB regret", "O(sqrt(KT log T))", f"bandits {u}", "s", [u])
    m.graph.add_edge(b.node_id, a.node_id, "generalizes")
    m.link_theorems(c.node_id, b.node_id)
    return [a.node_id, b.node_id, c.node_id]


def _ours(nodes: list[Any], u: str) -> list[str]:
    return [n.theorem_name for n in nodes if n.domain.endswith(u)]


def _graph_delta(m: Any, u: str) -> dict[str, int]:
    before = m.graph.stats()
    _graph_three(m, u)
    after = m.graph.stats()
    return {k: after[k] - before[k] for k in ("nodes", "edges")} | {"keys": sorted(after)}  # type: ignore[dict-item]


def _networkx(m: Any, u: str) -> Any:
    ids = _graph_three(m, u)
    graph = m.graph.to_networkx().subgraph(ids)
    names = {i: graph.nodes[i]["theorem_name"] for i in ids}
    return (type(graph).__name__, sorted(names.values()), sorted(graph.nodes[ids[0]]),
            sorted((names[a], names[b], d["relation"]) for a, b, d in graph.edges(data=True)))


GRAPH_VIEW: dict[str, Script] = {
    "add_theorem answers the node": lambda m, u: m.graph.add_theorem("L1", "x", u, "s", ["lemma"]),
    "add_edge and find_related": lambda m, u: (lambda ids: by_name(m.graph.find_related(ids[0], 2)))(_graph_three(m, u)),
    "find_related depth 1": lambda m, u: (lambda ids: by_name(m.graph.find_related(ids[2], 1)))(_graph_three(m, u)),
    "search_by_domain, case aside": lambda m, u: (_graph_three(m, u), _ours(m.graph.search_by_domain(f"PROBABILITY {u}"), u))[1],
    "search_by_domain answers the nodes": lambda m, u: (_graph_three(m, u), by_name(m.graph.search_by_domain(f"bandits {u}")))[1],
    "search_by_tag": lambda m, u: (_graph_three(m, u), _ours(m.graph.search_by_tag("concentration"), u),
                                   _ours(m.graph.search_by_tag(u), u))[1:],
    "all_nodes in the order added": lambda m, u: (_graph_three(m, u), _ours(m.graph.all_nodes(), u))[1],
    "stats": _graph_delta,
    "to_networkx": _networkx,
}


@pytest.mark.parametrize("case", GRAPH_VIEW, ids=list(GRAPH_VIEW))
def test_graph_view_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, GRAPH_VIEW[case])
    assert shape(got) == shape(want)


def test_the_views_hold_no_copy(daemon: DaemonProcess) -> None:
    """EurekaClaw's own PersistentMemory / KnowledgeGraph read their file once and save their copy:
    another writer's records would be unseen and then overwritten. The views ask the daemon each time."""
    u = unique()
    with ours(daemon, f"a-{u}") as first, ours(daemon, f"b-{u}") as second:
        persistent, graph = first.persistent, first.graph
        second.remember(f"{u}.other", "theirs", tags=[u])
        node = second.add_theorem("Azuma", "martingale", u)
        assert persistent.get(f"{u}.other") == "theirs" and [r.key for r in persistent.search_keys(u)] == [f"{u}.other"]
        assert [n.node_id for n in graph.search_by_domain(u)] == [node.node_id]
        persistent.put(f"{u}.mine", 1)
        assert second.recall(f"{u}.other") == "theirs" and second.recall(f"{u}.mine") == 1


REMEMBER_VALUES: dict[str, Script] = {
    "NaN comes back as EurekaClaw's file has it": lambda m, u: (
        m.remember(f"{u}.n", {"a": float("nan"), "b": [float("inf"), 1.5]}), getattr(m, "reload", lambda: None)(),
        m.recall(f"{u}.n"))[2],
    "a set comes back as a list": lambda m, u: (
        m.remember(f"{u}.s", {"a": {3}}), getattr(m, "reload", lambda: None)(), m.recall(f"{u}.s"))[2],
    "the largest integers MessagePack carries": lambda m, u: (
        m.remember(f"{u}.i", [2**64 - 1, -(2**63)]), m.recall(f"{u}.i"))[1],
}


@pytest.mark.parametrize("case", REMEMBER_VALUES, ids=list(REMEMBER_VALUES))
def test_remember_values_table(daemon: DaemonProcess, case: str) -> None:
    got, want = same(daemon, REMEMBER_VALUES[case])
    assert shape(got) == shape(want)


def test_an_integer_beyond_64_bits_is_refused_clearly_and_changes_nothing(daemon: DaemonProcess) -> None:
    """The deliberate difference: EurekaClaw's JSON file keeps remember(2**70); eurekamem's journal
    (MessagePack) cannot, so the call raises ValueError naming the key, the path and what to do,
    and nothing is stored, sent or spooled; the key keeps its old value."""
    u = unique()
    with ours(daemon, u) as mm:
        mm.remember(f"{u}.k", "old")
        with pytest.raises(ValueError, match=r"remember\('u.*\.k'\).*Integer out of range.*`\$\.value\.tried\[1\]`.*str\(n\)"):
            mm.remember(f"{u}.k", {"tried": [1, 2**70]})
        with pytest.raises(ValueError, match="Integer out of range"):
            mm.persistent.put(f"{u}.k", -(2**63) - 1)
        assert mm.buffered == 0 and mm.recall(f"{u}.k") == "old"


# --- load_for_injection ---------------------------------------------------------------------------


def _add_memories(daemon: DaemonProcess, domain: str, count: int) -> None:
    with Client(daemon.socket_path, timeout=TIMEOUT) as c:
        for i in range(count):
            c.add_memory(domain, "proof_strategy", f"Strategy {i} for {domain}",
                         f"Use technique number {i}. " + "Long explanation of the idea. " * (i + 5), dedup=False)
        c.snapshot()  # the memory files follow the journal; a snapshot writes them now


INJECTION: dict[str, tuple[int, Callable[[Any, str], str]]] = {
    "unknown domain": (0, lambda m, d: m.load_for_injection(d + " absent")),
    "k = 4 (analysis_stages, injector)": (6, lambda m, d: m.load_for_injection(d, k=4)),
    "fewer than k": (2, lambda m, d: m.load_for_injection(d)),
    "k = 0": (3, lambda m, d: m.load_for_injection(d, k=0)),
    "k = -1": (3, lambda m, d: m.load_for_injection(d, k=-1)),
    "k = 10": (3, lambda m, d: m.load_for_injection(d, k=10)),
}


@pytest.mark.parametrize("case", INJECTION, ids=list(INJECTION))
def test_load_for_injection_table(daemon: DaemonProcess, case: str) -> None:
    count, script = INJECTION[case]
    domain = f"injection {unique()}"
    _add_memories(daemon, domain, count)
    with ours(daemon, "s") as mm:
        got = script(mm, domain)
    want = script(ReferenceManager("s", daemon.data_dir), domain)
    assert got == want
    if count and "k = 0" not in case:
        assert got.startswith("<memories>\n\n# Strategy") and got.endswith("\n\n</memories>")


def test_load_for_injection_with_a_query_and_with_a_budget(daemon: DaemonProcess) -> None:
    domain = f"injection {unique()}"
    _add_memories(daemon, domain, 6)
    with ours(daemon, "s") as mm:
        block = mm.load_for_injection(domain, k=4, query="technique number 2")
        parts = block.split("\n\n# ")
        assert block.startswith("<memories>") and len(parts) == 5
        assert "Strategy 2 for" in parts[1]  # the best match first (EurekaClaw: its vectors' ranking)
        assert all(len("# " + p.removesuffix("\n\n</memories>")) <= 400 for p in parts[1:])
        budget = mm.load_for_injection(domain, k=4, token_budget=60)
        assert budget.startswith("<memories>") and len(budget) < len(block)  # the daemon's, within budget


# --- the daemon away, back, and started on demand -------------------------------------------------


def test_an_agent_keeps_running_while_the_daemon_is_down_and_its_events_arrive_later(tmp_path: Path) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="em-"))
    try:
        proc = DaemonProcess(tmp_path / "data", sock_dir / "s.sock").start()
        mm = ours(proc, "run-1", timeout=2.0)
        mm.log_event("theory", "before")
        mm.remember("k.before", 1)
        proc.kill()  # kill -9: episodic RAM is gone with it
        started = dt.datetime.now()
        mm._retry_at = 0.0
        events = [mm.log_event("theory", f"while down {i}") for i in range(3)]
        mm.remember("k.down", {"v": 2}, tags=["t"])
        assert mm.recall("k.down") == {"v": 2}  # what this manager remembered meanwhile
        assert mm.recall("k.before") in (None, 1)  # persistent.json's, if the daemon wrote it before dying
        assert [(r.key, r.value) for r in mm.recall_by_tag("t")] == [("k.down", {"v": 2})]  # the spool's
        node = mm.add_theorem("T", "s")  # made here and spooled: the agent goes on
        assert node.theorem_name == "T" and mm.find_related_theorems(node.node_id) == []
        assert mm.load_for_injection("anything") == ""
        assert [e.content for e in mm.recent_events()] == ["before", "while down 0", "while down 1", "while down 2"]
        assert mm.buffered == 5
        assert (dt.datetime.now() - started).total_seconds() < 5  # no call waited long
        proc.start()
        mm._retry_at = 0.0  # skip the back-off's wait
        assert [e.content for e in mm.recent_events(2)] == ["while down 1", "while down 2"]
        assert mm.buffered == 0 and mm.delivered == 5
        with Client(proc.socket_path, timeout=TIMEOUT) as c:
            at_daemon = c.recent("run-1", 500)
            assert [e.entry_id for e in at_daemon] == [e.entry_id for e in events]  # same ids, once each
            assert [dt.datetime.fromisoformat(e.timestamp).replace(tzinfo=None) for e in at_daemon] == [
                e.timestamp for e in events]  # the times they happened, not when they arrived
            assert c.recall("k.down").value == {"v": 2} and c.recall("k.before").value == 1
        mm.close()
        proc.terminate()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_buffered_events_are_bounded_and_the_back_off_keeps_calls_fast(tmp_path: Path) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="em-"))
    try:
        mm = MemoryManager("s", tmp_path / "memory", socket_path=sock_dir / "nobody.sock", autostart=False,
                           outbox_limit=10)
        for i in range(25):
            mm.log_event("theory", str(i))
        assert mm.buffered == 10 and mm.dropped == 15
        assert [e.content for e in mm.recent_events(3)] == ["22", "23", "24"]
        assert mm._retry_at > 0  # backing off: the next calls do not even try to connect
        mm.close()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_a_daemon_that_does_not_answer_costs_one_timeout_then_the_back_off(tmp_path: Path) -> None:
    """A socket that accepts and never answers (a stopped daemon): bounded calls, no exception."""
    sock_dir = Path(tempfile.mkdtemp(prefix="em-"))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(sock_dir / "mute.sock"))
        server.listen(8)
        mm = MemoryManager("s", tmp_path / "memory", socket_path=sock_dir / "mute.sock", autostart=False, timeout=0.2)
        before = dt.datetime.now()
        mm.log_event("theory", "x")
        assert mm.recall("k") is None
        assert mm.recent_events() and mm.buffered == 1
        assert (dt.datetime.now() - before).total_seconds() < 3
    finally:
        server.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


async def test_async_client_calls_are_bounded_by_default(autojump_clock: trio.abc.Clock, sock_dir: Path) -> None:
    """No call of AsyncClient waits for ever: the default timeout, on trio's virtual clock."""
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(sock_dir / "mute.sock"))
    listener.listen(8)
    client = AsyncClient(sock_dir / "mute.sock")
    start = trio.current_time()
    with pytest.raises(Timeout):
        await client.ping()
    assert trio.current_time() - start == pytest.approx(60.0)
    with pytest.raises(Timeout):
        await AsyncClient(sock_dir / "mute.sock", timeout=5).call("sys.ping")
    await client.aclose()
    listener.close()


def test_sync_client_timeouts_are_bounded() -> None:
    assert Client("/nonexistent.sock").timeout == 60.0
    for bad in (float("inf"), 0, -1, float("nan")):
        with pytest.raises(ValueError):
            Client("/nonexistent.sock", timeout=bad)


def test_the_data_root_follows_eurekaclaws_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper() == "EUREKACLAW_DIR"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert eurekaclaw_dir(tmp_path) == tmp_path / "home" / ".eurekaclaw"
    dotenv = "# EurekaClaw settings\nANTHROPIC_API_KEY=sk-x\nexport EUREKACLAW_DIR='~/research' # mine\n"
    (tmp_path / ".env").write_text(dotenv)
    assert eurekaclaw_dir(tmp_path) == tmp_path / "home" / "research"
    (tmp_path / ".env").write_text("EUREKACLAW_DIR=/data/eureka  # inline comment\n")
    assert eurekaclaw_dir(tmp_path) == Path("/data/eureka")
    monkeypatch.setenv("EUREKACLAW_DIR", str(tmp_path / "env"))  # the environment beats .env
    assert eurekaclaw_dir(tmp_path) == tmp_path / "env"
    monkeypatch.chdir(tmp_path)
    assert MemoryManager("s", autostart=False).data_dir == tmp_path / "env"
    assert MemoryManager("s", tmp_path / "x" / "memory", autostart=False).data_dir == tmp_path / "x"


AGENT = """
import json, sys
from eurekamem.client import MemoryManager
mm = MemoryManager(sys.argv[1])
mm.log_event("theory", "hello from " + sys.argv[1])
print(json.dumps({"recent": [e.content for e in mm.recent_events()], "pid": mm.client.call("sys.stats")["pid"],
                  "socket": mm.client.path}))
"""


def _agent_env(root: Path) -> dict[str, str]:
    dropped = ("EUREKAMEM_SOCKET", "XDG_RUNTIME_DIR", "EUREKAMEM_NO_AUTOSTART")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["EUREKACLAW_DIR"] = str(root)
    return env


def test_autostart_starts_one_daemon_for_two_agents_and_the_next_agent_reuses_it() -> None:
    root = Path(tempfile.mkdtemp(prefix="em-auto-"))
    pid = None
    try:
        env = _agent_env(root)
        agents = [subprocess.Popen([sys.executable, "-c", AGENT, f"agent{i}"], env=env, cwd=root,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
        answers = []
        for agent in agents:
            out, err = agent.communicate(timeout=60)
            assert agent.returncode == 0, err.decode()
            answers.append(json.loads(out))
        assert answers[0]["pid"] == answers[1]["pid"]  # one daemon: the lock kept the second from starting one
        pid = answers[0]["pid"]
        assert answers[0]["socket"] == str(root / "run" / "eurekamem.sock")
        assert (root / "run" / "eurekamem.log").read_text().count("serving on") == 1
        third = subprocess.run([sys.executable, "-c", AGENT, "agent0"], env=env, cwd=root, capture_output=True,
                               timeout=60, check=True)
        again = json.loads(third.stdout)
        assert again["pid"] == pid and again["recent"] == ["hello from agent0", "hello from agent0"]
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_gone(pid)
        shutil.rmtree(root, ignore_errors=True)


def test_no_autostart_when_the_environment_says_no() -> None:
    root = Path(tempfile.mkdtemp(prefix="em-auto-"))
    try:
        env = _agent_env(root) | {"EUREKAMEM_NO_AUTOSTART": "1"}
        code = ("from eurekamem.client import MemoryManager\nmm = MemoryManager('s')\n"
                "mm.log_event('theory', 'x')\nprint(mm.buffered, mm.recall('k'))")
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, timeout=60,
                              check=True)
        assert done.stdout.split() == [b"1", b"None"]
        assert not daemon_answers(str(root / "run" / "eurekamem.sock"))
        assert not (root / "run" / "eurekamem.log").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
