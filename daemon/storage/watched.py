"""Files that other programs write: what says a file changed, and reads that notice a change.

Rule kept here: a file changed when its signature (size, mtime_ns, inode) did, and its content is
known by its SHA-256; a read returns a file's bytes only when its signature before and after the
read are the same, so a scan never takes a half-written file for an edit (it looks again at its
next pass). Shared by the scans of memories/ (daemon/memory/watch.py) and skills/
(daemon/skills/watch.py), and so is the loop each actor runs them in (`scan_every`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("eurekamem")

# scans take at most about 1/SCAN_FACTOR of the time: the next one starts after max(watch_interval,
# SCAN_FACTOR x the last one's stats), so that a tree of many hot files (a bulk write) slows them down
SCAN_FACTOR = 20

FileSig = tuple[int, int, int]  # (size, mtime_ns, inode): a file changed when one of them did


async def scan_every(scan: Callable[[], Awaitable[Any]], pause: Callable[[], float], what: str, after: Callable[[], None] | None = None) -> None:
    """An actor's scan loop (memories/, skills/): scan() now, then again after pause() seconds each
    time, until the actor closes; a failed scan is logged ("<what> failed") and tried at the next
    turn; after() runs after each scan, failed or not."""
    while True:
        try:
            await scan()
        except trio.ClosedResourceError:
            return  # the actor closed: the daemon is stopping
        except Exception:
            log.exception("%s failed; will try again", what)
        finally:
            if after is not None:
                after()
        await trio.sleep(pause())


def signature(st: os.stat_result) -> FileSig:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Read:
    """One file as a scan read it: its bytes and signature (None: it went away), or why not."""

    relative: str
    data: bytes | None
    sig: FileSig | None
    error: str = ""


def read_files(root: Path, relatives: Iterable[str]) -> list[Read]:
    """Read each file; one that changes while it is read (its signature before and after differ)
    is left for the next scan (data None, no error)."""
    out: list[Read] = []
    for relative in relatives:
        path = root / relative
        try:
            with open(path, "rb") as f:
                before = signature(os.fstat(f.fileno()))
                data = f.read()
            after = signature(os.stat(path))
        except FileNotFoundError:
            out.append(Read(relative, None, None))
            continue
        except OSError as exc:
            out.append(Read(relative, None, None, f"unreadable: {exc.strerror or exc}"))
            continue
        if before != after:
            out.append(Read(relative, None, None))  # being written: next scan
            continue
        out.append(Read(relative, data, after))
    return out
