"""The write-ahead journal: segment files of checksummed, numbered records.

Rule kept here: a record is either read back exactly as written or not at all, and the journal
never silently skips over damage. A torn tail (an incomplete or bad record with nothing valid
after it, at the end of the LAST segment: a crash during a write) is cut off and logged; any other
damage (a bad record followed by a valid one, a torn non-last segment, a gap in the sequence
numbers) is corruption: `Journal.open` refuses with JournalCorrupt naming the file and offset,
and `repair` backs up, then truncates; `check_segment` states that rule once for the three that
apply it (`Journal.open`, `repair`, `eurekamem verify`). Once a write or sync fails the journal
refuses all further writes (it never retries and carries on). A new segment counts only after its
folder is fsynced.

Layout (all integers big-endian):

    segment file  <first_seq:020d>.log
    file header   magic b"EUMJRNL1" | version u16 | salt u32 | first_seq u64 | crc32 u32 (of the 22
                  bytes before it)                                                     = 26 bytes
    record        length u32 (of payload) | crc u32 | type u8 | seq u64 | payload      = 17 + length
                  crc = zlib.crc32(salt u32 | seq u64 | type u8 | payload)

Sequence numbers start at 1 and are consecutive across segments; a segment's first record has the
seq of its file name. The salt is random per segment, so stale bytes of an older file never pass
as records of this one. The journal is synchronous and single-writer (not thread-safe); the
daemon's journal actor calls it from one worker thread at a time.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import os
import re
import secrets
import struct
import zlib
from collections.abc import Sequence
from typing import Literal

from .files import (
    AppendFile,
    FileLayer,
    RealFiles,
    StrPath,
    atomic_write,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FILE_HEADER_SIZE",
    "Journal",
    "JournalCorrupt",
    "JournalWriteError",
    "MAGIC",
    "RECORD_HEADER_SIZE",
    "RepairAction",
    "RepairReport",
    "SegmentScan",
    "VERSION",
    "check_segment",
    "encode_file_header",
    "encode_record",
    "repair",
    "scan_segment",
    "segment_name",
]


logger = logging.getLogger("eurekamem.journal")


MAGIC = b"EUMJRNL1"


VERSION = 1


DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


_HEADER_BODY = struct.Struct(">8sHIQ")


_HEADER_CRC = struct.Struct(">I")


FILE_HEADER_SIZE = _HEADER_BODY.size + _HEADER_CRC.size  # 26


_RECORD = struct.Struct(">IIBQ")


RECORD_HEADER_SIZE = _RECORD.size  # 17


_CRC_PREFIX = struct.Struct(">IQB")


_MAX_U32 = 0xFFFFFFFF


_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")


Record = tuple[int, int, bytes]  # (seq, rtype, payload)


Buffer = bytes | bytearray | memoryview


class JournalCorrupt(Exception):
    """The journal has damage that is not a torn tail; the daemon must not start on it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, reason)
        self.path = path
        self.offset = offset
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"journal corrupt: {self.path} at byte offset {self.offset}: {self.reason}. "
            f"Run `eurekamem repair` to back up the damaged segment and truncate it at the "
            f"first bad record (records after that point are lost)."
        )


