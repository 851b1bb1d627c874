"""`eurekamem verify`: check a stopped daemon's data root (journal, snapshots, vectors, memory files).

Rule kept here: verify holds the data root's LOCK, so the daemon cannot start meanwhile, and it only
reads; it reports every problem it finds with the file that holds it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from .backup import segment_files
from .common import effective_config, fail

log = logging.getLogger("eurekamem.admin")


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

    from ..daemon.memory.format import fingerprint, memory_files, parse_markdown
    from ..daemon.memory.records import MemorySnapshot, PurgeMemory, PutMemory
    from ..daemon.paths import Paths
    from ..daemon.recovery import decode_mutation
    from ..daemon.retrieval.vector_files import MAGIC, read_header
    from ..daemon.retrieval.vectors import VectorStore
    from ..daemon.storage import eurekaclaw
    from ..daemon.storage.journal import check_segment, scan_segment
    from ..daemon.storage.store import RTYPE_MUTATION

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

    # the journal, by the rules Journal.open applies (check_segment), reporting every segment
    records: list[tuple[int, int, bytes]] = []
    last_seq: int | None = None
    expected: int | None = None
    segments = segment_files(root)
    journal_ok = True
    for index, path in enumerate(segments):
        name_seq = int(path.name[:20])
        scan = scan_segment(path.read_bytes())
        verdict, offset, reason = check_segment(name_seq, scan, expected, index == len(segments) - 1)
        if verdict == "damaged":
            report.problems.append(f"journal: {path.name}: damaged at offset {offset}: {reason} (eurekamem repair)")
            journal_ok = False
        elif verdict == "torn_tail":
            report.problems.append(
                f"journal: {path.name}: torn tail at offset {offset}: {reason} (the daemon cuts it off at start)"
            )
        elif verdict == "torn_header":
            report.problems.append(
                f"journal: {path.name}: {reason} (an empty last segment: the daemon removes it at start)"
            )
        if not scan.header_ok:
            break  # nothing after a bad header can be vouched for
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
    def records_in(data: bytes, name: str) -> int:
        return len(eurekaclaw.read_persistent(data, name))

    def nodes_in(data: bytes, name: str) -> int:
        return len(eurekaclaw.read_graph(data, name)[0])

    for path, count_in, what in ((paths.persistent, records_in, "records"), (paths.graph, nodes_in, "nodes")):
        if not path.exists():
            report.notes.append(f"{path.name}: absent")
            continue
        try:
            count = count_in(path.read_bytes(), path.name)
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
            _verify_vectors(paths.vectors, doc, report, VectorStore, read_header, MAGIC)
    else:
        report.notes.append("memories.snapshot: absent (tier 4 is imported from the .md files on start)")
    touched: set[str] = set()
    undecodable = 0
    for seq, rtype, payload in records:
        if seq <= checkpoint or rtype != RTYPE_MUTATION:
            continue
        try:
            mutation = decode_mutation(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            undecodable += 1
            continue
        for one in getattr(mutation, "parts", None) or [mutation]:  # a job's commit holds its memories
            if isinstance(one, PutMemory):
                memories[one.memory.id] = one.memory
                touched.add(one.memory.id)
            elif isinstance(one, PurgeMemory):
                memories.pop(one.id, None)
                touched.add(one.id)
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
            for path in memory_files(base):  # MEMORY.md and GLOBAL.md are the readable projection, no memories
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


def _verify_vectors(folder: Path, doc: Any, report: Report, VectorStore: Any, read_header: Any, magic: bytes) -> None:
    vpath = folder / f"{doc.stem()}.vectors"
    embedded = sum(1 for model in doc.models.values() if model == doc.model)
    if not vpath.exists():
        if embedded:
            report.problems.append(f"vectors/{vpath.name}: missing, but {embedded} memories have {doc.model} vectors (they would be re-embedded)")
        else:
            report.ok.append("vectors: none expected")
        return
    try:
        fmagic, _version, dim = read_header(vpath)
    except Exception as exc:  # OSError, or VectorFileError on a short file
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
    from ..daemon.config import ConfigError
    from ..daemon.errors import StartupError
    from ..daemon.paths import Paths, acquire_lock

    try:
        root = Path(effective_config(args, ("data_dir",))["data_dir"])
    except ConfigError as exc:
        return fail(str(exc))
    if not (root / "memory").is_dir():
        return fail(f"{root} holds no memory/ folder; nothing to verify")
    paths = Paths(root)
    try:
        fd = acquire_lock(paths)
    except StartupError as exc:
        return fail(f"{exc} (verify reads the files while no daemon runs)")
    try:
        report = verify_root(root)
    finally:
        os.close(fd)
    print(f"verify {root}")
    print(report.render())
    return 1 if report.problems else 0


