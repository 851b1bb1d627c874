"""Tier 4's index snapshot in PostgreSQL: start-up loads it and replays the feed after it, not every row.

Rules kept here:
- A snapshot is keyed by the feed seq it covers (`upto_seq`), never by the node that wrote it: it
  holds tier 4's state (the journal's memories.snapshot document, with the BM25 index) and its
  hnswlib index (VectorStore's two files), made from the memory actor's state between batches
  (`capture`, an internal call). Under the actor every mutation it applied is committed (tier.py:
  apply, then commit; a staged CommitJob holds the actor), so the state holds every memory
  mutation whose seq is at most the feed's highest seq read then: that is `upto_seq`. A state
  that may lack a committed mutation (a commit whose outcome was unknown) writes no snapshot.
  A node that also applies other nodes' mutations from the feed (part 2) holds those only up to
  where it has applied them all: it passes that seq as `applied_through`, and the snapshot covers
  no more (`capture`).
- One transaction writes the snapshot whole (a row in index_snapshots naming its parts' sizes and
  the document's crc32, the parts in 8 MiB chunks) and deletes the older ones: a reader sees the whole of one
  or none. Two writers at once take turns (an advisory lock); one that is not newer writes nothing.
- A daemon keeps a local copy of the newest snapshot it wrote or read (memory/postgres/copy in its
  data root, with the database row it matches, written last); a start reads that copy instead of
  the database's bytes only when the database's newest row is the same (seq, model, sizes, the
  document's crc32): a restart reads local files, as the journal's does; a new node, the database.
- Start-up (`fetch`) uses the newest snapshot only when it is of the configured model and
  dimension, whole (sizes, the document's crc32, the vector files' own checks and fingerprint), and
  the feed still holds every mutation after it (`feed_covers`); then tier 4 is the snapshot plus the
  memory mutations of the feed after `upto_seq`, replayed through `apply` in seq order (tier.py:
  re-applying one the snapshot holds changes nothing). Otherwise None, and the caller rebuilds from
  the rows (recovery.load_from_store's full path), which is what the tests compare it with.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

log = logging.getLogger("eurekamem.postgres")

KIND = "memory"
CHUNK = 8 << 20  # bytes per row of index_snapshot_chunks (bytea rows stay well under 1 GB)
STEM = "snapshot"
PARTS = ("doc", "vectors", "hnsw")
FILES = {"doc": f"{STEM}.doc", "vectors": f"{STEM}.vectors", "hnsw": f"{STEM}.hnsw"}
MANIFEST = f"{STEM}.json"  # the local copy's: what index_snapshots says of it, written last
LOCAL = "copy"  # the folder of the local copy, under the data root's memory/postgres
_LOCK = 727002  # pg_advisory_xact_lock: one snapshot writer at a time (727001: the schema's)


def schema() -> list[str]:
    """The two tables (schema version 3); the chunks are stored uncompressed (vectors do not
    compress, and trying costs CPU on every write)."""
    return [
        "CREATE TABLE IF NOT EXISTS index_snapshots (kind text NOT NULL, upto_seq bigint NOT NULL, model text NOT NULL,"
        " dim integer NOT NULL, parts jsonb NOT NULL, written_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (kind, upto_seq))",
        "CREATE TABLE IF NOT EXISTS index_snapshot_chunks (kind text NOT NULL, upto_seq bigint NOT NULL, part text NOT NULL,"
        " chunk integer NOT NULL, data bytea NOT NULL, PRIMARY KEY (kind, upto_seq, part, chunk),"
        " FOREIGN KEY (kind, upto_seq) REFERENCES index_snapshots ON DELETE CASCADE)",
        "ALTER TABLE index_snapshot_chunks ALTER COLUMN data SET STORAGE EXTERNAL",
    ]


class Captured(NamedTuple):
    """Tier 4 as one snapshot: the encoded document, the vector files in `folder`, what it covers."""

    upto_seq: int
    model: str
    dim: int
    doc: bytes
    folder: Path

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def feed_horizon(conn: Any) -> int:
    """The highest seq the feed holds now (0: none)."""
    return int(conn.execute("SELECT coalesce(max(seq), 0) FROM mutations").fetchone()[0])


def _newest_upto(conn: Any) -> int | None:
    value = conn.execute("SELECT max(upto_seq) FROM index_snapshots WHERE kind = %s", (KIND,)).fetchone()[0]
    return None if value is None else int(value)


def capture(state: Any, store: Any, scratch: Path | None, applied_through: int | None = None) -> Captured | None:
    """Runs as the memory actor's internal call (the module's rule): the covered seq (the feed's
    highest, or `applied_through` if lower), the state's document and its vector files (into a new
    folder under `scratch`). None during a change of model (two indexes; a restart then rebuilds
    from the rows, which keep both models' vectors)."""
    if state.previous is not None:
        return None
    with store.pool.connection() as conn:
        upto = feed_horizon(conn)
        conn.rollback()
    if applied_through is not None:
        upto = min(upto, applied_through)
    doc = msgspec.msgpack.encode(state.snapshot_document())
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".pg-snapshot-", dir=scratch))
    try:
        state.vectors.save(str(folder), STEM)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Captured(upto, state.model, int(state.vectors.dim), doc, folder)


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def upload(dsn: str, captured: Captured) -> dict[str, Any] | None:
    """Write the captured snapshot and delete the older ones, in one transaction on a connection
    of its own (the pool's stay for commits): its manifest (what index_snapshots says of it), or
    None when the database holds one at least as new. Blocking."""
    import psycopg

    (captured.folder / FILES["doc"]).write_bytes(captured.doc)  # streamed from there, and kept with the local copy
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        held = _newest_upto(conn)
        if held is not None and held >= captured.upto_seq:
            return None
        parts: dict[str, dict[str, int]] = {}
        conn.execute(
            "INSERT INTO index_snapshots (kind, upto_seq, model, dim, parts) VALUES (%s, %s, %s, %s, '{}')",
            (KIND, captured.upto_seq, captured.model, captured.dim),
        )
        with conn.cursor() as cur, cur.copy(
            "COPY index_snapshot_chunks (kind, upto_seq, part, chunk, data) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["text", "int8", "text", "int4", "bytea"])
            for part in PARTS:
                size = 0
                for n, chunk in enumerate(_chunks(captured.folder / FILES[part])):
                    copy.write_row((KIND, captured.upto_seq, part, n, chunk))
                    size += len(chunk)
                parts[part] = {"bytes": size}
        parts["doc"]["crc32"] = zlib.crc32(captured.doc)  # the vector files carry their own (_open)
        conn.execute(
            "UPDATE index_snapshots SET parts = %s WHERE kind = %s AND upto_seq = %s",
            (msgspec.json.encode(parts).decode(), KIND, captured.upto_seq),
        )
        conn.execute("DELETE FROM index_snapshots WHERE kind = %s AND upto_seq < %s", (KIND, captured.upto_seq))
    return {"upto_seq": captured.upto_seq, "model": captured.model, "dim": captured.dim, "parts": parts}


def write(captured: Captured, dsn: str, local: Path | None = None) -> bool:
    """upload(); the captured files then become the local copy in `local` (when given and the
    upload wrote), else are removed. Blocking."""
    try:
        manifest = upload(dsn, captured)
        if manifest is not None and local is not None:
            _keep(captured.folder, manifest, local)
        return manifest is not None
    finally:
        captured.discard()


def _keep(folder: Path, manifest: dict[str, Any], local: Path) -> None:
    """`folder` (the three parts' files) becomes the local copy: its manifest written last, then
    the folder renamed into place (a crash between the two steps leaves no local copy: the next
    start reads the database's)."""
    (folder / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    copy = local / LOCAL
    shutil.rmtree(copy, ignore_errors=True)
    folder.rename(copy)


def feed_covers(conn: Any, upto_seq: int) -> bool:
    """Whether the feed still holds every mutation committed after `upto_seq`. Trimming removes a
    prefix of the feed, so it does when its first seq is at most upto_seq + 1; an empty feed does
    when the sequence never went past upto_seq. (A trimmed feed whose first seq after upto_seq was
    never committed reads as not covering: a full rebuild, slower, never wrong.)"""
    first = conn.execute("SELECT min(seq) FROM mutations").fetchone()[0]
    if first is not None:
        return bool(first <= upto_seq + 1)
    last, called = conn.execute("SELECT last_value, is_called FROM mutation_seq").fetchone()
    return not called or int(last) <= upto_seq


class Loaded(NamedTuple):
    upto_seq: int
    doc: Any  # MemorySnapshot
    vectors: Any  # VectorStore
    source: str  # "database" or "local copy"
    seconds: dict[str, float]


def fetch(dsn: str, model: str, dim: int, local: Path | None) -> Loaded | str:
    """The newest usable snapshot of `model` (dimension `dim`), decoded and its index loaded, or
    why there is none (the module's rule). Read from the local copy in `local` when that is the
    same snapshot (its manifest equal to the database's row), else from the database (and then
    kept as the local copy). Blocking."""
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT upto_seq, model, dim, parts FROM index_snapshots WHERE kind = %s ORDER BY upto_seq DESC LIMIT 1",
            (KIND,),
        ).fetchone()
        if row is None:
            return "no snapshot in the database"
        upto, snap_model, snap_dim, parts = row
        if (snap_model, snap_dim) != (model, dim):
            return f"the snapshot is of {snap_model} ({snap_dim} dimensions), the daemon's model is {model} ({dim})"
        if not feed_covers(conn, upto):
            return f"the feed no longer holds every mutation after the snapshot's seq {upto}"
        if set(parts) != set(PARTS):
            return f"the snapshot at seq {upto} is incomplete"
        manifest = {"upto_seq": upto, "model": snap_model, "dim": snap_dim, "parts": parts}
        if local is not None and _manifest(local / LOCAL) == manifest:
            loaded = _open(local / LOCAL, manifest, "local copy", t0)
            if not isinstance(loaded, str):
                return loaded
            log.warning("PostgreSQL: the local copy of tier 4's snapshot cannot be used (%s); reading the database's", loaded)
            shutil.rmtree(local / LOCAL, ignore_errors=True)
        if local is not None:
            local.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".pg-load-", dir=local))
        try:
            damaged = _download(conn, manifest, folder)
            loaded = damaged if damaged is not None else _open(folder, manifest, "database", t0)
            if not isinstance(loaded, str) and local is not None:
                _keep(folder, manifest, local)
            return loaded
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _manifest(folder: Path) -> Any:
    try:
        return msgspec.json.decode((folder / MANIFEST).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def _download(conn: Any, manifest: dict[str, Any], folder: Path) -> str | None:
    """The parts' chunks into their files in `folder`, as they arrive; why not, if a size differs."""
    upto, parts = manifest["upto_seq"], manifest["parts"]
    files = {part: open(folder / FILES[part], "wb") for part in PARTS}  # noqa: SIM115 (closed below)
    sizes = dict.fromkeys(PARTS, 0)
    try:
        with conn.cursor(binary=True) as cur:
            cur.execute(
                "SELECT part, data FROM index_snapshot_chunks WHERE kind = %s AND upto_seq = %s ORDER BY part, chunk",
                (KIND, upto),
            )
            for part, data in cur:
                files[part].write(data)
                sizes[part] += len(data)
    finally:
        for f in files.values():
            f.close()
    for part in PARTS:
        if sizes[part] != parts[part]["bytes"]:
            return f"the snapshot at seq {upto} is damaged ({part}: {sizes[part]} bytes, {parts[part]['bytes']} expected)"
    return None


def _open(folder: Path, manifest: dict[str, Any], source: str, t0: float) -> Loaded | str:
    """The snapshot whose parts are the files in `folder`, decoded, or why not. Only the document
    gets a crc32 here: the .vectors header has its own and vouches for the body's and the .hnsw's
    (VectorStore.load)."""
    from ..memory.records import MemorySnapshot
    from ..retrieval.vectors import VectorStore

    upto, parts, model, dim = manifest["upto_seq"], manifest["parts"], manifest["model"], manifest["dim"]
    read = time.perf_counter()
    try:
        doc_bytes = (folder / FILES["doc"]).read_bytes()
    except OSError as exc:
        return f"the snapshot at seq {upto}: {exc}"
    if len(doc_bytes) != parts["doc"]["bytes"] or zlib.crc32(doc_bytes) != parts["doc"]["crc32"]:
        return f"the snapshot at seq {upto} is damaged (its document's size or crc32 differs)"
    try:
        doc = msgspec.msgpack.decode(doc_bytes, type=MemorySnapshot)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"the snapshot at seq {upto} does not decode: {exc}"
    del doc_bytes
    if doc.model != model:
        return f"the snapshot at seq {upto} holds {doc.model}'s memories, not {model}'s"
    vectors = VectorStore.load(str(folder), STEM, dim=dim, model=model, expected_fingerprint=doc.vectors_fingerprint)
    if vectors is None:
        return f"the snapshot at seq {upto}: its vectors cannot be used (logged above)"
    done = time.perf_counter()
    return Loaded(upto, doc, vectors, source, {"read_s": round(read - t0, 3), "decode_s": round(done - read, 3)})


@contextmanager
def one_snapshot(store: Any) -> Iterator[Any]:
    """A connection in one REPEATABLE READ transaction, the feed's head read in it into
    `store.loaded_seq` (the follower starts there, daemon/postgres/feed.py): the feed's tail and the
    other tiers' rows read on it are of that one moment. Blocking."""
    with store.pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        store.loaded_seq = store.head_seq(conn)
        yield conn


def feed_after(conn: Any, upto_seq: int) -> Iterator[bytes]:
    """The bodies of the feed's mutations after `upto_seq`, in seq order (its primary key), on a
    connection in a transaction (one_snapshot's). Blocking."""
    with conn.cursor(name="feed_tail", binary=True) as cur:
        cur.itersize = 2000
        cur.execute("SELECT body FROM mutations WHERE seq > %s ORDER BY seq", (upto_seq,))
        for (body,) in cur:
            yield bytes(body)


def rows_of(conn: Any, tables: list[str]) -> Iterator[tuple[bytes, bytes]]:
    """PostgresStore.rows_in_order's bodies of these tables alone (none of them `memories`), in
    commit order, on a connection in a transaction (one_snapshot's): the tiers a snapshot does not
    hold. Blocking."""
    if not tables:
        return
    parts = [f"SELECT seq, pos, body FROM {t}" for t in tables]
    query = " UNION ALL ".join(parts) + " ORDER BY 1, 2"
    with conn.cursor(name="load_rest", binary=True) as cur:
        cur.itersize = 2000
        cur.execute(query)
        for _seq, _pos, body in cur:
            yield bytes(body), b""


def drop(dsn: str) -> None:
    """Delete every tier 4 snapshot (a purge whose text a snapshot holds, when no new one can be written). Blocking."""
    import psycopg

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        conn.execute("DELETE FROM index_snapshots WHERE kind = %s", (KIND,))


def newest(dsn: str) -> tuple[int | None, int]:
    """(the newest snapshot's upto_seq or None, the feed's highest seq). Blocking."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return _newest_upto(conn), feed_horizon(conn)


TAIL = 500  # tier 4 changes after the last snapshot that make a new one due (or 2% of its memories, if more):
# a start replays each of them about as slowly as it was written (3.5 ms with a new vector here: 1,000
# took 3.3-3.8 s at 10k, where the snapshot itself loads in 0.9-1.5 s)
AGE = 600.0  # seconds after which any change of tier 4 makes one due


class DatabaseSnapshots:
    """When tier 4's snapshot is written into PostgreSQL (owned by daemon/snapshots.py's Snapshots,
    on the event loop, under its lock), counting tier 4's changes (its state's `_version`): after a
    purge (the old one holds the purged text); at the final snapshot when tier 4 changed; when
    TAIL changes (2% of the memories, if more: a start replays at most about these) or AGE seconds
    went by with changes; and once at start when the database has none, or one TAIL feed
    mutations behind. Never after a commit failed in this run: its outcome may be unknown, so the
    state may lack a committed mutation (the module's rule); the last good snapshot and the feed
    still give a restart everything."""

    def __init__(self, store: Any, memory: Any, scratch: Path) -> None:
        self.store = store
        self.memory = memory
        self.scratch = scratch
        self.version: int | None = None  # tier 4's change counter at the last snapshot written (or at start)
        self.at = 0.0
        self.owed = False
        self.written = 0
        self.last: dict[str, Any] = {}
        self._refused = False

    def statistics(self) -> dict[str, Any]:
        """How many this daemon wrote, the last one's seq and times, and whether it stopped writing them."""
        return {"written": self.written, "last": self.last or None, "refused": self._refused}

    async def start(self) -> None:
        """At the schedule's start: what the database holds decides whether one is owed now."""
        import trio

        upto, horizon = await trio.to_thread.run_sync(newest, self.store.dsn)
        self.owed = upto is None or horizon - upto >= TAIL
        self.version = await self.memory.run_internal(lambda s: s._version)
        self.at = trio.current_time()

    def _due(self, state: Any, force: bool, purged: bool, now: float) -> bool:
        if self.owed or purged:
            return True
        if self.version is None:  # start() failed: the database's state is unknown
            return True
        changes = state._version - self.version
        return changes > 0 and (force or changes >= max(TAIL, len(state.memories) // 50) or now - self.at >= AGE)

    async def maybe_write(self, force: bool = False, purged: bool = False) -> bool:
        import trio

        if self.store.failures:
            if not self._refused:
                log.warning("PostgreSQL: a commit failed during this run (its outcome may be unknown): this daemon "
                            "writes no more index snapshots until restarted")
                self._refused = True
            if purged:  # the snapshot must not keep the purged text
                await trio.to_thread.run_sync(drop, self.store.dsn)
            return False
        now = trio.current_time()

        # a node following the feed holds the others' mutations up to its follower's position only
        # (read before the capture: a position read early covers less, which the next start replays)
        follower = getattr(self.store, "feed", None)
        through = follower.applied if follower is not None else None

        def step(state: Any) -> tuple[int, Captured | None, bool]:
            if not self._due(state, force, purged, now):
                return state._version, None, False
            return state._version, capture(state, self.store, self.scratch, through), True

        version, captured, due = await self.memory.run_internal(step)
        if not due:
            return False
        held = trio.current_time() - now
        self.version, self.at, self.owed = version, trio.current_time(), False
        if captured is None:  # a change of model is under way
            if purged:
                await trio.to_thread.run_sync(drop, self.store.dsn)
            return False
        wrote = await trio.to_thread.run_sync(write, captured, self.store.dsn, self.scratch)
        took = trio.current_time() - now
        if wrote:
            self.written += 1
            self.last = {"upto_seq": captured.upto_seq, "capture_s": round(held, 3), "seconds": round(took, 3)}
            log.info("PostgreSQL: tier 4's index snapshot covers seq %d (%.0f ms, the memory actor held %.0f ms)",
                     captured.upto_seq, took * 1000, held * 1000)
        return wrote
