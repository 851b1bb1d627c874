"""Files that others write: a scan of memories/ turns another program's .md files into memories.

Rule kept here: a memory file that another program (EurekaClaw's SessionMemoryExtractor, a person
with an editor) wrote, changed or removed under `memories/<domain>/` becomes a journaled, embedded
change of tier 4 (new file: a memory; changed file: a new version; removed file: the memory
archived), and the daemon never rewrites or deletes such a file for it: the memory is committed
with `from_file`, which tells the projection that the file already shows it. The daemon's own
writes are not taken for edits: the projection reports every file it wrote (size, mtime, inode and
the SHA-256 of the bytes), and a scan reads only files whose (size, mtime_ns, inode) differ from
what it knows, then compares their hash. A file that cannot be read as a memory (not UTF-8, no
text) is reported (log, sys.stats) and left as it is, never deleted.

The scan stats what can have changed (see scan_tree: the folders, and the files changed lately) at
every watch_interval, and every file at every watch_full_interval; chosen over an inotify watcher
(watchfiles) by measurement, bench/README.md "Watching memories/". `Watcher` (what the scans know) is owned by the memory actor and touched only
while its projection lock is held, by a scan or by the projection; the scans' file reads and the
plans run in worker threads, the plans with the state lock (internal calls), as every state read.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ...protocol import Memory
from ..redact import redact_text
from ..storage.watched import FileSig, signature
from .format import (
    READABLE_FILES,
    derive_abstract,
    derive_overview,
    fingerprint,
    render_markdown,
)
from .projection import memory_from_text

if TYPE_CHECKING:
    from .state import MemoryState

log = logging.getLogger("eurekamem.memory")


# full scans take at most about 1/FULL_SCAN_FACTOR of the time: the next one is due after
# max(watch_full_interval, FULL_SCAN_FACTOR x the last one's duration)
FULL_SCAN_FACTOR = 50

PLAN_CHUNK = 256  # files planned per internal call (each is parsed with the state lock held)

MALFORMED_SHOWN = 20  # malformed files listed in sys.stats (all are counted)


HOT_SECONDS = 600.0  # a file changed this recently is stat-ed at every scan (see scan_tree)

RACY_SECONDS = 2.0  # a folder changed this recently is listed again at the next scan (mtime granularity)


@dataclass
class Tree:
    """What a scan saw: each folder's memory files (memories/<slug> and memories/<slug>/_archive:
    relative file -> signature), each folder's own signature, and each folder's hot files (changed
    in the last HOT_SECONDS). `looked` and `vanished` say what this scan looked at: the files it
    stat-ed, and those the previous scan saw that are gone."""

    files: dict[str, dict[str, FileSig]] = field(default_factory=dict)
    folders: dict[str, FileSig] = field(default_factory=dict)
    hot: dict[str, list[str]] = field(default_factory=dict)
    full: bool = True
    looked: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)

    def flat(self) -> dict[str, FileSig]:
        out: dict[str, FileSig] = {}
        for files in self.files.values():
            out.update(files)
        return out

    def count(self) -> int:
        return sum(len(files) for files in self.files.values())

    def sig(self, relative: str) -> FileSig | None:
        files = self.files.get(relative.rsplit("/", 1)[0])
        return files.get(relative) if files is not None else None

    def domain_folders(self) -> set[str]:
        return {folder for folder in self.folders if not folder.endswith("/_archive")}


def scan_tree(root: Path, before: Tree | None = None) -> Tree:
    """The memory files under root/memories (<slug>/*.md and <slug>/_archive/*.md, not MEMORY.md,
    GLOBAL.md or hidden files), relative to root, with their signatures.

    Without `before`, a full scan: every folder listed, every file stat-ed. With the last scan's
    Tree, only what can have changed: a folder whose signature changed (a file created, removed or
    renamed in it: editors that save by renaming, EurekaClaw's new insight files), or that changed
    less than RACY_SECONDS ago, is listed again; in the others only the hot files (changed in the
    last HOT_SECONDS) are stat-ed again. So a partial scan costs a stat per folder and per hot file,
    whatever the number of files; a file rewritten in place long after its last change is seen by
    the next full scan (the daemon runs one every watch_full_interval seconds)."""
    tree = Tree(full=before is None)
    base = root / "memories"
    now = time.time()
    try:
        domains = [entry for entry in os.scandir(base) if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")]
    except FileNotFoundError:
        domains = []
    for domain in domains:
        for relative, path in ((f"memories/{domain.name}", domain.path), (f"memories/{domain.name}/_archive", domain.path + "/_archive")):
            try:
                sig = signature(os.stat(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            tree.folders[relative] = sig
            old = before.files.get(relative) if before is not None else None
            if old is None or before is None or before.folders.get(relative) != sig or now - sig[1] / 1e9 < RACY_SECONDS:
                files = _list_folder(path, relative)
                tree.looked += files
                if old is not None:
                    tree.vanished += [f for f in old if f not in files]
                tree.hot[relative] = [f for f, file_sig in files.items() if now - file_sig[1] / 1e9 < HOT_SECONDS]
            else:
                files = old
                hot = []
                for file in before.hot.get(relative, ()):
                    try:
                        file_sig = signature(os.stat(root / file))
                    except FileNotFoundError:  # removed in place of... nothing: its folder would have changed
                        continue
                    if file_sig != files.get(file):
                        files = dict(files) if files is old else files
                        files[file] = file_sig
                    tree.looked.append(file)
                    if now - file_sig[1] / 1e9 < HOT_SECONDS:
                        hot.append(file)
                tree.hot[relative] = hot
            tree.files[relative] = files
    if before is not None:
        for relative, files in before.files.items():
            if relative not in tree.files:  # the folder is gone
                tree.vanished += list(files)
    return tree


def _list_folder(path: str, relative: str) -> dict[str, FileSig]:
    out: dict[str, FileSig] = {}
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name.endswith(".md") or name in READABLE_FILES:
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                out[f"{relative}/{name}"] = signature(entry.stat(follow_symlinks=False))
        except FileNotFoundError:
            continue
    return out


@dataclass
class Change:
    """A planned change of tier 4 for one file: "new" (a memory), "edit" (a new version of the
    file's memory), "move" (a memory whose file another program moved), "archive" (its file was
    removed), "same" (the file shows its memory: just remember the file), "pending" (the
    projection owes the file), "rewrite" (its folder is gone: write it again), "stale" (the
    daemon's own file of an older version, left by a crash: the projection removes it), "bad" (reported);
    "redacted" rides along with the file's change, counting what redaction replaced in it."""

    kind: str
    relative: str
    memory: Memory | None = None  # new / edit / move: the memory to commit; archive: the one archived
    texts: list[str] | None = None  # passages to embed (None: the vector stays as it is)
    revision: int = 0  # the memory's revision when planned (edit / move / archive)
    parsed: Memory | None = None  # edit / move: the memory read from the file
    reason: str = ""  # bad: why; redacted: the kinds replaced (comma-separated)


@dataclass
class Watcher:
    """What the scans know of memories/ (module rule: touched under the projection lock only)."""

    known: dict[str, tuple[FileSig, str]] = field(default_factory=dict)  # relative -> (signature, sha256)
    malformed: dict[str, tuple[FileSig, str]] = field(default_factory=dict)  # relative -> (signature, why)
    scans: int = 0
    imported: int = 0
    updated: int = 0
    moved: int = 0
    archived: int = 0
    last_scan_us: float = 0.0
    last_files: int = 0
    full_scans: int = 0
    tree: Tree | None = None  # what the last scan saw (None: the next scan is a full one)
    last_full: float = -math.inf  # trio.current_time() of the last full scan
    last_full_seconds: float = 0.0  # how long it took
    last_stat_seconds: float = 0.0  # how long the last scan's stats took (scan_tree)

    def wrote(self, files: dict[str, tuple[FileSig, str]], removed: Iterable[str]) -> None:
        """The projection wrote these files (or removed these): they are the daemon's own."""
        self.known.update(files)
        for relative in removed:
            self.known.pop(relative, None)
        for relative in files:
            self.malformed.pop(relative, None)

    def statistics(self) -> dict[str, Any]:
        shown = sorted(self.malformed.items())[:MALFORMED_SHOWN]
        return {
            "scans": self.scans,
            "full_scans": self.full_scans,
            "files": self.last_files,
            "last_scan_ms": round(self.last_scan_us / 1000, 3),
            "imported": self.imported,
            "updated": self.updated,
            "moved": self.moved,
            "archived": self.archived,
            "malformed": len(self.malformed),
            "malformed_files": [{"file": relative, "reason": why} for relative, (_, why) in shown],
        }


# --- planning: what each changed or removed file means (runs with the state lock held) --------------


def plan(
    state: MemoryState,
    reads: list[tuple[str, str, float]],
    gone: list[str],
    on_disk: Container[str],
    folders: set[str],
    redact: frozenset[str] = frozenset(),
) -> list[Change]:
    """Changes for files read (relative, text, mtime) and files gone; `on_disk` is every file the
    scan saw, `folders` every domain folder. Runs in the memory actor's internal call: it reads the
    state, changes nothing. Each file's text is redacted first (`redact`: the kinds, see
    daemon/redact.py): the memory holds no secret, the file stays as its writer left it. A file
    whose memory the projection still owes is "pending" (the projection writes it); a file gone
    with its whole domain folder is "rewrite" (the projection writes it again: a removed folder is
    no removal of its memories, one by one)."""
    out: list[Change] = []
    gone_set = set(gone)
    for relative, text, mtime in reads:
        replaced: list[str] = []
        if redact:
            text, replaced = redact_text(text, redact)
        current_id = state.file_owner(relative)
        current = state.memories.get(current_id) if current_id else None
        if current is not None and state.is_dirty(current.id):
            out.append(Change("pending", relative))
            continue
        if current is not None and render_markdown(current) == text:
            out.append(Change("same", relative))  # the daemon's own rendering (after a restart)
            continue
        parsed = memory_from_text(relative, text, mtime)
        if parsed is None:
            out.append(Change("bad", relative, reason="no text after the frontmatter"))
            continue
        if replaced:
            out.append(Change("redacted", relative, reason=",".join(replaced)))
        if current is not None:
            edited = edited_memory(current, parsed, relative)
            if edited is None:
                out.append(Change("same", relative))
            else:
                out.append(Change("edit", relative, edited, _texts(state, current, edited), state.revision(current.id), parsed))
            continue
        # a file the state does not know: the daemon's own of an older version (left by a crash before
        # the projection moved it), moved here (its id names a memory whose file is gone), or new
        owner = state.memories.get(parsed.id)
        if owner is not None and _left_behind(state, owner.id, relative, text):
            out.append(Change("stale", relative, owner))
            continue
        if owner is not None and owner.file not in on_disk:
            moved = edited_memory(owner, parsed, relative) or owner
            moved = _placed(moved, relative)
            out.append(Change("move", relative, moved, _texts(state, owner, moved), state.revision(owner.id), parsed))
            gone_set.discard(owner.file)
            continue
        if owner is not None:  # a copy of another memory's file, or the path of one removed earlier
            parsed = msgspec.structs.replace(parsed, id=state.new_id())
        out.append(Change("new", relative, parsed, state.passage_texts(parsed.title, parsed.content, _own(parsed))))
    for relative in gone:
        if relative not in gone_set:
            continue  # its memory moved (above)
        owner_id = state.file_owner(relative)
        owner = state.memories.get(owner_id) if owner_id else None
        if owner is None or owner.status != "active" or state.is_dirty(owner.id):
            continue  # nobody's, already archived, or the projection owes it (it is written again)
        if relative.rsplit("/", 1)[0] not in folders:
            out.append(Change("rewrite", relative, owner))
            continue
        out.append(Change("archive", relative, owner, revision=state.revision(owner.id)))
    return out


def _left_behind(state: MemoryState, memory_id: str, relative: str, text: str) -> bool:
    """Is this file, at a path the memory no longer has, byte for byte the daemon's own rendering of
    one of its previous versions at that path? Then the daemon wrote it and was stopped (killed)
    before its projection moved or removed it: no other program's move (which would have changed
    the file, or brought the current version's), and the projection removes it."""
    return any(
        entry.memory is not None and entry.memory.file == relative and render_markdown(entry.memory) == text
        for entry in state.history.get(memory_id, ())
    )


def _own(memory: Memory) -> str | None:
    return None if memory.abstract == derive_abstract(memory.content) else memory.abstract


def _texts(state: MemoryState, old: Memory, new: Memory) -> list[str] | None:
    """The passages to embed when the text changed, else None (the vector stays)."""
    if (old.title, old.content, _own(old)) == (new.title, new.content, _own(new)):
        return None
    return state.passage_texts(new.title, new.content, _own(new))


def _placed(memory: Memory, relative: str) -> Memory:
    """The memory as its file's folder places it: active in a domain folder, archived in _archive/."""
    archived = "/_archive/" in relative
    if archived == (memory.status == "archived"):
        return msgspec.structs.replace(memory, file=relative)
    return msgspec.structs.replace(
        memory, file=relative, status="archived" if archived else "active",
        archived_reason="its file was moved to _archive/" if archived else "",
    )


def edited_memory(old: Memory, parsed: Memory, relative: str) -> Memory | None:
    """`old` with what a person (or EurekaClaw) can change in the file: title, text, category,
    confidence, tags, abstract, pinned, validity. None when the file shows `old` as it is (the
    confidence as a file holds it, to two decimals). The domain, scope and id stay `old`'s."""
    text_changed = (parsed.title, parsed.content) != (old.title, old.content)
    abstract = parsed.abstract
    if text_changed and abstract == old.abstract:  # the old abstract left in the file: derive a new one
        abstract = derive_abstract(parsed.content)
    confidence = old.confidence if abs(parsed.confidence - old.confidence) < 0.005 else parsed.confidence
    new = msgspec.structs.replace(
        old,
        title=parsed.title,
        content=parsed.content,
        category=parsed.category,
        confidence=confidence,
        tags=parsed.tags,
        abstract=abstract,
        overview=derive_overview(parsed.content) if text_changed else old.overview,
        fingerprint=fingerprint(parsed.title, parsed.content),
        pinned=parsed.pinned,
        valid_from=parsed.valid_from or old.valid_from,
        valid_until=parsed.valid_until,
    )
    if new == old:
        return None
    return new


def apply_changes(state: MemoryState, changes: list[Change], vectors: dict[int, bytes]) -> list[str]:
    """Commit the planned changes (runs in the memory actor's internal call, so its mutations are
    journaled before it returns); `vectors` holds change index -> float32 row for those embedded.
    A memory changed by someone else since the plan gets the file's fields on top of its new state;
    returns the files whose change could not be committed (the next scan looks at them again)."""
    from .records import PutMemory

    retry: list[str] = []
    now = state.stamp()
    for at, change in enumerate(changes):
        memory = planned = change.memory
        if memory is None or planned is None:
            continue
        if change.kind == "rewrite":
            state.redirty([memory.id], [], [])
            continue
        if change.kind == "stale":  # the daemon's own old file: the projection removes it
            state.redirty([], [change.relative], [])
            continue
        vector = vectors.get(at)
        if change.kind == "new":
            if memory.id in state.memories or state.file_owner(change.relative) is not None:
                retry.append(change.relative)
                continue
            model = state.model if vector else ""
            state.commit(PutMemory(memory, model, vector or b"", 1, "imported", f"from {change.relative}, written by another program", True))
            continue
        current = state.memories.get(memory.id)
        if current is None:
            retry.append(change.relative)
            continue
        if state.revision(current.id) != change.revision:  # changed meanwhile: the file's fields on top
            if change.kind == "archive":
                if current.status != "active" or current.file != change.relative:
                    continue
            elif change.parsed is not None:
                redone = edited_memory(current, change.parsed, change.relative)
                memory = _placed(redone or current, change.relative)
                if (memory.title, memory.content, _own(memory)) != (planned.title, planned.content, _own(planned)):
                    vector = None  # embedded for other text: the background embeds it again
        if change.kind == "archive":
            state.archive(current, f"its file {change.relative} was removed by another program")
            continue
        memory = msgspec.structs.replace(memory, updated_at=now)
        if change.texts is None and vector is None:
            model, row = state.model_of.get(current.id, ""), state.vector_bytes(current.id)
        else:
            model, row = (state.model, vector) if vector else ("", b"")
        decision = "updated" if change.kind == "edit" else ("archived" if memory.status == "archived" and current.status != "archived" else "updated")
        reason = f"{change.relative} was edited by another program" if change.kind == "edit" else f"its file was moved to {change.relative}"
        state.commit(PutMemory(memory, model, row, state.version_of(current.id) + 1, decision, reason, True))
    return retry
