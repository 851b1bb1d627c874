"""The spool: writes made while the daemon is away, kept on disk until it has them.

Rules kept here:
- One file per process and data root, <root>/run/spool/<pid>-<random>.jsonl, one JSON line per
  write (method, params, when, the client-made node id of a graph.add_theorem), appended and
  fsynced before the call that made it returns. The process holds an exclusive flock on its file
  for as long as it exists, so another process takes a file over only once its writer is gone.
- Delivered in order, each exactly once: every answer is written back as an "ack" line (fsynced
  per batch) before the entry leaves the spool, and the file is removed once nothing is left.
  A write whose answer was lost (the connection broke, the daemon hung, the process died between
  the daemon's answer and the ack) is sent again: episodic.log carries its entry_id and timestamp
  (a repeat answers the same entry), persistent.remember (with its times) and skills.put are
  upserts of the same values, graph.link twice is one edge. graph.add_theorem carries its node_id
  (the daemon refuses a held one), so a repeat is first looked for with graph.get and taken as
  delivered when the node is there. skills.record_use has no id: a use whose answer was lost may
  count twice.
- The params are sent as spooled: the manager puts in them what the daemon would have given the
  write had it answered at once (a node's id and created_at, a record's times), so a delivered
  write is the record the agent was handed. A file of an older client may hold a graph.add_theorem
  without node_id: the daemon names that node on delivery, a lost answer's repeat is looked for
  with graph.search (same name, statement, domain, session and tags, made since it was spooled),
  and the spool keeps client id -> daemon id (in the ack lines too) so that links spooled after
  it, and this process's later calls with the old id, reach the delivered node.
- A file left by a process that exited first is delivered by the next process (or manager) on
  that root to reach the daemon, in its own order, before this process's own entries.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import secrets
import stat
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConnectionLost, EurekamemError, Timeout

__all__ = ["Spool", "SpoolEntry", "spool_for", "spools"]

log = logging.getLogger("eurekamem.client")

CHUNK = 128  # entries sent at once (one call_many, one fsync of their acks)


@dataclass
class SpoolEntry:
    seq: int
    method: str
    params: dict[str, Any]
    at: str  # when it was spooled (RFC 3339, UTC)
    owner: int = 0  # the manager that made it (this process only: its counters)
    maybe_sent: bool = False  # the daemon may already have it (its answer was lost)
    client_id: str | None = None  # graph.add_theorem: the node id handed to the agent

    def line(self) -> bytes:
        doc: dict[str, Any] = {"seq": self.seq, "method": self.method, "params": self.params, "at": self.at}
        if self.client_id is not None:
            doc["client_id"] = self.client_id
        if self.maybe_sent:
            doc["maybe_sent"] = True
        return (json.dumps(doc, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


Runner = Callable[[list[tuple[str, dict[str, Any]]]], list[Any]]  # call_many, bounded by the caller


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


class _File:
    """An open spool file: appended to under its flock."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fsync(self.fd)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:  # already taken over and removed
            log.debug("spool file %s already gone", self.path)
        os.close(self.fd)  # closing releases the flock


def _parse(raw: bytes) -> tuple[list[SpoolEntry], dict[str, str]]:
    """A spool file's entries still to deliver, and the node ids its acks recorded. A torn last
    line (its writer died mid-append, before the call returned) is ignored."""
    entries: dict[int, SpoolEntry] = {}
    ids: dict[str, str] = {}
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            log.warning("a torn line in a spool file skipped (%d bytes)", len(line))
            continue
        if not isinstance(doc, dict):
            continue
        if "ack" in doc:
            entries.pop(doc["ack"], None)
            if isinstance(doc.get("client_id"), str) and isinstance(doc.get("node_id"), str):
                ids[doc["client_id"]] = doc["node_id"]
        elif isinstance(doc.get("method"), str) and isinstance(doc.get("params"), dict):
            entries[int(doc["seq"])] = SpoolEntry(
                int(doc["seq"]),
                doc["method"],
                doc["params"],
                str(doc.get("at", "")),
                maybe_sent=True,  # its writer is gone: it may have been sent
                client_id=doc.get("client_id"),
            )
    return sorted(entries.values(), key=lambda e: e.seq), ids


