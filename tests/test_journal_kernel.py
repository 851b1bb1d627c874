"""The journal actor whose fdatasync the kernel makes (Linux AIO): the same answers as the writer
thread's (group commit in queue order, errors reach every waiter, a clean stop), on real files, with
the Journal on trio's thread and lent to a worker thread for blocking work."""

from __future__ import annotations

import errno
import os
import select
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.config import config_default
from eurekamem.daemon.storage.journal import Journal
from eurekamem.daemon.storage.journal_actor import JournalActor, JournalUnavailable
from eurekamem.daemon.storage.journal_kernel import KernelSync, kernel_sync_problem, make_journal_actor
from eurekamem.daemon.storage.journal_thread import WriterThreadSync
from fakefiles import FakeFiles


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    journal = Journal.open(tmp_path / "journal")[0]
    problem = kernel_sync_problem(journal)
    if problem is not None:
        journal.close()
        pytest.skip(f"the kernel cannot make the fdatasync here: {problem}")
    return journal


def _records(tmp_path: Path) -> list[bytes]:
    journal, records = Journal.open(tmp_path / "journal")
    journal.close()
    return [payload for _seq, _rtype, payload in records]


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journal-writer"]


def _kernel_actor(journal: Journal, acks: str = "actor") -> JournalActor:
    """The journal actor's front composed with the kernel's back-end (fsync=always: no batch timer)."""
    return JournalActor(journal, "always", 0.0, acks=acks, backend=KernelSync)


async def test_writes_are_durable_in_order_grouped_and_calls_run_between_them(journal, tmp_path) -> None:
    actor = make_journal_actor(journal, "always", config_default("batch_interval"), sync=config_default("journal_sync"))
    assert type(actor.backend) is KernelSync and actor.statistics()["sync"] == "kernel"
    seqs: list[int] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            assert not _writer_threads()

            async def client(n: int) -> None:
                for i in range(20):
                    seqs.append(await actor.submit([(1, f"{n}.{i}".encode())]))

            async with trio.open_nursery() as clients:
                for n in range(8):
                    clients.start_soon(client, n)
            rotated = await actor.run_exclusive(lambda journal: journal.rotate())  # lent to a worker thread
            assert rotated == 161 and actor.facts.segments == 2
            seqs.append(await actor.submit([(1, b"after"), (1, b"rotate")]))
            assert actor.statistics()["records"] == 162 and actor.acked_seq == 162
            actor.close()
    assert sorted(seqs) == list(range(1, 161)) + [162]
    assert actor.batches < 161  # grouped: fewer fdatasyncs than writes
    assert actor.fsync_latency.total == actor.batches
    with pytest.raises(JournalUnavailable, match="closed"):
        await actor.submit([(1, b"late")])
    with pytest.raises(trio.ClosedResourceError):
        await actor.run_exclusive(lambda journal: None)
    journal.close()
    records = _records(tmp_path)
    assert len(records) == 162 and records[-1] == b"rotate"


async def test_a_full_segment_rolls_in_a_worker_thread_and_nothing_is_lost(tmp_path) -> None:
    journal = Journal.open(tmp_path / "journal", segment_bytes=600)[0]
    if kernel_sync_problem(journal) is not None:
        pytest.skip("the kernel cannot make the fdatasync here")
    actor = _kernel_actor(journal)
    threads: set[str] = set()
    roll = journal.rotate

    def rotate() -> int:  # the roll is the Journal's own; it must never run on trio's thread
        threads.add(threading.current_thread().name)
        return roll()

    journal.rotate = rotate  # type: ignore[method-assign]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            for i in range(60):
                assert await actor.submit([(2, b"x" * 40 + str(i).encode())]) == i + 1
            actor.close()
    assert actor.facts.segments > 3 and threads and threading.main_thread().name not in threads
    journal.close()
    assert _records(tmp_path) == [b"x" * 40 + str(i).encode() for i in range(60)]


async def test_a_failed_fdatasync_fails_its_group_and_later_writes_until_resume(journal, tmp_path, monkeypatch) -> None:
    actor = _kernel_actor(journal)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            assert await actor.submit([(1, b"ok")]) == 1
            # the kernel answers EIO for the next fdatasync (the result as caio passes it: unsigned)
            kernel = actor.backend
            monkeypatch.setattr(kernel, "_completed", lambda result: setattr(kernel, "_result", (1 << 64) - errno.EIO))
            with pytest.raises(JournalUnavailable, match="journal write failed"):
                await actor.submit([(1, b"lost")])
            monkeypatch.undo()
            assert actor.failed and journal.failed
            with pytest.raises(JournalUnavailable):
                await actor.submit([(1, b"refused")])
            assert await actor.resume_journal() == 1  # b"lost" was written, never acknowledged: cut
            actor.clear_failure({})
            assert await actor.submit([(1, b"again")]) == 2
            actor.close()
    journal.close()
    assert _records(tmp_path) == [b"ok", b"again"]


