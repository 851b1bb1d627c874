"""`eurekamem backup` and `eurekamem restore`: a consistent archive of a running daemon's data root.

Why `backup` is consistent while the daemon keeps writing
--------------------------------------------------------
The daemon's files change in exactly three ways: (1) a snapshot replaces persistent.json,
knowledge_graph.json, memories.snapshot, vectors/* and the memory files by atomic rename (a new
inode; an old file is never changed in place), then writes journal/checkpoint.json naming the
sequence number C they cover, and only then deletes the journal segments that hold seq <= C;
(2) the journal only grows at the end of its last segment; (3) the memory projector rewrites .md
files (by rename) for memories whose newest version is in the journal.

backup asks for a snapshot (sys.snapshot), then records the identity (inode, size, mtime) of the
checkpoint and of every snapshot file, copies them (checkpoint first), then the .md files, then
the journal segments (each one up to the size it had when opened: a prefix of what the daemon
wrote, possibly ending in a torn record, which recovery cuts off as after a crash). Afterwards it
checks the identities again. If none changed, no snapshot completed during the copy, so the
copied snapshot files are exactly the generation named by the copied checkpoint C, and no segment
holding seq > C can have been deleted, so the copied segments hold every record from C + 1 to
their end. Restoring therefore recovers to exactly the state the daemon had at the last copied
record: the snapshot, plus the journal replayed past C. (Replay past the checkpoint is idempotent:
every journal record sets a whole record, node, edge or memory, so replaying it over a state that
already has it changes nothing.) If an identity changed, a snapshot raced the copy and the
archive is written again (a few attempts). .md files copied at any moment are rewritten on the
restored daemon's first start for every memory the journal touched past C.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any, TextIO

from .common import Progress, connect, effective_config, fail

log = logging.getLogger("eurekamem.admin")


BACKUP_MANIFEST = "eurekamem-backup.json"


BACKUP_ATTEMPTS = 5


BACKUP_TREES = ("memory", "memories", "skills")


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _snapshot_files(root: Path) -> list[Path]:
    """The checkpoint first, then every snapshot file (not the journal segments, not LOCK)."""
    memory = root / "memory"
    out = [memory / "journal" / "checkpoint.json"]
    if memory.is_dir():
        for path in sorted(memory.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            relative = path.relative_to(memory)
            if relative.parts[0] == "journal" or _is_temporary(path.name):
                continue
            out.append(path)
    return out


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _tree_files(root: Path, tree: str) -> list[Path]:
    base = root / tree
    if not base.is_dir():
        return []
    return [p for p in sorted(base.rglob("*")) if p.is_file() and not p.is_symlink() and not _is_temporary(p.name)]


def segment_files(root: Path) -> list[Path]:
    journal = root / "memory" / "journal"
    if not journal.is_dir():
        return []
    return sorted(p for p in journal.iterdir() if re.fullmatch(r"\d{20}\.log", p.name))


class _Raced(Exception):
    """A snapshot replaced files while they were being copied: copy again."""


def _add_file(tar: tarfile.TarFile, root: Path, path: Path, progress: Progress) -> int:
    """Add `path` as it is now (the size it had when opened: growing journals give a prefix)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return -1
    with f:
        st = os.fstat(f.fileno())
        info = tarfile.TarInfo(path.relative_to(root).as_posix())
        info.size = st.st_size
        info.mtime = int(st.st_mtime)
        info.mode = st.st_mode & 0o777
        tar.addfile(info, f)
    progress.add(st.st_size)
    return st.st_size


