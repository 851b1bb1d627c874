"""Files that others write: a scan of skills/ turns another program's SKILL.md files into skills.

Rule kept here: a `skills/<name>/SKILL.md` that another program (`eurekaclaw install-skills`,
EurekaClaw's own registry, a person, a test) wrote, changed or removed becomes a journaled change of
the skills tier (a new file: a skill; a changed file: the skill as the file now says; a removed file
or folder: the skill removed, as EurekaClaw's loader would no longer find it), and the daemon never
rewrites or deletes such a file for it: the change is committed with `from_file`, which tells the
projection that the file already shows it. A file whose skill the daemon changed meanwhile (the
projection owes it) keeps its text, and the daemon's usage figures are added to it (the projection
then writes both); the projection reads such a file first, so it never overwrites an edit unread.
The daemon's own files are known by what the projection reports (signature and SHA-256), or, after
a restart, by rendering their skill (a read, no commit). A file that is not UTF-8 is read as the start reads it
(replacement characters; the original kept as SKILL.md.orig before any rewrite); a file that cannot
be read, or a folder no skill may be named after, is reported once and left as it is; skills/ itself gone removes nothing (every file is
written again).

As memories/ is scanned (daemon/memory/watch.py; the signatures and the reads are
daemon/storage/watched.py's): every watch_interval seconds a partial scan stats skills/, each
skill's folder, the SKILL.md files of the folders that changed and of the files changed lately;
every watch_full_interval a full scan stats every SKILL.md (an edit in place long after the last).
`SkillsWatcher` is owned by the skills actor and touched only under its projection lock; the reads
run in a worker thread, the changes in one internal call (the state's owner).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..redact import shown
from ..storage.watched import FileSig, read_files, signature
from .format import name_problem, parse_skill, render_skill

if TYPE_CHECKING:
    from .state import SkillsState

log = logging.getLogger("eurekamem.skills")



HOT_SECONDS = 600.0  # a SKILL.md changed this recently is stat-ed at every scan
RACY_SECONDS = 2.0  # a folder changed this recently is looked at again (mtime granularity)


@dataclass
class SkillTree:
    """What a scan saw of skills/: its own signature (None: not there), each skill folder's
    signature, each present SKILL.md's signature (by folder name), and the files it stat-ed."""

    base: FileSig | None = None
    folders: dict[str, FileSig] = field(default_factory=dict)
    files: dict[str, FileSig] = field(default_factory=dict)
    looked: list[str] = field(default_factory=list)


def _recent(sig: FileSig, now: float, seconds: float) -> bool:
    return now - sig[1] / 1e9 < seconds


