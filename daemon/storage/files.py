"""The file-system layer under the journal and the snapshots.

Rule kept here: nothing is durable until it was synced. Written bytes count only after the file's
datasync; a created, renamed or unlinked name counts only after an fsync of its folder. RealFiles
passes the operations to the OS; tests use a fake layer that can crash (tests/fakefiles.py).
And nothing is for other users: files are created 0600 (folders 0700 under the daemon's umask,
PRIVATE_UMASK); `make_private` takes group and other permissions off an existing tree, never off a
folder others share (`unsafe_root_reason` refuses such a folder as a data root).

All operations are blocking; trio code runs them in `trio.to_thread.run_sync`.
"""

from __future__ import annotations

import abc
import errno as _errno
import logging
import os
import secrets
import stat
import typing
from collections.abc import Iterable
from typing import Any, Union

_log = logging.getLogger("eurekamem.files")


__all__ = [
    "PRIVATE_UMASK",
    "AppendFile",
    "FileLayer",
    "RealFiles",
    "atomic_write",
    "make_private",
    "unsafe_root_reason",
    "write_unless_same",
    "open_private",
]


PRIVATE_UMASK = 0o077  # the daemon's umask: what it creates is 0700 (folders) or 0600 (files)


StrPath = Union[str, "os.PathLike[str]"]


class AppendFile(abc.ABC):
    """A file opened for appending. `write` writes everything or raises OSError."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Current size in bytes (durable or not)."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Append all of `data` (one call; loops over short writes)."""

    @abc.abstractmethod
    def datasync(self) -> None:
        """Make the written bytes durable (fdatasync)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the handle; idempotent. Does not sync."""

    def fileno(self) -> int | None:
        """The OS file descriptor, for a sync made elsewhere (the kernel's); None when there is none."""
        return None

    def __enter__(self) -> AppendFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileLayer(abc.ABC):
    """The operations the journal and the snapshots need. Paths are str or PathLike."""

    @abc.abstractmethod
    def open_append(self, path: StrPath) -> AppendFile:
        """Open (creating if missing) a file for appending. A new name is durable only after
        `fsync_dir` of its folder."""

    @abc.abstractmethod
    def read_bytes(self, path: StrPath) -> bytes:
        """The whole content of a file as currently visible."""

    @abc.abstractmethod
    def truncate(self, path: StrPath, size: int) -> None:
        """Cut a file to `size` bytes and make the new size durable (ftruncate + fsync)."""

    @abc.abstractmethod
    def rename(self, src: StrPath, dst: StrPath) -> None:
        """Atomically replace `dst` by `src`; durable after `fsync_dir` of the folder(s)."""

    @abc.abstractmethod
    def unlink(self, path: StrPath) -> None:
        """Remove a file; durable after `fsync_dir` of its folder."""

    @abc.abstractmethod
    def listdir(self, directory: StrPath) -> list[str]:
        """Names in a folder, sorted."""

    @abc.abstractmethod
    def makedirs(self, directory: StrPath) -> None:
        """Create a folder and its missing parents (no error if it exists)."""

    @abc.abstractmethod
    def fsync_dir(self, directory: StrPath) -> None:
        """Make the folder's entries (creations, renames, unlinks) durable."""

    @abc.abstractmethod
    def exists(self, path: StrPath) -> bool:
        """Whether a file or folder exists at `path`."""


class _RealAppendFile(AppendFile):
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_APPEND | os.O_CREAT | os.O_WRONLY | _O_CLOEXEC, 0o600)
        try:
            self._size = os.fstat(self._fd).st_size
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def size(self) -> int:
        return self._size

    def _require_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: file is closed")
        return self._fd

    def write(self, data: bytes) -> None:
        fd = self._require_fd()
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:  # pragma: no cover - os.write raises instead on Linux
                raise OSError(_errno.EIO, "short write of 0 bytes", self.path)
            self._size += n
            view = view[n:]

    def datasync(self) -> None:
        fd = self._require_fd()
        _fdatasync(fd)

    def fileno(self) -> int | None:
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class RealFiles(FileLayer):
    """The real file system through os.* calls."""

    def open_append(self, path: StrPath) -> AppendFile:
        return _RealAppendFile(os.fspath(path))

    def read_bytes(self, path: StrPath) -> bytes:
        with open(os.fspath(path), "rb") as f:
            return f.read()

    def truncate(self, path: StrPath, size: int) -> None:
        fd = os.open(os.fspath(path), os.O_WRONLY | _O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: StrPath, dst: StrPath) -> None:
        os.replace(os.fspath(src), os.fspath(dst))

    def unlink(self, path: StrPath) -> None:
        os.unlink(os.fspath(path))

    def listdir(self, directory: StrPath) -> list[str]:
        return sorted(os.listdir(os.fspath(directory)))

    def makedirs(self, directory: StrPath) -> None:
        os.makedirs(os.fspath(directory), exist_ok=True)

    def fsync_dir(self, directory: StrPath) -> None:
        fd = os.open(os.fspath(directory) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self, path: StrPath) -> bool:
        return os.path.exists(os.fspath(path))