class JournalWriteError(Exception):
    """A write or sync of the journal failed; the journal accepts no more writes.

    `error` is the original OSError (also the exception's __cause__).
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return f"journal is read-only after a failed write or sync: {self.error}"


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}.log"


def encode_file_header(salt: int, first_seq: int, version: int = VERSION) -> bytes:
    body = _HEADER_BODY.pack(MAGIC, version, salt, first_seq)
    return body + _HEADER_CRC.pack(zlib.crc32(body))


def _record_crc(salt: int, seq: int, rtype: int, payload: Buffer) -> int:
    return zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(salt, seq, rtype)))


def encode_record(salt: int, seq: int, rtype: int, payload: Buffer) -> bytes:
    return _RECORD.pack(len(payload), _record_crc(salt, seq, rtype, payload), rtype, seq) + bytes(payload)


@dataclasses.dataclass
class SegmentScan:
    """What one segment file holds. Exactly one of clean / torn / corrupt is true.

    - header_ok: the file header is complete, has a good CRC and a known version (then
      version, salt and first_seq are set; otherwise they are None).
    - records: the valid records, in order, all before `valid_end`.
    - valid_end: offset just after the last valid record (0 when the header is bad); when the
      segment is not clean, this is also the offset of the first bad byte.
    - torn: the bytes from valid_end on are an incomplete or bad record with nothing valid after.
    - corrupt: damage with valid data after it (or a bad sequence number, or a bad header on a
      file longer than a header); `records_after` counts the valid-looking records after it.
    - reason: why the segment is torn or corrupt ("" when clean).
    """

    header_ok: bool
    version: int | None
    salt: int | None
    first_seq: int | None
    records: list[Record]
    valid_end: int
    torn: bool = False
    corrupt: bool = False
    reason: str = ""
    records_after: int = 0

    @property
    def clean(self) -> bool:
        return not (self.torn or self.corrupt)

    @property
    def size(self) -> int:
        """Bytes of valid data (header + records), i.e. valid_end."""
        return self.valid_end


def _check_record(data: Buffer, pos: int, salt: int, lo: int, hi: int) -> int:
    """End offset of a valid record at `pos` whose seq is in [lo, hi], or -1."""
    n = len(data)
    if pos + RECORD_HEADER_SIZE > n:
        return -1
    length, crc, rtype, seq = _RECORD.unpack_from(data, pos)
    if not lo <= seq <= hi:
        return -1
    end = pos + RECORD_HEADER_SIZE + length
    if end > n:
        return -1
    if _record_crc(salt, seq, rtype, data[pos + RECORD_HEADER_SIZE : end]) != crc:
        return -1
    result: int = end
    return result


def _find_valid(data: Buffer, start: int, salt: int, lo: int, hi: int) -> int:
    """Offset of the first valid record at or after `start` with seq in [lo, hi], or -1."""
    last = len(data) - RECORD_HEADER_SIZE
    for pos in range(start, last + 1):
        if _check_record(data, pos, salt, lo, hi) >= 0:
            return pos
    return -1


def _count_valid(data: Buffer, start: int, salt: int, lo: int) -> int:
    """How many valid-looking records (seq >= lo) lie at or after `start`, walking forward."""
    hi = lo + len(data) // RECORD_HEADER_SIZE + 1
    count = 0
    pos = start
    while True:
        pos = _find_valid(data, pos, salt, lo, hi)
        if pos < 0:
            return count
        count += 1
        pos = _check_record(data, pos, salt, lo, hi)


def scan_segment(data: Buffer) -> SegmentScan:
    """Parse one segment file's bytes (no I/O). See SegmentScan for the result."""
    view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    n = len(view)
    if n < FILE_HEADER_SIZE:
        return SegmentScan(False, None, None, None, [], 0, torn=True,
                           reason=f"incomplete file header ({n} of {FILE_HEADER_SIZE} bytes)")
    magic, version, salt, first_seq = _HEADER_BODY.unpack_from(view, 0)
    (hcrc,) = _HEADER_CRC.unpack_from(view, _HEADER_BODY.size)
    header_crc_ok = zlib.crc32(view[: _HEADER_BODY.size]) == hcrc
    if not header_crc_ok or magic != MAGIC:
        why = "bad file magic" if magic != MAGIC else "file header CRC mismatch"
        if n == FILE_HEADER_SIZE:
            return SegmentScan(False, None, None, None, [], 0, torn=True, reason=why)
        # Without a trustworthy header nothing after it can be vouched for: never cut silently.
        after = _count_valid(view, FILE_HEADER_SIZE, salt, max(first_seq, 1))
        return SegmentScan(False, None, None, None, [], 0, corrupt=True, records_after=after,
                           reason=f"{why}, with {n - FILE_HEADER_SIZE} bytes after the header")
    if version != VERSION:
        return SegmentScan(False, None, None, None, [], 0, corrupt=True,
                           reason=f"unsupported journal version {version} (this build reads {VERSION})")
    if first_seq == 0:
        return SegmentScan(False, None, None, None, [], 0, corrupt=True,
                           reason="file header has first sequence number 0")

    records: list[Record] = []
    pos = FILE_HEADER_SIZE
    expected = first_seq
    why = ""
    while pos < n:
        if n - pos < RECORD_HEADER_SIZE:
            why = f"incomplete record header ({n - pos} of {RECORD_HEADER_SIZE} bytes)"
            break
        length, crc, rtype, seq = _RECORD.unpack_from(view, pos)
        end = pos + RECORD_HEADER_SIZE + length
        if end > n:
            why = f"incomplete record (payload length {length} runs past the end of the file)"
            break
        payload = view[pos + RECORD_HEADER_SIZE : end]
        if _record_crc(salt, seq, rtype, payload) != crc:
            why = "record CRC mismatch"
            break
        if seq != expected:
            return SegmentScan(True, version, salt, first_seq, records, pos, corrupt=True,
                               records_after=_count_valid(view, pos, salt, 1),
                               reason=f"record has sequence number {seq} where {expected} was expected")
        records.append((seq, rtype, bytes(payload)))
        expected += 1
        pos = end
    else:
        return SegmentScan(True, version, salt, first_seq, records, pos)

    hi = expected + (n - pos) // RECORD_HEADER_SIZE + 1
    found = _find_valid(view, pos + 1, salt, expected, hi)
    if found < 0:
        return SegmentScan(True, version, salt, first_seq, records, pos, torn=True, reason=why)
    (_, _, _, fseq) = _RECORD.unpack_from(view, found)
    return SegmentScan(True, version, salt, first_seq, records, pos, corrupt=True,
                       records_after=_count_valid(view, found, salt, expected),
                       reason=f"{why}, but a valid record (seq {fseq}) follows at offset {found}")


