"""The skills actor (batches, query embedding, skill vectors, the SKILL.md projection) and the reading
of the skill files at start.

Rules kept here:
- The state is touched only by this actor, one batch or internal call at a time (TierActor's loop):
  a batch whose searches need a query embedded runs in a worker thread, so the event loop keeps
  serving the other tiers meanwhile; every other batch is lookups and runs on the event loop.
- Skill vectors are computed in the background without the state (the embedder is thread-safe) and
  stored only if the skill's text did not change meanwhile; an embedder that fails is retried with a
  growing pause, and search meanwhile finds the skills by BM25.
- The files follow the journal: shortly after a change the projector writes the SKILL.md files that
  changed, each atomically (a reader never sees half of one); `project_files(durable=True)`, which
  every snapshot calls before its checkpoint, makes everything written since durable (file and
  folder fsync) or raises, so no checkpoint ever covers a change whose file is not on disk. A file
  the daemon did not change is never rewritten, other files in a skill's folder are never touched,
  and a file read with bytes that are not UTF-8 is kept aside as SKILL.md.orig before its first
  rewrite. At start the files are the tier's snapshot (EurekaClaw's, on a first start): every folder
  with a SKILL.md is read leniently; a folder whose name no skill may have is left alone, with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from ...protocol import Call, Skill
from ..primitives import PendingSync
from ..redact import shown
from ..storage.files import RealFiles, atomic_write
from ..storage.store import Store
from ..storage.watched import SCAN_FACTOR, FileSig, digest, scan_every, signature
from ..tier import TierActor
from .format import name_problem, parse_skill
from .state import (
    DRAFTS_FOLDER,
    SEED_STATS_FILE,
    SKILLS_FOLDER,
    Projection,
    SkillsState,
    query_of,
)
from .watch import (
    SkillsWatcher,
    SkillTree,
    apply_files,
    problem_of,
    read_skill_files,
    scan_skills,
)

log = logging.getLogger("eurekamem.skills")


EMBED_BATCH = 64  # skills given a vector per background step


MIN_EMBED_PAUSE, MAX_EMBED_PAUSE = 1.0, 60.0  # seconds between attempts while background work keeps failing


class SkillsActor(TierActor):
    def __init__(
        self,
        state: SkillsState,
        store: Store,
        root: Path,
        *,
        projection_interval: float,
        watch_interval: float,
        watch_full_interval: float,
    ) -> None:
        super().__init__(state, store)
        self.state: SkillsState = state
        # fixed for the state's life: the embedding thread and statistics need not read the state for them
        self.embedder = state.embedder
        self.model = state.model
        self._search_time = state.search_time.copy()  # published by _publish, after each batch
        self.root = root
        self.projection_interval = projection_interval
        self.files_written = 0
        self.projection_errors = 0
        self.embedded = 0
        self.embed_failures = 0
        self._work = trio.Event()  # set when files are owed or skills wait for a vector
        self._projection_lock = trio.Lock()  # one projection at a time, from taking the changes to writing them
        self._unsynced = PendingSync()  # written or removed since the last durable projection
        self.watcher = SkillsWatcher()  # what the scans of skills/ know (daemon/skills/watch.py)
        self.watch_interval = watch_interval  # seconds between scans of skills/ (0: none)
        self.watching = watch_interval > 0
        self.watch_full_interval = watch_full_interval  # seconds between full scans (Config.watch_full_interval)
        self._loops_scope = trio.CancelScope()  # the background loops: stop_loops, or the actor's end
        self._scanned = trio.Event()  # set (and replaced) after each scan
        self._note_work()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._background)
            if self.watch_interval > 0:  # by the setting (a test may turn `watching` on to drive the scans itself)
                nursery.start_soon(self._watch)
            try:
                await super().run()
            finally:
                nursery.cancel_scope.cancel()

    def stop_loops(self) -> None:
        """At shutdown, before the final snapshot: no more scans of skills/ (the projector goes on
        until the actor closes: the snapshot's project_files(durable=True) waits for its lock)."""
        self._loops_scope.cancel()

    # --- batches ------------------------------------------------------------------------------------

    async def handle_calls(self, calls: list[Call]) -> list[Any]:
        if len(self.state.vectors) and any(query_of(call) is not None for call in calls):
            results = await trio.to_thread.run_sync(self._process, calls)
        else:
            results = self._process(calls)
        self._note_work()
        return results

    def _process(self, calls: list[Call]) -> list[Any]:
        self.state.prepare(calls)
        return [self._handle_now(call) for call in calls]

    async def _call_on_state(self, fn: Callable[[Any], Any]) -> Any:
        result = fn(self.state)
        self._note_work()
        return result

    def _publish(self) -> None:
        """As the state's owner, between batches: the counts and a copy of the search histogram."""
        super()._publish()
        self._search_time = self.state.search_time.copy()

    def _note_work(self) -> None:
        """As the state's owner: wake the background task when files are owed or vectors missing."""
        if self.state.owes_files() or self.state.missing_vectors(1):
            self._work.set()

    # --- background ---------------------------------------------------------------------------------

    async def _background(self) -> None:
        """Project the files and embed the skills that wait for a vector, whenever there is work; a
        failure is logged and tried again later (the journal has the data, BM25 finds the skills)."""
        pause = 0.0
        while True:
            await self._work.wait()
            self._work = trio.Event()
            await trio.sleep(max(self.projection_interval, pause))  # one write for a burst of changes
            try:
                await self.project_files()
                try:
                    await self.embed_missing()
                except trio.ClosedResourceError:
                    raise
                except Exception:
                    self.embed_failures += 1
                    raise
            except trio.ClosedResourceError:  # the actor was closed: shutdown, after the final snapshot
                return
            except Exception as exc:
                pause = min(MAX_EMBED_PAUSE, max(MIN_EMBED_PAUSE, 2 * pause))
                log.error("skills: background work failed (trying again in %.0f s): %s", pause, exc)
                self._work.set()
            else:
                pause = 0.0

    async def _watch(self) -> None:
        """Scan skills/ every watch_interval seconds (or more: SCAN_FACTOR times the last scan's
        length) for SKILL.md files other programs wrote, changed or removed; the first at once."""
        with self._loops_scope:
            await scan_every(
                self.scan_files,
                lambda: max(self.watch_interval, SCAN_FACTOR * self.watcher.last_scan_ms / 1000),
                "skills: the scan of skills/",
            )

    async def put_draft(self, name: str, body: str, **fields: Any) -> Skill:
        """For the learning loop's extraction job: store a distilled skill as a draft (status draft,
        source distilled), journaled before this returns; see SkillsState.draft_mutation for the
        checks, the name taken when `name` is in use, and why a job run twice stores it once."""
        skill: Skill = await self.run_internal(lambda state: state.put_draft(name, body, **fields))
        return skill

    async def embed_missing(self) -> int:
        """Give up to EMBED_BATCH skills without a vector one (the embedding runs without the state)."""
        todo = await self.run_internal(lambda state: state.missing_vectors(EMBED_BATCH))
        if not todo:
            return 0
        vectors = await trio.to_thread.run_sync(self.embedder.embed_passages, [text for _, text in todo])
        done: int = await self.run_internal(lambda state: state.set_vectors(todo, vectors))
        self.embedded += done
        return done

    async def project_files(self, durable: bool = False) -> int:
        """Write the skill files that changed; durable=True also fsyncs all written since the last
        durable call, and raises if anything could not be written (a snapshot must then fail)."""
        async with self._projection_lock:
            if self.watching and self.watcher.scans:
                await self._adopt_edits_of_owed()
            projection: Projection = await self.run_internal(lambda state: state.take_projection())
            written = 0
            if not projection.empty():
                self._unsynced.update(touched_paths(self.root, projection))
                wrote: dict[str, tuple[FileSig, str]] = {}
                try:
                    written = await trio.to_thread.run_sync(write_projection, self.root, projection, wrote)
                except OSError as exc:
                    self.projection_errors += 1
                    log.error("could not write skill files (the journal has them; will retry): %s", exc)
                    await self.run_internal(lambda state: state.redirty(projection))
                    if durable:
                        raise
                    return 0
                self.files_written += written
                self.watcher.known.update(wrote)  # the daemon's own files: no scan takes them for edits
            if durable and self._unsynced:
                await self._unsynced.sync()
            return written

    # --- files other programs write (daemon/skills/watch.py) ----------------------------------------

    async def _adopt_edits_of_owed(self) -> None:
        """Before a projection (its lock held): a file the projection is about to rewrite that
        another program changed since the last scan is read first (apply_files keeps its text),
        so that no edit is overwritten unread."""
        owed: list[str] = await self.run_internal(
            lambda state: [name for name in state.dirty if state.files.get(name) == f"{SKILLS_FOLDER}/{name}/SKILL.md"]
        )
        known = self.watcher.known
        candidates = [name for name in owed if name in known]
        if not candidates:
            return

        def changed() -> list[str]:
            out = []
            for name in candidates:
                try:
                    sig = signature(os.stat(self.root / SKILLS_FOLDER / name / "SKILL.md"))
                except OSError:
                    continue  # removed: the projection writes it again (the daemon's change is owed)
                if sig != known[name][0]:
                    out.append(name)
            return out

        names = await trio.to_thread.run_sync(changed)
        if names:
            await self._adopt(names, [], {}, {"new": 0, "edit": 0, "removed": 0, "bad": 0})

    async def scan_files(self, full: bool = False) -> dict[str, int]:
        """One scan of skills/ (a full one when asked, the first, and every watch_full_interval):
        SKILL.md files another program wrote, changed or removed since the last scan become journaled
        changes of the tier. Returns the counts of what it did."""
        async with self._projection_lock:
            started = time.perf_counter()
            try:
                return await self._scan(full)
            finally:
                self.watcher.scans += 1
                self.watcher.last_scan_ms = (time.perf_counter() - started) * 1000
                self._scanned.set()
                self._scanned = trio.Event()

    async def wait_scanned(self) -> None:
        """Return after the next scan of skills/ ends."""
        await self._scanned.wait()

    async def _scan(self, full: bool) -> dict[str, int]:
        watcher = self.watcher
        now = trio.current_time()
        full = full or watcher.tree is None or now >= watcher.last_full + self.watch_full_interval
        tree: SkillTree = await trio.to_thread.run_sync(scan_skills, self.root, None if full else watcher.tree)
        if full:
            watcher.last_full = now
            watcher.full_scans += 1
        counts = {"new": 0, "edit": 0, "removed": 0, "bad": 0}
        known, reported = watcher.known, watcher.reported
        if tree.base is None:  # skills/ itself is gone: no removal of each skill; every file written again
            watcher.tree = tree
            if known:
                log.warning("skills: %s/skills is gone; writing the skills' files again", self.root)
                names = list(known)
                known.clear()
                await self.run_internal(lambda state: state.rewrite(names))
            return counts
        watcher.tree = tree
        candidates = tree.files if full else {name: tree.files[name] for name in tree.looked if name in tree.files}
        changed: list[str] = []
        for name, sig in candidates.items():
            if name in known and known[name][0] == sig or name in reported and reported[name][0] == sig:
                continue
            problem = problem_of(name)
            if problem is not None:
                self._report(name, sig, problem)
                counts["bad"] += 1
                continue
            changed.append(name)
        for name in [n for n in reported if n not in tree.files]:
            del reported[name]
        gone = [name for name in known if name not in tree.files]
        if not (changed or gone):
            return counts
        return await self._adopt(changed, gone, candidates, counts)

    async def _adopt(
        self, changed: list[str], gone: list[str], candidates: dict[str, FileSig], counts: dict[str, int]
    ) -> dict[str, int]:
        """Read the changed files, apply them and the files gone (apply_files), record what was seen."""
        watcher = self.watcher
        known = watcher.known
        reads = await trio.to_thread.run_sync(read_skill_files, self.root, changed)
        texts: list[tuple[str, str, float]] = []
        lossy: set[str] = set()
        seen: dict[str, tuple[FileSig, str]] = {}
        for read in reads:
            if read.error:
                self._report(read.name, candidates.get(read.name), read.error)
                counts["bad"] += 1
                continue
            if read.data is None or read.sig is None:
                continue  # gone, or being written: the next scan looks again
            sha = digest(read.data)
            if read.name in known and known[read.name][1] == sha:
                known[read.name] = (read.sig, sha)  # touched, same bytes
                continue
            try:
                text = read.data.decode("utf-8")
            except UnicodeDecodeError:  # read as the start reads it (load_skill_files), kept aside once
                text = read.data.decode("utf-8", errors="replace")
                lossy.add(read.name)
                log.warning("skills: skills/%s/SKILL.md is not UTF-8: read with replacement characters", shown(read.name))
            seen[read.name] = (read.sig, sha)
            texts.append((read.name, text, read.sig[1] / 1e9))
        before = set(known)
        outcome: dict[str, str] = await self.run_internal(lambda state: apply_files(state, texts, gone, lossy, before))
        for name in gone:
            known.pop(name, None)
        for name, what in outcome.items():
            relative = f"skills/{name}/SKILL.md"
            if what == "removed":
                counts["removed"] += 1
                log.info("skills: %s was removed by another program: skill %s removed", shown(relative), shown(name))
            elif what == "ignored":
                self._report(name, seen[name][0], "its name is a draft's or a skill's kept elsewhere")
            elif what in ("new", "edit", "same"):
                known[name] = seen[name]
                watcher.reported.pop(name, None)
                if what != "same":
                    counts[what] += 1
                    log.info("skills: %s %s by another program", shown(relative), "written" if what == "new" else "edited")
        watcher.imported += counts["new"]
        watcher.updated += counts["edit"]
        watcher.removed += counts["removed"]
        return counts

    def _report(self, name: str, sig: FileSig | None, why: str) -> None:
        """A folder of skills/ that is no skill's file (once per version of it), left as it is."""
        if self.watcher.reported.get(name, (None, ""))[0] != sig:
            log.warning("skills: skills/%s/SKILL.md left as it is: %s", shown(name), why)
        self.watcher.reported[name] = (sig, why)
        self.watcher.known.pop(name, None)

    def statistics(self) -> dict[str, Any]:
        return {
            "watch": {"enabled": self.watching, **self.watcher.statistics()},
            "files_written": self.files_written,
            "projection_errors": self.projection_errors,
            "embedded": self.embedded,
            "embed_failures": self.embed_failures,
            "model": self.model,
            "search": self._search_time.summary(),
        }


# --- the files -------------------------------------------------------------------------------------------


def touched_paths(root: Path, projection: Projection) -> list[Path]:
    """The files and folders a projection changes (each folder's own entry is fsynced with its parent)."""
    out: list[Path] = []
    for _, relative, _ in projection.writes:
        out += [root / relative, (root / relative).parent]
    for relative in projection.removes:
        out += [root / relative, (root / relative).parent]
    if projection.seed_stats:
        out.append(root / SEED_STATS_FILE)
    return out


def write_projection(root: Path, projection: Projection, wrote: dict[str, tuple[FileSig, str]] | None = None) -> int:
    """Runs in a worker thread: write, remove and update what the projection says; returns files
    written. `wrote` gets name -> (signature, sha256) of each skills/ file written (the watcher's)."""
    fs = RealFiles()
    written = 0
    keep = set(projection.keep_originals)
    for name, relative, text in projection.writes:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        original = path.with_name(path.name + ".orig")
        if relative in keep and path.exists() and not original.exists():
            os.link(path, original)  # the bytes another program wrote, as they were
        data = text.encode("utf-8")
        atomic_write(fs, str(path), data, sync=False)
        written += 1
        if wrote is not None and relative == f"{SKILLS_FOLDER}/{name}/SKILL.md":
            wrote[name] = (signature(os.stat(path)), digest(data))
    for relative in projection.removes:
        path = root / relative
        if path.is_file():
            path.unlink()
        folder = path.parent
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # an empty folder would stop EurekaClaw's loader (it expects a SKILL.md in each)
    if projection.seed_stats:
        written += _update_seed_stats(fs, root / SEED_STATS_FILE, projection.seed_stats)
    return written


def _update_seed_stats(fs: RealFiles, path: Path, stats: dict[str, dict[str, Any]]) -> int:
    """EurekaClaw keeps seed skills' usage in seed_skill_stats.json too: update its entries."""
    current: Any = {}
    if path.exists():
        try:
            current = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            current = exc
        if not isinstance(current, dict):
            log.warning("%s is not a JSON object; left as it is (the skills' files have their statistics)", path)
            return 0
    current.update(stats)
    atomic_write(fs, str(path), json.dumps(current, indent=2).encode("utf-8"), sync=False)
    return 1


def load_skill_files(state: SkillsState, root: Path) -> int:
    """Read every skills/<name>/SKILL.md and memory/skill_drafts/<name>/SKILL.md into the state (at
    start, before the journal is replayed); returns how many were read."""
    count = 0
    for folder, draft in ((SKILLS_FOLDER, False), (DRAFTS_FOLDER, True)):
        base = root / folder
        if not base.is_dir():
            continue
        for entry in sorted(os.scandir(base), key=lambda e: e.name):
            name = entry.name
            path = Path(entry.path) / "SKILL.md"
            if not entry.is_dir() or not path.is_file():
                continue
            relative = f"{folder}/{name}/SKILL.md"
            problem = name_problem(name)
            if problem is not None:
                log.warning("skills: left %s alone: the name %r %s", shown(str(relative)), shown(name), problem)
                continue
            if name in state.skills:  # a confirmed draft whose old file was not removed before a crash
                log.info("skills: %s is an older copy of %s; removing it", relative, state.files[name])
                state.stale_files[relative] = None
                continue
            try:
                data = path.read_bytes()
                mtime = path.stat().st_mtime
            except OSError as exc:
                log.warning("skills: could not read %s: %s", relative, exc)
                continue
            try:
                text, lossy = data.decode("utf-8"), False
            except UnicodeDecodeError:
                text, lossy = data.decode("utf-8", errors="replace"), True
            skill, extra, problems = parse_skill(text, name, mtime=mtime, draft=draft)
            for what in problems:
                log.warning("skills: %s: %s", relative, what)
            state.load(skill, extra, relative)
            if lossy:
                log.warning("skills: %s is not UTF-8: read with replacement characters (kept aside once)", relative)
                state.keep_original[name] = None
            count += 1
    _overlay_seed_stats(state, root / SEED_STATS_FILE)
    return count


def _overlay_seed_stats(state: SkillsState, path: Path) -> None:
    """EurekaClaw's update_stats writes a seed skill's usage to seed_skill_stats.json, never to its
    SKILL.md: where that file counts more uses than the SKILL.md, its figures are the newer ones."""
    if not path.is_file():
        return
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.warning("skills: could not read %s: %s", path, exc)
        return
    if not isinstance(stats, dict):
        return
    for name, entry in stats.items():
        skill = state.skills.get(name)
        if skill is None or skill.source != "seed" or not isinstance(entry, dict):
            continue
        uses = entry.get("usage_count")
        rate = entry.get("success_rate")
        if not isinstance(uses, int) or isinstance(uses, bool) or uses <= skill.usage_count:
            continue
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and 0 <= rate <= 1:
            rate = float(rate)
        else:
            rate = skill.success_rate
        newer = msgspec.structs.replace(skill, usage_count=uses, success_rate=rate)
        state.load(newer, state.extra[name], state.files[name])  # the SKILL.md stays as it is (EurekaClaw's rule)
