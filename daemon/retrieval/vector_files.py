"""The files a VectorStore is saved in: their format, and the checks that a file is whole.

Rule kept here: a file is used only when everything it says about itself checks (magic, version,
the header's and the body's crc32, the size, the dimension and the model), and a .hnsw file only
when its size and crc32 match what its .vectors file says; hnswlib's own save is checked complete
against its header (it does not report a failed write). Anything else is refused
(VectorFileError, or an OSError for an incomplete write), never half used.

Files (``save`` / ``load``), all integers little-endian:

    <stem>.hnsw     hnswlib's own ``save_index`` format (written to a temporary name, checked
                    complete against its own header, fsynced; renamed with the .vectors file)
    <stem>.vectors  header  magic b"EUMVECS1" | version u32 | dim u32 | count u64 |
                            fingerprint u64 | hnsw_size u64 | hnsw_crc u32 | body_crc u32 |
                            model_len u16 | model (utf-8) | header_crc u32 (of all bytes before it)
                    body    labels int64[count] (ascending) | rows float32[count, dim]
                    body_crc = crc32 of the body; hnsw_crc/hnsw_size describe the .hnsw file
                    saved together with it. Streamed in slices to a temporary file,
                    datasynced, renamed after the .hnsw (then the folder is fsynced).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from typing import Any

import numpy as np

from ..storage.files import RealFiles, StrPath

log = logging.getLogger("eurekamem.vectors")

__all__ = [
    "MAGIC",
    "VERSION",
    "VectorFileError",
    "check_hnsw_file",
    "delete_files",
    "parse_vectors",
    "read_header",
    "remove_temporaries",
    "remove_unnamed_vector_files",
    "sync_and_crc",
    "vectors_header",
]


MAGIC = b"EUMVECS1"


VERSION = 1


_HEAD = struct.Struct("<8sIIQQQIIH")


_U32 = struct.Struct("<I")


def read_header(path: str | os.PathLike[str]) -> tuple[bytes, int, int]:
    """A .vectors file's (magic, version, dimension), read from its first bytes alone, for a reader
    that needs the dimension before it can call VectorStore.load (`eurekamem verify`); the magic is
    returned unchecked (compare it with MAGIC). OSError if unreadable, VectorFileError if too short."""
    with open(path, "rb") as f:
        head = f.read(_HEAD.size)
    if len(head) < _HEAD.size:
        raise VectorFileError(f"too short ({len(head)} bytes)")
    magic, version, dim = _HEAD.unpack_from(head)[:3]
    return magic, version, dim


class VectorFileError(ValueError):
    """A .vectors file that cannot be used (bad magic, version, checksum, dimension or model)."""


def vectors_header(dim: int, count: int, fingerprint: int, hnsw_size: int, hnsw_crc: int, body_crc: int, model: str) -> bytes:
    """The header of a .vectors file (module docstring), its own crc32 last."""
    name = model.encode("utf-8")
    head = _HEAD.pack(MAGIC, VERSION, dim, count, fingerprint, hnsw_size, hnsw_crc, body_crc, len(name)) + name
    return head + _U32.pack(zlib.crc32(head))


def delete_files(directory: StrPath, stem: str) -> None:
    """Remove ``<stem>.vectors``, ``<stem>.hnsw`` and temporaries if present (then fsync the folder)."""
    folder = os.fspath(directory)
    removed = remove_temporaries(folder, stem)
    for ext in (".vectors", ".hnsw"):
        try:
            os.unlink(os.path.join(folder, stem + ext))
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        RealFiles().fsync_dir(folder)


def remove_temporaries(folder: str, stem: str) -> bool:
    """Unlink the temporary files a save of `stem` may have left; True if there were any."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False
    found = False
    for name in names:
        if name.endswith(".tmp") and (name.startswith(f".{stem}.hnsw.") or name.startswith(f".{stem}.vectors.")):
            try:
                os.unlink(os.path.join(folder, name))
                found = True
            except FileNotFoundError:
                pass
    return found


