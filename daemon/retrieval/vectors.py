"""Dense vectors of one embedding model: a label-indexed float32 matrix plus an hnswlib index.

Rule kept here: the matrix is the truth and the hnswlib index is a cache of it. Every live vector
is a row of the matrix (row number = label, normalised to unit length); the hnswlib index
(space "cosine") holds the same live labels, and deleted ones only as tombstones. Anything the
index cannot answer exactly (small filtered sets, a graph that cannot return k results) is
answered from the matrix, and when the saved index file is missing, stale or damaged it is
rebuilt from the saved vectors rather than trusted.

Labels are non-negative integers assigned by the caller (the memory actor maps memory ids to
them). Storage is proportional to the largest label ever used, so the caller should assign them
densely (0, 1, 2, ..., reusing freed ones if it likes); labels at or above ``MAX_LABEL`` are
refused.

Search answers cosine similarity (1 - hnswlib's cosine distance, recomputed exactly from the
matrix for the rows returned), best first, ties broken by the smaller label. ``allowed`` (an array
of labels, e.g. the labels of one domain) restricts the answer. A small allowed set is searched
exactly with numpy (perfect recall, cost linear in its size: about 0.2 us a row); a large one
through hnswlib, whose cost grows as the allowed fraction shrinks. The two costs cross near
sqrt(1000 * n) allowed rows (bench/bench_vectors.py), so by default a set of at most
max(1000, sqrt(1000 * n)) live labels goes exact; ``filter_exact_max`` fixes the limit instead.
Through hnswlib, a set of at least ``OVERFETCH_MIN_FRACTION`` (20 %) of the labels over-fetches:
it asks for 1.5 k / fraction unfiltered results with ef scaled by 1 / fraction (the recall of an
unfiltered query of that depth), post-filters, and asks for four times more until k allowed
labels came back; a smaller fraction uses hnswlib's ``filter=`` callback instead (called for each
node the walk considers, so the walk keeps going until it met ef allowed nodes). Measured: from
20 % on, over-fetching is 1.2-2.5x faster at the same recall; at 5-10 % the callback keeps recall
near 0.995 where over-fetching drops to about 0.985. An unfiltered search of a store with at most
``exact_max`` vectors is exact too. hnswlib's ef grows with the collection, as
max(ef_search, EF_AT_100K * sqrt(n / 100k)): 64 up to ~40k vectors, 100 at 100k, 316 at 1M,
which keeps recall@10 at 0.95-0.97 on the benchmark's collections (see EF_AT_100K). Exact
scoring works in slices of 512 rows: a single large matrix-vector product lets OpenBLAS start its
threads, which on a busy machine costs 10x more.

The fingerprint is an order-independent 64-bit digest of the live (label, vector) pairs (the sum
of blake2b-64 of each pair), kept up to date on every add and remove, so ``fingerprint()`` is O(1)
and it changes when a vector is replaced, not only when the label set changes. The caller stores
it in its own snapshot and passes it back to ``load(expected_fingerprint=...)``: a .vectors file
from another generation is then refused (None) instead of silently used. The .hnsw file is
accepted only if its size and crc32 match the .vectors header; otherwise it is rebuilt.
To survive a crash between writing these files and writing the snapshot that names them, give
each snapshot generation its own stem and ``delete_files`` the previous one once the new
snapshot is durable.

The files' format and their checks are vector_files.py's; ``save`` and ``load`` write and read
them, a save to temporary names first.

Threads: every method is blocking. hnswlib's ``add_items`` and ``knn_query`` release the GIL and
must never overlap, so each method that reads or changes the matrix or the index holds the store's
lock (``_guard``): a search in one thread (tier 4's dense-search thread) and a write in another
cannot interleave, whatever the caller does. The owners serialise their calls anyway (one batch
at a time), so the lock is uncontended: it makes the rule hold by construction, not by convention.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import math
import os
import secrets
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import hnswlib
import numpy as np

from ..storage.files import RealFiles, StrPath
from .vector_files import (
    VectorFileError,
    check_hnsw_file,
    delete_files,
    parse_vectors,
    remove_temporaries,
    sync_and_crc,
    vectors_header,
)

log = logging.getLogger("eurekamem.vectors")


__all__ = ["MAX_LABEL", "VectorStore"]


MAX_LABEL = 2**31 - 1


_MASK64 = (1 << 64) - 1


_SLICE = 512  # rows per matrix-vector product in exact search


OVERFETCH_MIN_FRACTION = 0.2  # filtered hnswlib search: over-fetch from here, filter callback below


# hnswlib's ef grows with the collection so that recall holds: at least EF_AT_100K * sqrt(n / 100k).
# Measured on the benchmark's structured 512-d collections (bench/suite.py, M 16, ef_construction
# 200), recall@10 of the top 10: 100k ef 64 0.941, ef 100 0.972; 1M ef 100 0.824, ef 200 0.921,
# ef 300 0.956, ef 400 0.973 (p99 1.2 / 1.7 / 4.5 / 5.1 ms for the top 100, one thread).
EF_AT_100K = 100


def _item_hash(label: int, row: np.ndarray) -> int:
    h = hashlib.blake2b(label.to_bytes(8, "little", signed=True), digest_size=8)
    h.update(row.tobytes())
    return int.from_bytes(h.digest(), "little")


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique is 15x slower in numpy 2.4: it hashes, then sorts)."""
    a = np.sort(a)
    if a.size > 1:
        a = a[np.append(True, a[1:] != a[:-1])]
    return a


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(method: _F) -> _F:
    """Run `method` holding the store's lock (see Threads in the module docstring)."""

    @functools.wraps(method)
    def run(self: VectorStore, *args: Any, **kwargs: Any) -> Any:
        with self._guard:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)


