"""The file layer: RealFiles against the OS, FakeFiles' durability model and its crashes."""

from __future__ import annotations

import errno
import os
import random

import pytest

from eurekamem.daemon.storage.files import FileLayer, RealFiles, atomic_write
from fakefiles import FakeFiles


def _put(fs: FileLayer, path: str, data: bytes, *, sync: bool = True) -> None:
    f = fs.open_append(path)
    f.write(data)
    if sync:
        f.datasync()
    f.close()


# --- behaviour both layers share -------------------------------------------------------------


@pytest.fixture(params=["real", "fake"])
def layer(request, tmp_path) -> tuple[FileLayer, str]:
    if request.param == "real":
        return RealFiles(), str(tmp_path)
    fs = FakeFiles()
    fs.makedirs("/data")
    return fs, "/data"


def test_common_operations(layer) -> None:
    fs, root = layer
    d = os.path.join(root, "a", "b")
    assert not fs.exists(d)
    fs.makedirs(d)
    fs.makedirs(d)  # exists already: fine
    assert fs.exists(d)
    p = os.path.join(d, "f.log")
    f = fs.open_append(p)
    assert f.size == 0
    f.write(b"hello ")
    f.write(memoryview(b"world"))
    assert f.size == 11
    f.datasync()
    f.close()
    f.close()  # idempotent
    with pytest.raises(ValueError):
        f.write(b"x")
    g = fs.open_append(p)  # appends to what is there
    assert g.size == 11
    g.write(b"!")
    g.close()
    assert fs.read_bytes(p) == b"hello world!"
    fs.truncate(p, 5)
    assert fs.read_bytes(p) == b"hello"
    fs.fsync_dir(d)
    q = os.path.join(d, "g.log")
    _put(fs, q, b"other")
    fs.rename(q, p)
    assert fs.read_bytes(p) == b"other"
    assert fs.listdir(d) == ["f.log"]
    fs.unlink(p)
    assert fs.listdir(d) == []
    assert not fs.exists(p)
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(p)
    with pytest.raises(FileNotFoundError):
        fs.unlink(p)
    with pytest.raises(FileNotFoundError):
        fs.listdir(os.path.join(root, "missing"))


def test_atomic_write_both(layer) -> None:
    fs, root = layer
    p = os.path.join(root, "snap.json")
    atomic_write(fs, p, b"one")
    atomic_write(fs, p, b"two")
    assert fs.read_bytes(p) == b"two"
    assert fs.listdir(root) == ["snap.json"]  # no temp file left behind


# --- FakeFiles' durability model -------------------------------------------------------------


def test_unsynced_bytes_are_lost_at_a_crash() -> None:
    fs = FakeFiles()
    fs.makedirs("/d")
    fs.fsync_dir("/")
    f = fs.open_append("/d/f")
    f.write(b"durable")
    f.datasync()
    fs.fsync_dir("/d")
    f.write(b"-volatile")
    assert fs.read_bytes("/d/f") == b"durable-volatile"
    assert fs.durable_bytes("/d/f") == b"durable"
    after = fs.crash()
    assert after.read_bytes("/d/f") == b"durable"
    # the old one is untouched and the crash copy is independent
    assert fs.read_bytes("/d/f") == b"durable-volatile"
    after.open_append("/d/f").write(b"X")
    assert fs.read_bytes("/d/f") == b"durable-volatile"


def test_a_new_name_needs_fsync_dir() -> None:
    fs = FakeFiles()
    fs.makedirs("/d")
    fs.fsync_dir("/")
    _put(fs, "/d/new", b"data")  # content synced, name not
    assert not fs.crash().exists("/d/new")
    fs.fsync_dir("/d")
    assert fs.crash().read_bytes("/d/new") == b"data"


def test_a_new_folder_needs_fsync_of_its_parent() -> None:
    fs = FakeFiles()
    fs.makedirs("/d/e")
    assert not fs.crash().exists("/d")
    fs.fsync_dir("/")
    assert fs.crash().exists("/d") and not fs.crash().exists("/d/e")
    fs.fsync_dir("/d")
    assert fs.crash().exists("/d/e")