Verdict = Literal["clean", "torn_tail", "torn_header", "damaged"]


def check_segment(name_seq: int, scan: SegmentScan, expected: int | None, last: bool) -> tuple[Verdict, int, str]:
    """What the journal's rules make of one segment in its place: (verdict, offset, reason).

    `name_seq` is the seq its file name gives, `expected` the one the previous segment ends
    before (None for the first), `last` whether no segment follows. Verdicts:
    - clean;
    - torn_tail: an incomplete record at the end of the last segment (a crash during a write):
      `Journal.open` cuts the file at `offset`;
    - torn_header: the last segment's header is incomplete and nothing follows (a crash while it
      was created): `Journal.open` removes the file;
    - damaged: anything else (a gap, a bad header, a header that disagrees with the name, damage
      with valid data after it, a torn segment that is not the last): `Journal.open` refuses, and
      `repair` truncates at `offset` (0: moves the whole file away).
    """
    if expected is not None and name_seq != expected:
        return "damaged", 0, _gap_reason(expected, name_seq)
    if not scan.header_ok:
        if scan.torn and last:
            return "torn_header", 0, scan.reason
        return "damaged", 0, scan.reason if not scan.torn else f"{scan.reason} in a segment that is not the last"
    if scan.first_seq != name_seq:
        reason = f"file header says first sequence number {scan.first_seq} but the file name says {name_seq}"
        return "damaged", 0, reason
    if scan.corrupt:
        return "damaged", scan.valid_end, scan.reason
    if scan.torn:
        if not last:
            return "damaged", scan.valid_end, f"{scan.reason} in a segment that is not the last"
        return "torn_tail", scan.valid_end, scan.reason
    return "clean", scan.valid_end, ""


@dataclasses.dataclass
class _Segment:
    name: str
    first_seq: int
    size: int
    records: int


def _segment_names(names: Sequence[str]) -> list[str]:
    return sorted(n for n in names if _SEGMENT_RE.match(n))


def _make_durable_dirs(fs: FileLayer, directory: str) -> None:
    """Create `directory` if needed and fsync the parent of every folder made here, and always
    the journal folder's own parent: whoever made it, its name must be durable before any
    record in it counts."""
    d = os.path.abspath(directory)
    created: list[str] = []
    probe = d
    while not fs.exists(probe):
        created.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if created:
        fs.makedirs(d)
    for folder in created or [d]:
        fs.fsync_dir(os.path.dirname(folder) or "/")


