"""`eurekamem migrate --to postgres`: copy a journal data root into an empty PostgreSQL database.

Rule kept here: migrate holds the data root's LOCK (no daemon runs on it meanwhile), loads the root
as a restart would (daemon/recovery.py's `recover`), commits every tier's state as the mutations
that rebuild it (daemon/postgres/migrate.py), then loads the database back and compares, per kind
of record, counts and checksums; it exits 1 when any differ. A database that already holds
mutations is refused unless --force, which writes over it: rows of the same ids are replaced,
rows the root does not have are left as they are (and then show in the comparison).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import effective_config, fail

if TYPE_CHECKING:
    from ..daemon.paths import Paths


def cmd_migrate(args: argparse.Namespace) -> int:
    from ..daemon.config import ConfigError
    from ..daemon.errors import StartupError
    from ..daemon.paths import Paths, acquire_lock

    if args.to != "postgres":
        return fail(f"migrate knows only --to postgres, not {args.to!r}")
    try:
        config = effective_config(args, ("data_dir",))
    except ConfigError as exc:
        return fail(str(exc))
    root = Path(config["data_dir"])
    if not (root / "memory").is_dir():
        return fail(f"{root} holds no memory/ folder; nothing to migrate")
    paths = Paths(root)
    try:
        fd = acquire_lock(paths)
    except StartupError as exc:
        return fail(f"{exc} (migrate reads the data root while no daemon runs: stop it first)")
    try:
        # the daemon's configured model: the root's vectors load only under the model they were made by
        return _migrate(paths, args.postgres_dsn, args.force, config["embedder"], config.embedder_options())
    finally:
        os.close(fd)


def _migrate(paths: Paths, dsn: str, force: bool, model: str, options: dict[str, Any]) -> int:
    from ..daemon import recovery
    from ..daemon.errors import StartupError
    from ..daemon.postgres.migrate import all_mutations, checksums, commit_all, vector_drift
    from ..daemon.postgres.store import PostgresStore, shown_dsn
    from ..daemon.retrieval.embed import make_embedder

    try:
        source = recovery.recover(paths, embedder=make_embedder(model, **options))
    except (StartupError, ValueError, TypeError) as exc:
        return fail(str(exc))
    if source.journal is not None:
        source.journal.close()
    store = PostgresStore(dsn, pool_size=2)
    try:
        store.open()
    except Exception as exc:
        return fail(f"PostgreSQL ({shown_dsn(dsn)}) cannot be used: {exc}")
    try:
        held = store.counts()["mutations"]
        if held and not force:
            return fail(
                f"the database already holds {held} mutations; migrate copies into an empty database "
                "(--force writes over it: the root's records replace those of the same ids, others stay)"
            )
        written = commit_all(store, all_mutations(source))
        loaded = recovery.load_from_store(store, recovery.Recovered(source.memory.embedder), use_snapshot=False)
        snapshot = _index_snapshot(store, loaded)
    finally:
        store.close()
    before, after = checksums(source), checksums(loaded)
    print(f"migrate {paths.root} -> {shown_dsn(dsn)}: {written} mutations written")
    print(f"{'kind':<14} {'root':>8} {'database':>9}  {'root sum':<16}  {'database sum':<16}")
    differ = []
    for kind in before:
        (n1, s1), (n2, s2) = before[kind], after[kind]
        mark = "" if (n1, s1) == (n2, s2) else "  DIFFERS"
        if mark:
            differ.append(kind)
        print(f"{kind:<14} {n1:>8} {n2:>9}  {s1:<16}  {s2:<16}{mark}")
    drift = vector_drift(source, loaded)
    print(f"vectors: the largest difference of a component is {drift:.1e} (float32 rounding when reloaded: under 1e-5)")
    if drift > 1e-5:
        differ.append("vectors")
    if differ:
        return fail(f"the database differs from the root in: {', '.join(differ)}")
    print(f"tier 4's index snapshot: {snapshot}")
    print("ok: the database holds what the root holds")
    return 0


def _index_snapshot(store: Any, loaded: Any) -> str:
    """Tier 4's index snapshot of what was just loaded back, so that a daemon's first start on the
    database loads it rather than rebuilding the indexes (daemon/postgres/snapshots.py)."""
    from ..daemon.postgres import snapshots

    captured = snapshots.capture(loaded.memory, store, None)
    if captured is None:
        return "not written (a change of model is under way: the daemon rebuilds from the rows)"
    if not snapshots.write(captured, store.dsn):
        return "not written (the database holds a newer one)"
    return f"written, covering seq {captured.upto_seq}"