def test_rename_and_unlink_revert_without_fsync_dir() -> None:
    fs = FakeFiles()
    fs.makedirs("/d")
    fs.fsync_dir("/")
    _put(fs, "/d/a", b"A")
    _put(fs, "/d/b", b"B")
    fs.fsync_dir("/d")
    fs.rename("/d/a", "/d/b")
    crashed = fs.crash()
    assert crashed.read_bytes("/d/a") == b"A" and crashed.read_bytes("/d/b") == b"B"
    fs.fsync_dir("/d")
    crashed = fs.crash()
    assert crashed.listdir("/d") == ["b"] and crashed.read_bytes("/d/b") == b"A"
    fs.unlink("/d/b")
    assert fs.crash().listdir("/d") == ["b"]
    fs.fsync_dir("/d")
    assert fs.crash().listdir("/d") == []


def test_truncate_is_durable() -> None:
    fs = FakeFiles()
    _put(fs, "/f", b"0123456789", sync=False)
    fs.fsync_dir("/")
    fs.truncate("/f", 4)
    assert fs.crash().read_bytes("/f") == b"0123"


def test_atomic_write_crash_leaves_old_or_new() -> None:
    fs = FakeFiles()
    atomic_write(fs, "/snap", b"old")
    for seed in range(30):
        state = fs.crash()
        state.fail("fsync_dir", errno.EIO)
        with pytest.raises(OSError):
            atomic_write(state, "/snap", b"new")  # renamed, folder never fsynced
        seen = state.crash(random.Random(seed)).read_bytes("/snap")
        assert seen in (b"old", b"new")
    assert fs.crash().read_bytes("/snap") == b"old"


def test_torn_crash_keeps_a_prefix_of_unsynced_bytes() -> None:
    fs = FakeFiles()
    _put(fs, "/f", b"AAAA")
    fs.fsync_dir("/")
    f = fs.open_append("/f")
    f.write(b"BBBBBBBB")
    lengths = set()
    for seed in range(50):
        data = fs.crash(random.Random(seed)).read_bytes("/f")
        assert data.startswith(b"AAAA") and b"BBBBBBBB".startswith(data[4:])
        lengths.add(len(data))
        zeroed = fs.crash(random.Random(seed), zero_fill=True).read_bytes("/f")
        assert zeroed[:4] == b"AAAA" and set(zeroed[4:]) <= {0}
    assert len(lengths) > 3
    assert fs.crash(random.Random(0)).crash().read_bytes("/f") == fs.crash(random.Random(0)).read_bytes("/f")


def test_torn_crash_keeps_a_prefix_of_folder_changes() -> None:
    fs = FakeFiles()
    for name in "abc":
        _put(fs, f"/{name}", name.encode())
    outcomes = {tuple(fs.crash(random.Random(seed)).listdir("/")) for seed in range(60)}
    assert outcomes == {(), ("a",), ("a", "b"), ("a", "b", "c")}


def test_injected_failures() -> None:
    fs = FakeFiles()
    f = fs.open_append("/f")
    fs.fail("write", errno.ENOSPC, after=1, partial=3)
    f.write(b"ok")
    with pytest.raises(OSError) as info:
        f.write(b"abcdef")
    assert info.value.errno == errno.ENOSPC
    assert fs.read_bytes("/f") == b"okabc"  # a short write landed before the error
    with pytest.raises(OSError):
        f.write(b"again")  # every later write fails too, each landing its 3 bytes
    fs.fail("sync", errno.EIO)
    with pytest.raises(OSError) as info:
        f.datasync()
    assert info.value.errno == errno.EIO
    assert fs.durable_bytes("/f") == b""
    fs.fail("fsync_dir", errno.EIO)
    with pytest.raises(OSError):
        fs.fsync_dir("/")
    fs.heal()
    f.write(b"!")
    f.datasync()
    fs.fsync_dir("/")
    assert fs.crash().read_bytes("/f") == b"okabcaga!"
    assert fs.stats == {"write": 4, "datasync": 2, "fsync_dir": 2}
    with pytest.raises(ValueError):
        fs.fail("read")  # type: ignore[arg-type]
