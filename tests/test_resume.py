"""sys.resume: leaving read-only mode after a journal failure, with the journal on fake files.

The fake file layer (daemon/_files.FakeFiles) fails writes or fsyncs on demand and, at a simulated
power loss (`crash()`), keeps only what was synced: a restart on it shows what a real disk would.
"""

from __future__ import annotations

import errno
import logging
import random
from pathlib import Path

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.storage.journal import Journal, JournalWriteError
from eurekamem.daemon.storage.journal_sync import sync_if_unsynced
from fakefiles import FakeFiles

J = "/j"


async def _no_snapshot(force: bool = False) -> int:
    return -1


def _remember(key: str, value: int) -> dict:
    return {"key": key, "value": value}


# --- the journal alone ----------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["write", "sync"])
def test_journal_resume_cuts_back_to_the_last_sync_and_starts_a_segment(op: str) -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs)
    j.append([(1, b"acked-1"), (1, b"acked-2")])
    j.sync()
    fs.fail(op, errno.ENOSPC, partial=7)  # a short write on a full disk lands a few bytes
    with pytest.raises(JournalWriteError):
        j.append([(1, b"never-acked")])
        j.sync()
    assert j.failed
    with pytest.raises(JournalWriteError) as still:  # the disk is still full: stays failed, says why
        j.resume()
    assert j.failed and "No space left" in str(still.value)
    fs.heal()
    assert j.resume() == (1 if op == "sync" else 0)  # the written-but-unsynced record is cut
    assert not j.failed and j.last_seq == 2 and j.segment_count == 2
    assert j.append([(1, b"after")]) == 3
    j.sync()
    assert j.resume() == 0  # not failed: nothing to do
    j.close()
    _, records = Journal.open(J, fs=fs.crash(random.Random(3)))
    assert [payload for _, _, payload in records] == [b"acked-1", b"acked-2", b"after"]


def test_journal_resume_of_an_empty_segment_rewrites_it_in_place() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs, first_seq=10)
    fs.fail("sync")
    with pytest.raises(JournalWriteError):
        j.append([(1, b"x")])
        j.sync()
    fs.heal()
    assert j.resume() == 1
    assert j.segment_names == ["00000000000000000010.log"] and j.next_seq == 10
    assert j.append([(1, b"y")]) == 10
    j.sync()
    j.close()
    assert [p for _, _, p in Journal.open(J, fs=fs.crash())[1]] == [b"y"]


# --- the daemon -----------------------------------------------------------------------------------


async def test_sys_resume_after_a_full_disk(data_dir: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeFiles()
    sock = sock_dir / "s.sock"
    caplog.set_level(logging.INFO, logger="eurekamem")
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, fs=fake) as daemon:
            conn = await RawConnection.open(sock)
            not_needed = await conn.result("sys.resume", {})
            assert {key: not_needed[key] for key in ("resumed", "read_only")} == {"resumed": False, "read_only": False}
            assert not_needed["jobs"]["queued"] == 0  # the job queue was nudged all the same
            await conn.result("persistent.remember", _remember("a", 1))
            node = await conn.result("graph.add_theorem", {"theorem_name": "T", "formal_statement": "t"})

            fake.fail("sync", errno.ENOSPC)  # the record is written, its fsync fails: never acknowledged
            assert await conn.error_kind("persistent.remember", _remember("lost", 2)) == "read_only"
            assert await conn.error_kind("persistent.forget", {"key": "a"}) == "read_only"
            assert await conn.result("persistent.recall", {"key": "lost"}) is None
            assert (await conn.result("persistent.recall", {"key": "a"}))["value"] == 1
            stats = await conn.result("sys.stats", {})
            assert stats["read_only"] is True and "No space left" in stats["journal"]["failed"]
            assert stats["journal"]["failed_at"] and stats["journal"]["resumes"] == 0

            # still full: sys.resume answers read_only with the reason and nothing changes
            answer = await conn.call("sys.resume", {})
            assert answer["error"]["data"]["kind"] == "read_only" and answer["error"]["code"] == -32030
            assert "No space left" in answer["error"]["message"]
            assert (await conn.result("sys.stats", {}))["read_only"] is True
            assert await conn.error_kind("persistent.remember", _remember("lost", 3)) == "read_only"

            fake.heal()  # space was freed
            assert await conn.error_kind("persistent.remember", _remember("lost", 4)) == "read_only"  # no silent retry
            resumed = await conn.result("sys.resume", {})
            assert resumed["resumed"] is True and resumed["read_only"] is False
            assert "No space left" in resumed["was"] and resumed["cut_records"] == 1
            stats = await conn.result("sys.stats", {})
            assert stats["read_only"] is False and stats["journal"]["failed"] is None
            assert stats["journal"]["resumes"] == 1 and "No space left" in stats["journal"]["last_resume"]["was"]

            await conn.result("persistent.remember", _remember("b", 5))
            await conn.result("graph.link", {"from_id": node["node_id"], "to_id": node["node_id"]})
            assert (await conn.result("persistent.forget", {"key": "a"}))["deleted"] is True
            await conn.result("persistent.remember", _remember("a", 6))
            await conn.aclose()
            daemon.snapshot = _no_snapshot  # as if killed: only the journal carries the writes
        log_text = caplog.text
        assert "read-only" in log_text and "journal resumed" in log_text

        # a power loss now: only what was synced survives; every acknowledged write is there
        async with running_daemon(data_dir, sock, fs=fake.crash(random.Random(5))) as daemon:
            conn = await RawConnection.open(sock)
            assert (await conn.result("persistent.recall", {"key": "a"}))["value"] == 6
            assert (await conn.result("persistent.recall", {"key": "b"}))["value"] == 5
            assert await conn.result("persistent.recall", {"key": "lost"}) is None
            assert (await conn.result("graph.stats", {}))["edges"] == 1
            assert daemon.recovery["replayed"] == 6  # a, T, b, link, forget a, a: nothing un-acked
            await conn.aclose()