class Journal:
    """An append-only journal over a folder of segments. Use `Journal.open`.

    Not thread-safe: one writer (thread) at a time. `append` does not sync; call `sync` before
    acknowledging anything it wrote.
    """

    def __init__(self, fs: FileLayer, directory: str, segment_bytes: int) -> None:
        self._fs = fs
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._handle: AppendFile | None = None  # on self._segments[-1]
        self._salt = 0
        self._next_seq = 1
        self._error: BaseException | None = None
        self._closed = False
        # what the last successful sync (or segment creation) made durable, in the last segment:
        # `resume` cuts back to it, so bytes written after it (acknowledged or not) never count
        self._synced_end = 0
        self._synced_seq = 0

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: StrPath,
        *,
        fs: FileLayer | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        first_seq: int = 1,
    ) -> tuple[Journal, list[Record]]:
        """Open (creating if needed) the journal in `directory` and read it all.

        Returns the journal, positioned for appending, and every record (seq, rtype, payload)
        in order. A torn tail of the last segment is truncated and logged; other damage raises
        JournalCorrupt. `first_seq` is the first sequence number of a journal with no segments
        (pass the snapshot's covered seq + 1 if the folder was lost). `fs` defaults to RealFiles().
        """
        if segment_bytes <= 0:
            raise ValueError("segment_bytes must be positive")
        if first_seq < 1:
            raise ValueError("first_seq must be >= 1")
        fs = RealFiles() if fs is None else fs
        d = os.fspath(directory)
        _make_durable_dirs(fs, d)
        self = cls(fs, d, segment_bytes)
        records: list[Record] = []
        names = _segment_names(fs.listdir(d))
        expected: int | None = None
        for i, name in enumerate(names):
            path = os.path.join(d, name)
            last = i == len(names) - 1
            name_seq = int(name[:20])
            data = fs.read_bytes(path)
            scan = scan_segment(data)
            verdict, offset, reason = check_segment(name_seq, scan, expected, last)
            if verdict == "torn_header":
                # Crash while the segment was being created: it holds no record.
                logger.warning("journal %s: torn file header (%s); removing the empty segment", path, reason)
                fs.unlink(path)
                fs.fsync_dir(d)
                expected = name_seq
                break
            if verdict == "damaged":
                raise JournalCorrupt(path, offset, reason)
            if verdict == "torn_tail":
                dropped = len(data) - scan.valid_end
                logger.warning("journal %s: torn tail at offset %d (%s); truncating %d bytes, "
                               "keeping %d records", path, scan.valid_end, scan.reason, dropped,
                               len(scan.records))
                fs.truncate(path, scan.valid_end)
            records.extend(scan.records)
            assert scan.salt is not None
            self._segments.append(_Segment(name, name_seq, scan.valid_end, len(scan.records)))
            self._salt = scan.salt
            expected = name_seq + len(scan.records)
            del data, scan

        self._next_seq = expected if expected is not None else first_seq
        try:
            if self._segments:
                cur = self._segments[-1]
                self._synced_end, self._synced_seq = cur.size, self._next_seq - 1
                self._handle = fs.open_append(os.path.join(d, cur.name))
                if self._handle.size != cur.size:  # pragma: no cover - someone else writes
                    raise JournalCorrupt(os.path.join(d, cur.name), cur.size,
                                         "segment changed while it was being opened")
            else:
                self._create_segment(self._next_seq)
        except BaseException:
            self.close()
            raise
        return self, records

    # -- state ------------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record gets."""
        return self._next_seq

    @property
    def last_seq(self) -> int:
        """The sequence number of the last appended record (next_seq - 1; 0 if none ever)."""
        return self._next_seq - 1

    @property
    def size_bytes(self) -> int:
        """Bytes in all segments, synced or not."""
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segment_names(self) -> list[str]:
        return [s.name for s in self._segments]

    @property
    def error(self) -> BaseException | None:
        """The OSError that made the journal read-only, or None."""
        return self._error

    @property
    def failed(self) -> bool:
        return self._error is not None

    @property
    def unsynced(self) -> bool:
        """Records were appended since the last successful sync (fsync=batch's periodic sync and the
        final one at close look at this)."""
        return self.last_seq > self._synced_seq

    # -- writing ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._error is not None:
            raise JournalWriteError(self._error) from self._error
        if self._closed:
            raise ValueError("journal is closed")

    def _fail(self, exc: OSError) -> JournalWriteError:
        self._error = exc
        logger.error("journal %s: write failed, journal is now read-only: %s", self._dir, exc)
        return JournalWriteError(exc)

    def append(self, records: Sequence[tuple[int, Buffer]]) -> int:
        """Append (rtype, payload) records with consecutive seqs in ONE write; return the last
        seq (last_seq unchanged if `records` is empty). Does not sync. Rolls to a new segment
        first when the current one has reached segment_bytes."""
        self._check_writable()
        for rtype, payload in records:
            if not isinstance(rtype, int) or not 0 <= rtype <= 255:
                raise ValueError(f"record type must be an int in 0..255, not {rtype!r}")
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            if len(payload) > _MAX_U32:
                raise ValueError("payload too large for one record")
        if not records:
            return self.last_seq
        cur = self._segments[-1]
        if cur.size >= self._segment_bytes and cur.records > 0:
            self._roll()
            cur = self._segments[-1]
        seq = self._next_seq
        parts = []
        for rtype, payload in records:
            parts.append(encode_record(self._salt, seq, rtype, payload))
            seq += 1
        buf = b"".join(parts)
        assert self._handle is not None
        try:
            self._handle.write(buf)
        except OSError as e:
            raise self._fail(e) from e
        cur.size += len(buf)
        cur.records += len(records)
        self._next_seq = seq
        return seq - 1

    # -- a sync made elsewhere (journal_kernel.py: the kernel's fdatasync of sync_fd) ----------

    @property
    def roll_due(self) -> bool:
        """The next append would first roll to a new segment (a datasync, a new file, a folder fsync)."""
        cur = self._segments[-1]
        return self._error is None and not self._closed and cur.size >= self._segment_bytes and cur.records > 0

    def sync_fd(self) -> int | None:
        """The current segment's file descriptor, for a datasync made elsewhere (None: the file layer has none)."""
        return None if self._handle is None else self._handle.fileno()

    def mark_synced(self) -> None:
        """A datasync of sync_fd() made elsewhere, started after the last append, succeeded: every
        appended record is durable (what `sync` records)."""
        self._check_writable()
        self._synced_end, self._synced_seq = self._segments[-1].size, self.last_seq

    def fail(self, exc: OSError) -> JournalWriteError:
        """A datasync made elsewhere failed: the journal is read-only until `resume` (as after a
        failed `sync`). Returns the error to raise or report."""
        return self._fail(exc)

    def sync(self) -> None:
        """Make every appended record durable (datasync of the current segment)."""
        self._check_writable()
        assert self._handle is not None
        try:
            self._handle.datasync()
        except OSError as e:
            raise self._fail(e) from e
        self._synced_end, self._synced_seq = self._segments[-1].size, self.last_seq

    def rotate(self) -> int:
        """Sync and close the current segment and start a new one; return its first seq
        (= next_seq). A no-op when the current segment holds no record yet."""
        self._check_writable()
        if self._segments[-1].records > 0:
            self._roll()
        return self._next_seq

    def _roll(self) -> None:
        assert self._handle is not None
        try:
            self._handle.datasync()
            self._synced_end, self._synced_seq = self._segments[-1].size, self.last_seq
            self._handle.close()
            self._handle = None
            self._create_segment(self._next_seq)
        except OSError as e:
            raise self._fail(e) from e

    def _create_segment(self, first_seq: int) -> None:
        name = segment_name(first_seq)
        path = os.path.join(self._dir, name)
        if self._fs.exists(path):
            raise FileExistsError(17, "journal segment already exists", path)
        salt = secrets.randbits(32)
        handle = self._fs.open_append(path)
        try:
            handle.write(encode_file_header(salt, first_seq))
            handle.datasync()
            self._fs.fsync_dir(self._dir)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        self._salt = salt
        self._segments.append(_Segment(name, first_seq, FILE_HEADER_SIZE, 0))
        self._synced_end, self._synced_seq = FILE_HEADER_SIZE, first_seq - 1

    def resume(self) -> int:
        """Make a failed journal writable again, safely; returns how many records were cut.

        The bytes after the last successful sync may be anything (a short write on a full disk, or
        records whose sync failed and that the kernel may have dropped): the current segment is cut
        back to that point (a durable truncate), then a new segment is started, which is also the
        test that the disk takes a write, a datasync and a folder fsync again. Records after the
        cut were never acknowledged under fsync=always; under batch/off the caller must make them
        durable another way (a snapshot). On any error the journal stays failed (with the new
        error) and JournalWriteError is raised; calling `resume` again later is safe. A no-op
        returning 0 when the journal has not failed.
        """
        if self._closed:
            raise ValueError("journal is closed")
        if self._error is None:
            return 0
        cur = self._segments[-1]
        path = os.path.join(self._dir, cur.name)
        cut = self._next_seq - 1 - self._synced_seq
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()  # the failed descriptor is never written again
        try:
            self._fs.truncate(path, self._synced_end)
            cur.size = self._synced_end
            cur.records = self._synced_seq + 1 - cur.first_seq
            self._next_seq = self._synced_seq + 1
            stray = os.path.join(self._dir, segment_name(self._next_seq))
            if cur.records == 0:
                # nothing in the segment: replace it by a fresh empty one (durably, in one rename)
                salt = secrets.randbits(32)
                atomic_write(self._fs, path, encode_file_header(salt, cur.first_seq))
                self._salt = salt
                self._handle = self._fs.open_append(path)
                self._synced_end, self._synced_seq = FILE_HEADER_SIZE, cur.first_seq - 1
            else:
                if self._fs.exists(stray):  # left by a roll that failed half-way: it holds no record
                    self._fs.unlink(stray)
                    self._fs.fsync_dir(self._dir)
                self._create_segment(self._next_seq)
        except OSError as e:
            self._error = e
            logger.error("journal %s: resume failed, journal stays read-only: %s", self._dir, e)
            raise JournalWriteError(e) from e
        self._error = None
        if cut:
            logger.warning("journal %s: resumed; cut %d records written after the last sync", self._dir, cut)
        return cut

    def drop_before(self, seq: int) -> list[str]:
        """Delete the segments all of whose records have seq < `seq` (never the current one),
        oldest first, then fsync the folder. Returns the deleted file names."""
        self._check_writable()
        dropped: list[str] = []
        try:
            while len(self._segments) > 1 and self._segments[1].first_seq <= seq:
                seg = self._segments[0]
                self._fs.unlink(os.path.join(self._dir, seg.name))
                self._segments.pop(0)
                dropped.append(seg.name)
            if dropped:
                self._fs.fsync_dir(self._dir)
        except OSError as e:
            raise self._fail(e) from e
        return dropped

    def close(self) -> None:
        """Close the current segment (does not sync). Idempotent."""
        self._closed = True
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "failed" if self._error else "closed" if self._closed else "open"
        return (f"<Journal {self._dir!r} {state} next_seq={self._next_seq} "
                f"segments={len(self._segments)}>")


