"""The durable store's seam: what the tier actors commit through.

Rule kept here: every durable tier (all but tier 1's rings) changes its state by applying mutations
(each carries the whole resulting record) and hands one batch's mutations, in order, to
`Store.commit`, which returns only once they are durable; nobody in the batch is answered before.
When it raises `StoreUnavailable`, nothing of the batch may be kept: the actor rolls the batch back
and its writes answer the error's `code`:

- `read_only`: the store refuses writes (the journal failed until sys.resume; a database that
  refuses the write: a full disk, a read-only replica, a missing permission), reads go on;
- `unavailable`: the store cannot be reached, or a commit's outcome is unknown (the connection
  dropped during COMMIT): retryable, and since every mutation is an upsert of whole records by id,
  a retry of the same write leaves the same rows.

Two stores sit behind it: the journal (daemon/storage/journal_actor.py, the default: segments of
checksummed records in the data root) and PostgreSQL (daemon/postgres/store.py). Start-up loads
the tiers from the same store (daemon/recovery.py, from the journal or from PostgreSQL's tables). A change feed (several daemons on one database) plugs in here: what a store committed,
in order, is what other daemons apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from ...protocol import ProtocolError

RTYPE_MUTATION = 1  # the journal's record type of a msgpack-encoded mutation (daemon/recovery.py decodes it)

mutation_encoder = msgspec.msgpack.Encoder()


class StoreUnavailable(Exception):
    """A commit that did not happen, or whose outcome is unknown; `code` is what its writes answer
    (the module's rule)."""

    code = "read_only"

    def __init__(self, message: str, code: str | None = None, **data: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.data = data  # sent beside the kind (`store` names which one failed)

    def error(self) -> ProtocolError:
        """The answer of a write this failure stopped."""
        if self.code == "read_only":
            return ProtocolError("read_only", f"read-only: {self}", **self.data)
        return ProtocolError(self.code, str(self), **self.data)


class StoreConflict(StoreUnavailable):
    """A batch whose decisions the committed rows contradict (store = postgres, several nodes: what
    another node committed since the batch's node last caught up touches what the batch read,
    daemon/memory/concurrency.py): nothing of it was written; `rows` holds the feed it was checked
    against (seq, node, body) and `head` its last seq, for the actor to catch up and decide again.
    Answered `unavailable` (retryable) by a caller that does not decide again."""

    def __init__(self, rows: list[tuple[int, str, bytes]], head: int) -> None:
        super().__init__("another node changed what this write decided on; try again", "unavailable", store="postgres")
        self.rows = rows
        self.head = head


class Store(Protocol):
    """Where durable mutations go (the module's rule)."""

    store_name: str  # what sys.stats says under `store`: "journal" or "postgres"

    async def commit(self, mutations: Sequence[Any]) -> None:
        """Make one batch's mutations durable, in order; raises StoreUnavailable when they are not."""
