"""Tier 4 on several nodes (store = postgres, issue 26 §2): a batch's decisions checked against the committed rows.

Rule kept here: a memory batch decides on its node's state (memory.add's dedup: which memory a new
text duplicates, or that none does; a feedback, an update, a review's approval: the memory or the
review as it is now) and commits what it decided. On several nodes that state may lack what
another node committed meanwhile (its follower applies it a little later), so the batch's
transaction checks the decisions before it writes (PostgresStore.check_decisions): under the
feed's lock, which every commit of every node takes first (so nothing commits between the check
and this COMMIT), it reads the feed after `after`, the seq through which this node's tier 4 holds
every committed change (its follower's applied seq, or the head it caught up to itself), and the
batch conflicts when another node's mutation there touches what the batch read (`Decisions`):
a memory it changed (by id), a review request it decided (by id), or a domain in which it
deduplicated a text (by domain: the near duplicates of a text are of its domain). On a conflict
nothing is written; the actor rolls the batch back, applies the tier-4 mutations of that feed
(every node's, in seq order: the committed state, as the follower will again, idempotently), runs
the batch's calls again and commits with `after` = that head (at most RETRIES times: then the
writes answer `unavailable`, retryable). So two nodes adding one memory at once make one memory
and one merge; two feedbacks of one memory on two nodes both count, on the committed record; two
approvals of one request approve it once (the second finds it decided).

What it costs, and why this and not a per-domain advisory lock or row locks (measured in
bench/bench_dedup_nodes.py): the feed's lock already serialises the team's commits, so the
decision needs no lock of its own: it needs the committed rows read after that lock. A per-domain
lock (`pg_advisory_xact_lock(k, hash(domain))`) taken in the transaction waits for nothing the
feed's lock did not already wait for and adds a statement; taken before the decision, on the node,
it would hold a database lock across the embedding and the state's work. Row locks on the
candidates (`SELECT ... FOR UPDATE`) lock nothing when there is no candidate yet, the case of two
nodes adding the same new memory at once, so both would create it: not correct alone. The check
adds one read of the feed's tail (usually a few rows, by the key) and one round trip to a memory
batch's transaction: on the loaded 2-core VM a bare transaction of that shape ran at 0.32x the
commits/s of the feed lock and an insert (the domain lock on top 0.19x, row locks 0.42x: medians
of 5 rounds, within the machine's noise of each other), while memory.add itself is bound by its
embedding: one node on PostgreSQL adds at 0.97x a daemon on the journal, two nodes at 1.59x (one
domain, 9 batches decided again) and 2.03x (a domain each). Batches of other tiers pay nothing.

The journal store (one daemon) has no other writer: nothing here runs for it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import msgspec

from ...protocol import domain_slug
from .records import PurgeMemory, PutMemory
from .review import PutReview

RETRIES = 8  # decisions taken again after conflicts before a batch answers `unavailable`


class _Tag(msgspec.Struct):
    type: str = ""


class _Parts(msgspec.Struct):
    parts: list[msgspec.Raw] = []


_TAGS = {"memory.put", "memory.purge", "review.put"}
_peek = msgspec.msgpack.Decoder(_Tag)
_parts = msgspec.msgpack.Decoder(_Parts)
_tier4 = msgspec.msgpack.Decoder(PutMemory | PurgeMemory | PutReview)


def tier4_mutations(body: bytes) -> list[Any]:
    """The memories and review requests one committed mutation changes (a job's commit's parts
    included), as the follower hands them to tier 4 (a memory read from a file on the writer's
    node is owed its file here: from_file cleared); nothing for the other tiers' mutations."""
    tag = _peek.decode(body).type
    if tag == "jobs.commit":
        return [part for raw in _parts.decode(body).parts for part in tier4_mutations(bytes(raw))]
    if tag not in _TAGS:
        return []
    mutation = _tier4.decode(body)
    if isinstance(mutation, PutMemory) and mutation.from_file:
        mutation = msgspec.structs.replace(mutation, from_file=False)
    return [mutation]


class Decisions:
    """What one batch decided on (the module's rule): the memories it changed, the review requests
    it decided, the domains (slugs) in which it deduplicated; `after`: the seq through which the
    node had applied every committed change when it decided, when the actor caught up itself
    (None: the follower's applied seq, which the store reads)."""

    __slots__ = ("after", "domains", "ids", "reviews")

    def __init__(self, mutations: Iterable[Any], domains: Iterable[str], after: int | None) -> None:
        self.ids: set[str] = set()
        self.reviews: set[str] = set()
        self.domains = set(domains)
        self.after = after
        for mutation in mutations:
            if isinstance(mutation, PutReview):
                self.reviews.add(mutation.item.id)
                mutation = mutation.memory
            if isinstance(mutation, PutMemory):
                self.ids.add(mutation.memory.id)
            elif isinstance(mutation, PurgeMemory):
                self.ids.add(mutation.id)

    def conflicting(self, rows: list[tuple[int, str, bytes]], node: str, after: int) -> bool:
        """Whether another node committed, after `after`, a change to what the batch decided on."""
        return any(
            self.touches(mutation)
            for seq, writer, body in rows
            if seq > after and writer != node
            for mutation in tier4_mutations(body)
        )

    def touches(self, mutation: Any) -> bool:
        if isinstance(mutation, PutReview):
            if mutation.item.id in self.reviews:
                return True
            if mutation.memory is None:
                return False
            mutation = mutation.memory
        if isinstance(mutation, PurgeMemory):
            return mutation.id in self.ids
        memory = mutation.memory
        return memory.id in self.ids or domain_slug(memory.domain) in self.domains


def caught_up(rows: list[tuple[int, str, bytes]]) -> list[tuple[int, str, Any]]:
    """(seq, node, mutation) of a conflict's feed's tier-4 mutations, every node's, in seq order:
    what the actor applies to hold the committed state before it decides again."""
    return [(seq, node, mutation) for seq, node, body in rows for mutation in tier4_mutations(body)]


class CaughtUp:
    """Other nodes' mutations an actor applied itself, after a conflict, before its follower reached
    them: when the follower hands them over, they are not applied again, since the node may have
    committed newer versions of the same memories since (which applying them again would roll back
    until the follower reached those). Kept in seq order; what the follower passed without handing
    over (it had applied it before the actor caught up) is dropped once its applied seq passes it."""

    def __init__(self) -> None:
        self.kept: collections.deque[tuple[int, Any]] = collections.deque()

    def add(self, seq: int, mutation: Any) -> None:
        self.kept.append((seq, mutation))

    def unapplied(self, mutations: list[Any], applied: int) -> list[Any]:
        """Of what the follower hands over, what this node does not hold yet."""
        while self.kept and self.kept[0][0] <= applied:
            self.kept.popleft()
        if not self.kept:
            return mutations
        out = []
        for mutation in mutations:
            match = next((i for i, (_seq, held) in enumerate(self.kept) if held == mutation), None)
            if match is None:
                out.append(mutation)
            else:
                del self.kept[match]
        return out
