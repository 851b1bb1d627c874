"""The journal actor's writer thread: group commit in queue order, errors reach every waiter, a
clean stop that writes and syncs everything queued before close()."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from eurekamem.daemon.config import config_default
from eurekamem.daemon.storage.journal import Journal
from eurekamem.daemon.storage.journal_actor import JournalActor, JournalUnavailable
from fakefiles import FakeFiles

J = "/j"


def _journal(fs: FakeFiles) -> Journal:
    return Journal.open(J, fs=fs)[0]


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journal-writer"]


async def test_writes_are_durable_in_order_and_the_thread_stops_on_close() -> None:
    fs = FakeFiles()
    actor = JournalActor(_journal(fs), "always", config_default("batch_interval"))
    seqs: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)

        async def client(n: int) -> None:
            for i in range(20):
                seqs.append(await actor.submit([(1, f"{n}.{i}".encode())]))

        async with trio.open_nursery() as clients:
            for n in range(8):
                clients.start_soon(client, n)
        rotated = await actor.run_exclusive(lambda journal: journal.rotate())
        assert rotated == 161
        seqs.append(await actor.submit([(1, b"after"), (1, b"rotate")]))
        assert actor.statistics()["records"] == 162
        actor.close()
    assert not _writer_threads()
    assert sorted(seqs) == list(range(1, 161)) + [162]
    assert actor.batches < 161 + 1  # grouped: fewer fsyncs than writes
    with pytest.raises(JournalUnavailable, match="closed"):
        await actor.submit([(1, b"late")])
    with pytest.raises(trio.ClosedResourceError):
        await actor.run_exclusive(lambda journal: None)
    records = Journal.open(J, fs=fs.crash())[1]  # only what was made durable survives a crash
    assert len(records) == 162 and records[-1][2] == b"rotate"


async def test_a_failed_write_fails_its_group_and_every_later_write() -> None:
    fs = FakeFiles()
    actor = JournalActor(_journal(fs), "always", config_default("batch_interval"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        assert await actor.submit([(1, b"ok")]) == 1
        fs.fail("sync")
        with pytest.raises(JournalUnavailable, match="journal write failed"):
            await actor.submit([(1, b"lost")])
        assert actor.failed and actor.statistics()["failed"]
        with pytest.raises(JournalUnavailable):
            await actor.submit([(1, b"refused")])
        failing = actor.submit_nowait([(1, b"refused too")])
        with pytest.raises(JournalUnavailable):
            await failing.wait()
        with pytest.raises(ZeroDivisionError):  # a call that raises reaches its caller too
            await actor.run_exclusive(lambda journal: 1 / 0)
        actor.close()
    assert not _writer_threads()
    assert [r[2] for r in Journal.open(J, fs=fs.crash())[1]] == [b"ok"]


async def test_batch_policy_syncs_at_close() -> None:
    fs = FakeFiles()
    journal = _journal(fs)
    actor = JournalActor(journal, "batch", batch_interval=3600)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await actor.submit([(1, b"a")])
        assert journal.unsynced  # written, not synced (the writer thread is idle: nothing else touches it)
        actor.close()
    assert not journal.unsynced
    assert [r[2] for r in Journal.open(J, fs=fs.crash())[1]] == [b"a"]


async def test_poller_acks_come_back_through_the_poll_and_through_the_actor_once_it_stops() -> None:
    """acks="poller": results wait behind ack_fd until a poller drains them (as the bulk I/O layer's pass
    does); after poller_stopped the actor drains them itself, and close() still ends the thread."""
    import select

    fs = FakeFiles()
    actor = JournalActor(_journal(fs), "always", config_default("batch_interval"), acks="poller")
    assert actor.ack_fd is not None
    poll = select.epoll()
    poll.register(actor.ack_fd, select.EPOLLIN)
    got: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)

            async def write(payload: bytes) -> None:
                got.append(await actor.submit([(1, payload)]))

            nursery.start_soon(write, b"one")
            await trio.lowlevel.wait_readable(poll.fileno())  # the group is written: its ack waits for the poll
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # nobody drained yet: the waiter is not woken by anything else
            assert poll.poll(0) == [(actor.ack_fd, select.EPOLLIN)]
            actor.drain_acks()
            await trio.testing.wait_all_tasks_blocked()
            assert got == [1]
            actor.poller_stopped()  # from here the actor's own task drains
            await write(b"two")
            assert got == [1, 2]
            actor.close()
    poll.close()
    assert not _writer_threads() and actor.ack_fd is None  # closed with the thread
    assert len(Journal.open(J, fs=fs.crash())[1]) == 2


async def test_a_cancelled_run_still_answers_what_was_queued_before_close() -> None:
    """The front runs its back-end shielded: cancelling the actor's run after close() still makes
    every queued write durable and answers it, then stops the thread and gives back its eventfd."""
    fs = FakeFiles()
    actor = JournalActor(_journal(fs), "always", config_default("batch_interval"))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            await trio.testing.wait_all_tasks_blocked()
            first = actor.submit_nowait([(1, b"a")])
            second = actor.submit_nowait([(1, b"b")])
            actor.close()
            nursery.cancel_scope.cancel()
        assert await first.wait() == 1 and await second.wait() == 2
    assert not _writer_threads() and actor.ack_fd is None
    assert [r[2] for r in Journal.open(J, fs=fs.crash())[1]] == [b"a", b"b"]