class Spool:
    """This process's spool for one data root (see the module's rules). Thread-safe: `lock`
    orders appends and deliveries (callers hold it across "deliver, then send the new write")."""

    def __init__(self, root: Path, folder: Path) -> None:
        self.root = root
        self.dir = folder
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.pending: deque[SpoolEntry] = deque()
        self.node_ids: dict[str, str] = {}  # client-made node id -> the daemon's
        self.delivered: Counter[int] = Counter()
        self.dropped: Counter[int] = Counter()
        self._file: _File | None = None
        self._seq = 0
        self._orphans_done = False

    # --- appending ------------------------------------------------------------------------

    def _open(self) -> _File:
        if self._file is None:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.dir / f"{self.pid}-{secrets.token_hex(6)}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the file's name is durable too
            finally:
                os.close(dir_fd)
            self._file = _File(path, fd)
        return self._file

    def add(
        self,
        method: str,
        params: dict[str, Any],
        *,
        owner: int = 0,
        maybe_sent: bool = False,
        client_id: str | None = None,
        limit: int | None = None,
    ) -> SpoolEntry:
        """Spool a write (on disk before this returns). With `limit`: the owner's oldest entry is
        dropped first when it already has that many (counted in `dropped`)."""
        with self.lock:
            if limit is not None and self.count(owner) >= limit:
                oldest = next(e for e in self.pending if e.owner == owner)
                self._ack([(oldest, None)])
                self.dropped[owner] += 1
                if self.dropped[owner] == 1 or self.dropped[owner] % 1000 == 0:
                    log.error("eurekamem spool full (%d): %d writes dropped so far", limit, self.dropped[owner])
            self._seq += 1
            entry = SpoolEntry(self._seq, method, params, _now(), owner, maybe_sent, client_id)
            self._open().append(entry.line())
            self.pending.append(entry)
            return entry

    def _ack(self, done: list[tuple[SpoolEntry, str | None]], file: _File | None = None) -> None:
        """Record entries as delivered (with the daemon's node id of an add_theorem), durably."""
        target = file or self._file
        lines = []
        for entry, node_id in done:
            doc: dict[str, Any] = {"ack": entry.seq}
            if entry.client_id is not None and node_id is not None:
                doc |= {"client_id": entry.client_id, "node_id": node_id}
                self.node_ids[entry.client_id] = node_id
            lines.append(json.dumps(doc) + "\n")
        if target is not None and lines:
            target.append("".join(lines).encode())
        if file is None:
            seqs = {entry.seq for entry, _ in done}
            self.pending = deque(e for e in self.pending if e.seq not in seqs)
            if not self.pending and self._file is not None:
                self._file.remove()
                self._file = None

    def count(self, owner: int | None = None) -> int:
        with self.lock:
            return len(self.pending) if owner is None else sum(1 for e in self.pending if e.owner == owner)

    def node_id(self, node_id: str) -> str:
        """The daemon's id for a node this process made while it was away (else the id itself)."""
        return self.node_ids.get(node_id, node_id)

    # --- delivering -----------------------------------------------------------------------

    def deliver(self, run: Runner) -> None:
        """Every spooled write to the daemon, in order: first those of processes that exited
        before delivering theirs (once per reconnection), then ours. Raises ConnectionLost or
        Timeout when the daemon went away meanwhile (what was answered is acked)."""
        with self.lock:
            if not self._orphans_done:
                self._adopt_orphans(run)
                self._orphans_done = True
            self._send(list(self.pending), run, None)

    def rescan(self) -> None:
        """Look for files exited processes left on the next delivery (the daemon went away, or a
        new manager of the root was made)."""
        self._orphans_done = False

    def _adopt_orphans(self, run: Runner) -> None:
        try:
            names = sorted(self.dir.iterdir(), key=lambda p: p.stat().st_mtime_ns) if self.dir.is_dir() else []
        except OSError as exc:
            log.warning("spool folder %s not readable: %s", self.dir, exc)
            return
        for path in names:
            if self._file is not None and path == self._file.path or path.suffix != ".jsonl":
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # another process took it over meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # its writer is alive: its own to deliver
                continue
            orphan = _File(path, fd)
            try:
                if not path.exists():  # removed by its taker between our open and our lock
                    os.close(fd)
                    continue
                with open(fd, "rb", closefd=False) as f:
                    f.seek(0)
                    entries, ids = _parse(f.read())
                self.node_ids.update(ids)
                if entries:
                    log.warning(
                        "eurekamem: delivering %d writes spooled by an exited process (%s)", len(entries), path.name
                    )
                self._send(entries, run, orphan)
            except BaseException:
                os.close(fd)
                raise
            orphan.remove()

    def _send(self, entries: list[SpoolEntry], run: Runner, file: _File | None) -> None:
        at = 0
        while at < len(entries):
            entry = entries[at]
            if entry.method == "graph.add_theorem" and entry.maybe_sent:
                found = self._already_there(entry, run)
                if found is not None:
                    self._done([(entry, found)], file)
                    at += 1
                    continue
                chunk = [entry]
            else:
                chunk = []
                made: set[str] = set()  # nodes made in this chunk: a link to one waits for its id
                for e in entries[at : at + CHUNK]:
                    if e.method == "graph.add_theorem" and e.maybe_sent:
                        break
                    if e.method == "graph.link" and made & {e.params.get("from_id"), e.params.get("to_id")}:
                        break
                    if e.client_id is not None:
                        made.add(e.client_id)
                    chunk.append(e)
            calls = [(e.method, self._translated(e)) for e in chunk]
            try:
                results = run(calls)
            except (ConnectionLost, Timeout):
                for e in chunk:
                    e.maybe_sent = True
                raise
            done: list[tuple[SpoolEntry, str | None]] = []
            lost: BaseException | None = None
            for e, result in zip(chunk, results):
                if lost is not None or isinstance(result, (ConnectionLost, Timeout)):
                    lost = lost or result
                    e.maybe_sent = True
                    continue
                if isinstance(result, EurekamemError):
                    level = logging.DEBUG if result.kind == "not_found" and e.method == "graph.link" else logging.ERROR
                    log.log(
                        level, "a spooled %s was refused by the daemon, dropped: %s: %s", e.method, result.kind, result
                    )
                    done.append((e, None))
                    continue
                node_id = result.get("node_id") if isinstance(result, dict) else None
                done.append((e, node_id if isinstance(node_id, str) else None))
                self.delivered[e.owner] += 1
            self._done(done, file)
            if lost is not None:
                raise lost
            at += len(chunk)

    def _done(self, done: list[tuple[SpoolEntry, str | None]], file: _File | None) -> None:
        self._ack(done, file)

    def _translated(self, entry: SpoolEntry) -> dict[str, Any]:
        if entry.method != "graph.link":
            return entry.params
        params = dict(entry.params)
        for name in ("from_id", "to_id"):
            if isinstance(params.get(name), str):
                params[name] = self.node_id(params[name])
        return params

    def _already_there(self, entry: SpoolEntry, run: Runner) -> str | None:
        """The node a lost answer's graph.add_theorem made, if the daemon has it (the rules)."""
        p = entry.params
        if isinstance(p.get("node_id"), str):
            (held,) = run([("graph.get", {"node_id": p["node_id"]})])
            if isinstance(held, (ConnectionLost, Timeout)):
                raise held
            return p["node_id"] if isinstance(held, dict) else None
        query = {"query": p["theorem_name"], "limit": 10_000}
        if p.get("domain"):
            query["domain"] = p["domain"]
        (found,) = run([("graph.search", query)])
        if isinstance(found, BaseException):
            if isinstance(found, (ConnectionLost, Timeout)):
                raise found
            return None
        since = entry.at[:19]
        for node in found if isinstance(found, list) else []:
            if (
                node.get("theorem_name") == p["theorem_name"]
                and node.get("formal_statement") == p["formal_statement"]
                and node.get("domain", "") == p.get("domain", "")
                and node.get("session_id", "") == p.get("session_id", "")
                and list(node.get("tags", [])) == list(dict.fromkeys(p.get("tags", [])))
                and str(node.get("created_at", ""))[:19] >= since
            ):
                return str(node["node_id"])
        return None

    # --- at exit --------------------------------------------------------------------------

    def summary(self) -> str:
        kinds = Counter(e.method for e in self.pending)
        return ", ".join(f"{n} {m}" for m, n in sorted(kinds.items()))


