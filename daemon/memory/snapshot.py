"""Tier 4's snapshot on disk: memories.snapshot and the vector files it names.

Rule kept here: a snapshot never names a vector file that is not there. The vectors are saved first,
under a new stem whenever they changed (a file once named is never rewritten), then the snapshot
that names them, and only then are the files no snapshot names removed; a crash at any point leaves
the last snapshot written whole, with its vector files. `save_snapshot` runs as the memory actor's
internal call (it reads and updates the state's saved stems and fingerprints).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import msgspec

from ..retrieval.vector_files import remove_unnamed_vector_files
from ..retrieval.vectors import VectorStore
from ..storage.files import RealFiles, atomic_write
from .records import MemorySnapshot
from .state import MemoryState


def save_snapshot(state: MemoryState, snapshot_path: Path, vectors_dir: Path) -> None:
    """Runs in the actor's thread: the vectors when they changed (under a new stem), then
    memories.snapshot naming them, then the files no snapshot names any more (the caller
    then projects). A crash at any point leaves a snapshot whose vector files exist."""
    vectors_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = state.vectors.fingerprint()
    if not (state.vectors_stem and fingerprint == state.saved_fingerprint and (vectors_dir / f"{state.vectors_stem}.vectors").exists()):
        stem = new_stem(state.model)
        state.vectors.save(str(vectors_dir), stem)
        state.vectors_stem, state.saved_fingerprint = stem, fingerprint
    if state.previous is not None and state.previous[1].fingerprint() != state.previous_saved_fingerprint:
        # a purge erased a vector of the old model too: its files must not keep it
        previous_fingerprint, stem = state.previous[1].fingerprint(), new_stem(state.previous[0])
        state.previous[1].save(str(vectors_dir), stem)
        state.previous_stem, state.previous_saved_fingerprint = stem, previous_fingerprint
    doc = state.snapshot_document()
    atomic_write(RealFiles(), str(snapshot_path), msgspec.msgpack.encode(doc))
    remove_unnamed_vector_files(vectors_dir, {doc.vectors_stem, doc.previous_stem} - {""})


def new_stem(model: str) -> str:
    """A new generation's file stem: the model's name made safe (openai:org/model too), a random suffix."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', model)}.{secrets.token_hex(4)}"


def read_memory_snapshot(path: Path) -> MemorySnapshot | None:
    if not path.exists():
        return None
    return msgspec.msgpack.decode(path.read_bytes(), type=MemorySnapshot)


def load_vectors(vectors_dir: Path, stem: str, model: str, dim: int) -> VectorStore | None:
    if not vectors_dir.exists():
        return None
    return VectorStore.load(str(vectors_dir), stem, dim=dim, model=model)
