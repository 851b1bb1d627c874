"""The journal: round trips, torn tails at every byte, bit flips, simulated crashes, repair,
and write failures (PROTOCOL.md §8, "Durability")."""

from __future__ import annotations

import errno
import logging
import os
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eurekamem.daemon.storage.files import RealFiles
from eurekamem.daemon.storage.journal import (
    FILE_HEADER_SIZE,
    MAGIC,
    RECORD_HEADER_SIZE,
    Journal,
    JournalCorrupt,
    JournalWriteError,
    encode_file_header,
    encode_record,
    repair,
    scan_segment,
    segment_name,
)
from fakefiles import FakeFiles

J = "/j"  # the journal folder on FakeFiles
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def payloads(n: int, seed: int = 0) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    sizes = [0, 1, 5, RECORD_HEADER_SIZE, 40, 3]
    return [(rng.randrange(256), rng.randbytes(sizes[i % len(sizes)])) for i in range(n)]


def numbered(records: list[tuple[int, bytes]], first: int = 1) -> list[tuple[int, int, bytes]]:
    return [(first + i, t, p) for i, (t, p) in enumerate(records)]


def fake_with(files: dict[str, bytes]) -> FakeFiles:
    """A FakeFiles whose /j holds exactly these segment files, all durable."""
    fs = FakeFiles()
    fs.makedirs(J)
    fs.fsync_dir("/")
    for name, data in files.items():
        f = fs.open_append(f"{J}/{name}")
        f.write(data)
        f.datasync()
        f.close()
    fs.fsync_dir(J)
    return fs


def segments_of(fs: FakeFiles) -> dict[str, bytes]:
    return {n: fs.read_bytes(f"{J}/{n}") for n in fs.listdir(J) if n.endswith(".log")}


def built(batches: list[list[tuple[int, bytes]]], segment_bytes: int = 1 << 20) -> dict[str, bytes]:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs, segment_bytes=segment_bytes)
    for batch in batches:
        j.append(batch)
    j.sync()
    j.close()
    return segments_of(fs)