async def test_sys_resume_under_fsync_batch_snapshots_what_was_acknowledged(data_dir: Path, sock_dir: Path) -> None:
    """Under fsync=batch a write is acknowledged before its fsync; if that fsync fails, the journal
    is cut back on resume, so the record must reach the disk through a snapshot first."""
    fake = FakeFiles()
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, fs=fake, fsync="batch", batch_interval=0.02) as daemon:
            conn = await RawConnection.open(sock)
            journal_actor = daemon.journal_actor
            failed = trio.Event()
            set_failed = journal_actor._set_failed

            def failing(reason: str) -> None:
                set_failed(reason)
                failed.set()

            journal_actor._set_failed = failing  # type: ignore[method-assign]
            fake.fail("sync", errno.EIO)
            await conn.result("persistent.remember", _remember("acked", 1))  # acknowledged, not yet synced
            await failed.wait()  # the periodic fsync failed
            assert (await conn.result("sys.stats", {}))["read_only"] is True
            assert await conn.error_kind("persistent.remember", _remember("lost", 2)) == "read_only"
            fake.heal()
            resumed = await conn.result("sys.resume", {})
            assert resumed["resumed"] is True and resumed["cut_records"] == 1 and "snapshot_seq" in resumed
            await conn.result("persistent.remember", _remember("later", 3))
            # the fsync that fsync=batch runs within batch_interval: run now in the writer thread
            # unless the periodic one already did (either way "later" is on disk before the crash)
            await journal_actor.run_exclusive(sync_if_unsynced)
            assert fake.stats["datasync"]
            await conn.aclose()
            daemon.snapshot = _no_snapshot
        async with running_daemon(data_dir, sock, fs=fake.crash()):
            conn = await RawConnection.open(sock)
            assert (await conn.result("persistent.recall", {"key": "acked"}))["value"] == 1
            assert (await conn.result("persistent.recall", {"key": "later"}))["value"] == 3
            assert await conn.result("persistent.recall", {"key": "lost"}) is None
            await conn.aclose()


async def test_eurekamem_resume_command(data_dir: Path, sock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eurekamem.cli.main import main

    fake = FakeFiles()
    sock = sock_dir / "s.sock"
    argv = ["resume", "--socket", str(sock), "--timeout", "10"]
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, fs=fake):
            conn = await RawConnection.open(sock)
            fake.fail("write", errno.EIO)
            assert await conn.error_kind("persistent.remember", _remember("x", 1)) == "read_only"
            assert await trio.to_thread.run_sync(main, argv) == 1
            assert "read_only: still read-only" in capsys.readouterr().err
            fake.heal()
            assert await trio.to_thread.run_sync(main, argv) == 0
            assert "resumed: writable again" in capsys.readouterr().out
            assert await trio.to_thread.run_sync(main, argv) == 0
            assert "not read-only" in capsys.readouterr().out
            await conn.result("persistent.remember", _remember("x", 2))
            await conn.aclose()
