"""FakeFiles: an in-memory file layer that can crash, for the journal and snapshot tests.

Rule kept here: nothing is durable until it was synced. FakeFiles keeps both views (what the
process sees and what a disk would keep) and `crash()` returns what a machine would find after
losing power (the durable view, optionally plus a random prefix of what was still in flight), so
tests can check the ordering of writes, syncs and renames.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import posixpath
import random
import threading
from collections.abc import Iterable
from typing import Literal

from eurekamem.daemon.storage.files import AppendFile, FileLayer, StrPath

_log = logging.getLogger("eurekamem.files")


class _Inode:
    """A file's content: `data` as visible now, `durable` the prefix that survives a crash."""

    __slots__ = ("data", "durable")

    def __init__(self, data: bytes = b"") -> None:
        self.data = bytearray(data)
        self.durable = len(data)  # invariant: data[:durable] is what the disk holds


class _Dir:
    """A folder: `durable` entries plus the not yet fsynced changes, in order."""

    __slots__ = ("durable", "pending", "current")

    def __init__(self) -> None:
        self.durable: dict[str, _Inode | _Dir] = {}
        # each change is applied atomically: ((name, node or None for removal), ...)
        self.pending: list[tuple[tuple[str, _Inode | _Dir | None], ...]] = []
        self.current: dict[str, _Inode | _Dir] = {}

    def change(self, *edits: tuple[str, _Inode | _Dir | None]) -> None:
        self.pending.append(edits)
        _apply(self.current, edits)

    def sync(self) -> None:
        self.durable = dict(self.current)
        self.pending.clear()


def _apply(entries: dict[str, _Inode | _Dir], edits: Iterable[tuple[str, _Inode | _Dir | None]]) -> None:
    for name, node in edits:
        if node is None:
            entries.pop(name, None)
        else:
            entries[name] = node


def _enoent(path: str) -> OSError:
    return FileNotFoundError(_errno.ENOENT, os.strerror(_errno.ENOENT), path)


FailOp = Literal["write", "sync", "fsync_dir"]


class _FakeAppendFile(AppendFile):
    def __init__(self, fs: FakeFiles, path: str, inode: _Inode) -> None:
        self._fs = fs
        self.path = path
        self._inode = inode
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._inode.data)

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: file is closed")

    def write(self, data: bytes) -> None:
        self._check()
        with self._fs._lock:
            self._fs.stats["write"] += 1
            err = self._fs._should_fail("write")
            if err is not None:
                keep = min(self._fs._partial_write, len(data))
                self._inode.data += bytes(data[:keep])
                raise OSError(err, os.strerror(err), self.path)
            self._inode.data += bytes(data)

    def datasync(self) -> None:
        self._check()
        with self._fs._lock:
            self._fs.stats["datasync"] += 1
            err = self._fs._should_fail("sync")
            if err is not None:
                raise OSError(err, os.strerror(err), self.path)
            self._inode.durable = len(self._inode.data)

    def close(self) -> None:
        self._closed = True