def write_backup(root: Path, target: Path, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Write one tar (gzip when the name ends in .gz or .tgz) of the data root; see the module doc."""
    from ..daemon.storage.files import open_private
    compress = target.name.endswith((".gz", ".tgz"))
    for attempt in range(1, BACKUP_ATTEMPTS + 1):
        snapshot_files = _snapshot_files(root)
        before = {p: _identity(p) for p in snapshot_files}
        checkpoint = _read_checkpoint(root)
        others = [p for tree in BACKUP_TREES[1:] for p in _tree_files(root, tree)]
        segments = segment_files(root)
        total = sum((_identity(p) or (0, 0, 0))[1] for p in snapshot_files + others + segments)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        progress = Progress(total, "backup", progress_stream)
        try:
            with open_private(tmp) as raw, tarfile.open(fileobj=raw, mode="w:gz" if compress else "w") as tar:  # 0600
                manifest: dict[str, Any] = {"format": 1, "checkpoint_seq": checkpoint, "files": []}
                for path in snapshot_files:
                    if _add_file(tar, root, path, progress) < 0 and before[path] is not None:
                        raise _Raced(f"{path} disappeared")
                    if before[path] is not None:
                        manifest["files"].append(path.relative_to(root).as_posix())
                for path in others:  # .md files, _index.json, skills: rewritten by rename, any version will do
                    if _add_file(tar, root, path, progress) >= 0:
                        manifest["files"].append(path.relative_to(root).as_posix())
                copied = []
                for path in segments:
                    if _add_file(tar, root, path, progress) < 0:
                        raise _Raced(f"journal segment {path.name} was dropped")
                    copied.append(path.name)
                    manifest["files"].append(path.relative_to(root).as_posix())
                after = {p: _identity(p) for p in snapshot_files}
                if after != before or _read_checkpoint(root) != checkpoint:
                    raise _Raced("a snapshot was written during the copy")
                if copied and int(copied[0][:20]) > checkpoint + 1:
                    raise _Raced(f"the journal starts at seq {int(copied[0][:20])}, after the checkpoint's {checkpoint} + 1")
                manifest["journal_segments"] = copied
                manifest["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                data = json.dumps(manifest, indent=2).encode()
                info = tarfile.TarInfo(BACKUP_MANIFEST)
                info.size = len(data)
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
            progress.close()
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
            manifest["attempts"] = attempt
            manifest["bytes"] = target.stat().st_size
            return manifest
        except _Raced as exc:
            progress.close()
            log.info("backup attempt %d: %s; copying again", attempt, exc)
            tmp.unlink(missing_ok=True)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    raise RuntimeError(f"snapshots kept replacing the files during {BACKUP_ATTEMPTS} attempts; try again when the daemon is quieter")


def _read_checkpoint(root: Path) -> int:
    path = root / "memory" / "journal" / "checkpoint.json"
    try:
        return int(json.loads(path.read_bytes())["seq"])
    except FileNotFoundError:
        return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from ..client import ConnectionLost, EurekamemError

    target = Path(args.path).expanduser()
    if not target.name.endswith((".tar", ".tar.gz", ".tgz")):
        return fail(f"{target}: the archive's name must end in .tar, .tar.gz or .tgz")
    if not target.parent.is_dir():
        return fail(f"{target.parent} is not a folder")
    try:
        with connect(args) as client:
            seq = client.call("sys.snapshot", {})["seq"]
            root = Path(client.call("sys.stats", {})["data_dir"])
    except BrokenPipeError:  # stdout's reader went away, not the daemon: main() ends quietly
        raise
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return fail(f"backup needs the running daemon (for a snapshot): {exc}")
    try:
        manifest = write_backup(root, target)
    except (OSError, RuntimeError) as exc:
        return fail(f"backup failed: {exc}")
    print(
        f"wrote {target} ({manifest['bytes']:,} bytes, {len(manifest['files'])} files) from {root}: "
        f"snapshot at seq {seq}, checkpoint {manifest['checkpoint_seq']}, journal segments {len(manifest['journal_segments'])}"
    )
    return 0


def restore_backup(archive: Path, target: Path, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Unpack a backup into `target`, which must be empty or absent. Returns the manifest."""
    from ..daemon.storage.files import make_private
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} is not an empty folder; restore only into an empty data root")
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        manifest: dict[str, Any] = {}
        chosen = []
        for member in members:
            name = member.name
            if name == BACKUP_MANIFEST:
                manifest = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
                continue
            parts = Path(name).parts
            if not parts or parts[0] not in BACKUP_TREES or ".." in parts or name.startswith("/"):
                raise ValueError(f"{archive}: unexpected member {name!r}; not an eurekamem backup")
            if not (member.isfile() or member.isdir()):
                raise ValueError(f"{archive}: member {name!r} is not a plain file")
            chosen.append(member)
        if not manifest:
            raise ValueError(f"{archive}: no {BACKUP_MANIFEST}; not an eurekamem backup (or a truncated one)")
        target.mkdir(parents=True, exist_ok=True)
        progress = Progress(sum(m.size for m in chosen), "restore", progress_stream)
        for member in chosen:
            tar.extract(member, target, filter="data")
            progress.add(member.size)
        progress.close()
    (target / "memory" / "journal").mkdir(parents=True, exist_ok=True)
    make_private(target)  # as the daemon keeps its root: 0700 folders, 0600 files
    return manifest


def cmd_restore(args: argparse.Namespace) -> int:
    from ..daemon.config import ConfigError

    archive = Path(args.path).expanduser()
    if not archive.is_file():
        return fail(f"{archive} does not exist")
    try:
        target = Path(effective_config(args, ("data_dir",))["data_dir"])
    except ConfigError as exc:
        return fail(str(exc))
    try:
        manifest = restore_backup(archive, target)
    except (ValueError, OSError, tarfile.TarError) as exc:
        return fail(f"restore failed: {exc}")
    print(
        f"restored {len(manifest.get('files', []))} files into {target} (checkpoint seq {manifest.get('checkpoint_seq')}, "
        f"backup written {manifest.get('written_at')}); start it with: eurekamem serve --data-dir {target}"
    )
    return 0