def record_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record in a clean segment."""
    spans, pos = [], FILE_HEADER_SIZE
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        spans.append((pos, pos + RECORD_HEADER_SIZE + length))
        pos += RECORD_HEADER_SIZE + length
    return spans


# --- the format --------------------------------------------------------------------------------


def test_format_is_what_design_md_says() -> None:
    header = encode_file_header(salt=0x01020304, first_seq=7)
    assert len(header) == FILE_HEADER_SIZE == 26
    assert header[:8] == MAGIC
    assert struct.unpack(">HIQ", header[8:22]) == (1, 0x01020304, 7)
    assert struct.unpack(">I", header[22:])[0] == zlib.crc32(header[:22])
    rec = encode_record(0x01020304, 7, 9, b"payload")
    length, crc, rtype, seq = struct.unpack(">IIBQ", rec[:17])
    assert (length, rtype, seq, rec[17:]) == (7, 9, 7, b"payload")
    assert crc == zlib.crc32(struct.pack(">IQB", 0x01020304, 7, 9) + b"payload")
    assert segment_name(7) == "00000000000000000007.log"


def test_scan_segment_clean_torn_corrupt() -> None:
    salt = 99
    recs = [encode_record(salt, s, 1, b"x" * s) for s in (5, 6, 7)]
    data = encode_file_header(salt, 5) + b"".join(recs)
    scan = scan_segment(data)
    assert scan.clean and scan.header_ok and (scan.salt, scan.first_seq, scan.version) == (salt, 5, 1)
    assert scan.records == [(5, 1, b"xxxxx"), (6, 1, b"xxxxxx"), (7, 1, b"xxxxxxx")]
    assert scan.valid_end == len(data)

    torn = scan_segment(data[:-3])
    assert torn.torn and not torn.corrupt and len(torn.records) == 2
    assert torn.valid_end == len(data) - len(recs[2])

    bad = bytearray(data)
    bad[FILE_HEADER_SIZE + RECORD_HEADER_SIZE] ^= 0x40  # payload of the first record
    corrupt = scan_segment(bytes(bad))
    assert corrupt.corrupt and not corrupt.torn
    assert corrupt.valid_end == FILE_HEADER_SIZE and corrupt.records == []
    assert corrupt.records_after == 2 and "CRC" in corrupt.reason

    # a record that checks out but has the wrong sequence number is corruption, even last
    skipped = encode_file_header(salt, 5) + recs[0] + recs[2]
    s = scan_segment(skipped)
    assert s.corrupt and "sequence number 7 where 6" in s.reason and s.valid_end == FILE_HEADER_SIZE + len(recs[0])

    # another segment's record (other salt) is garbage, not a valid record
    foreign = encode_file_header(salt, 5) + recs[0] + encode_record(salt + 1, 6, 1, b"y")
    assert scan_segment(foreign).torn

    assert scan_segment(b"").torn and scan_segment(data[:10]).torn
    header_only = encode_file_header(salt, 5)
    assert scan_segment(header_only).clean
    flipped = bytearray(header_only)
    flipped[3] ^= 1
    assert scan_segment(bytes(flipped)).torn  # a bad header with nothing after it
    assert scan_segment(bytes(flipped) + recs[0]).corrupt
    future = encode_file_header(salt, 5, version=2)
    assert scan_segment(future).corrupt and "version 2" in scan_segment(future).reason
    assert scan_segment(memoryview(data)).records == scan.records


def test_zero_filled_tail_is_torn() -> None:
    data = built([payloads(3)])["00000000000000000001.log"]
    assert scan_segment(data + bytes(100)).torn
    assert scan_segment(data + bytes(3)).torn


# --- round trips ---------------------------------------------------------------------------------


def test_new_journal_is_empty_and_created_durably(tmp_path) -> None:
    d = tmp_path / "a" / "journal"
    j, recs = Journal.open(d)
    assert recs == [] and j.next_seq == 1 and j.last_seq == 0 and j.segment_count == 1
    assert os.listdir(d) == [segment_name(1)]
    assert j.size_bytes == FILE_HEADER_SIZE
    assert j.append([]) == 0
    j.close()
    j, recs = Journal.open(d)
    assert recs == [] and j.next_seq == 1
    j.close()

    fs = FakeFiles()
    Journal.open(J, fs=fs)[0].close()
    assert fs.crash().listdir(J) == [segment_name(1)]  # folder and segment survive a crash

    fs = FakeFiles()
    Journal.open("/a/b/c", fs=fs)[0].close()  # every level made here is fsynced into its parent
    assert fs.crash().listdir("/a/b/c") == [segment_name(1)]

    fs = FakeFiles()
    fs.makedirs("/data")
    fs.fsync_dir("/")
    fs.makedirs("/data/journal")  # made by someone else (a lock file's mkdir), never fsynced
    j, _ = Journal.open("/data/journal", fs=fs)
    j.append(payloads(1))
    j.sync()
    assert len(Journal.open("/data/journal", fs=fs.crash())[1]) == 1


def test_first_seq_applies_to_an_empty_folder_only() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs, first_seq=1000)
    assert j.append(payloads(2)) == 1001
    j.sync()
    j.close()
    j, recs = Journal.open(J, fs=fs, first_seq=5)
    assert [r[0] for r in recs] == [1000, 1001] and j.next_seq == 1002


def test_round_trip_with_rolls_rotations_and_drops(tmp_path) -> None:
    d = tmp_path / "journal"
    j, _ = Journal.open(d, segment_bytes=200)
    written: list[tuple[int, bytes]] = []
    for i in range(12):
        batch = payloads(1 + i % 4, seed=i)
        assert j.append(batch) == len(written) + len(batch)
        written += batch
        if i == 5:
            assert j.rotate() == len(written) + 1
            assert j.rotate() == len(written) + 1  # nothing written since: no new segment
        if i % 3 == 0:
            j.sync()
    j.sync()
    assert j.segment_count == len(os.listdir(d)) > 3
    assert j.size_bytes == sum(os.path.getsize(d / n) for n in os.listdir(d))
    assert j.next_seq == len(written) + 1 and j.last_seq == len(written)
    j.close()

    j, recs = Journal.open(d, segment_bytes=200)
    assert recs == numbered(written)
    names = sorted(os.listdir(d))
    firsts = [int(n[:20]) for n in names]
    # drop everything before the third segment's first seq: exactly the first two go
    assert j.drop_before(firsts[2]) == names[:2]
    assert j.drop_before(firsts[2]) == []
    assert sorted(os.listdir(d)) == names[2:]
    # never the current segment, however high
    assert j.drop_before(10**9) == names[2:-1] and os.listdir(d) == [names[-1]]
    more = payloads(3, seed=99)
    j.append(more)
    j.sync()
    j.close()
    j, recs = Journal.open(d, segment_bytes=200)
    assert recs == numbered(written + more)[firsts[-1] - 1 :]
    j.close()


def test_append_is_one_write_and_does_not_sync() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs)
    before = dict(fs.stats)
    assert j.append(payloads(50)) == 50
    assert fs.stats["write"] == before["write"] + 1
    assert fs.stats["datasync"] == before["datasync"]
    j.sync()
    assert fs.stats["datasync"] == before["datasync"] + 1


def test_append_rejects_bad_records_without_failing() -> None:
    j, _ = Journal.open(J, fs=FakeFiles())
    with pytest.raises(ValueError):
        j.append([(256, b"")])
    with pytest.raises(TypeError):
        j.append([(1, "text")])  # type: ignore[list-item]
    assert not j.failed and j.append([(0, b"ok")]) == 1
    j.close()
    with pytest.raises(ValueError):
        j.append([(0, b"late")])


# --- torn tails at every byte -------------------------------------------------------------------


def _check_cut(fs: FakeFiles | RealFiles, d, expected: list, next_seq: int, extra: list) -> None:
    j, recs = Journal.open(d, fs=fs)
    assert recs == expected
    assert j.next_seq == next_seq
    assert j.append(extra) == next_seq + len(extra) - 1
    j.sync()
    j.close()
    j, recs = Journal.open(d, fs=fs)
    assert recs == expected + numbered(extra, next_seq)
    j.close()


def test_truncate_the_last_segment_at_every_byte(caplog) -> None:
    batches = [payloads(3, 1), payloads(4, 2), payloads(3, 3)]
    files = built(batches, segment_bytes=120)
    names = sorted(files)
    assert len(names) >= 2
    last = names[-1]
    data = files[last]
    first = int(last[:20])
    all_records = numbered([r for b in batches for r in b])
    before_last = [r for r in all_records if r[0] < first]
    spans = record_spans(data)
    extra = payloads(2, 7)
    caplog.set_level(logging.WARNING, logger="eurekamem.journal")
    for cut in range(len(data) + 1):
        fs = fake_with({**files, last: data[:cut]})
        whole = sum(1 for _, end in spans if end <= cut)
        expected = before_last + all_records[first - 1 : first - 1 + whole]
        _check_cut(fs, J, expected, first + whole, extra)
        boundary = cut == FILE_HEADER_SIZE or any(end == cut for _, end in spans)
        if not boundary:
            assert "torn" in caplog.text
        caplog.clear()


def test_truncate_a_real_file_at_every_byte(tmp_path) -> None:
    records = payloads(6, 5)
    src = tmp_path / "src"
    j, _ = Journal.open(src)
    j.append(records[:2])
    j.append(records[2:])
    j.sync()
    j.close()
    data = (src / segment_name(1)).read_bytes()
    spans = record_spans(data)
    extra = payloads(1, 8)
    for cut in range(len(data) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / segment_name(1)).write_bytes(data[:cut])
        whole = sum(1 for _, end in spans if end <= cut)
        _check_cut(RealFiles(), d, numbered(records)[:whole], whole + 1, extra)


def test_a_torn_non_last_segment_is_corruption() -> None:
    files = built([payloads(3, 1), payloads(3, 2)], segment_bytes=50)
    names = sorted(files)
    assert len(names) == 2
    files[names[0]] = files[names[0]][:-1]
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(J, fs=fake_with(files))
    assert info.value.path == f"{J}/{names[0]}" and "not the last" in info.value.reason


def test_missing_and_misnamed_segments_are_corruption() -> None:
    files = built([payloads(2, i) for i in range(4)], segment_bytes=60)
    names = sorted(files)
    assert len(names) >= 3
    gap = {n: files[n] for n in names if n != names[1]}
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(J, fs=fake_with(gap))
    assert info.value.path == f"{J}/{names[2]}" and "missing" in info.value.reason
    renamed = dict(files)
    renamed[segment_name(int(names[-1][:20]) + 1)] = renamed.pop(names[-1])
    with pytest.raises(JournalCorrupt):
        Journal.open(J, fs=fake_with(renamed))


def test_other_files_in_the_folder_are_ignored() -> None:
    files = built([payloads(2)])
    fs = fake_with({**files, "00000000000000000001.log.bak-20260101T000000Z": b"junk", "notes.txt": b"x"})
    j, recs = Journal.open(J, fs=fs)
    assert len(recs) == 2


# --- bit flips ----------------------------------------------------------------------------------

FLIP_BATCHES = [payloads(3, 11), payloads(2, 12), payloads(4, 13)]
FLIP_FILES = built(FLIP_BATCHES, segment_bytes=110)
FLIP_NAMES = sorted(FLIP_FILES)
FLIP_RECORDS = numbered([r for b in FLIP_BATCHES for r in b])


@FAST
@given(st.data())
def test_a_bit_flip_is_refused_or_cuts_only_the_last_record(data) -> None:
    assert len(FLIP_NAMES) >= 2
    name = data.draw(st.sampled_from(FLIP_NAMES), label="segment")
    original = FLIP_FILES[name]
    pos = data.draw(st.integers(0, len(original) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(original)
    damaged[pos] ^= 1 << bit
    spans = record_spans(original)
    last_segment = name == FLIP_NAMES[-1]
    in_last_record = bool(spans) and pos >= spans[-1][0]
    try:
        j, recs = Journal.open(J, fs=fake_with({**FLIP_FILES, name: bytes(damaged)}))
    except JournalCorrupt as exc:
        assert not (last_segment and in_last_record)
        assert exc.path == f"{J}/{name}"
        assert exc.offset == max([s for s, _ in spans if s <= pos], default=0)
        assert name in str(exc) and str(exc.offset) in str(exc) and "eurekamem repair" in str(exc)
    else:
        assert last_segment and in_last_record
        assert recs == FLIP_RECORDS[:-1]  # never a record with wrong content
        j.close()


@FAST
@given(st.data())
def test_garbage_anywhere_never_yields_a_wrong_record(data) -> None:
    name = data.draw(st.sampled_from(FLIP_NAMES))
    original = FLIP_FILES[name]
    pos = data.draw(st.integers(0, len(original) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=40))
    damaged = original[:pos] + junk + original[pos + len(junk) :]
    try:
        j, recs = Journal.open(J, fs=fake_with({**FLIP_FILES, name: damaged}))
    except JournalCorrupt:
        return
    assert recs == FLIP_RECORDS[: len(recs)]
    j.close()


# --- simulated crashes ---------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("rotate")),
        st.tuples(st.just("drop")),
        st.tuples(st.just("crash"), st.integers(0, 2**32), st.booleans(), st.booleans()),
    ),
    max_size=30,
)


@FAST
@given(OPS, st.integers(0, 1000))
def test_crash_keeps_every_synced_record_and_invents_nothing(ops, seed) -> None:
    rng = random.Random(seed)
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs, segment_bytes=90)
    written: dict[int, tuple[int, bytes]] = {}  # seq -> record, as last written
    synced = 0  # every seq <= synced must survive
    floor = 1  # seqs below were dropped
    ops = ops + [("crash", seed, True, False)]
    for op in ops:
        if op[0] == "append":
            batch = [(rng.randrange(256), rng.randbytes(rng.choice([0, 3, 20]))) for _ in range(op[1])]
            last = j.append(batch)
            for i, rec in enumerate(batch):
                written[last - len(batch) + 1 + i] = rec
        elif op[0] == "sync":
            j.sync()
            synced = j.last_seq
        elif op[0] == "rotate":
            j.rotate()
            synced = j.last_seq
        elif op[0] == "drop":
            target = rng.randint(1, j.next_seq)
            j.drop_before(target)
            floor = max(floor, target)
        else:
            _, crash_seed, torn, zero_fill = op
            fs = fs.crash(random.Random(crash_seed) if torn else None, zero_fill=zero_fill)
            j, recs = Journal.open(J, fs=fs, segment_bytes=90)
            seqs = [r[0] for r in recs]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
            for seq, rtype, payload in recs:
                assert written[seq] == (rtype, payload)  # nothing never written appears
            assert set(range(floor, synced + 1)) <= set(seqs)  # every synced record survives
            assert j.next_seq == (seqs[-1] + 1 if seqs else j.next_seq)
            assert j.next_seq >= synced + 1
            # what came back is durable now; what did not is gone for good
            synced = j.last_seq
            for seq in [s for s in written if s > j.last_seq]:
                del written[seq]


def test_group_commit_order_survives_a_crash_mid_roll() -> None:
    # The roll syncs the old segment before the new one exists, so a crash right after the
    # new segment's creation (name not fsynced yet, header maybe torn) loses nothing synced.
    for seed in range(40):
        fs = FakeFiles()
        j, _ = Journal.open(J, fs=fs, segment_bytes=60)
        j.append(payloads(3))
        fs.fail("fsync_dir", errno.EIO, after=0)
        fs.fail("sync", errno.EIO, after=1 + seed % 2)  # old segment's sync ok, then maybe header's
        with pytest.raises(JournalWriteError):
            j.append(payloads(1, 9))
        crashed = fs.crash(random.Random(seed), zero_fill=seed % 3 == 0)
        j2, recs = Journal.open(J, fs=crashed, segment_bytes=60)
        assert recs == numbered(payloads(3))
        assert j2.append(payloads(1, 9)) == 4
        j2.sync()
        j2.close()
        assert Journal.open(J, fs=crashed)[1] == numbered(payloads(3) + payloads(1, 9))


# --- write failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("partial", [0, 5])
def test_a_failed_write_makes_the_journal_read_only(partial) -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs)
    j.append(payloads(2))
    j.sync()
    fs.fail("write", errno.ENOSPC, partial=partial)
    with pytest.raises(JournalWriteError) as info:
        j.append(payloads(2, 1))
    assert isinstance(info.value.error, OSError) and info.value.error.errno == errno.ENOSPC
    assert info.value.__cause__ is info.value.error
    assert j.failed and j.error is info.value.error and j.last_seq == 2
    fs.heal()  # the disk has room again: still no retry, no carrying on
    for call in (lambda: j.append(payloads(1)), j.sync, j.rotate, lambda: j.drop_before(10)):
        with pytest.raises(JournalWriteError) as again:
            call()
        assert again.value.error is info.value.error
    j.close()
    # a restart recovers: the partial record is a torn tail
    j, recs = Journal.open(J, fs=fs.crash(random.Random(1)))
    assert recs == numbered(payloads(2))


def test_a_failed_sync_makes_the_journal_read_only() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs)
    j.append(payloads(2))
    fs.fail("sync", errno.EIO)
    with pytest.raises(JournalWriteError) as info:
        j.sync()
    assert info.value.error.errno == errno.EIO
    fs.heal()
    with pytest.raises(JournalWriteError):
        j.append(payloads(1))
    with pytest.raises(JournalWriteError):
        j.sync()
    assert "read-only" in str(info.value)


def test_a_failed_folder_sync_in_drop_before_is_fatal() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs)
    j.append(payloads(1))
    j.rotate()
    j.append(payloads(1))
    fs.fail("fsync_dir", errno.EIO)
    with pytest.raises(JournalWriteError):
        j.drop_before(2)
    assert j.failed


# --- repair ---------------------------------------------------------------------------------------


def _journal_with_segments(d, n_segments: int = 3) -> list[tuple[int, int, bytes]]:
    j, _ = Journal.open(d)
    written: list[tuple[int, bytes]] = []
    for i in range(n_segments):
        batch = payloads(4, seed=i)
        j.append(batch)
        written += batch
        if i < n_segments - 1:
            j.rotate()
    j.sync()
    j.close()
    return numbered(written)


def test_repair_backs_up_and_truncates_at_the_first_bad_record(tmp_path) -> None:
    d = tmp_path / "journal"
    records = _journal_with_segments(d)
    names = sorted(os.listdir(d))
    middle = d / names[1]
    original = middle.read_bytes()
    spans = record_spans(original)
    bad_start, bad_end = spans[1]
    damaged = bytearray(original)
    damaged[bad_end - 1] ^= 0xFF
    middle.write_bytes(bytes(damaged))

    with pytest.raises(JournalCorrupt) as info:
        Journal.open(d)
    assert info.value.path == str(middle) and info.value.offset == bad_start
    assert str(middle) in str(info.value) and f"offset {bad_start}" in str(info.value)
    assert "eurekamem repair" in str(info.value)

    report = repair(d)
    assert report.changed and len(report.actions) == 2
    cut, moved = report.actions
    assert cut.file == str(middle) and cut.offset == bad_start
    assert cut.bytes_dropped == len(original) - bad_start
    assert cut.records_dropped == len(spans) - 2  # the valid-looking records after the bad one
    assert open(cut.backup, "rb").read() == bytes(damaged)
    assert os.path.basename(cut.backup).startswith(names[1] + ".bak-")
    assert cut.backup.endswith("Z")
    assert moved.file == str(d / names[2]) and moved.offset == 0 and moved.records_dropped == 4
    assert os.path.exists(moved.backup) and not os.path.exists(moved.file)
    assert "truncated at offset" in str(report)

    j, recs = Journal.open(d)
    first_of_middle = int(names[1][:20])
    assert recs == records[: first_of_middle]  # segment 1 and the first record of segment 2
    assert j.append(payloads(1, 42)) == first_of_middle + 1
    j.close()
    assert not repair(d).changed  # healthy now
    assert "nothing to repair" in str(repair(d))


def test_repair_of_a_bad_first_header_keeps_the_numbering() -> None:
    fs = FakeFiles()
    j, _ = Journal.open(J, fs=fs, first_seq=500)
    j.append(payloads(3))
    j.sync()
    j.close()
    name = segment_name(500)
    damaged = bytearray(fs.read_bytes(f"{J}/{name}"))
    damaged[0] ^= 1
    fs = fake_with({name: bytes(damaged)})
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(J, fs=fs)
    assert info.value.offset == 0 and "magic" in info.value.reason
    report = repair(J, fs)
    assert report.actions[0].offset == 0 and report.actions[0].records_dropped == 3
    assert report.created == f"{J}/{name}"
    j, recs = Journal.open(J, fs=fs.crash())  # the repair itself is durable
    assert recs == [] and j.next_seq == 500


def test_repair_of_a_gap_moves_the_later_segments_away() -> None:
    files = built([payloads(2, i) for i in range(4)], segment_bytes=60)
    names = sorted(files)
    del files[names[1]]
    fs = fake_with(files)
    report = repair(J, fs)
    assert [a.file for a in report.actions] == [f"{J}/{n}" for n in names[2:]]
    j, recs = Journal.open(J, fs=fs)
    assert recs == numbered(payloads(2, 0))
    assert j.next_seq == 3


def test_repair_leaves_a_torn_tail_to_open() -> None:
    files = built([payloads(3)])
    name = sorted(files)[0]
    fs = fake_with({name: files[name][:-2]})
    assert not repair(J, fs).changed
    assert len(Journal.open(J, fs=fs)[1]) == 2


# --- one rule for open, repair and verify ----------------------------------------------------------


def _two_segments(tmp_path) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    d = str(tmp_path / "memory" / "journal")
    j, _ = Journal.open(d, segment_bytes=10**9)
    j.append([(1, b"a"), (1, b"b")])
    j.rotate()
    j.append([(1, b"c")])
    j.sync()
    j.close()
    return d, sorted(n for n in os.listdir(d) if n.endswith(".log"))


def test_open_repair_and_verify_agree_on_a_torn_tail_and_on_damage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from eurekamem.cli.verify import verify_root

    d, names = _two_segments(tmp_path)
    last = os.path.join(d, names[-1])
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x00\x09torn")  # a crash in the middle of a record at the end of the last segment
    problems = verify_root(tmp_path).problems
    assert any("torn tail" in p and "cuts it off at start" in p for p in problems), problems
    assert not repair(d).changed  # a torn tail is left to open, which cuts it
    j, records = Journal.open(d)
    assert [r[2] for r in records] == [b"a", b"b", b"c"]
    j.close()

    first = os.path.join(d, names[0])
    data = bytearray(open(first, "rb").read())
    data[FILE_HEADER_SIZE + RECORD_HEADER_SIZE] ^= 0xFF  # the first record's payload: a valid one follows
    open(first, "wb").write(bytes(data))
    problems = verify_root(tmp_path).problems
    assert any(names[0] in p and "damaged at offset" in p and "eurekamem repair" in p for p in problems), problems
    with pytest.raises(JournalCorrupt):
        Journal.open(d)
    assert repair(d).changed
    j, records = Journal.open(d)  # the damage and everything after it moved away
    assert records == []
    j.close()
    assert not any("damaged" in p for p in verify_root(tmp_path).problems)