async def test_a_refused_submission_fails_the_group_and_the_journal(journal) -> None:
    actor = _kernel_actor(journal)

    def refuse(*operations: object) -> int:
        raise ValueError("The file descriptor specified in the first iocb is invalid [EBADF]")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            kernel = actor.backend
            context = kernel._context
            kernel._context = _Refusing(context, refuse)
            with pytest.raises(JournalUnavailable, match="fdatasync not submitted"):
                await actor.submit([(1, b"never synced")])
            kernel._context = context
            assert journal.failed and actor.statistics()["failed"]
            with pytest.raises(ZeroDivisionError):  # a call that raises reaches its caller, as with the thread
                await actor.run_exclusive(lambda journal: 1 / 0)
            actor.close()
    journal.close()


class _Refusing:
    """A caio context whose submit refuses (as io_submit does for a bad descriptor)."""

    def __init__(self, context: object, submit: object) -> None:
        self._context = context
        self.submit = submit

    def __getattr__(self, name: str) -> object:
        return getattr(self._context, name)


async def test_poller_completions_come_back_through_the_poll_and_through_the_actor_once_it_stops(journal) -> None:
    """acks="poller": a group's completion waits behind ack_fd until a poller drains it (as the bulk I/O
    layer's pass does); after poller_stopped the actor's task reads completions itself."""
    actor = _kernel_actor(journal, acks="poller")
    assert actor.ack_fd is not None
    poll = select.epoll()
    poll.register(actor.ack_fd, select.EPOLLIN)
    got: list[int] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)

            async def write(payload: bytes) -> None:
                got.append(await actor.submit([(1, payload)]))

            nursery.start_soon(write, b"one")
            await trio.lowlevel.wait_readable(poll.fileno())  # the kernel completed the fdatasync
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # nobody drained yet: the waiter is not woken by anything else
            actor.drain_acks()
            await trio.testing.wait_all_tasks_blocked()
            assert got == [1]
            actor.poller_stopped()
            await write(b"two")
            assert got == [1, 2]
            actor.close()
    poll.close()
    assert actor.ack_fd is None


async def test_close_waits_for_the_group_in_the_kernel_and_answers_it(journal, tmp_path) -> None:
    actor = _kernel_actor(journal)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            await trio.testing.wait_all_tasks_blocked()
            first = actor.submit_nowait([(1, b"a")])  # its fdatasync is in the kernel now
            second = actor.submit_nowait([(1, b"b")])  # waits behind it
            actor.close()
            nursery.cancel_scope.cancel()  # even a cancelled run answers what was queued before close()
    assert await first.wait() == 1 and await second.wait() == 2
    journal.close()
    assert _records(tmp_path) == [b"a", b"b"]


def test_the_thread_is_kept_where_the_kernel_cannot_or_should_not_sync(journal) -> None:
    fake = Journal.open("/j", fs=FakeFiles())[0]
    assert kernel_sync_problem(fake) == "the journal's file layer has no file descriptor"
    assert type(make_journal_actor(fake, "always", config_default("batch_interval"), sync=config_default("journal_sync")).backend) is WriterThreadSync
    for fsync, sync in (("batch", "auto"), ("off", "auto"), ("always", "thread")):
        actor = make_journal_actor(journal, fsync, config_default("batch_interval"), sync=sync)
        assert type(actor.backend) is WriterThreadSync and actor.statistics()["sync"] == "thread"
        if actor.ack_fd is not None:
            os.close(actor.ack_fd)
    with pytest.raises(ValueError, match="auto or thread"):
        make_journal_actor(journal, "always", config_default("batch_interval"), sync="kernel")
    with pytest.raises(ValueError, match="fsync=always only"):  # the kernel's back-end syncs every group
        JournalActor(journal, "batch", config_default("batch_interval"), backend=KernelSync)


# --- the daemon ----------------------------------------------------------------------------------


async def test_the_daemon_syncs_through_the_kernel_and_keeps_what_it_acknowledged(data_dir: Path, sock_dir: Path) -> None:
    probe = Journal.open(data_dir / "probe")[0]
    problem = kernel_sync_problem(probe)
    probe.close()
    if problem is not None:
        pytest.skip(f"the kernel cannot make the fdatasync here: {problem}")
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock) as daemon:
            assert daemon.journal_actor.sync == "kernel"
            async def client(n: int) -> None:
                conn = await RawConnection.open(sock)
                for i in range(n, 40, 8):
                    await conn.result("persistent.remember", {"key": f"k{i}", "value": i})

            async with trio.open_nursery() as nursery:  # writes from 8 clients at once: groups, one fdatasync each
                for n in range(8):
                    nursery.start_soon(client, n)
            conn = await RawConnection.open(sock)
            stats = await conn.result("sys.stats", {})
            assert stats["journal"]["sync"] == "kernel" and stats["journal"]["records"] >= 40
            assert stats["journal"]["fsync_latency"]["count"] == stats["journal"]["batches"]
        async with running_daemon(data_dir, sock, journal_sync="thread") as daemon:
            assert daemon.journal_actor.sync == "thread"
            conn = await RawConnection.open(sock)
            assert [(await conn.result("persistent.recall", {"key": f"k{i}"}))["value"] for i in range(40)] == list(range(40))
            assert (await conn.result("sys.stats", {}))["journal"]["sync"] == "thread"