def _gap_reason(expected: int, name_seq: int) -> str:
    if name_seq > expected:
        return (f"sequence numbers {expected}..{name_seq - 1} are missing between segments "
                f"(the previous segment ends at {expected - 1})")
    return (f"segment starts at sequence number {name_seq} but the previous segment already "
            f"reaches {expected - 1}")


@dataclasses.dataclass(frozen=True)
class RepairAction:
    """One file repair changed. offset 0 with backup set means the whole file was moved away."""

    file: str
    backup: str | None
    offset: int
    bytes_dropped: int
    records_dropped: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """What `repair` did; `actions` is empty when the journal needed no repair."""

    directory: str
    actions: tuple[RepairAction, ...] = ()
    created: str | None = None  # an empty segment written so sequence numbers continue

    @property
    def changed(self) -> bool:
        return bool(self.actions) or self.created is not None

    @property
    def records_dropped(self) -> int:
        return sum(a.records_dropped for a in self.actions)

    def __str__(self) -> str:
        if not self.changed:
            return f"journal {self.directory}: nothing to repair"
        lines = [f"journal {self.directory}: repaired"]
        for a in self.actions:
            if a.offset:
                lines.append(f"  {a.file}: truncated at offset {a.offset}, dropped {a.bytes_dropped} "
                             f"bytes / {a.records_dropped} valid-looking records ({a.reason}); "
                             f"original saved as {a.backup}")
            else:
                lines.append(f"  {a.file}: moved to {a.backup}, dropped {a.bytes_dropped} bytes / "
                             f"{a.records_dropped} valid-looking records ({a.reason})")
        if self.created:
            lines.append(f"  created empty segment {self.created}")
        return "\n".join(lines)