class VectorStore:
    """Vectors of one model, searchable by cosine similarity. See the module docstring."""

    def __init__(
        self,
        dim: int,
        *,
        model: str,
        M: int = 16,
        ef_construction: int = 200,
        ef_search: int = 64,
        initial_capacity: int = 1024,
        filter_exact_max: int | None = None,
        exact_max: int = 1_000,
        num_threads: int = -1,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, not {dim}")
        self.dim = int(dim)
        self.model = str(model)
        self.M = int(M)
        self.ef_construction = int(ef_construction)
        self._ef_search = int(ef_search)
        self.initial_capacity = max(1, int(initial_capacity))
        self.filter_exact_max = filter_exact_max
        self.exact_max = int(exact_max)
        self.num_threads = int(num_threads)
        cap = _next_pow2(self.initial_capacity)
        self._vecs = np.zeros((cap, self.dim), dtype=np.float32)
        self._live = np.zeros(cap, dtype=bool)
        # labels the hnswlib index may still know (live, or a tombstone not yet reused)
        self._known = np.zeros(cap, dtype=bool)
        self._hi = 0  # 1 + the largest label ever stored
        self._count = 0
        self._hash = 0
        self._guard = threading.RLock()  # held by every method that reads or changes the matrix or index
        self._index = self._new_index(cap)

    # -- basics ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __contains__(self, label: object) -> bool:
        try:
            i = int(label)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False
        return 0 <= i < self._live.shape[0] and bool(self._live[i])

    def __repr__(self) -> str:
        return f"VectorStore(model={self.model!r}, dim={self.dim}, count={self._count})"

    @property
    def ef_search(self) -> int:
        return self._ef_search

    @ef_search.setter
    @_guarded
    def ef_search(self, value: int) -> None:
        self._ef_search = int(value)
        self._index.set_ef(self._ef_search)

    def ef_for(self, n: int) -> int:
        """The ef a search of n live vectors uses (hnswlib also never goes below k)."""
        return max(self._ef_search, int(EF_AT_100K * math.sqrt(n / 100_000)))

    @_guarded
    def get(self, label: int) -> np.ndarray:
        """A copy of the stored (unit-length) vector of `label`; KeyError if absent."""
        if label not in self:
            raise KeyError(label)
        result: np.ndarray = self._vecs[int(label)].copy()
        return result

    @_guarded
    def similarities(self, query: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The cosine of `query` with each of `labels`' vectors (float32), NaN where a label has
        none: what a ranker reads of a few hundred candidates without a search."""
        q = self._query(query)
        lab = np.asarray(labels, dtype=np.int64).reshape(-1)
        out = np.full(lab.size, np.nan, dtype=np.float32)
        ok = (lab >= 0) & (lab < self._hi)
        ok[ok] = self._live[lab[ok]]
        if ok.any():
            out[ok] = self._vecs[lab[ok]] @ q
        return out

    @_guarded
    def labels(self) -> np.ndarray:
        """The live labels, ascending (int64)."""
        return np.flatnonzero(self._live[: self._hi]).astype(np.int64)

    def fingerprint(self) -> str:
        """Digest of the live (label, vector) pairs: ``"<count>:<16 hex digits>"``. O(1)."""
        return f"{self._count}:{self._hash:016x}"

    @_guarded
    def stats(self) -> dict[str, int]:
        return {
            "count": self._count,
            "capacity": int(self._vecs.shape[0]),
            "hnsw_elements": int(self._index.element_count),
            "hnsw_max_elements": int(self._index.get_max_elements()),
        }

    # -- writes ---------------------------------------------------------------------------

    @_guarded
    def add(self, labels: np.ndarray | list[int], vectors: np.ndarray) -> None:
        """Insert or replace vectors. `labels`: int64 (n,); `vectors`: (n, dim) or (dim,) for n=1.

        Vectors are stored normalised; zero, NaN or infinite vectors are refused (ValueError,
        nothing changed). A label given twice in one call keeps its last vector.
        """
        labs = np.asarray(labels, dtype=np.int64).reshape(-1)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim == 1:
            vecs = vecs.reshape(1, -1)
        if vecs.ndim != 2 or vecs.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (n, {self.dim}), not {np.shape(vectors)}")
        if vecs.shape[0] != labs.shape[0]:
            raise ValueError(f"{labs.shape[0]} labels for {vecs.shape[0]} vectors")
        if labs.size == 0:
            return
        if labs.min() < 0 or labs.max() > MAX_LABEL:
            raise ValueError(f"labels must be in [0, {MAX_LABEL}]")
        if not np.isfinite(vecs).all():
            raise ValueError("vectors must be finite")
        norms = np.linalg.norm(vecs, axis=1)
        if (norms == 0).any():
            raise ValueError("zero vectors have no direction")
        vecs = np.ascontiguousarray(vecs / norms[:, None], dtype=np.float32)
        if labs.size > 1:  # keep the last occurrence of a repeated label
            order = np.argsort(labs, kind="stable")
            s = labs[order]
            last = np.append(s[1:] != s[:-1], True)  # the last of each run of equal labels
            if not last.all():
                keep = np.sort(order[last])
                labs, vecs = labs[keep], vecs[keep]
        self._grow(int(labs.max()) + 1)
        # a live label given the vector it has (a merge that kept the text, an archive, a metadata
        # update) is left alone: hnswlib's in-place update re-links the point's neighbourhood and
        # costs several inserts (the tolerance absorbs re-normalising a stored vector)
        unchanged = self._live[labs] & (np.abs(self._vecs[labs] - vecs).max(axis=1) <= 1e-6)
        if unchanged.any():
            labs, vecs = labs[~unchanged], vecs[~unchanged]
            if labs.size == 0:
                return

        was_live = self._live[labs].copy()
        # tombstones the index still holds: bring them back so add_items updates them in place
        revived: list[int] = []
        for lab in labs[~was_live & self._known[labs]].tolist():
            try:
                self._index.unmark_deleted(lab)
                revived.append(lab)
            except RuntimeError:  # its slot was reused by replace_deleted: the index forgot it
                self._known[lab] = False
        update = was_live | self._known[labs]
        new = ~update
        n_new = int(new.sum())
        try:
            need = self._index.element_count + n_new
            if need > self._index.get_max_elements():
                self._index.resize_index(max(need, 2 * self._index.get_max_elements()))
            if update.any():
                self._index.add_items(vecs[update], labs[update], num_threads=self.num_threads)
            if n_new:
                # a label unknown to the index may take a tombstone's slot
                self._index.add_items(vecs[new], labs[new], num_threads=self.num_threads, replace_deleted=True)
        except BaseException:
            for lab in revived:
                try:
                    self._index.mark_deleted(lab)
                except RuntimeError:  # pragma: no cover
                    pass
            raise
        h = self._hash
        for lab in labs[was_live].tolist():
            h -= _item_hash(lab, self._vecs[lab])
        self._vecs[labs] = vecs
        for lab, row in zip(labs.tolist(), vecs):
            h += _item_hash(lab, row)
        self._hash = h & _MASK64
        self._count += int((~was_live).sum())
        self._live[labs] = True
        self._known[labs] = True
        self._hi = max(self._hi, int(labs.max()) + 1)

    @_guarded
    def remove(self, label: int, *, erase: bool = False) -> bool:
        """Delete `label` (a tombstone in the index). Idempotent; True if it was present.

        The matrix row is zeroed; the hnswlib index keeps a tombstone's data (and `save` writes it)
        unless `erase`: then the point is first overwritten in place with a seeded random vector
        (one insert's cost), so no file keeps the vector of a purged memory."""
        if label not in self:
            return False
        lab = int(label)
        if erase:
            noise = np.random.default_rng(lab).standard_normal((1, self.dim)).astype(np.float32)
            self._index.add_items(noise, np.asarray([lab], dtype=np.int64), num_threads=1)
        self._index.mark_deleted(lab)
        self._live[lab] = False
        self._count -= 1
        self._hash = (self._hash - _item_hash(lab, self._vecs[lab])) & _MASK64
        self._vecs[lab] = 0.0
        return True

    @_guarded
    def rebuild(self) -> None:
        """Build a fresh hnswlib index from the matrix (drops all tombstones)."""
        labs = self.labels()
        index = self._new_index(max(_next_pow2(labs.size), self.initial_capacity))
        if labs.size:
            index.add_items(self._vecs[labs], labs, num_threads=self.num_threads)
        self._index = index
        self._known[:] = False
        self._known[labs] = True

    # -- search ---------------------------------------------------------------------------

    @_guarded
    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k labels nearest to `query` (cosine) and their similarities, best first.

        `allowed`: labels that may be returned (others, and absent labels, are ignored).
        """
        q = self._query(query)
        if k <= 0 or self._count == 0:
            return _empty()
        if allowed is None:
            if self._count <= self.exact_max:
                return self._exact(q, k, None)
            return self._approx(q, k, None)
        rows = self._allowed_rows(allowed)
        if rows.size == 0:
            return _empty()
        limit = self.filter_exact_max
        if limit is None:
            limit = max(1000, int(math.sqrt(1000.0 * self._count)))
        if rows.size <= limit or self._count <= self.exact_max:
            return self._exact(q, k, rows)
        return self._approx(q, k, rows)

    @_guarded
    def exact_search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Brute-force search over the matrix (perfect recall; for checks and small sets)."""
        q = self._query(query)
        if k <= 0 or self._count == 0:
            return _empty()
        rows = None if allowed is None else self._allowed_rows(allowed)
        if rows is not None and rows.size == 0:
            return _empty()
        return self._exact(q, k, rows)

    def _query(self, query: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise ValueError(f"query must have {self.dim} dimensions, not {q.shape[0]}")
        norm = float(np.linalg.norm(q))
        if not np.isfinite(norm) or norm == 0.0:
            raise ValueError("query must be a finite, non-zero vector")
        return q / np.float32(norm)

    def _allowed_rows(self, allowed: np.ndarray) -> np.ndarray:
        a = np.asarray(allowed, dtype=np.int64).reshape(-1)
        a = a[(a >= 0) & (a < self._hi)]
        return _unique(a[self._live[a]])

    def _exact(self, q: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if rows is None:
            rows = np.flatnonzero(self._live[: self._hi])
        rows = rows.astype(np.int64, copy=False)
        scores = np.empty(rows.size, dtype=np.float32)
        buf = np.empty((min(_SLICE, rows.size), self.dim), dtype=np.float32)
        for i in range(0, rows.size, _SLICE):
            part = rows[i : i + _SLICE]
            block = buf[: part.size]
            np.take(self._vecs, part, axis=0, out=block, mode="clip")  # "raise" would buffer twice
            np.dot(block, q, out=scores[i : i + part.size])
        return self._top(rows, scores, k)

    @staticmethod
    def _top(labels: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k < labels.size:  # keep every tie of the k-th score, so the label decides exactly
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            sel = scores >= kth
            labels, scores = labels[sel], scores[sel]
        order = np.lexsort((labels, -scores))[:k]
        return labels[order], scores[order].astype(np.float32, copy=False)

    def _approx(self, q: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        n = self._count
        want = min(k, n if rows is None else rows.size)
        allowed_fn = None
        fetch, ef = want, self.ef_for(n)
        base = ef
        mask: np.ndarray | None = None
        if rows is not None:
            mask = np.zeros(self._hi, dtype=bool)
            mask[rows] = True
            depth = k * n / rows.size  # where the k-th allowed label sits in the unfiltered order
            if rows.size >= OVERFETCH_MIN_FRACTION * n:
                # over-fetch: 1.5 x that deep, as wide as an unfiltered query of that depth
                fetch = min(n, max(4 * k, int(1.5 * depth) + k))
                ef = min(n, max(base, int(base * depth / max(k, 1))))
            else:
                allowed_fn = mask.__getitem__  # hnswlib asks for every node it considers
        if ef != self._ef_search:
            self._index.set_ef(ef)
        try:
            while True:
                try:
                    found, _ = self._index.knn_query(q, k=fetch, num_threads=1, filter=allowed_fn)
                except RuntimeError:  # the walk did not reach `fetch` (allowed) live elements
                    log.debug("hnswlib could not return %d results; exact search instead", fetch)
                    return self._exact(q, k, rows)
                labs = found[0].astype(np.int64)
                if mask is None or allowed_fn is not None:
                    break
                labs = labs[mask[labs]]
                if labs.size >= want or fetch >= n:
                    break
                fetch = min(n, fetch * 4)
        finally:
            if ef != self._ef_search:
                self._index.set_ef(self._ef_search)
        labs = labs[:want]
        return self._top(labs, self._vecs[labs] @ q, want)

    # -- persistence ----------------------------------------------------------------------

    @_guarded
    def save(self, directory: StrPath, stem: str) -> str:
        """Write ``<stem>.hnsw`` and ``<stem>.vectors``; returns ``fingerprint()``.

        Both go to temporary names first, each complete (hnswlib does not report a failed write,
        so its file is checked against its own header: `check_hnsw_file`) and datasynced, and are
        renamed into place only then (the .hnsw first, the .vectors that vouches for it second),
        then the folder is fsynced. On any failure (a full disk) the temporaries are removed and
        the error raised: no file of `stem` is left under its final name with less than it should
        hold."""
        fs = RealFiles()
        folder = os.fspath(directory)
        fs.makedirs(folder)
        remove_temporaries(folder, stem)  # left by a crash during an earlier save
        token = secrets.token_hex(6)
        hnsw_tmp = os.path.join(folder, f".{stem}.hnsw.{token}.tmp")
        vectors_tmp = os.path.join(folder, f".{stem}.vectors.{token}.tmp")
        try:
            self._index.save_index(hnsw_tmp)
            check_hnsw_file(hnsw_tmp, int(self._index.element_count))
            hnsw_size, hnsw_crc = sync_and_crc(hnsw_tmp)
            labs = self.labels()

            def body() -> Iterator[bytes]:  # in slices: no second full copy of the matrix in memory
                yield labs.astype("<i8").tobytes()
                for i in range(0, labs.size, 8192):
                    yield self._vecs[labs[i : i + 8192]].astype("<f4", copy=False).tobytes()

            body_crc = 0
            for chunk in body():
                body_crc = zlib.crc32(chunk, body_crc)
            head = vectors_header(self.dim, labs.size, self._hash, hnsw_size, hnsw_crc, body_crc, self.model)
            with fs.open_append(vectors_tmp) as f:
                for chunk in itertools.chain([head], body()):
                    f.write(chunk)
                f.datasync()
            fs.rename(hnsw_tmp, os.path.join(folder, stem + ".hnsw"))
            fs.rename(vectors_tmp, os.path.join(folder, stem + ".vectors"))
        except BaseException:
            for tmp in (hnsw_tmp, vectors_tmp):
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                except OSError as exc:  # the original error matters more; a stray temp file is harmless
                    log.warning("could not remove the temporary file %s: %s", tmp, exc)
            raise
        fs.fsync_dir(folder)
        return self.fingerprint()

    @staticmethod
    def delete_files(directory: StrPath, stem: str) -> None:
        """Remove ``<stem>.vectors``, ``<stem>.hnsw`` and temporaries if present (then fsync the folder)."""
        delete_files(directory, stem)

    @classmethod
    def load(
        cls,
        directory: StrPath,
        stem: str,
        *,
        dim: int,
        model: str,
        expected_fingerprint: str | None = None,
        **params: int,
    ) -> VectorStore | None:
        """The store saved as `stem` in `directory`, or None (logged) when it cannot be trusted.

        None when ``<stem>.vectors`` is missing, unreadable, damaged (magic, version, checksums,
        size), of another dimension or model, or when `expected_fingerprint` is given and
        differs. A missing, damaged or mismatched ``<stem>.hnsw`` is rebuilt from the vectors.
        `params` are the constructor's keyword arguments (M, ef_search, ...).
        """
        folder = os.fspath(directory)
        vpath = os.path.join(folder, stem + ".vectors")
        try:
            data = RealFiles().read_bytes(vpath)
        except FileNotFoundError:
            log.info("%s: missing", vpath)
            return None
        except OSError as e:
            log.warning("%s: unreadable: %s", vpath, e)
            return None
        try:
            head, labs, rows = parse_vectors(data, dim=dim, model=model)
        except VectorFileError as e:
            log.warning("%s: %s", vpath, e)
            return None
        fp = f"{labs.size}:{head['fingerprint']:016x}"
        if expected_fingerprint is not None and fp != expected_fingerprint:
            log.warning("%s: fingerprint %s, expected %s: stale", vpath, fp, expected_fingerprint)
            return None
        if labs.size and (labs.min() < 0 or labs.max() > MAX_LABEL or (np.diff(labs) <= 0).any()):
            log.warning("%s: labels out of range or not ascending", vpath)
            return None
        store = cls(dim, model=model, **params)
        if labs.size:
            store._grow(int(labs.max()) + 1)
            store._vecs[labs] = rows
            store._live[labs] = True
            store._hi = int(labs.max()) + 1
        store._count = int(labs.size)
        store._hash = int(head["fingerprint"])
        if not store._load_index(os.path.join(folder, stem + ".hnsw"), head):
            store.rebuild()
        return store

    def _load_index(self, path: str, head: dict[str, Any]) -> bool:
        try:
            size, crc = sync_and_crc(path, sync=False)
        except FileNotFoundError:
            log.info("%s: missing; rebuilding the index from the vectors", path)
            return False
        except OSError as e:
            log.warning("%s: unreadable (%s); rebuilding the index from the vectors", path, e)
            return False
        if (size, crc) != (head["hnsw_size"], head["hnsw_crc"]):
            log.warning("%s: does not match its .vectors file; rebuilding the index", path)
            return False
        index = hnswlib.Index(space="cosine", dim=self.dim)
        try:
            index.load_index(path, max_elements=0, allow_replace_deleted=True)
        except (RuntimeError, ValueError, MemoryError) as e:
            log.warning("%s: hnswlib cannot load it (%s); rebuilding the index", path, e)
            return False
        if index.dim != self.dim or index.space != "cosine" or index.element_count < self._count:
            log.warning("%s: wrong shape; rebuilding the index", path)
            return False
        known = np.asarray(index.get_ids_list(), dtype=np.int64)
        if known.size and (known.min() < 0 or known.max() > MAX_LABEL):
            log.warning("%s: labels out of range; rebuilding the index", path)
            return False
        if known.size:
            self._grow(int(known.max()) + 1)
        self._known[:] = False
        self._known[known] = True
        if not self._known[self._live].all():
            log.warning("%s: lacks some labels; rebuilding the index", path)
            return False
        index.set_ef(self._ef_search)
        self._index = index
        self.M = int(index.M)
        self.ef_construction = int(index.ef_construction)
        return True

    # -- internals ------------------------------------------------------------------------

    def _new_index(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(
            max_elements=max(1, capacity), M=self.M, ef_construction=self.ef_construction, allow_replace_deleted=True
        )
        index.set_ef(self._ef_search)
        return index

    def _grow(self, slots: int) -> None:
        cap = self._vecs.shape[0]
        if slots <= cap:
            return
        new_cap = max(2 * cap, _next_pow2(slots))
        vecs = np.zeros((new_cap, self.dim), dtype=np.float32)
        vecs[:cap] = self._vecs
        self._vecs = vecs
        for name in ("_live", "_known"):
            old = getattr(self, name)
            grown = np.zeros(new_cap, dtype=bool)
            grown[:cap] = old
            setattr(self, name, grown)