def atomic_write(fs: FileLayer, path: StrPath, data: bytes | Iterable[bytes], *, sync: bool = True) -> None:
    """Replace `path` by `data` so that a crash leaves either the old or the new content.

    Writes a temporary file in the same folder, datasyncs it, renames it over `path` and fsyncs
    the folder. On error the temporary file is removed (best effort) and the error re-raised.
    With sync=False nothing is synced (readers still never see half a file): the caller makes it
    durable later (sync_files), and until then a crash may leave the old content or an empty file.
    """
    p = os.fspath(path)
    folder, name = os.path.split(p)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    f = fs.open_append(tmp)
    try:
        try:
            chunks: Iterable[bytes] = [data] if isinstance(data, bytes) else data
            for chunk in chunks:
                f.write(chunk)
            if sync:
                f.datasync()
        finally:
            f.close()
        fs.rename(tmp, p)
    except BaseException:
        try:
            fs.unlink(tmp)
        except OSError as exc:  # the original error matters more; a stray temp file is harmless
            _log.warning("could not remove the temporary file %s: %s", tmp, exc)
        raise
    if sync:
        fs.fsync_dir(folder or ".")


def sync_files(paths: Iterable[StrPath]) -> None:
    """Make files written with atomic_write(sync=False), and removals, durable: fsync each file
    that still exists, then each folder once. An OSError other than a missing file is raised."""
    folders: set[str] = set()
    for path in paths:
        p = os.fspath(path)
        folders.add(os.path.dirname(p) or ".")
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue  # removed or moved since: its folder's fsync below makes that durable
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in sorted(folders):
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)




def open_private(path: StrPath, mode: str = "wb", encoding: str | None = None) -> typing.IO[Any]:
    """open(path, mode) for writing a new file that only its owner may read (0600 whatever the
    umask): backups, exports. Truncates an existing file (and makes it 0600 too)."""
    p = os.fspath(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def write_unless_same(fs: FileLayer, path: StrPath, data: bytes) -> bool:
    """atomic_write, unless `path` already holds exactly `data`: then it is only synced (it may be
    another program's unsynced write) and left as it is, mtime and inode included. True when written.
    For the files other programs read and watch (EurekaClaw's persistent.json and knowledge_graph.json)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        atomic_write(fs, path, data)
        return True
    try:
        same = os.fstat(fd).st_size == len(data) and _read_all(fd) == data
        if same:
            os.fsync(fd)
    finally:
        os.close(fd)
    if not same:
        atomic_write(fs, path, data)
    return not same


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def unsafe_root_reason(root: StrPath) -> str | None:
    """Why `root` must not be a data root, or None when it may be (a missing root may: the daemon
    makes it). A data root is one user's private folder; a folder others share is refused: sticky
    (as /tmp is), writable by every user, or owned by another user. The daemon would otherwise
    tighten the permissions of other programs' files (a stand-in for /tmp went 1777 -> 1700)."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & stat.S_ISVTX:
        return f"it is a shared folder (sticky bit set, mode {stat.filemode(st.st_mode)}), as /tmp is"
    if st.st_mode & stat.S_IWOTH:
        return f"every user may write it (mode {stat.filemode(st.st_mode)})"
    return None


def _shared_folder(st: os.stat_result) -> bool:
    """A folder the tightening never changes nor enters: another user's, sticky, or world-writable."""
    return st.st_uid != os.geteuid() or bool(st.st_mode & (stat.S_ISVTX | stat.S_IWOTH))


def make_private(root: StrPath, *, only: Iterable[str] | None = None) -> int:
    """Take group and other permissions off `root` and everything under it (folders 0700 at most,
    files 0600 at most). Returns how many were changed. A missing root is not an error (nothing to do).

    Never changed and never entered: symbolic links, and folders that are another user's, sticky or
    world-writable (a shared folder inside is left as it is, with what it holds); files of another
    user are left too. With `only` (names of entries of `root`), just those entries' trees are
    tightened, not `root` itself nor its other entries: a folder the daemon did not make keeps what
    other programs keep there."""
    changed = 0
    top = os.fspath(root)
    if not os.path.isdir(top):
        return 0
    starts = [top] if only is None else [os.path.join(top, name) for name in only]
    for start in starts:
        try:
            if _shared_folder(os.lstat(start)) or not os.path.isdir(start) or os.path.islink(start):
                continue
        except FileNotFoundError:
            continue
        for folder, dirs, files in os.walk(start):
            for name in [None, *files]:
                path = folder if name is None else os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:  # removed meanwhile
                    continue
                if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077 or st.st_uid != os.geteuid():
                    continue
                if name is None and _shared_folder(st):
                    continue  # os.walk's listing below only: the folder itself is not entered (dirs filter)
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
                changed += 1
            kept = []
            for d in dirs:
                try:
                    st = os.lstat(os.path.join(folder, d))
                except FileNotFoundError:
                    continue
                if not stat.S_ISLNK(st.st_mode) and not _shared_folder(st):
                    kept.append(d)
            dirs[:] = kept
    return changed
