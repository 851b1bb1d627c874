"""A real full disk: the daemon's data root on a 1 MiB tmpfs, filled until the journal fails.

Needs root (mount); skipped with the reason otherwise. The real daemon runs as a subprocess and is
talked to through the blocking client over its socket; every call has a timeout. The daemon must
turn read-only (reads keep working, sys.stats says why), accept writes again after space is freed
and sys.resume, and, after a kill -9 and a restart, show every acknowledged write and none of the
refused ones. (The case "sys.resume while the disk is still full" is in test_resume.py, on fake
files: on a real tmpfs, cutting the failed write's bytes may itself free the page a new segment
needs, so its outcome there is not deterministic.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import tmpfs
from daemon_process import DaemonProcess
from eurekamem.client import Client, ReadOnly

DISK_BYTES = 1024 * 1024
FILLER_BYTES = 256 * 1024
VALUE = "v" * 16_000  # one journal record of about 16 KB
CALL_TIMEOUT = 20.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        yield disk


def _daemon(disk: Path, sock_dir: Path) -> DaemonProcess:
    return DaemonProcess(
        disk / "data", sock_dir / "s.sock",
        "--snapshot-quiet", "3600", "--snapshot-max-delay", "3600",
        "--projection-interval", "3600",
    )


def test_a_full_disk_turns_read_only_and_sys_resume_recovers(small_disk: Path, sock_dir: Path) -> None:
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # room we can give back later
        f.write(b"\0" * FILLER_BYTES)
        os.fsync(f.fileno())
    daemon = _daemon(small_disk, sock_dir).start()
    acked: dict[str, int] = {}
    refused: list[str] = []
    try:
        with Client(daemon.socket_path, timeout=CALL_TIMEOUT) as client:
            for i in range(DISK_BYTES // len(VALUE) + 10):  # more than fits
                try:
                    client.call("persistent.remember", key=f"k{i}", value={"n": i, "pad": VALUE})
                except ReadOnly as exc:
                    assert "No space left" in exc.message
                    refused.append(f"k{i}")
                    break
                acked[f"k{i}"] = i
            assert refused, "the disk never filled up"
            with pytest.raises(ReadOnly):
                client.call("persistent.remember", key="refused-too", value=1)
            refused.append("refused-too")

            # reads keep working; sys.stats says read-only and why
            assert client.call("persistent.recall", key="k0")["value"]["n"] == 0
            assert client.call("persistent.recall", key=refused[0]) is None
            stats = client.stats()
            assert stats["read_only"] is True and "No space left" in stats["journal"]["failed"]
            assert client.ping()

            filler.unlink()  # the operator frees space
            resumed = client.resume()
            assert resumed["resumed"] is True and "No space left" in resumed["was"]
            assert client.stats()["read_only"] is False
            for i in range(3):
                client.call("persistent.remember", key=f"after{i}", value={"n": i})
                acked[f"after{i}"] = i
        # stderr is read by a thread of the test: wait for the line rather than race it
        assert daemon.wait_for_output("journal resumed", CALL_TIMEOUT) and "read-only" in daemon.output

        daemon.kill()  # kill -9: only the journal carries the writes
        daemon = _daemon(small_disk, sock_dir).start()
        with Client(daemon.socket_path, timeout=CALL_TIMEOUT) as client:
            assert client.stats()["read_only"] is False
            for key, n in acked.items():
                record = client.call("persistent.recall", key=key)
                assert record is not None and record["value"]["n"] == n, key
            for key in refused:
                assert client.call("persistent.recall", key=key) is None, key
            assert sorted(client.call("persistent.keys", prefix="")["keys"]) == sorted(acked)
        assert daemon.terminate() == 0
    finally:
        daemon.kill()
