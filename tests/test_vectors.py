"""VectorStore: add / replace / remove / search, filters, recall against exact search, files."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from eurekamem.daemon.retrieval.vector_files import MAGIC, VectorFileError, read_header
from eurekamem.daemon.retrieval.vectors import VectorStore


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def embedding_like(rng: np.random.Generator, n: int, dim: int = 384) -> np.ndarray:
    """Unit vectors with the structure of sentence embeddings: topic clusters, low intrinsic rank.

    Uniformly random unit vectors in 384-d are the worst case for any graph index (all pairs are
    nearly orthogonal, so the "nearest" neighbours are hardly nearer than the rest); real
    embeddings are not like that, and neither is this.
    """
    rank, topics = 32, 200
    basis = rng.standard_normal((rank, dim)).astype(np.float32) / np.sqrt(rank)
    centres = rng.standard_normal((topics, dim)).astype(np.float32)
    x = (
        0.7 * centres[rng.integers(0, topics, n)]
        + rng.standard_normal((n, rank)).astype(np.float32) @ basis
        + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    )
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def hnsw_only(dim: int, **kw) -> VectorStore:
    """A store that answers every search through hnswlib (no exact shortcuts)."""
    kw.setdefault("model", "test")
    return VectorStore(dim, exact_max=0, filter_exact_max=0, **kw)


# --- basics -----------------------------------------------------------------------------------


def test_add_get_contains_len() -> None:
    rng = np.random.default_rng(0)
    s = VectorStore(8, model="m")
    x = rng.standard_normal((5, 8)).astype(np.float32) * 3
    s.add(np.arange(5), x)
    assert len(s) == 5
    assert 3 in s and 5 not in s and -1 not in s and "x" not in s
    np.testing.assert_allclose(s.get(2), x[2] / np.linalg.norm(x[2]), rtol=1e-6)
    with pytest.raises(KeyError):
        s.get(7)
    assert s.labels().tolist() == [0, 1, 2, 3, 4]
    s.add(7, x[0])  # one label, one vector
    assert 7 in s and len(s) == 6


def test_bad_input_changes_nothing() -> None:
    s = VectorStore(4, model="m")
    s.add([0], np.ones(4))
    fp = s.fingerprint()
    for labels, vecs in [
        ([1], np.zeros(4)),
        ([1], np.array([1, np.nan, 0, 0])),
        ([1], np.ones(5)),
        ([1, 2], np.ones((1, 4))),
        ([-1], np.ones(4)),
        ([2**40], np.ones(4)),
    ]:
        with pytest.raises(ValueError):
            s.add(labels, vecs)
    assert len(s) == 1 and s.fingerprint() == fp
    with pytest.raises(ValueError):
        s.search(np.zeros(4), 1)
    with pytest.raises(ValueError):
        s.search(np.ones(3), 1)


@pytest.mark.parametrize("path", ["exact", "hnsw"])
def test_replace_and_remove(path: str) -> None:
    rng = np.random.default_rng(1)
    s = hnsw_only(16) if path == "hnsw" else VectorStore(16, model="m")
    x = unit(rng, 200, 16)
    s.add(np.arange(200), x)
    assert s.search(x[10], 1)[0].tolist() == [10]
    fp = s.fingerprint()

    new = unit(rng, 1, 16)[0]
    s.add([10], new)  # replace
    assert len(s) == 200
    assert s.fingerprint() != fp
    labels, scores = s.search(new, 1)
    assert labels.tolist() == [10] and scores[0] == pytest.approx(1.0, abs=1e-5)
    everything = dict(zip(*(a.tolist() for a in s.search(x[10], 200))))
    assert len(everything) == 200
    assert everything[10] == pytest.approx(float(new @ x[10]), abs=1e-5)  # scored by its new vector
    s.add([10], x[10])  # back: the fingerprint does not depend on history
    assert s.fingerprint() == fp

    assert s.remove(10) is True
    assert s.remove(10) is False  # idempotent
    assert 10 not in s and len(s) == 199
    assert 10 not in s.search(x[10], 20)[0].tolist()
    s.add([10], x[10])  # re-add after removal (revives the tombstone)
    assert s.search(x[10], 1)[0].tolist() == [10]
    assert s.fingerprint() == fp


def test_repeated_label_in_one_batch_keeps_last() -> None:
    rng = np.random.default_rng(2)
    s = hnsw_only(8)
    x = unit(rng, 3, 8)
    s.add([4, 4, 5], x)
    assert len(s) == 2
    np.testing.assert_allclose(s.get(4), x[1], rtol=1e-6)
    assert s.search(x[1], 1)[0].tolist() == [4]


def test_scores_are_cosine_best_first_ties_by_label() -> None:
    s = VectorStore(3, model="m")
    s.add([5, 2, 9], np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32))
    labels, scores = s.search(np.array([1, 0, 0]), 3)
    assert labels.tolist() == [2, 5, 9]
    np.testing.assert_allclose(scores, [1, 1, 0], atol=1e-6)
    assert s.search(np.array([1, 0, 0]), 1)[0].tolist() == [2]  # a tie at the cut: smaller label
    assert s.search(np.array([1, 0, 0]), 0)[0].size == 0
    assert VectorStore(3, model="m").search(np.array([1, 0, 0]), 5)[0].size == 0


def test_growth_past_initial_capacity() -> None:
    rng = np.random.default_rng(3)
    s = hnsw_only(32, initial_capacity=4)
    x = unit(rng, 1500, 32)
    for i in range(50):  # one at a time
        s.add([i], x[i])
    s.add(np.arange(50, 1500), x[50:])  # then in bulk
    s.add([5000], x[0])  # a label far beyond the rest
    assert len(s) == 1501
    assert s.stats()["capacity"] >= 5001 and s.stats()["hnsw_max_elements"] >= 1501
    for i in rng.choice(1500, 50, replace=False):
        assert s.search(x[i], 1)[0][0] in (i, 5000 if i == 0 else i)


def test_tombstones_are_reused_and_never_returned() -> None:
    """Random adds, replaces and removes against a dict model, through the hnswlib path."""
    rng = np.random.default_rng(4)
    pyr = random.Random(4)
    s = hnsw_only(16, initial_capacity=16)
    model: dict[int, np.ndarray] = {}
    for _ in range(3000):
        op = pyr.random()
        lab = pyr.randrange(300)
        if op < 0.6:
            v = unit(rng, 1, 16)[0]
            s.add([lab], v)
            model[lab] = v
        else:
            s.remove(lab)
            model.pop(lab, None)
    assert len(s) == len(model)
    assert sorted(model) == s.labels().tolist()
    # tombstone slots were reused: the index never held much more than the peak live count
    assert s.stats()["hnsw_elements"] <= 300
    for lab, v in model.items():
        labels, _ = s.search(v, 5)
        assert labels[0] == lab
        assert len(set(labels.tolist())) == len(labels)
        assert all(int(x) in model for x in labels)
    # a fresh store with the same content has the same fingerprint
    t = VectorStore(16, model="test")
    t.add(np.array(sorted(model)), np.array([model[k] for k in sorted(model)]))
    assert t.fingerprint() == s.fingerprint()


# --- filters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("filter_exact_max", [0, 10**9])  # hnswlib path, exact path
def test_allowed_filter_is_honoured(filter_exact_max: int) -> None:
    rng = np.random.default_rng(5)
    n = 3000
    s = VectorStore(24, model="m", exact_max=0, filter_exact_max=filter_exact_max)
    x = unit(rng, n, 24)
    s.add(np.arange(n), x)
    for i in range(0, n, 7):
        s.remove(i)
    for frac in (0.5, 0.05, 0.005):
        allowed = rng.choice(n, int(n * frac), replace=False)
        allowed_live = {int(a) for a in allowed if a % 7}
        noisy = np.concatenate([allowed, [-5, n + 100, 10**9], allowed[:3]])  # junk and repeats
        for q in unit(rng, 20, 24):
            labels, scores = s.search(q, 10, allowed=noisy)
            assert set(labels.tolist()) <= allowed_live
            assert len(labels) == min(10, len(allowed_live))
            assert len(set(labels.tolist())) == len(labels)
            assert (np.diff(scores) <= 1e-6).all()
            ex_labels, _ = s.exact_search(q, 10, allowed=allowed)
            if filter_exact_max:
                assert labels.tolist() == ex_labels.tolist()
            else:  # approximate, but on this small set nearly always the same
                assert len(set(labels.tolist()) & set(ex_labels.tolist())) >= 8
    assert s.search(x[1], 5, allowed=np.array([0, 7, 14]))[0].size == 0  # only removed labels
    assert s.search(x[1], 5, allowed=np.array([], dtype=np.int64))[0].size == 0


def test_overfetch_grows_when_the_allowed_labels_are_far() -> None:
    """Allowed = the quarter of labels least similar to the query: over-fetching must dig deep."""
    rng = np.random.default_rng(9)
    n = 2000
    s = hnsw_only(16)
    x = unit(rng, n, 16)
    s.add(np.arange(n), x)
    q = x[0]
    far = np.argsort(x @ q)[: n // 4]  # the 500 least similar
    labels, _ = s.search(q, 10, allowed=far)
    assert len(labels) == 10 and np.isin(labels, far).all()
    expect = s.exact_search(q, 10, allowed=far)[0]
    assert len(set(labels.tolist()) & set(expect.tolist())) >= 9


@pytest.mark.slow
def test_recall_at_10_against_exact_20k_384d() -> None:
    rng = np.random.default_rng(6)
    n, dim = 20_000, 384
    data = embedding_like(rng, n + 100, dim)
    x, queries = data[:n], data[n:]
    s = hnsw_only(dim, ef_construction=100)
    s.add(np.arange(n), x)
    hits = 0
    for q in queries:
        got = set(s.search(q, 10)[0].tolist())
        hits += len(got & set(s.exact_search(q, 10)[0].tolist()))
    recall = hits / (10 * len(queries))
    assert recall >= 0.95, recall
    # filters through hnswlib: 30 % over-fetches, 10 % uses the filter callback
    for frac in (0.3, 0.1):
        allowed = rng.choice(n, int(n * frac), replace=False)
        hits = 0
        for q in queries[:50]:
            got = s.search(q, 10, allowed=allowed)[0]
            assert np.isin(got, allowed).all()
            hits += len(set(got.tolist()) & set(s.exact_search(q, 10, allowed=allowed)[0].tolist()))
        assert hits / 500 >= 0.95, (frac, hits / 500)


# --- files ------------------------------------------------------------------------------------


def _store(n: int = 500, dim: int = 16, seed: int = 7) -> tuple[VectorStore, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = hnsw_only(dim)
    x = unit(rng, n, dim)
    s.add(np.arange(n), x)
    for i in range(0, n, 5):
        s.remove(i)
    return s, x


def _same_answers(a: VectorStore, b: VectorStore, x: np.ndarray) -> None:
    for q in x[:40]:
        la, sa = a.search(q, 10)
        lb, sb = b.search(q, 10)
        assert la.tolist() == lb.tolist()
        np.testing.assert_allclose(sa, sb, atol=1e-6)


def test_save_load_round_trip(tmp_path) -> None:
    s, x = _store()
    (tmp_path / ".e5-small.1.hnsw.0123456789ab.tmp").write_bytes(b"left by a crash")
    (tmp_path / ".e5-small.1.vectors.0123456789ab.tmp").write_bytes(b"left by a crash")
    fp = s.save(tmp_path, "e5-small.1")
    assert fp == s.fingerprint()
    assert sorted(os.listdir(tmp_path)) == ["e5-small.1.hnsw", "e5-small.1.vectors"]  # no temp files left
    t = VectorStore.load(tmp_path, "e5-small.1", dim=16, model="test", expected_fingerprint=fp, exact_max=0)
    assert t is not None
    assert len(t) == len(s) and t.fingerprint() == fp
    assert t.labels().tolist() == s.labels().tolist()
    assert t.stats()["hnsw_elements"] == s.stats()["hnsw_elements"]  # the saved graph, not a rebuild
    _same_answers(s, t, x)
    # the loaded store keeps working: re-add removed labels (tombstones), add new ones
    t.add([0, 5, 1000], x[[0, 5, 1]])
    assert t.search(x[5], 1)[0].tolist() == [5]
    assert t.search(x[0], 1)[0].tolist() == [0]
    VectorStore.delete_files(tmp_path, "e5-small.1")
    assert os.listdir(tmp_path) == []
    assert VectorStore.load(tmp_path, "e5-small.1", dim=16, model="test") is None


def test_empty_store_round_trip(tmp_path) -> None:
    s = VectorStore(4, model="m")
    fp = s.save(tmp_path, "x")
    t = VectorStore.load(tmp_path, "x", dim=4, model="m", expected_fingerprint=fp)
    assert t is not None and len(t) == 0 and t.fingerprint() == fp
    t.add([1], np.ones(4))
    assert t.search(np.ones(4), 1)[0].tolist() == [1]


def _corrupt(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    ["missing", "empty", "truncated", "magic", "header", "body", "version", "dim", "model", "stale"],
)
def test_unusable_vectors_file_gives_none(tmp_path, damage: str, caplog) -> None:
    s, _ = _store(100)
    fp = s.save(tmp_path, "m")
    vpath = tmp_path / "m.vectors"
    kw = {"dim": 16, "model": "test", "expected_fingerprint": fp}
    if damage == "missing":
        vpath.unlink()
    elif damage == "empty":
        vpath.write_bytes(b"")
    elif damage == "truncated":
        vpath.write_bytes(vpath.read_bytes()[:-3])
    elif damage == "magic":
        _corrupt(vpath, 0)
    elif damage == "header":
        _corrupt(vpath, 20)  # inside count / fingerprint
    elif damage == "body":
        _corrupt(vpath, len(vpath.read_bytes()) - 10)
    elif damage == "version":
        data = bytearray(vpath.read_bytes())
        data[8:12] = struct.pack("<I", 99)
        vpath.write_bytes(bytes(data))
    elif damage == "dim":
        kw["dim"] = 32
    elif damage == "model":
        kw["model"] = "other"
    elif damage == "stale":
        s.add([1], np.ones(16))  # the caller's snapshot names a later state than the files
        kw["expected_fingerprint"] = s.fingerprint()
    with caplog.at_level("INFO", logger="eurekamem.vectors"):
        assert VectorStore.load(tmp_path, "m", **kw) is None
    assert caplog.records  # it says why


@pytest.mark.parametrize("damage", ["missing", "corrupt", "truncated", "other_generation"])
def test_bad_hnsw_file_is_rebuilt(tmp_path, damage: str, caplog) -> None:
    s, x = _store(400)
    fp = s.save(tmp_path, "m")
    hpath = tmp_path / "m.hnsw"
    if damage == "missing":
        hpath.unlink()
    elif damage == "corrupt":
        _corrupt(hpath, len(hpath.read_bytes()) // 2)
    elif damage == "truncated":
        hpath.write_bytes(hpath.read_bytes()[:1000])
    elif damage == "other_generation":  # a crash between the two renames of a later save
        other, _ = _store(400, seed=8)
        other.save(tmp_path, "other")
        os.replace(tmp_path / "other.hnsw", hpath)
    with caplog.at_level("INFO", logger="eurekamem.vectors"):
        t = VectorStore.load(tmp_path, "m", dim=16, model="test", expected_fingerprint=fp, exact_max=0)
    assert t is not None and t.fingerprint() == fp
    assert any("rebuild" in r.getMessage() for r in caplog.records)
    assert t.stats()["hnsw_elements"] == len(s)  # a fresh graph, without tombstones
    _same_answers(s, t, x)


def test_re_adding_a_vector_unchanged_leaves_the_index_alone() -> None:
    """A merge that keeps the text, an archive or a metadata update re-adds a memory's own vector:
    hnswlib is not asked to update the point (it would re-link its neighbourhood), and the store
    answers as before; a changed vector still goes through."""
    rng = np.random.default_rng(3)
    store = hnsw_only(32)
    x = unit(rng, 50, 32)
    store.add(np.arange(50), x)
    fingerprint = store.fingerprint()
    calls: list[int] = []
    real = store._index

    class Spy:
        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(real, name)

        def add_items(self, vectors, labels, **kw):  # type: ignore[no-untyped-def]
            calls.append(len(labels))
            return real.add_items(vectors, labels, **kw)

    store._index = Spy()
    store.add([7], x[7] * 3.0)  # the same direction, stored normalised: unchanged
    store.add([8, 9], x[8:10].copy())
    assert calls == [] and store.fingerprint() == fingerprint and len(store) == 50
    store.add([7, 8], np.stack([x[7], x[20]]))  # 8 changes, 7 does not
    assert calls == [1]
    labels, scores = store.search(x[20], 2)
    assert set(labels.tolist()) == {8, 20} and scores[0] == pytest.approx(1.0, abs=1e-5)


def test_ef_grows_with_the_collection(monkeypatch) -> None:
    """hnswlib searches with ef max(ef_search, EF_AT_100K * sqrt(n / 100k)), then goes back to
    ef_search; a larger ef finds at least as much."""
    from eurekamem.daemon.retrieval import vectors as _vectors

    assert VectorStore(8, model="t").ef_for(1_000) == 64
    assert VectorStore(8, model="t").ef_for(100_000) == 100
    assert 300 <= VectorStore(8, model="t").ef_for(1_000_000) <= 320
    rng = np.random.default_rng(4)
    store = hnsw_only(16)
    x = unit(rng, 3000, 16)
    store.add(np.arange(3000), x)
    seen: list[int] = []
    real = store._index

    class Spy:
        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(real, name)

        def knn_query(self, *a, **kw):  # type: ignore[no-untyped-def]
            seen.append(real.ef)
            return real.knn_query(*a, **kw)

    store._index = Spy()
    store.search(x[0], 5)
    monkeypatch.setattr(_vectors, "EF_AT_100K", 2000)  # as if the store were large
    store.search(x[0], 5)
    assert seen == [store.ef_search, int(2000 * (3000 / 100_000) ** 0.5)] and real.ef == store.ef_search


def test_read_header_gives_the_dimension_a_saved_file_was_written_with(tmp_path: Path) -> None:
    """read_header is what `eurekamem verify` reads before VectorStore.load (which needs the dim)."""
    s = VectorStore(8, model="m")
    s.add(np.arange(3), np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32))
    s.save(tmp_path, "memories")
    path = tmp_path / "memories.vectors"
    assert read_header(path) == (MAGIC, 1, 8)
    short = tmp_path / "short.vectors"
    short.write_bytes(MAGIC)
    with pytest.raises(VectorFileError, match="too short"):
        read_header(short)
    other = tmp_path / "other.vectors"
    other.write_bytes(b"x" * 100)
    assert read_header(other)[0] != MAGIC
