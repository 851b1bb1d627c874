"""Tier 4's data: the memories, their labels, filter columns, vectors and BM25 index, and the
reads every part of the state shares (MemoryData, the base of MemoryState), among them the
embeddings a batch needs (computed before its handlers run, kept in `Prepared`).

Rule kept here: this is the data MemoryState owns (memory/state.py's rule: one owner, changed only
through `apply`); the parts built on it (search.py, dedup.py, projection.py) add only the state
each of them owns (its caches, its dirty sets) and read the rest through the methods here. Nothing
here changes a memory except `keep`, which commits a PutMemory like every other change.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from ...protocol import Memory, ProtocolError, domain_slug
from ...protocol import methods as m
from ..retrieval.lexical import LexicalIndex
from ..retrieval.text import EMBED_WINDOW, EMBED_WINDOWS, passage_windows, pooled
from ..retrieval.vectors import VectorStore
from ..tier import TierState
from .columns import FilterColumns
from .format import derive_abstract, fingerprint, title_slug
from .params import MIN_CONFIDENCE, updated_text
from .prepared import Prepared, query_to_embed
from .records import MaintenanceRecord, PutMemory, VersionEntry
from .review import ReviewQueue
from .strength import StrengthSettings, rfc3339, strength


def memory_text(memory: Memory) -> str:
    """What the lexical index sees: title, abstract and content."""
    return f"{memory.title}\n{memory.abstract}\n{memory.content}"


def own_abstract(memory: Memory) -> str | None:
    """A stored memory's abstract if a client gave it (not the daemon's derived one)."""
    return None if memory.abstract == derive_abstract(memory.content) else memory.abstract


class MemoryData(TierState):
    """Tier 4's memories and indexes, and the reads every part shares (module rule)."""

    def __init__(self, embedder: Any, files_root: str = "memories") -> None:
        super().__init__()
        self.embedder = embedder
        self.model = embedder.name
        self.embed_window = EMBED_WINDOW.get(self.model, EMBED_WINDOW["default"])  # see passage_windows
        self.embed_chars = self.embed_window * EMBED_WINDOWS  # the most of a content ever embedded
        self.thresholds = embedder.thresholds
        self.memories: dict[str, Memory] = {}
        self.model_of: dict[str, str] = {}  # memory id -> model of its vector ("" when none yet)
        self._unembedded: dict[str, None] = {}  # ids whose vector is not of the current model
        self._label: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self._next_label = 0
        # labels a purge freed, smallest first (a heap): new memories take them before new ones, so
        # churn does not grow the label-indexed arrays (vectors, filters, BM25) nor hnswlib's slots
        self._free_labels: list[int] = []
        self._fingerprints: dict[tuple[str, str], str] = {}  # (domain slug, fp) -> id, active only
        self._files: dict[str, str] = {}  # file -> id
        self._domains: dict[str, dict[str, None]] = {}  # slug -> ids in insertion order
        self._global: dict[str, None] = {}
        self._version = 0
        self.history: dict[str, list[VersionEntry]] = {}  # id -> its versions, oldest first (memory/state.py's rule)
        self.vectors = VectorStore(embedder.dim, model=self.model)
        self.columns = FilterColumns()
        self.lexical = LexicalIndex(stem=True)  # stemmed (issue 18): a dump of plain tokens is rebuilt
        self.lexical_from = "new"  # or "snapshot" / "rebuilt" (from the texts) after load_snapshot
        self.files_root = files_root
        self.embed_error: str | None = None  # set while the embedder is failing
        # (model, VectorStore, Embedder) of the model used before a change of model, kept for
        # search until every memory has a vector of the new one
        self.previous: tuple[str, VectorStore, Any] | None = None
        # the files (memory/vectors/<stem>.vectors and .hnsw) that hold the vectors as last saved:
        # every snapshot that changed them writes a new stem, and the old files go only once the
        # new memories.snapshot names the new stem (a crash in between keeps the old pair usable)
        self.vectors_stem = ""
        self.saved_fingerprint = ""  # of self.vectors when saved as vectors_stem
        self.previous_stem = ""
        self.previous_saved_fingerprint = ""  # of self.previous's store when saved as previous_stem
        self._prepared = Prepared()
        self._active = 0  # memories whose status is active, kept by _put / _purge / load_snapshot

        self.review = ReviewQueue()  # promotion requests (daemon/memory/review.py)
        self.share_policy: Callable[[str], str] = lambda domain: "review"  # the daemon sets its config's
        # the lifecycle (issue 13): strength's tables and weights (the daemon sets them from its
        # Config), the wall clock every timestamp and every strength is taken from (tests give
        # trio's virtual one), a revision per memory (what maintenance checks before it changes a
        # memory it planned to), the last maintenance runs
        self.settings = StrengthSettings.defaults()
        self.wall: Callable[[], float] = time.time
        self._revision: dict[str, int] = {}
        self._revisions = 0
        self.maintenance_runs: list[MaintenanceRecord] = []
        self._valid_cache: dict[Any, tuple[np.ndarray, float]] = {}  # filters by the time: (labels, good until)

    def stamp(self) -> str:
        """The current time from the state's wall clock, RFC 3339 in UTC."""
        return rfc3339(self.wall())

    def valid_now(self, memory: Memory, at: float | None = None) -> bool:
        """Is the memory's fact true at `at` (default now)? valid_from <= at < valid_until."""
        label = self._label.get(memory.id)
        if label is None:
            return False
        at = self.wall() if at is None else at
        return bool(self.columns.valid_from[label] <= at < self.columns.valid_until[label])

    def strength_of(self, memory: Memory, at: float | None = None) -> float:
        return strength(memory, self.wall() if at is None else at, self.settings)

    def revision(self, memory_id: str) -> int:
        """A number that changes whenever the memory does (in this process; not journaled)."""
        return self._revision.get(memory_id, 0)

    def id_at(self, label: int) -> str:
        return self._id_of[label]

    def memory_at(self, label: int) -> Memory:
        return self.memories[self._id_of[label]]

    @staticmethod
    def slug_of(memory: Memory) -> str:
        return domain_slug(memory.domain)

    def passage_texts(self, title: str, content: str, abstract: str | None = None) -> list[str]:
        """The texts a memory's vector is pooled from (passage_windows with this model's window)."""
        return passage_windows(title, content, abstract, self.embed_window)

    def has_fingerprint(self, slug: str, fp: str) -> bool:
        """Is an active memory of that domain slug an exact duplicate (same fingerprint)?"""
        return (slug, fp) in self._fingerprints

    def version_of(self, memory_id: str) -> int:
        """The current version number of a memory (1 for one without a history yet)."""
        entries = self.history.get(memory_id)
        return entries[-1].version if entries else 1

    def keep(self, memory: Memory, old: Memory, decision: str = "", reason: str = "") -> None:
        """Commit a changed memory whose text is unchanged: its vector goes along as it is. With a
        decision it is a new version in the memory's history (memory.history); without one (use
        counts) the same version."""
        version = self.version_of(old.id) + 1 if decision else 0
        self.commit(PutMemory(memory, self.model_of.get(old.id, ""), self.vector_bytes(old.id), version, decision, reason))

    def existing_memory(self, memory_id: str) -> Memory:
        """The memory with this id; not_found (a client's error) when there is none."""
        memory = self.memories.get(memory_id)
        if memory is None:
            raise ProtocolError("not_found", f"no memory with id {memory_id!r}", id=memory_id)
        return memory

    # --- a batch's embeddings: computed before its handlers run, or here when one is missing ----

    def texts_to_embed(self, calls: list[Any]) -> tuple[list[str], list[str]]:
        passages: dict[str, None] = {}
        queries: dict[str, None] = {}
        for call in calls:
            name, p = call.spec.name, call.params
            if name == "memory.add":
                self._want_passage(p, passages)
            elif name == "memory.add_many":
                for item in p.items:
                    self._want_passage(item, passages)
            elif name == "memory.update" and (p.title is not None or p.content is not None):
                old = self.memories.get(p.id)
                if old is not None:
                    passages.update(dict.fromkeys(self.passage_texts(*updated_text(old, p))))
            else:
                query = query_to_embed(call)
                if query is not None:
                    queries[query] = None
        return list(passages), list(queries)

    def _want_passage(self, p: m.MemoryAdd, out: dict[str, None]) -> None:
        if p.dedup and p.confidence < MIN_CONFIDENCE:
            return
        if p.dedup and (domain_slug(p.domain), fingerprint(p.title, p.content)) in self._fingerprints:
            return
        out.update(dict.fromkeys(self.passage_texts(p.title, p.content, p.abstract)))

    def prepare(self, calls: list[Any]) -> Prepared:
        prepared = Prepared()
        passages, queries = self.texts_to_embed(calls)
        if passages:
            rows = self.embedder.embed_passages(passages)
            prepared.passages = dict(zip(passages, rows))
        if queries:
            prepared.queries = dict(zip(queries, self.embedder.embed_queries(queries)))
            if self.previous is not None:
                prepared.previous_queries = dict(zip(queries, self.previous[2].embed_queries(queries)))
        return prepared

    def use_passages(self, passages: dict[str, np.ndarray]) -> None:
        """Embeddings computed elsewhere (a job embeds off the actor) for the adds that follow."""
        prepared = Prepared()
        prepared.passages = dict(passages)
        self._prepared = prepared

    def forget_prepared(self) -> None:
        """Drop the last batch's embeddings (and the texts they are keyed by)."""
        self._prepared = Prepared()

    def _passage_vector(self, title: str, content: str, abstract: str | None) -> np.ndarray:
        texts = self.passage_texts(title, content, abstract)
        vectors = [self._prepared.passages.get(text) for text in texts]
        missing = [text for text, vector in zip(texts, vectors) if vector is None]
        if missing:  # not prepared (the state changed since): embedded here, bounded as ever
            made = dict(zip(missing, self._embed_many(self.embedder.embed_passages, missing)))
            vectors = [made[text] if vector is None else vector for text, vector in zip(texts, vectors)]
        return pooled(vectors)  # type: ignore[arg-type]

    def _query_vector(self, query: str) -> np.ndarray:
        vector = self._prepared.queries.get(query)
        if vector is None:
            vector = self._embed(self.embedder.embed_queries, query)
        return vector

    def _embed(self, fn: Callable[[list[str]], np.ndarray], text: str) -> np.ndarray:
        result: np.ndarray = self._embed_many(fn, [text])[0]
        return result

    def _embed_many(self, fn: Callable[[list[str]], np.ndarray], texts: list[str]) -> np.ndarray:
        if self.embed_error is not None:
            raise ProtocolError("unavailable", self.embed_error, model=self.model)
        try:
            return fn(texts)
        except Exception as exc:
            raise ProtocolError("unavailable", f"the embedder {self.model} failed: {exc}", model=self.model) from None

    @staticmethod
    def new_id() -> str:
        return str(uuid.uuid4())

    def add_loaded_vectors(self, vectors: dict[str, bytes]) -> int:
        """The current model's vectors of a load that applied its memories without them (the
        PostgreSQL store), in one insert: hnswlib builds its graph on every core at once, where an
        insert per memory took most of the start-up. Those of memories no longer held are left out;
        how many were added."""
        labels, matrix = self._rows_of(vectors)
        if not len(labels):
            return 0
        self.vectors.add(labels, matrix)
        for memory_id in vectors:
            if memory_id in self._label:
                self._set_model(memory_id, self.model)
        return len(labels)

    def keep_previous(self, model: str, vectors: dict[str, bytes], embedder: Any) -> int:
        """During a change of model, after a load that kept each memory's latest vector only (the
        PostgreSQL store): `vectors` of the memories still waiting for the current model's, by the
        previous `model`, become the store that keeps dense search answering for them (as a
        snapshot's previous vector file does). How many were kept."""
        labels, matrix = self._rows_of({i: v for i, v in vectors.items() if self.model_of.get(i) == model})
        if not len(labels):
            return 0
        store = VectorStore(matrix.shape[1], model=model)
        store.add(labels, matrix)
        self.previous = (model, store, embedder)
        return len(labels)

    def _rows_of(self, vectors: dict[str, bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The labels of the memories held among `vectors` (float32 rows) and their rows as a matrix."""
        held = [memory_id for memory_id in vectors if memory_id in self._label]
        labels = np.fromiter((self._label[i] for i in held), dtype=np.int64, count=len(held))
        if not held:
            return labels, np.empty((0, 0), dtype=np.float32)
        matrix = np.frombuffer(b"".join(vectors[i] for i in held), dtype=np.float32).reshape(len(held), -1)
        return labels, matrix

    def vector_bytes(self, memory_id: str) -> bytes:
        """The memory's float32 vector row as a record carries it (empty: none yet)."""
        label = self._label.get(memory_id)
        if label is None or label not in self.vectors:
            return b""
        return np.asarray(self.vectors.get(label), dtype=np.float32).tobytes()

    def _new_file(self, slug: str, title: str, fp: str, created_at: str) -> str:
        date = created_at[:10].replace("-", "")
        return self._free_name(f"{self.files_root}/{slug}/{date}_{title_slug(title)}", fp)

    def _free_name(self, base: str, fp: str) -> str:
        """`base`.md, else EurekaClaw's `base_<fp[:4]>`.md, else with _2, _3, ...: a name no memory
        (active or archived) has, so that no two records ever share a file."""
        name = f"{base}.md"
        if name in self._files:
            name = f"{base}_{fp[:4]}.md"
            n = 2
            while name in self._files:
                name = f"{base}_{fp[:4]}_{n}.md"
                n += 1
        return name

    def _set_model(self, memory_id: str, model: str) -> None:
        self.model_of[memory_id] = model
        if model == self.model:
            self._unembedded.pop(memory_id, None)
        else:
            self._unembedded[memory_id] = None

    def _current_labels(self, now: float) -> np.ndarray:
        """Active memories valid now."""
        return self._by_time(("current", self._version), now, lambda: self.columns.labels(valid_at=now), depends_on_now=True)

    def _by_time(self, key: Any, now: float, compute: Callable[[], np.ndarray], *, depends_on_now: bool) -> np.ndarray:
        cached = self._valid_cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        result = compute()
        until = self.columns.next_change(now) if depends_on_now else math.inf
        if len(self._valid_cache) > 256:
            self._valid_cache.clear()
        self._valid_cache[key] = (result, until)
        return result
