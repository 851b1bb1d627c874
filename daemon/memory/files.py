"""Tier 4's side in memories/: the projector that writes the memory files, the scans that read
back what other programs wrote there, and the import of EurekaClaw's memory files at start.

Rule kept here: the .md files and _index.json follow the journal: a projector writes what changed
within about a second, and every snapshot flushes it (durably). One projection at a time, from
taking the changes to writing them (the projection lock): two interleaved ones could write an older
version of a file after a newer one (or after its removal); a scan holds the same lock, so it never
reads a file the projector is writing, and the projector never overwrites a file changed since the
last scan (another program wrote it). `MemoryFiles` owns what the scans know (the Watcher,
daemon/memory/watch.py) and touches it under that lock only; the memories themselves it reads and
changes only through the memory actor's internal calls (`run_internal`), the actor being the one
owner of tier 4's state. The files are written and read in worker threads, off the event loop.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from ...protocol.readable import render_readable
from ..primitives import PendingSync
from ..redact import Redactor, redact_text
from ..retrieval.text import pooled
from ..storage.files import RealFiles, atomic_write
from ..storage.watched import SCAN_FACTOR, FileSig, digest, read_files, scan_every, signature
from .format import index_entry, memory_files, render_markdown
from .state import MemoryState
from .watch import (
    FULL_SCAN_FACTOR,
    PLAN_CHUNK,
    Change,
    Tree,
    Watcher,
    apply_changes,
    plan,
    scan_tree,
)

log = logging.getLogger("eurekamem.memory")

_WHAT = {"new": "was written by another program", "edit": "was edited by another program", "move": "was moved here by another program"}


class MemoryFiles:
    """The projector and the scans of memories/ (module rule), held by the memory actor: given the
    actor's internal call, how work leaves the event loop, the group summaries for MEMORY.md, the
    embedder (fixed for the state's life) and the redactor of files others wrote."""

    def __init__(
        self,
        root: Path,
        *,
        run_internal: Callable[[Callable[[MemoryState], Any]], Awaitable[Any]],
        run_sync: Callable[..., Awaitable[Any]],
        summaries: Callable[[list[str]], Awaitable[dict[str, str]]],
        embedder: Any,
        redactor: Redactor | None,
        watch_full_interval: float,
    ) -> None:
        self.root = root
        self._run_internal = run_internal
        self._run_sync = run_sync
        self._summaries = summaries
        self.embedder = embedder
        self.redactor = redactor
        self.watch_full_interval = watch_full_interval  # seconds between full scans (Config.watch_full_interval)
        self.files_written = 0
        self.projection_errors = 0
        # what the scans of memories/ know (daemon/memory/watch.py): touched under _lock only
        self.watcher = Watcher()
        self.first_scan = trio.Event()  # set once the scan at start is done (or failed)
        self._lock = trio.Lock()  # one projection (or scan) at a time: see the module docstring
        self._unsynced = PendingSync()  # files written (or removed) since the last durable projection
        self._projected = trio.Event()  # set (and replaced) after each projection that wrote files

    async def project(self, durable: bool = False) -> int:
        """Write the .md files and _index.json that changed; returns the number of files written.

        The files are renamed into place (a reader never sees half of one) but not fsynced: the
        journal has every change they show. durable=True (a snapshot, before its checkpoint lets
        the journal forget those changes) fsyncs everything written since the last durable call,
        each file and folder once, however often it was rewritten meanwhile.
        """
        async with self._lock:
            written = await self._project()
            if durable and self._unsynced:
                await self._unsynced.sync()
            return written

    async def _project(self) -> int:
        readable, (changed, removed, indexes) = await self._run_internal(
            lambda state: (state.take_readable(), state.take_projection())  # in this order: see take_readable
        )
        if not (changed or removed or indexes or readable):
            return 0
        summaries = await self._summaries([file.split("/")[-2] for file, _, _, _ in readable if file.endswith("/MEMORY.md")])
        documents = [(*item, summaries.get(item[0].split("/")[-2])) for item in readable]
        touched = [self.root / m.file for m in changed] + [self.root / f for f in removed]
        touched += [self.root / "memories" / slug / "_index.json" for slug in indexes]
        touched += [self.root / item[0] for item in documents]
        self._unsynced.update(touched)  # before writing: a failure half-way still leaves them to sync
        # what the scans last saw of the files this writes or removes: one that changed since (another
        # program wrote it) is left as it is, for the next scan (None: unknown; no check before the first scan)
        known = self.watcher.known
        expected = {f: known[f][0] if f in known else None for f in [m.file for m in changed] + removed} if self.watcher.scans else None
        try:
            result = await self._run_sync(write_projection, self.root, changed, removed, indexes, documents, expected)
        except OSError as exc:
            self.projection_errors += 1
            log.error("could not write memory files (the journal has them; will retry): %s", exc)
            ids = [memory.id for memory in changed]
            domains = list(indexes) + [item[0].split("/")[-2] for item in documents if item[0].endswith("/MEMORY.md")]
            again_global = any(item[0].endswith("/GLOBAL.md") for item in documents)
            await self._run_internal(lambda state: state.redirty(ids, removed, domains, again_global))
            return 0
        self.watcher.wrote(result.files, result.removed)
        for relative in result.left:
            log.warning("tier 4: %s changed on disk since the last scan; left as it is (the next scan reads it)", relative)
        self.files_written += result.written
        self._projected.set()
        self._projected = trio.Event()
        written: int = result.written
        return written

    async def scan(self, full: bool = False) -> dict[str, int]:
        """One scan of memories/ (daemon/memory/watch.py; a full one when asked, the first, and every
        watch_full_interval): files another program wrote, changed or removed since the last scan
        become journaled changes of tier 4; then, if there were any, the projection writes what
        they owe (_index.json, archived copies). Returns the counts of what it did."""
        async with self._lock:
            started = time.perf_counter_ns()
            counts = await self._scan(full)
            self.watcher.scans += 1
            if any(counts.values()):
                await self._project()
            self.watcher.last_scan_us = (time.perf_counter_ns() - started) / 1000
            return counts

    async def _scan(self, full: bool) -> dict[str, int]:
        watcher = self.watcher
        first = watcher.scans == 0
        now = trio.current_time()
        full = full or watcher.tree is None or now >= watcher.last_full + max(
            self.watch_full_interval, FULL_SCAN_FACTOR * watcher.last_full_seconds
        )
        before = None if full else watcher.tree
        started = time.perf_counter()
        tree: Tree = await self._run_sync(scan_tree, self.root, before)
        watcher.last_stat_seconds = time.perf_counter() - started
        if full:
            watcher.last_full, watcher.last_full_seconds = now, watcher.last_stat_seconds
            watcher.full_scans += 1
        watcher.tree = tree
        folders = tree.domain_folders()
        watcher.last_files = tree.count()
        known, malformed = watcher.known, watcher.malformed
        if full:  # every file compared with what the scans know
            seen = tree.flat()
            for relative in [f for f in malformed if f not in seen]:
                del malformed[relative]
            candidates: dict[str, FileSig] = seen
            gone = [f for f in known if f not in seen]
        else:  # the files this scan looked at, and those it found gone
            candidates = {f: sig for f in tree.looked if (sig := tree.sig(f)) is not None}
            gone = [f for f in dict.fromkeys(tree.vanished) if f in known or f in malformed]
            for relative in gone:
                malformed.pop(relative, None)
        changed = [
            f for f, sig in candidates.items()
            if (f not in known or known[f][0] != sig) and not (f in malformed and malformed[f][0] == sig)
        ]
        if first:  # files removed while the daemon was down: the memories whose file is not there
            present = candidates
            gone += await self._run_internal(
                lambda s: [m.file for m in s.memories.values() if m.status == "active" and m.file not in present]
            )
        counts = {"new": 0, "edit": 0, "move": 0, "archive": 0, "bad": 0}
        if not (changed or gone):
            return counts
        reads = await self._run_sync(read_files, self.root, changed)
        texts: list[tuple[str, str, float]] = []
        sigs: dict[str, tuple[FileSig, str]] = {}
        for read in reads:
            if read.error:
                self._malformed(read.relative, candidates[read.relative], read.error)
                counts["bad"] += 1
                continue
            if read.data is None or read.sig is None or not read.data:
                continue  # gone, being written, or empty so far: the next scan looks again
            sha = digest(read.data)
            if read.relative in known and known[read.relative][1] == sha:
                known[read.relative] = (read.sig, sha)  # touched, same bytes
                continue
            try:
                text = read.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                self._malformed(read.relative, read.sig, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
                counts["bad"] += 1
                continue
            sigs[read.relative] = (read.sig, sha)
            texts.append((read.relative, text, read.sig[1] / 1e9))
        on_disk = tree.flat() if not full else candidates
        changes: list[Change] = []
        kinds: frozenset[str] = self.redactor.unknown_domain if self.redactor is not None else frozenset()
        for at in range(0, max(len(texts), 1), PLAN_CHUNK):
            chunk = texts[at : at + PLAN_CHUNK]
            lost = gone if at == 0 else []

            def planned(s: MemoryState, chunk: list[tuple[str, str, float]] = chunk, lost: list[str] = lost) -> list[Change]:
                return plan(s, chunk, lost, on_disk, folders, kinds)

            changes += await self._run_internal(planned)
        for change in changes:
            if change.kind == "redacted" and self.redactor is not None:
                self.redactor.counted(change.reason.split(","))
        changes = [change for change in changes if change.kind != "redacted"]
        vectors = await self._embed_changes(changes)
        retry = set(await self._run_internal(lambda s: apply_changes(s, changes, vectors)))
        for change in changes:
            relative = change.relative
            if change.kind == "archive":
                known.pop(relative, None)
                log.info("tier 4: %s was removed by another program: memory %s archived", relative, change.memory and change.memory.id)
            elif change.kind == "rewrite":
                known.pop(relative, None)
            elif change.kind == "bad":
                self._malformed(relative, sigs[relative][0], change.reason)
            elif relative not in retry:
                sig, sha = sigs[relative]
                known[relative] = (sig, "" if change.kind == "pending" else sha)
                malformed.pop(relative, None)
                if change.kind in ("new", "edit", "move"):
                    log.info("tier 4: %s %s: memory %s", relative, _WHAT[change.kind], change.memory and change.memory.id)
                elif change.kind == "stale":
                    log.info("tier 4: %s is this daemon's file of an older version of memory %s, left by a stop before"
                             " its projection: removed", relative, change.memory and change.memory.id)
            if change.kind in counts and relative not in retry:
                counts[change.kind] += 1
        for relative in gone:  # archived, moved, nobody's, or owed by the projection (which records it anew)
            known.pop(relative, None)
        watcher.imported += counts["new"]
        watcher.updated += counts["edit"]
        watcher.moved += counts["move"]
        watcher.archived += counts["archive"]
        return counts

    def _malformed(self, relative: str, sig: FileSig, why: str) -> None:
        """Report a file that is no memory (once per version of it) and leave it as it is."""
        if self.watcher.malformed.get(relative, (None, ""))[0] != sig:
            log.warning("tier 4: %s is not a memory file (%s); left as it is", relative, why)
        self.watcher.malformed[relative] = (sig, why)
        self.watcher.known.pop(relative, None)

    async def _embed_changes(self, changes: list[Change]) -> dict[int, bytes]:
        """The vectors of the changes whose text is new, by change index; none if the embedder fails
        (those memories are committed without one and embedded in the background)."""
        wanted = [(at, change.texts) for at, change in enumerate(changes) if change.texts]
        if not wanted:
            return {}
        flat = [text for _, texts in wanted for text in texts or ()]
        try:
            rows = await trio.to_thread.run_sync(self.embedder.embed_passages, flat, abandon_on_cancel=True)
        except Exception as exc:
            log.error("tier 4: could not embed %d files another program wrote (embedded later): %s", len(wanted), exc)
            return {}
        out: dict[int, bytes] = {}
        position = 0
        for at, texts in wanted:
            n = len(texts or ())
            out[at] = pooled(list(rows[position : position + n])).astype("float32").tobytes()
            position += n
        return out

    async def wait_projected(self) -> None:
        """Return after the next projection that writes files (the projector's, a snapshot's or
        anyone's): for a reader that wants the files to show a change it made."""
        await self._projected.wait()

    async def watch(self, interval: float) -> None:
        """Scan memories/ every `interval` seconds (or more: SCAN_FACTOR) for files other programs
        wrote, changed or removed (daemon/memory/watch.py); the first scan at once, before the first
        projection, so that the projection never overwrites a file edited while the daemon was down."""
        await scan_every(
            self.scan,
            lambda: max(interval, SCAN_FACTOR * self.watcher.last_stat_seconds),
            "tier 4: the scan of memories/",
            after=self.first_scan.set,
        )


class Written(msgspec.Struct):
    """What write_projection did: files written, the memory files' signatures and hashes as written,
    the memory files removed, and those left alone because another program changed them."""

    written: int
    files: dict[str, tuple[FileSig, str]]
    removed: list[str]
    left: list[str]


def _unchanged(path: Path, expected: FileSig | None) -> bool:
    """Is the file at `path` as the last scan saw it (absent, when it saw none)?"""
    try:
        sig = signature(os.stat(path))
    except FileNotFoundError:
        return True
    return sig == expected


def write_projection(
    root: Path,
    changed: list[Any],
    removed: list[str],
    indexes: dict[str, list[Any]],
    documents: list[tuple[str, str, list[Any], bool, str | None]] = [],  # noqa: B006 (read only)
    expected: dict[str, FileSig | None] | None = None,
) -> Written:
    """The .md files, removals, _index.json files and the readable projection (MEMORY.md and
    GLOBAL.md: (file, domain, [(memory, strength)], whether GLOBAL.md lists any, summary),
    rendered here, off the event loop), each renamed into place whole.

    With `expected` (the scans' signatures, daemon/memory/watch.py), a memory file that changed
    since the last scan is neither overwritten nor removed: another program wrote it. _index.json
    keeps what others wrote: entries of files in the folder that no memory here lists, and the
    keys of an entry besides ours (EurekaClaw's embedding, while the memory's text is the same);
    it is written only when that changes it."""
    fs = RealFiles()
    written = 0
    files: dict[str, tuple[FileSig, str]] = {}
    gone: list[str] = []
    left: list[str] = []
    for memory in changed:
        path = root / memory.file
        if expected is not None and not _unchanged(path, expected.get(memory.file)):
            left.append(memory.file)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        data = render_markdown(memory).encode()
        atomic_write(fs, str(path), data, sync=False)
        files[memory.file] = (signature(os.stat(path)), digest(data))
        written += 1
    for relative in removed:
        path = root / relative
        if expected is not None and not _unchanged(path, expected.get(relative)):
            left.append(relative)
            continue
        if path.is_file():
            os.unlink(path)
        gone.append(relative)
    for slug, memories in indexes.items():
        folder = root / "memories" / slug
        folder.mkdir(parents=True, exist_ok=True)
        if _write_index(fs, folder, slug, memories):
            written += 1
    for relative, domain, listed, has_global, summary in documents:
        text = render_readable(domain, listed, is_global=relative.endswith("/GLOBAL.md"), has_global=has_global, summary=summary)
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(fs, str(path), text.encode(), sync=False)
        written += 1
    return Written(written, files, gone, left)


def _write_index(fs: Any, folder: Path, slug: str, memories: list[Any]) -> bool:
    """memories/<slug>/_index.json: our memories whose file is in this folder, merged into what is
    there (see write_projection); True when it was written."""
    path = folder / "_index.json"
    try:
        existing = msgspec.json.decode(path.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        existing = None
    before: dict[str, Any] = existing if isinstance(existing, dict) else {}
    prefix = f"memories/{slug}/"
    ours: dict[str, Any] = {}
    for memory in memories:
        name = memory.file.removeprefix(prefix)
        if "/" in name or not memory.file.startswith(prefix):
            continue  # archived, or a file in another folder (a domain written under another slug)
        ours[name] = index_entry(memory, before.get(name))  # another program's entry kept as it wrote it
    entries = dict(ours)
    for name, entry in before.items():  # another program's entries for files that are there
        if name not in ours and (folder / name).is_file():
            entries[name] = entry
    if existing is not None and entries == before:
        return False
    atomic_write(fs, str(path), json.dumps(entries, indent=2).encode(), sync=False)  # as EurekaClaw writes it: ASCII escapes
    return True



def import_eurekaclaw_memories(
    state: MemoryState, root: Path, redact: frozenset[str] = frozenset(), replaced: list[str] | None = None
) -> int:
    """Every memories/<domain>/*.md (and _archive/) that EurekaClaw or we wrote, as memories; each
    file's text redacted first (`redact`: the kinds, as the scans of memories/ do; the kinds
    replaced are added to `replaced`): the memory holds no secret, the file stays as its writer left it."""
    base = root / "memories"
    if not base.is_dir():
        return 0
    count = 0
    for path in memory_files(base):  # never MEMORY.md / GLOBAL.md: the daemon's readable projection
        relative = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            log.warning("could not read %s: %s", path, exc)
            continue
        if redact:
            text, hits = redact_text(text, redact)
            if replaced is not None:
                replaced += hits
        if state.import_file(relative, text, path.stat().st_mtime) is not None:
            count += 1
    return count