_spools: dict[tuple[Path, int], Spool] = {}
_spools_lock = threading.Lock()


def _shared_folder(path: Path) -> bool:
    """A folder others write in too ($TMPDIR: sticky or world-writable, or not ours): no run/ there."""
    try:
        st = path.stat()
    except OSError:
        return False  # made by us when needed
    return bool(st.st_mode & (stat.S_ISVTX | stat.S_IWOTH)) or st.st_uid != os.geteuid()


def spool_folder(root: Path, memory_dir: Path) -> Path:
    """<root>/run/spool; for a root others share (a memory_dir in a TemporaryDirectory(), whose
    parent is $TMPDIR) <memory_dir>/.eurekamem-spool instead, never a run/ folder in theirs."""
    return memory_dir / ".eurekamem-spool" if _shared_folder(root) else root / "run" / "spool"


def spool_for(root: Path, memory_dir: Path | None = None) -> Spool:
    """This process's spool for a data root (a forked child gets its own)."""
    folder = spool_folder(root.resolve(), (memory_dir or root / "memory").resolve())
    key = (folder, os.getpid())
    with _spools_lock:
        spool = _spools.get(key)
        if spool is None:
            spool = _spools[key] = Spool(root.resolve(), folder)
        return spool


def spools() -> list[Spool]:
    with _spools_lock:
        return [s for (_root, pid), s in _spools.items() if pid == os.getpid()]