def _utc_stamp() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def _backup_path(fs: FileLayer, path: str, stamp: str) -> str:
    candidate = f"{path}.bak-{stamp}"
    k = 1
    while fs.exists(candidate):
        candidate = f"{path}.bak-{stamp}-{k}"
        k += 1
    return candidate


def _valid_looking(scan: SegmentScan) -> int:
    return len(scan.records) + scan.records_after


def repair(directory: StrPath, fs: FileLayer | None = None) -> RepairReport:
    """Make a journal that `Journal.open` refuses openable again, keeping backups.

    Finds the first damage (as `Journal.open` would), saves the affected segment as
    `<name>.bak-<UTC timestamp>` and truncates it at the first bad record (or moves it away
    whole when its header is bad or its numbering does not fit), and moves every later segment
    to a backup too, since sequence numbers after a hole cannot be replayed. A torn tail of the
    last segment is left for `Journal.open`, which truncates it. Afterwards `Journal.open`
    succeeds and returns the records before the damage.
    """
    fs = RealFiles() if fs is None else fs
    d = os.fspath(directory)
    names = _segment_names(fs.listdir(d)) if fs.exists(d) else []
    stamp = _utc_stamp()
    expected: int | None = None
    for i, name in enumerate(names):
        path = os.path.join(d, name)
        last = i == len(names) - 1
        name_seq = int(name[:20])
        data = fs.read_bytes(path)
        scan = scan_segment(data)
        verdict, cut, reason = check_segment(name_seq, scan, expected, last)  # cut 0: move away whole
        if verdict == "torn_header":
            break  # open removes a torn, empty last segment by itself
        if verdict != "damaged":  # clean, or a torn tail that open cuts by itself
            expected = name_seq + len(scan.records)
            continue

        actions: list[RepairAction] = []
        backup = _backup_path(fs, path, stamp)
        if cut == 0:
            fs.rename(path, backup)
            actions.append(RepairAction(path, backup, 0, len(data), _valid_looking(scan), reason))
        else:
            atomic_write(fs, backup, data)  # the backup is durable before anything is cut
            fs.truncate(path, cut)
            actions.append(RepairAction(path, backup, cut, len(data) - cut, scan.records_after, reason))
        for later in names[i + 1 :]:
            lpath = os.path.join(d, later)
            ldata = fs.read_bytes(lpath)
            lbackup = _backup_path(fs, lpath, stamp)
            fs.rename(lpath, lbackup)
            actions.append(RepairAction(lpath, lbackup, 0, len(ldata), _valid_looking(scan_segment(ldata)),
                                        "follows the damage; its sequence numbers cannot be replayed"))
        fs.fsync_dir(d)
        created = None
        if cut == 0 and i == 0:
            # Nothing is left: start an empty segment where the damaged one started, so that
            # sequence numbers keep growing past what snapshots may already cover.
            created = os.path.join(d, segment_name(name_seq))
            atomic_write(fs, created, encode_file_header(secrets.randbits(32), name_seq))
        for a in actions:
            logger.warning("journal repair: %s", a)
        return RepairReport(d, tuple(actions), created)
    return RepairReport(d)