def remove_unnamed_vector_files(vectors_dir: StrPath, keep: set[str]) -> None:
    """Delete the vector files and temporaries of every stem but `keep` (older generations, a
    retired model, what a crash during a save left)."""
    stems = set()
    for name in os.listdir(vectors_dir):
        for ext in (".vectors", ".hnsw"):
            if name.endswith(ext) and not name.startswith("."):
                stems.add(name[: -len(ext)])
        if name.startswith(".") and name.endswith(".tmp"):  # .<stem>.hnsw.<hex>.tmp
            stems.add(name[1:].rsplit(".", 3)[0])
    for stem in stems - keep:  # an older generation: routine after a snapshot that wrote a new one
        log.debug("removing vector files %s.* (no snapshot names them)", stem)
        delete_files(vectors_dir, stem)


_HNSW_HEADER = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib's saveIndex header (hnswalg.h), 96 bytes


def check_hnsw_file(path: str, elements: int) -> None:
    """Raise OSError unless `path` is a whole hnswlib index file of `elements` elements.

    hnswlib writes with an unchecked std::ofstream: on a full disk its save "succeeds" and leaves a
    short file. Its layout is the header, then `cur_element_count * size_data_per_element` bytes,
    then one u32 size (a multiple of 4) and that many bytes of links per element: walked here, so
    a file cut anywhere is caught."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(_HNSW_HEADER.size)
        problem = ""
        if len(head) < _HNSW_HEADER.size:
            problem = f"{size} bytes, not even hnswlib's header"
        else:
            count, per_element = _HNSW_HEADER.unpack(head)[2:4]
            links_at = _HNSW_HEADER.size + count * per_element
            if count != elements:
                problem = f"it holds {count} elements, the index {elements}"
            elif size < links_at or (size - links_at) % 4:
                problem = f"{size} bytes, cut in the element data"
            else:
                f.seek(links_at)
                words = np.frombuffer(f.read(), dtype="<u4").tolist()
                i = n = 0
                while n < count and i < len(words):
                    i += 1 + words[i] // 4
                    n += 1
                if n != count or i != len(words):
                    problem = f"{size} bytes, cut in the links of element {n} of {count}"
    if problem:
        free = _free_bytes(os.path.dirname(path))
        raise OSError(
            errno.ENOSPC if free is not None and free < (1 << 20) else errno.EIO,
            f"hnswlib wrote an incomplete index file ({problem}; {free if free is not None else '?'} bytes free on its disk)",
            path,
        )


def _free_bytes(folder: str) -> int | None:
    try:
        st = os.statvfs(folder or ".")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def sync_and_crc(path: str, *, sync: bool = True) -> tuple[int, int]:
    """(size, crc32) of a file, read in chunks; fsync it first when `sync`."""
    crc = 0
    size = 0
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def parse_vectors(data: bytes, *, dim: int, model: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    if len(data) < _HEAD.size + 4:
        raise VectorFileError(f"too short ({len(data)} bytes)")
    magic, version, fdim, count, fingerprint, hnsw_size, hnsw_crc, body_crc, model_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise VectorFileError("not a vectors file (bad magic)")
    if version != VERSION:
        raise VectorFileError(f"version {version}, expected {VERSION}")
    head_end = _HEAD.size + model_len
    if len(data) < head_end + 4:
        raise VectorFileError("truncated header")
    (head_crc,) = _U32.unpack_from(data, head_end)
    if zlib.crc32(data[:head_end]) != head_crc:
        raise VectorFileError("header checksum mismatch")
    fmodel = data[_HEAD.size : head_end].decode("utf-8", errors="replace")
    if fdim != dim:
        raise VectorFileError(f"dimension {fdim}, expected {dim}")
    if fmodel != model:
        raise VectorFileError(f"model {fmodel!r}, expected {model!r}")
    start = head_end + 4
    expected_len = start + count * 8 + count * dim * 4
    if len(data) != expected_len:
        raise VectorFileError(f"{len(data)} bytes, expected {expected_len} for {count} vectors")
    body = memoryview(data)[start:]
    if zlib.crc32(body) != body_crc:
        raise VectorFileError("body checksum mismatch")
    labs = np.frombuffer(data, dtype="<i8", count=count, offset=start).astype(np.int64)
    rows = np.frombuffer(data, dtype="<f4", count=count * dim, offset=start + count * 8)
    rows = rows.astype(np.float32).reshape(count, dim)
    head = {"fingerprint": fingerprint, "hnsw_size": hnsw_size, "hnsw_crc": hnsw_crc}
    return head, labs, rows