def scan_skills(root: Path, before: SkillTree | None) -> SkillTree:
    """The SKILL.md files under root/skills (folder names not starting with a dot). Without
    `before`, a full scan; with the last scan's tree, skills/ is listed again only when it changed,
    and a SKILL.md is stat-ed only when its folder changed or it changed lately (see the module)."""
    tree = SkillTree()
    base = root / "skills"
    now = time.time()
    try:
        tree.base = signature(os.stat(base))
    except (FileNotFoundError, NotADirectoryError):
        return tree
    if before is None or before.base != tree.base or _recent(tree.base, now, RACY_SECONDS):
        try:
            names = [e.name for e in os.scandir(base) if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return SkillTree()
    else:
        names = list(before.folders)
    for name in names:
        folder = base / name
        try:
            folder_sig = signature(os.stat(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        tree.folders[name] = folder_sig
        old = before.files.get(name) if before is not None else None
        look = (
            before is None
            or old is None
            or before.folders.get(name) != folder_sig
            or _recent(folder_sig, now, RACY_SECONDS)
            or _recent(old, now, HOT_SECONDS)
        )
        if not look:
            tree.files[name] = old  # type: ignore[assignment]  # old is not None here
            continue
        try:
            st = os.stat(folder / "SKILL.md")
        except (FileNotFoundError, NotADirectoryError):
            continue
        tree.looked.append(name)
        tree.files[name] = signature(st)
    return tree


@dataclass
class Read:
    name: str
    data: bytes | None  # None: gone or being written (the next scan looks again), or unreadable
    sig: FileSig | None
    error: str = ""


def read_skill_files(root: Path, names: list[str]) -> list[Read]:
    """Each skills/<name>/SKILL.md's bytes, read as the memories/ scan reads its files (one that
    changes while it is read is left for the next scan)."""
    reads = read_files(root, [f"skills/{name}/SKILL.md" for name in names])
    return [Read(name, read.data, read.sig, read.error) for name, read in zip(names, reads)]


@dataclass
class SkillsWatcher:
    """What the scans know of skills/ (module rule: touched under the projection lock only)."""

    known: dict[str, tuple[FileSig, str]] = field(default_factory=dict)  # name -> (signature, sha256) of its file
    reported: dict[str, tuple[FileSig | None, str]] = field(default_factory=dict)  # name -> (signature, why)
    tree: SkillTree | None = None
    last_full: float = -math.inf
    scans: int = 0
    full_scans: int = 0
    imported: int = 0
    updated: int = 0
    removed: int = 0
    last_scan_ms: float = 0.0

    def statistics(self) -> dict[str, Any]:
        return {
            "scans": self.scans,
            "full_scans": self.full_scans,
            "files": len(self.tree.files) if self.tree is not None else 0,
            "last_scan_ms": round(self.last_scan_ms, 3),
            "imported": self.imported,
            "updated": self.updated,
            "removed": self.removed,
            "malformed": len(self.reported),
        }


# --- the changes (run as the state's owner: an internal call of the skills actor) -----------------


def apply_files(
    state: SkillsState,
    reads: list[tuple[str, str, float]],
    gone: list[str],
    lossy: Container[str] = frozenset(),
    seen_before: Container[str] = frozenset(),
) -> dict[str, str]:
    """Commit what the files read (name, text, mtime) and the files gone say (`lossy`: files read
    with replacement characters, kept aside as SKILL.md.orig before a rewrite; `seen_before`: the
    files a scan or the projection saw before, so that a change of one is another program's: a file
    not seen before whose skill the daemon owes is older than the daemon's change, after a restart
    say, and left to the projection); returns name -> what
    was done: "new", "edit", "same" (the file shows the skill), "pending" (the projection owes the
    file), "removed", "ignored" (not a skill's file: a draft's name, say; reported by the caller)."""
    from .state import PutSkill, RemoveSkill, only_usage

    out: dict[str, str] = {}
    for name, text, mtime in reads:
        relative = f"skills/{name}/SKILL.md"
        current = state.skills.get(name)
        if current is not None and state.files.get(name) != relative:
            out[name] = "ignored"  # a draft (its file is in memory/skill_drafts), or a skill found elsewhere
            continue
        owed = name in state.dirty
        if owed and name not in seen_before:
            out[name] = "pending"
            continue
        if current is not None and not owed and render_skill(current, state.extra.get(name, "")) == text:
            out[name] = "same"
            continue
        parsed, extra, problems = parse_skill(text, name, mtime=mtime)
        for what in problems:
            log.warning("skills: %s: %s", relative, what)
        if current is not None:
            if parsed.created_at != current.created_at and "created_at:" not in text:
                parsed = msgspec.structs.replace(parsed, created_at=current.created_at)  # dated by mtime only
            if owed or current.source == "seed" and parsed.source == "seed" and current.usage_count > parsed.usage_count:
                # owed: the daemon's change not written yet (a use, most often) keeps its figures, the
                # file its text; a seed's figures live in seed_skill_stats.json
                parsed = only_usage(parsed, current)
            if parsed == current and extra == state.extra.get(name, ""):
                out[name] = "pending" if owed else "same"
                continue
        state.commit(PutSkill(parsed, extra, from_file=not owed))
        if name in lossy:
            state.keep_original[name] = None
        out[name] = "edit" if current is not None else "new"
    for name in gone:
        current = state.skills.get(name)
        if current is None or state.files.get(name) != f"skills/{name}/SKILL.md" or name in state.dirty:
            continue  # nobody's, a draft's name, or owed by the projection (which writes it again)
        state.commit(RemoveSkill(name))
        out[name] = "removed"
    return out


def problem_of(name: str) -> str | None:
    """Why a folder of skills/ is no skill's (its name), or None."""
    problem = name_problem(name)
    return None if problem is None else f"the name {shown(name)!r} {problem}"
