"""Operator commands: config show, metrics, top, backup, restore, export, import, verify.

Rule kept here: every command that changes or reads live data goes through the daemon's socket
(it owns the data while it runs); only `restore` (into an empty folder) and `verify` (which holds
the data root's LOCK, so the daemon cannot run meanwhile) read or write the files themselves.

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
import select
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

log = logging.getLogger("eurekamem.admin")

BACKUP_MANIFEST = "eurekamem-backup.json"
BACKUP_ATTEMPTS = 5
BACKUP_TREES = ("memory", "memories", "skills")
PAGE = 500  # items per pipelined batch of calls


# --- small helpers --------------------------------------------------------------------------------


def _err(message: str) -> int:
    print(f"eurekamem: {message}", file=sys.stderr)
    return 1


def _effective(args: argparse.Namespace, names: Iterable[str] = ("data_dir", "socket")) -> Any:
    from . import _config

    flags = {name: getattr(args, name, None) for name in names}
    return _config.load(flags, getattr(args, "config", None))


def _client(args: argparse.Namespace) -> Any:
    from eurekamem.client import Client

    return Client(_effective(args)["socket"], timeout=getattr(args, "timeout", 60.0))


class Progress:
    """A one-line text progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, force: bool = False) -> None:
        self.stream = stream or sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = force or tty
        self.total = max(total, 0)
        self.label = label
        self.done = 0
        self._last = -1.0

    def add(self, n: int = 1) -> None:
        self.done += n
        self.draw()

    def draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < 0.1:
            return
        self._last = now
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        width = 30
        filled = int(fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {fraction * 100:5.1f}% ({self.done}/{self.total})")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.draw(final=True)
            self.stream.write("\n")
            self.stream.flush()


# --- config show ----------------------------------------------------------------------------------


def cmd_config_show(args: argparse.Namespace) -> int:
    from . import _config

    try:
        effective = _config.load(_config.flags_from_args(None, args), args.config)
    except _config.ConfigError as exc:
        return _err(str(exc))
    if args.json:
        doc = {
            "config_file": str(effective.config_file) if effective.config_file else None,
            "settings": {
                name: {"value": value, "source": effective.sources[name], "origin": effective.origins[name]}
                for name, value in effective.values.items()
            },
        }
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(_config.format_effective(effective))
    return 0


# --- metrics --------------------------------------------------------------------------------------


def _escape_label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Exposition:
    """Builds Prometheus text exposition format 0.0.4: HELP and TYPE once per family, then samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def _family(self, name: str, kind: str, help_text: str) -> list[str]:
        if name not in self.families:
            self.families[name] = (kind, help_text, [])
        return self.families[name][2]

    @staticmethod
    def _labels(labels: dict[str, Any] | None) -> str:
        if not labels:
            return ""
        return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"

    def sample(self, name: str, kind: str, help_text: str, value: Any, labels: dict[str, Any] | None = None, suffix: str = "") -> None:
        if value is None:
            return
        self._family(name, kind, help_text).append(f"{name}{suffix}{self._labels(labels)} {_number(value)}")

    def summary_us(self, name: str, help_text: str, summary: dict[str, Any], labels: dict[str, Any] | None = None) -> None:
        """A latency summary from a Histogram.summary() in microseconds, exposed in seconds."""
        labels = dict(labels or {})
        for quantile, key in (("0.5", "p50_us"), ("0.9", "p90_us"), ("0.99", "p99_us"), ("0.999", "p999_us")):
            if key in summary:
                self.sample(name, "summary", help_text, summary[key] / 1e6, {**labels, "quantile": quantile})
        if "sum_us" in summary:
            self.sample(name, "summary", help_text, summary["sum_us"] / 1e6, labels, "_sum")
        self.sample(name, "summary", help_text, summary.get("count", 0), labels, "_count")

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, lines) in self.families.items():
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)
        return "\n".join(out) + "\n"


_HANDLED = {"version", "pid", "started_at", "data_dir", "socket", "read_only", "tiers", "journal", "memory",
            "snapshot", "recovery", "requests"}


def render_metrics(stats: dict[str, Any]) -> str:
    """sys.stats as Prometheus text: requests, errors, latency summaries, journal, tiers, queues."""
    m = _Exposition()
    m.sample("eurekamem_info", "gauge", "Build information (always 1).", 1, {"version": stats.get("version", "")})
    m.sample("eurekamem_process_pid", "gauge", "The daemon's process id.", stats.get("pid"))
    started = _epoch(stats.get("started_at"))
    m.sample("eurekamem_start_time_seconds", "gauge", "When the daemon started, in seconds since the epoch.", started)
    m.sample("eurekamem_read_only", "gauge", "1 when the journal cannot be written and writes are refused.", bool(stats.get("read_only")))

    requests = stats.get("requests", {})
    for method, entry in requests.get("methods", {}).items():
        labels = {"method": method}
        m.sample("eurekamem_requests_total", "counter", "Requests answered, by method.", entry.get("count", 0), labels)
    for method, entry in requests.get("methods", {}).items():
        for kind, count in sorted(entry.get("errors", {}).items()):
            m.sample("eurekamem_request_errors_total", "counter", "Error answers, by method and error kind.", count, {"method": method, "kind": kind})
    for method, entry in requests.get("methods", {}).items():
        m.summary_us("eurekamem_request_duration_seconds", "Time from a request's arrival to its answer, by method.", entry, {"method": method})
    m.sample("eurekamem_connections_open", "gauge", "Client connections open now.", requests.get("connections_open"))
    m.sample("eurekamem_connections_total", "counter", "Client connections accepted since start.", requests.get("connections_total"))

    journal = stats.get("journal", {})
    m.sample("eurekamem_journal_bytes", "gauge", "Bytes in the journal's segment files.", journal.get("bytes"))
    m.sample("eurekamem_journal_segments", "gauge", "Journal segment files.", journal.get("segments"))
    m.sample("eurekamem_journal_last_seq", "gauge", "Sequence number of the last durable journal record.", journal.get("last_seq"))
    m.sample("eurekamem_journal_batches_total", "counter", "Journal group-commit batches written.", journal.get("batches"))
    m.sample("eurekamem_journal_records_total", "counter", "Journal records written.", journal.get("records"))
    m.sample("eurekamem_journal_failed", "gauge", "1 when the journal stopped after a write error.", bool(journal.get("failed")))
    m.sample("eurekamem_journal_resumes_total", "counter", "Times sys.resume made the journal writable again.", journal.get("resumes"))
    if isinstance(journal.get("fsync_latency"), dict):
        m.summary_us("eurekamem_journal_fsync_seconds", "Latency of the journal's fsync calls.", journal["fsync_latency"], {"policy": journal.get("fsync", "")})

    for tier, counts in stats.get("tiers", {}).items():
        for key, value in counts.items():
            if key == "queue":
                m.sample("eurekamem_queue_length", "gauge", "Requests waiting in a tier actor's queue.", value, {"tier": tier})
            elif isinstance(value, (int, float)):
                m.sample("eurekamem_tier_items", "gauge", "Items held by a tier, by kind (records, nodes, memories, ...).", value, {"tier": tier, "kind": key})

    memory = stats.get("memory", {})
    for key, help_text in (
        ("files_written", "Memory .md and _index.json files written."),
        ("projection_errors", "Failed writes of memory files (retried)."),
        ("reembedded", "Memories embedded again in the background."),
    ):
        m.sample(f"eurekamem_memory_{key}_total", "counter", help_text, memory.get(key))
    for mode, summary in (memory.get("search") or {}).items():
        if isinstance(summary, dict):
            m.summary_us("eurekamem_memory_search_seconds", "memory.search's own time, by mode: index, BM25 and fusion, without the query's embedding.", summary, {"mode": mode})
    if isinstance(memory.get("query_embedding"), dict):
        m.summary_us("eurekamem_memory_query_embedding_seconds", "Embedding one search query.", memory["query_embedding"])
    if memory.get("model"):
        m.sample("eurekamem_memory_model_info", "gauge", "The embedding model of tier 4 (always 1).", 1, {"model": memory["model"]})
    m.sample("eurekamem_snapshot_seq", "gauge", "Journal sequence number covered by the last snapshot.", stats.get("snapshot", {}).get("seq"))
    recovery = stats.get("recovery", {})
    m.sample("eurekamem_recovery_seconds", "gauge", "Time recovery took at start.", recovery.get("seconds"))
    m.sample("eurekamem_recovery_replayed_records", "gauge", "Journal records replayed at start.", recovery.get("replayed"))

    for key, value in stats.items():  # sections added later (jobs, limits, ...): numbers as gauges
        if key not in _HANDLED:
            for path, number in _numeric_leaves(value, [key]):
                name = "eurekamem_" + "_".join(re.sub(r"[^a-zA-Z0-9_]", "_", p) for p in path)
                m.sample(name, "gauge", f"sys.stats {'.'.join(path)}.", number)
    return m.render()


def _numeric_leaves(value: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    if isinstance(value, bool) or isinstance(value, (int, float)):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numeric_leaves(item, path + [str(key)])


def _epoch(stamp: Any) -> float | None:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def cmd_metrics(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    try:
        with _client(args) as client:
            stats = client.call("sys.stats", {})
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return _err(f"not running or not reachable: {exc}")
    sys.stdout.write(render_metrics(stats))
    return 0


# --- top ------------------------------------------------------------------------------------------

CLEAR = "\x1b[H\x1b[2J"


def render_top(stats: dict[str, Any], previous: dict[str, Any] | None, elapsed: float) -> str:
    lines = []
    journal = stats["journal"]
    requests = stats["requests"]
    rate = ""
    if previous is not None and elapsed > 0:
        rate = f"  {(requests['total'] - previous['requests']['total']) / elapsed:,.0f} req/s"
    lines.append(f"eurekamem {stats['version']}  pid {stats['pid']}  since {stats['started_at']}{rate}")
    lines.append(f"  data {stats['data_dir']}   socket {stats['socket']}")
    state = "READ-ONLY: " + str(journal.get("failed")) if stats.get("read_only") else "writable"
    fl = journal.get("fsync_latency", {})
    lines.append(
        f"  journal  {journal['bytes']:,} bytes, {journal['segments']} segments, seq {journal['last_seq']}, "
        f"fsync {journal['fsync']} p50 {fl.get('p50_us', 0)} us p99 {fl.get('p99_us', 0)} us, {state}"
    )
    for tier, counts in stats["tiers"].items():
        lines.append(f"  {tier:<10} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append(f"  connections {requests['connections_open']} open, {requests['connections_total']} total; {requests['total']:,} requests")
    lines.append(f"    {'method':<22} {'count':>9} {'rate/s':>8} {'p50 us':>10} {'p99 us':>10} {'max us':>10} {'errors':>7}")
    before = (previous or {}).get("requests", {}).get("methods", {})
    for name, entry in requests["methods"].items():
        per_second = (entry["count"] - before.get(name, {}).get("count", 0)) / elapsed if previous is not None and elapsed > 0 else 0.0
        lines.append(
            f"    {name:<22} {entry['count']:>9} {per_second:>8.0f} {entry['p50_us']:>10} {entry['p99_us']:>10} "
            f"{entry['max_us']:>10} {sum(entry['errors'].values()):>7}"
        )
    lines.append("")
    lines.append("q or Ctrl-C quits")
    return "\n".join(lines)


class _Keys:
    """Single key presses from a terminal stdin (cbreak mode), restored on exit; nothing otherwise."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.saved: Any = None

    def __enter__(self) -> "_Keys":
        try:
            if sys.stdin.isatty():
                import termios
                import tty

                self.fd = sys.stdin.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (OSError, ValueError, AttributeError):
            self.fd = None
        return self

    def wait(self, seconds: float) -> str:
        """Wait up to `seconds`; returns a key pressed meanwhile ("" when none)."""
        if self.fd is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self.fd], [], [], seconds)
        return os.read(self.fd, 16).decode(errors="replace") if ready else ""

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def cmd_top(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    previous: dict[str, Any] | None = None
    previous_at = 0.0
    done = 0
    try:
        with _client(args) as client, _Keys() as keys:
            while True:
                try:
                    stats = client.call("sys.stats", {})
                except (EurekamemError, ConnectionLost, OSError) as exc:
                    return _err(f"not running or not reachable: {exc}")
                now = time.monotonic()
                sys.stdout.write(CLEAR + render_top(stats, previous, now - previous_at) + "\n")
                sys.stdout.flush()
                previous, previous_at = stats, now
                done += 1
                if args.iterations and done >= args.iterations:
                    return 0
                if "q" in keys.wait(args.interval).lower():
                    return 0
    except KeyboardInterrupt:
        return 0


# --- backup and restore ---------------------------------------------------------------------------


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


def _segment_files(root: Path) -> list[Path]:
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
    compress = target.name.endswith((".gz", ".tgz"))
    for attempt in range(1, BACKUP_ATTEMPTS + 1):
        snapshot_files = _snapshot_files(root)
        before = {p: _identity(p) for p in snapshot_files}
        checkpoint = _read_checkpoint(root)
        others = [p for tree in BACKUP_TREES[1:] for p in _tree_files(root, tree)]
        segments = _segment_files(root)
        total = sum((_identity(p) or (0, 0, 0))[1] for p in snapshot_files + others + segments)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        progress = Progress(total, "backup", progress_stream)
        try:
            with tarfile.open(tmp, "w:gz" if compress else "w") as tar:
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
    from eurekamem.client import ConnectionLost, EurekamemError

    target = Path(args.path).expanduser()
    if not target.name.endswith((".tar", ".tar.gz", ".tgz")):
        return _err(f"{target}: the archive's name must end in .tar, .tar.gz or .tgz")
    if not target.parent.is_dir():
        return _err(f"{target.parent} is not a folder")
    try:
        with _client(args) as client:
            seq = client.call("sys.snapshot", {})["seq"]
            root = Path(client.call("sys.stats", {})["data_dir"])
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return _err(f"backup needs the running daemon (for a snapshot): {exc}")
    try:
        manifest = write_backup(root, target)
    except (OSError, RuntimeError) as exc:
        return _err(f"backup failed: {exc}")
    print(
        f"wrote {target} ({manifest['bytes']:,} bytes, {len(manifest['files'])} files) from {root}: "
        f"snapshot at seq {seq}, checkpoint {manifest['checkpoint_seq']}, journal segments {len(manifest['journal_segments'])}"
    )
    return 0


def restore_backup(archive: Path, target: Path, progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Unpack a backup into `target`, which must be empty or absent. Returns the manifest."""
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
    return manifest


def cmd_restore(args: argparse.Namespace) -> int:
    from ._config import ConfigError

    archive = Path(args.path).expanduser()
    if not archive.is_file():
        return _err(f"{archive} does not exist")
    try:
        target = Path(_effective(args, ("data_dir",))["data_dir"])
    except ConfigError as exc:
        return _err(str(exc))
    try:
        manifest = restore_backup(archive, target)
    except (ValueError, OSError, tarfile.TarError) as exc:
        return _err(f"restore failed: {exc}")
    print(
        f"restored {len(manifest.get('files', []))} files into {target} (checkpoint seq {manifest.get('checkpoint_seq')}, "
        f"backup written {manifest.get('written_at')}); start it with: eurekamem serve --data-dir {target}"
    )
    return 0


# --- export ---------------------------------------------------------------------------------------


def _results(client: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    out = []
    for start in range(0, len(calls), PAGE):
        for result in client.call_many(calls[start : start + PAGE]):
            if isinstance(result, BaseException):
                raise result
            out.append(result)
    return out


def export_records(client: Any, progress_stream: TextIO | None = None) -> Iterator[dict[str, Any]]:
    """Every persistent record, graph node and edge, and memory, as {"tier": ..., **record}."""
    from eurekamem.protocol._methods import MAX_LIMIT

    keys = client.call("persistent.keys", {"limit": MAX_LIMIT})["keys"]
    if len(keys) >= MAX_LIMIT:
        log.warning("persistent.keys answers at most %d keys; the export holds the first %d", MAX_LIMIT, MAX_LIMIT)
    nodes_doc = client.call("graph.export", {"format": "node_link"})["data"]
    node_ids = [node["id"] for node in nodes_doc.get("nodes", [])]
    first = client.call("memory.list", {"status": "any", "limit": MAX_LIMIT, "offset": 0})
    progress = Progress(len(keys) + len(node_ids) + first["total"], "export", progress_stream)
    for start in range(0, len(keys), PAGE):
        chunk = keys[start : start + PAGE]
        for record in _results(client, [("persistent.recall", {"key": key}) for key in chunk]):
            if record is not None:
                yield {"tier": "persistent", **record}
        progress.add(len(chunk))
    for start in range(0, len(node_ids), PAGE):
        chunk = node_ids[start : start + PAGE]
        for node in _results(client, [("graph.get", {"node_id": node_id}) for node_id in chunk]):
            yield {"tier": "graph_node", **node}
        progress.add(len(chunk))
    for edge in nodes_doc.get("edges", []):
        yield {"tier": "graph_edge", "from_id": edge["source"], "to_id": edge["target"], "relation": edge.get("relation") or edge.get("key") or "uses"}
    page = first
    offset = 0
    while True:
        for memory in page["memories"]:
            yield {"tier": "memory", **memory}
        progress.add(len(page["memories"]))
        offset += len(page["memories"])
        if not page["memories"] or offset >= page["total"]:
            break
        page = client.call("memory.list", {"status": "any", "limit": MAX_LIMIT, "offset": offset})
    progress.close()


def cmd_export(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    out: TextIO
    counts: dict[str, int] = {}
    target = Path(args.out).expanduser() if args.out else None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp") if target else None
    try:
        with _client(args) as client:
            out = open(tmp, "w", encoding="utf-8") if tmp else sys.stdout
            try:
                for item in export_records(client):
                    out.write(json.dumps(item, ensure_ascii=False) + "\n")
                    counts[item["tier"]] = counts.get(item["tier"], 0) + 1
            finally:
                if tmp:
                    out.close()
    except (EurekamemError, ConnectionLost, OSError) as exc:
        if tmp:
            tmp.unlink(missing_ok=True)
        return _err(f"export failed: {exc}")
    if tmp and target:
        os.replace(tmp, target)
    summary = ", ".join(f"{n} {tier}" for tier, n in counts.items()) or "nothing"
    print(f"exported {summary}" + (f" to {target}" if target else ""), file=sys.stderr)
    return 0


# --- import ---------------------------------------------------------------------------------------

_MEMORY_FIELDS = ("domain", "category", "title", "content", "confidence", "tags", "source_session", "scope", "abstract", "overview")


class Importer:
    """Adds exported or EurekaClaw records through the socket; node ids change, so it keeps a map."""

    def __init__(self, client: Any, progress: Progress) -> None:
        self.client = client
        self.progress = progress
        self.node_map: dict[str, str] = {}
        self.counts: dict[str, int] = {"persistent": 0, "graph_node": 0, "graph_edge": 0, "memory": 0}
        self.failed: list[str] = []

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed.append(f"{what}: {getattr(exc, 'message', exc)}")

    def persistent(self, records: list[dict[str, Any]]) -> None:
        calls = [("persistent.remember", {"key": r["key"], "value": r.get("value"), "tags": list(r.get("tags") or []),
                                          "source_session": str(r.get("source_session") or "")}) for r in records]
        for record, result in zip(records, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"persistent {record.get('key')!r}", result)
            else:
                self.counts["persistent"] += 1
        self.progress.add(len(records))

    def nodes(self, nodes: list[dict[str, Any]]) -> None:
        calls = []
        for n in nodes:
            tags = n.get("tags") or []
            calls.append(("graph.add_theorem", {
                "theorem_name": n.get("theorem_name") or n.get("node_id") or "untitled",
                "formal_statement": n.get("formal_statement") or "",
                "domain": n.get("domain") or "", "session_id": n.get("session_id") or "",
                "tags": tags.split(",") if isinstance(tags, str) else list(tags),
            }))
        for node, result in zip(nodes, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"graph node {node.get('node_id')!r}", result)
            else:
                self.node_map[str(node.get("node_id"))] = result["node_id"]
                self.counts["graph_node"] += 1
        self.progress.add(len(nodes))

    def edges(self, edges: list[tuple[str, str, str]]) -> None:
        calls = []
        for from_id, to_id, relation in edges:
            calls.append(("graph.link", {"from_id": self.node_map.get(from_id, from_id), "to_id": self.node_map.get(to_id, to_id),
                                         "relation": relation if relation in ("uses", "generalizes", "specializes", "contradicts") else "uses"}))
        for edge, result in zip(edges, self._call_all(calls)):
            if isinstance(result, BaseException):
                self._fail(f"graph edge {edge}", result)
            else:
                self.counts["graph_edge"] += 1
        self.progress.add(len(edges))

    def memories(self, memories: list[dict[str, Any]]) -> None:
        """memory.add_many (dedup off) in batches; an archived memory is archived again after."""
        for start in range(0, len(memories), PAGE):
            chunk = memories[start : start + PAGE]
            items = [self._memory_item(m) for m in chunk]
            try:
                results: list[Any] = self.client.call("memory.add_many", {"items": items})
            except Exception:  # one bad item fails the batch: add them one by one to find it
                results = self.client.call_many([("memory.add", item) for item in items])
            archive = []
            for memory, result in zip(chunk, results):
                if isinstance(result, BaseException):
                    self._fail(f"memory {memory.get('title')!r}", result)
                    continue
                self.counts["memory"] += 1
                if memory.get("status") == "archived":
                    archive.append(("memory.delete", {"id": result["memory"]["id"]}))
            for result in self._call_all(archive):
                if isinstance(result, BaseException):
                    self._fail("archiving a memory", result)
            self.progress.add(len(chunk))

    @staticmethod
    def _memory_item(memory: dict[str, Any]) -> dict[str, Any]:
        item = {k: memory[k] for k in _MEMORY_FIELDS if memory.get(k) is not None}
        item.setdefault("domain", "general")
        if not item.get("abstract"):
            item.pop("abstract", None)
        if not item.get("overview"):
            item.pop("overview", None)
        item["dedup"] = False
        return item

    def _call_all(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(calls), PAGE):
            out.extend(self.client.call_many(calls[start : start + PAGE]))
        return out


def read_jsonl(path: Path) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": []}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            tier = item.pop("tier", None) if isinstance(item, dict) else None
            if tier not in groups:
                raise ValueError(f"{path}:{number}: no known \"tier\" (persistent, graph_node, graph_edge, memory)")
            if tier == "graph_edge":
                item = (str(item["from_id"]), str(item["to_id"]), str(item.get("relation") or "uses"))
            groups[tier].append(item)
    return groups


def read_eurekaclaw_root(root: Path) -> tuple[dict[str, list[Any]], list[str]]:
    """A plain EurekaClaw data root: persistent.json, knowledge_graph.json, memories/*/*.md."""
    from . import _eurekaclaw as eurekaclaw
    from ._memory_files import parse_markdown
    from eurekamem.protocol._records import MEMORY_CATEGORIES

    notes: list[str] = []
    groups: dict[str, list[Any]] = {"persistent": [], "graph_node": [], "graph_edge": [], "memory": []}
    persistent = root / "memory" / "persistent.json"
    if persistent.is_file():
        for record in eurekaclaw.read_persistent(persistent.read_bytes(), str(persistent)).values():
            groups["persistent"].append({"key": record.key, "value": record.value, "tags": record.tags, "source_session": record.source_session})
    graph = root / "memory" / "knowledge_graph.json"
    if graph.is_file():
        nodes, edges = eurekaclaw.read_graph(graph.read_bytes(), str(graph))
        for node in nodes.values():
            groups["graph_node"].append({"node_id": node.node_id, "theorem_name": node.theorem_name, "formal_statement": node.formal_statement,
                                         "domain": node.domain, "session_id": node.session_id, "tags": node.tags})
        groups["graph_edge"].extend(edges)
    journal = root / "memory" / "journal"
    if _segment_files(root) and any(p.stat().st_size > 26 for p in _segment_files(root)):
        notes.append(f"{journal} holds journal records: if a daemon ran there, stop it cleanly first so its snapshots are current")
    base = root / "memories"
    paths = sorted(base.glob("*/*.md")) + sorted(base.glob("*/_archive/*.md")) if base.is_dir() else []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            notes.append(f"could not read {path}: {exc}")
            continue
        fields, content, heading = parse_markdown(text)
        if not content.strip():
            notes.append(f"{path}: no text, skipped")
            continue
        title = str(fields.get("title") or heading or path.stem[9:].replace("_", " ") or "untitled")
        category = str(fields.get("category") or "domain_knowledge")
        try:
            confidence = min(1.0, max(0.0, float(fields.get("confidence", 0.8))))
        except (TypeError, ValueError):
            confidence = 0.8
        if confidence != confidence:
            confidence = 0.8
        tags = fields.get("tags")
        folder = (path.parent.parent if path.parent.name == "_archive" else path.parent).name
        groups["memory"].append({
            "domain": str(fields.get("domain") or folder),  # no domain field: the folder's slug
            "category": category if category in MEMORY_CATEGORIES else "domain_knowledge",
            "title": title[:1024],
            "content": content,
            "confidence": round(confidence, 4),
            "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
            "source_session": str(fields.get("source_session") or "")[:256],
            "scope": "global" if fields.get("scope") == "global" else "local",
            "status": "archived" if path.parent.name == "_archive" else "active",
        })
    return groups, notes


def import_groups(client: Any, groups: dict[str, list[Any]], progress_stream: TextIO | None = None) -> Importer:
    total = sum(len(v) for v in groups.values())
    progress = Progress(total, "import", progress_stream)
    importer = Importer(client, progress)
    importer.persistent(groups["persistent"])
    importer.nodes(groups["graph_node"])
    importer.edges(groups["graph_edge"])
    memories = groups["memory"]
    memories.sort(key=lambda m: str(m.get("created_at") or ""))  # oldest first, as they were written
    importer.memories(memories)
    progress.close()
    return importer


def cmd_import(args: argparse.Namespace) -> int:
    from eurekamem.client import ConnectionLost, EurekamemError

    from ._eurekaclaw import SnapshotReadError

    source = Path(args.source).expanduser()
    notes: list[str] = []
    try:
        if source.is_dir():
            groups, notes = read_eurekaclaw_root(source)
        elif source.is_file():
            groups = read_jsonl(source)
        else:
            return _err(f"{source} does not exist")
    except (ValueError, KeyError, OSError, SnapshotReadError) as exc:
        return _err(f"cannot read {source}: {exc}")
    for note in notes:
        print(f"eurekamem: note: {note}", file=sys.stderr)
    try:
        with _client(args) as client:
            importer = import_groups(client, groups)
    except (EurekamemError, ConnectionLost, OSError) as exc:
        return _err(f"import failed: {exc}")
    summary = ", ".join(f"{n} {tier}" for tier, n in importer.counts.items())
    print(f"imported {summary} from {source}")
    for failure in importer.failed[:20]:
        print(f"  failed: {failure}", file=sys.stderr)
    if importer.failed:
        print(f"eurekamem: {len(importer.failed)} items could not be imported", file=sys.stderr)
        return 1
    return 0


# --- verify ---------------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.ok: list[str] = []
        self.problems: list[str] = []
        self.notes: list[str] = []

    def render(self) -> str:
        lines = [f"ok    {line}" for line in self.ok]
        lines += [f"note  {line}" for line in self.notes]
        lines += [f"DIFF  {line}" for line in self.problems]
        verdict = "clean" if not self.problems else f"{len(self.problems)} difference(s)"
        lines.append(f"verify: {verdict}")
        return "\n".join(lines)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def verify_root(root: Path) -> Report:
    """Check the journal, the snapshots, the vectors and the memory files against each other.
    The caller holds the LOCK (the daemon is not running)."""
    import msgspec

    from . import _eurekaclaw as eurekaclaw
    from ._app import Paths, mutation_decoder
    from ._journal import scan_segment
    from ._memories import MemorySnapshot, PurgeMemory, PutMemory
    from ._memory_files import fingerprint, parse_markdown
    from ._state import RTYPE_MUTATION
    from ._vectors import _HEAD, MAGIC, VectorStore

    report = Report()
    paths = Paths(root)

    # the checkpoint
    checkpoint = 0
    if paths.checkpoint.exists():
        try:
            checkpoint = int(json.loads(paths.checkpoint.read_bytes())["seq"])
            report.ok.append(f"checkpoint: seq {checkpoint}")
        except (ValueError, KeyError, TypeError) as exc:
            report.problems.append(f"{paths.checkpoint}: unreadable ({exc})")
    else:
        report.notes.append("no checkpoint: the daemon has not written a snapshot here yet")

    # the journal
    records: list[tuple[int, int, bytes]] = []
    last_seq: int | None = None
    expected: int | None = None
    segments = _segment_files(root)
    journal_ok = True
    for index, path in enumerate(segments):
        name_seq = int(path.name[:20])
        if expected is not None and name_seq != expected:
            report.problems.append(f"journal: {path.name} starts at seq {name_seq}, {expected} expected (a gap)")
            journal_ok = False
        scan = scan_segment(path.read_bytes())
        if not scan.header_ok:
            report.problems.append(f"journal: {path.name}: {scan.reason}")
            journal_ok = False
            break
        if scan.first_seq != name_seq:
            report.problems.append(f"journal: {path.name}: header says first seq {scan.first_seq}")
            journal_ok = False
        if scan.corrupt:
            report.problems.append(f"journal: {path.name}: corrupt at offset {scan.valid_end}: {scan.reason} (eurekamem repair)")
            journal_ok = False
        elif scan.torn:
            last = index == len(segments) - 1
            where = "torn tail" if last else "torn record in a segment that is not the last"
            report.problems.append(f"journal: {path.name}: {where} at offset {scan.valid_end}: {scan.reason}" +
                                   (" (the daemon cuts it off at start)" if last else " (eurekamem repair)"))
            journal_ok = journal_ok and last
        records.extend(scan.records)
        expected = name_seq + len(scan.records)
        last_seq = expected - 1
    if segments and journal_ok:
        first = int(segments[0].name[:20])
        span = f"seqs {first}..{last_seq}" if last_seq is not None and last_seq >= first else "no records"
        report.ok.append(f"journal: {len(segments)} segments scan cleanly, {span}")
    if segments and int(segments[0].name[:20]) > checkpoint + 1:
        report.problems.append(f"journal: starts at seq {int(segments[0].name[:20])}, but the checkpoint covers only up to {checkpoint}: records are missing")
    if last_seq is not None and last_seq < checkpoint:
        report.problems.append(f"journal: ends at seq {last_seq}, before the checkpoint's seq {checkpoint}")
    elif last_seq is not None:
        report.ok.append(f"checkpoint seq {checkpoint} <= journal last seq {last_seq}")

    # tiers 2 and 3
    for path, reader, what in ((paths.persistent, eurekaclaw.read_persistent, "records"), (paths.graph, eurekaclaw.read_graph, "nodes")):
        if not path.exists():
            report.notes.append(f"{path.name}: absent")
            continue
        try:
            value = reader(path.read_bytes(), path.name)
            count = len(value) if what == "records" else len(value[0])
            report.ok.append(f"{path.name}: parses ({count} {what})")
        except eurekaclaw.SnapshotReadError as exc:
            report.problems.append(f"{path.name}: {exc}")

    # tier 4: the snapshot, its vectors, then the journal past the checkpoint
    memories: dict[str, Any] = {}
    if paths.memory_snapshot.exists():
        try:
            doc = msgspec.msgpack.decode(paths.memory_snapshot.read_bytes(), type=MemorySnapshot)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            report.problems.append(f"memories.snapshot: does not decode: {exc}")
            doc = None
        if doc is not None:
            memories = {m.id: m for m in doc.memories}
            report.ok.append(f"memories.snapshot: decodes ({len(memories)} memories, model {doc.model})")
            _verify_vectors(paths.vectors, doc, report, VectorStore, _HEAD, MAGIC)
    else:
        report.notes.append("memories.snapshot: absent (tier 4 is imported from the .md files on start)")
    touched: set[str] = set()
    undecodable = 0
    for seq, rtype, payload in records:
        if seq <= checkpoint or rtype != RTYPE_MUTATION:
            continue
        try:
            mutation = mutation_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            undecodable += 1
            continue
        if isinstance(mutation, PutMemory):
            memories[mutation.memory.id] = mutation.memory
            touched.add(mutation.memory.id)
        elif isinstance(mutation, PurgeMemory):
            memories.pop(mutation.id, None)
            touched.add(mutation.id)
    if undecodable:
        report.problems.append(f"journal: {undecodable} records past the checkpoint do not decode as mutations")

    # the memory files against the memories
    if paths.memory_snapshot.exists() or touched:
        bad = 0
        known_files = set()
        for memory in memories.values():
            known_files.add(memory.file)
            path = root / memory.file
            problem = None
            if not path.is_file():
                problem = f"{memory.file}: missing (memory {memory.id})"
            else:
                fields, content, heading = parse_markdown(path.read_text(encoding="utf-8", errors="replace"))
                title = str(fields.get("title") or heading or "")
                if fingerprint(title, content) != memory.fingerprint:
                    problem = f"{memory.file}: its text does not match memory {memory.id} (fingerprint {fingerprint(title, content)}, expected {memory.fingerprint})"
            if problem:
                if memory.id in touched:
                    report.notes.append(problem + "; changed in the journal, rewritten on the daemon's next start")
                else:
                    bad += 1
                    report.problems.append(problem)
        if not bad:
            report.ok.append(f"memory files: {len(memories)} match their memories")
        base = root / "memories"
        if base.is_dir():
            for path in sorted(base.glob("*/*.md")) + sorted(base.glob("*/_archive/*.md")):
                relative = path.relative_to(root).as_posix()
                if relative not in known_files:
                    report.problems.append(f"{relative}: a memory file that no memory owns")
            for index_path in sorted(base.glob("*/_index.json")):
                try:
                    if not isinstance(json.loads(index_path.read_bytes()), dict):
                        raise ValueError("not an object")
                except ValueError as exc:
                    report.problems.append(f"{index_path.relative_to(root)}: unreadable ({exc})")
    return report


def _verify_vectors(folder: Path, doc: Any, report: Report, VectorStore: Any, head: Any, magic: bytes) -> None:
    vpath = folder / f"{doc.stem()}.vectors"
    embedded = sum(1 for model in doc.models.values() if model == doc.model)
    if not vpath.exists():
        if embedded:
            report.problems.append(f"vectors/{vpath.name}: missing, but {embedded} memories have {doc.model} vectors (they would be re-embedded)")
        else:
            report.ok.append("vectors: none expected")
        return
    try:
        with open(vpath, "rb") as f:
            first = f.read(head.size)
        fmagic, _version, dim = head.unpack_from(first)[:3]
    except Exception as exc:  # OSError, or struct.error on a short file
        report.problems.append(f"vectors/{vpath.name}: unreadable header ({exc})")
        return
    if fmagic != magic:
        report.problems.append(f"vectors/{vpath.name}: not a vectors file")
        return
    collect = _Collect()
    vectors_log = logging.getLogger("eurekamem.vectors")
    vectors_log.addHandler(collect)
    try:
        store = VectorStore.load(str(folder), doc.stem(), dim=dim, model=doc.model, expected_fingerprint=doc.vectors_fingerprint)
    finally:
        vectors_log.removeHandler(collect)
    if store is None:
        why = "; ".join(collect.messages) or "refused"
        report.problems.append(f"vectors/{vpath.name}: does not match memories.snapshot ({why})")
    else:
        report.ok.append(f"vectors/{vpath.name}: fingerprint {store.fingerprint()} matches ({len(store)} vectors)")


def cmd_verify(args: argparse.Namespace) -> int:
    from ._app import Paths, StartupError, acquire_lock
    from ._config import ConfigError

    try:
        root = Path(_effective(args, ("data_dir",))["data_dir"])
    except ConfigError as exc:
        return _err(str(exc))
    if not (root / "memory").is_dir():
        return _err(f"{root} holds no memory/ folder; nothing to verify")
    paths = Paths(root)
    try:
        fd = acquire_lock(paths)
    except StartupError as exc:
        return _err(f"{exc} (verify reads the files while no daemon runs)")
    try:
        report = verify_root(root)
    finally:
        os.close(fd)
    print(f"verify {root}")
    print(report.render())
    return 1 if report.problems else 0


# --- the command line -----------------------------------------------------------------------------


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register config show, metrics, top, backup, restore, export, import and verify."""
    from ._config import add_serve_flags

    config = sub.add_parser("config", help="the effective configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print every setting, its value and where it came from (default, file, env, flag)")
    common(show)
    add_serve_flags(show)
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func=cmd_config_show)

    metrics = sub.add_parser("metrics", help="sys.stats in Prometheus text format")
    common(metrics)
    metrics.add_argument("--timeout", type=float, default=5.0)
    metrics.set_defaults(func=cmd_metrics)

    top = sub.add_parser("top", help="a live status view, refreshed every second (q or Ctrl-C quits)")
    common(top)
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after this many refreshes (0: until q)")
    top.add_argument("--timeout", type=float, default=5.0)
    top.set_defaults(func=cmd_top)

    backup = sub.add_parser("backup", help="a consistent archive (.tar or .tar.gz) of the running daemon's data")
    common(backup)
    backup.add_argument("path", help="the archive to write: NAME.tar or NAME.tar.gz")
    backup.add_argument("--timeout", type=float, default=600.0)
    backup.set_defaults(func=cmd_backup)

    restore = sub.add_parser("restore", help="unpack a backup into an empty data root")
    restore.add_argument("path", help="the archive written by eurekamem backup")
    restore.add_argument("--data-dir", help="the empty data root to fill (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    restore.add_argument("--config", help="config file (for its data_dir)")
    restore.set_defaults(func=cmd_restore)

    export = sub.add_parser("export", help="every record as JSON lines, read through the daemon")
    common(export)
    export.add_argument("--format", choices=["jsonl"], default="jsonl")
    export.add_argument("--out", help="write here instead of stdout")
    export.add_argument("--timeout", type=float, default=600.0)
    export.set_defaults(func=cmd_export)

    imp = sub.add_parser("import", help="add a jsonl export, or a plain EurekaClaw data root, through the daemon")
    common(imp)
    imp.add_argument("source", help="a .jsonl file from eurekamem export, or an EurekaClaw data root folder")
    imp.add_argument("--timeout", type=float, default=600.0)
    imp.set_defaults(func=cmd_import)

    verify = sub.add_parser("verify", help="check journal, snapshots, vectors and memory files against each other (daemon stopped)")
    verify.add_argument("--data-dir", help="data root (default $EUREKACLAW_DIR or ~/.eurekaclaw)")
    verify.add_argument("--config", help="config file (for its data_dir)")
    verify.set_defaults(func=cmd_verify)