class FakeFiles(FileLayer):
    """An in-memory file system that knows what is durable, for crash tests.

    - Bytes written to a file are durable after `datasync` of a handle on it; `truncate` is
      durable at once (it syncs, like RealFiles.truncate).
    - A name created, renamed or unlinked is durable after `fsync_dir` of its folder; the same
      holds for a folder made by `makedirs` (fsync its parent). "/" always exists.
    - `crash(rng)` returns a new FakeFiles with only the durable state. With a seeded
      random.Random, each file also keeps a random prefix of its unsynced bytes (a torn write;
      optionally zero-filled as some file systems leave them), and each folder keeps a random
      prefix of its un-fsynced changes (metadata reaches the disk in order, but maybe early).
    - `fail(op, err)` makes later operations raise OSError(err): "write" (optionally landing a
      few bytes of the failing write first, like a short write on a full disk), "sync"
      (datasync) or "fsync_dir". `heal()` clears the failures.
    - `stats` counts writes, datasyncs and fsync_dirs, for tests of group commit.

    Thread-safe (one lock); relative paths are taken relative to "/".
    """

    def __init__(self) -> None:
        self._root = _Dir()
        self._lock = threading.RLock()
        self._failures: dict[str, tuple[int, int]] = {}  # op -> (errno, successes left)
        self._partial_write = 0
        self.stats: dict[str, int] = {"write": 0, "datasync": 0, "fsync_dir": 0}

    # -- failure injection ------------------------------------------------------------------

    def fail(self, op: FailOp, err: int = _errno.EIO, *, after: int = 0, partial: int = 0) -> None:
        """Let `after` more `op` calls succeed, then make every later one raise OSError(err).

        For "write", `partial` bytes of each failing write are appended before the error.
        """
        if op not in ("write", "sync", "fsync_dir"):
            raise ValueError(f"unknown operation {op!r}")
        self._failures[op] = (err, after)
        if op == "write":
            self._partial_write = partial

    def heal(self) -> None:
        """Stop injecting failures."""
        self._failures.clear()
        self._partial_write = 0

    def _should_fail(self, op: str) -> int | None:
        spec = self._failures.get(op)
        if spec is None:
            return None
        err, left = spec
        if left > 0:
            self._failures[op] = (err, left - 1)
            return None
        return err

    # -- paths ------------------------------------------------------------------------------

    @staticmethod
    def _norm(path: StrPath) -> str:
        p = os.fspath(path)
        if not isinstance(p, str):
            raise TypeError("FakeFiles takes str paths")
        return posixpath.normpath(posixpath.join("/", p))

    def _lookup_dir(self, path: str) -> _Dir:
        node: _Inode | _Dir = self._root
        for part in path.split("/"):
            if not part:
                continue
            if not isinstance(node, _Dir):
                raise NotADirectoryError(_errno.ENOTDIR, os.strerror(_errno.ENOTDIR), path)
            nxt = node.current.get(part)
            if nxt is None:
                raise _enoent(path)
            node = nxt
        if not isinstance(node, _Dir):
            raise NotADirectoryError(_errno.ENOTDIR, os.strerror(_errno.ENOTDIR), path)
        return node

    def _parent(self, path: str) -> tuple[_Dir, str]:
        head, name = posixpath.split(path)
        if not name:
            raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), path)
        return self._lookup_dir(head), name

    def _lookup_file(self, path: str) -> _Inode:
        parent, name = self._parent(path)
        node = parent.current.get(name)
        if node is None:
            raise _enoent(path)
        if isinstance(node, _Dir):
            raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), path)
        return node

    # -- FileLayer --------------------------------------------------------------------------

    def open_append(self, path: StrPath) -> AppendFile:
        p = self._norm(path)
        with self._lock:
            parent, name = self._parent(p)
            node = parent.current.get(name)
            if isinstance(node, _Dir):
                raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), p)
            if node is None:
                node = _Inode()
                parent.change((name, node))
            return _FakeAppendFile(self, p, node)

    def read_bytes(self, path: StrPath) -> bytes:
        p = self._norm(path)
        with self._lock:
            return bytes(self._lookup_file(p).data)

    def truncate(self, path: StrPath, size: int) -> None:
        p = self._norm(path)
        if size < 0:
            raise OSError(_errno.EINVAL, os.strerror(_errno.EINVAL), p)
        with self._lock:
            inode = self._lookup_file(p)
            err = self._should_fail("sync")
            if len(inode.data) > size:
                del inode.data[size:]
            else:
                inode.data += bytes(size - len(inode.data))
            if err is not None:
                inode.durable = min(inode.durable, size)
                raise OSError(err, os.strerror(err), p)
            inode.durable = size

    def rename(self, src: StrPath, dst: StrPath) -> None:
        s, d = self._norm(src), self._norm(dst)
        with self._lock:
            sparent, sname = self._parent(s)
            node = sparent.current.get(sname)
            if node is None:
                raise _enoent(s)
            dparent, dname = self._parent(d)
            if isinstance(dparent.current.get(dname), _Dir):
                raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), d)
            if s == d:
                return
            if sparent is dparent:
                sparent.change((sname, None), (dname, node))
            else:
                dparent.change((dname, node))
                sparent.change((sname, None))

    def unlink(self, path: StrPath) -> None:
        p = self._norm(path)
        with self._lock:
            parent, name = self._parent(p)
            node = parent.current.get(name)
            if node is None:
                raise _enoent(p)
            if isinstance(node, _Dir):
                raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), p)
            parent.change((name, None))

    def listdir(self, directory: StrPath) -> list[str]:
        p = self._norm(directory)
        with self._lock:
            return sorted(self._lookup_dir(p).current)

    def makedirs(self, directory: StrPath) -> None:
        p = self._norm(directory)
        with self._lock:
            node = self._root
            for part in p.split("/"):
                if not part:
                    continue
                nxt = node.current.get(part)
                if nxt is None:
                    nxt = _Dir()
                    node.change((part, nxt))
                elif not isinstance(nxt, _Dir):
                    raise FileExistsError(_errno.EEXIST, os.strerror(_errno.EEXIST), p)
                node = nxt

    def fsync_dir(self, directory: StrPath) -> None:
        p = self._norm(directory)
        with self._lock:
            d = self._lookup_dir(p)
            self.stats["fsync_dir"] += 1
            err = self._should_fail("fsync_dir")
            if err is not None:
                raise OSError(err, os.strerror(err), p)
            d.sync()

    def exists(self, path: StrPath) -> bool:
        p = self._norm(path)
        with self._lock:
            try:
                parent, name = self._parent(p)
            except IsADirectoryError:
                return True  # "/"
            except OSError:
                return False
            return name in parent.current

    # -- inspection and crashes -------------------------------------------------------------

    def durable_bytes(self, path: StrPath) -> bytes:
        """The synced prefix of a file's content (ignores whether its name is durable)."""
        p = self._norm(path)
        with self._lock:
            inode = self._lookup_file(p)
            return bytes(inode.data[: inode.durable])

    def crash(self, rng: random.Random | None = None, *, zero_fill: bool = False) -> FakeFiles:
        """What a machine finds after losing power now, as a new FakeFiles (this one is left as
        it was). Without `rng` exactly the durable state; with it, also a random prefix of each
        file's unsynced bytes (zeros instead when `zero_fill`) and of each folder's un-fsynced
        changes."""
        with self._lock:
            new = FakeFiles()
            inodes: dict[int, _Inode] = {}

            def copy_dir(old: _Dir) -> _Dir:
                entries = dict(old.durable)
                if rng is not None and old.pending:
                    _apply_prefix(entries, old.pending, rng.randint(0, len(old.pending)))
                out = _Dir()
                for name in sorted(entries):
                    node = entries[name]
                    if isinstance(node, _Dir):
                        out.durable[name] = copy_dir(node)
                    else:
                        clone = inodes.get(id(node))
                        if clone is None:
                            clone = inodes[id(node)] = _Inode(_survivor(node, rng, zero_fill))
                        out.durable[name] = clone
                out.current = dict(out.durable)
                return out

            new._root = copy_dir(self._root)
            return new


def _apply_prefix(entries: dict[str, _Inode | _Dir], pending: list, n: int) -> None:
    for edits in pending[:n]:
        _apply(entries, edits)


def _survivor(inode: _Inode, rng: random.Random | None, zero_fill: bool) -> bytes:
    kept = bytes(inode.data[: inode.durable])
    unsynced = len(inode.data) - inode.durable
    if rng is None or unsynced <= 0:
        return kept
    n = rng.randint(0, unsynced)
    if zero_fill:
        return kept + bytes(n)
    return kept + bytes(inode.data[inode.durable : inode.durable + n])


