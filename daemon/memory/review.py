"""The review queue: requests that a local memory become global (memory.promote, and the learning
loop's proposals), and what was decided (review.approve, review.reject).

Rules kept here:
- The queue is part of the memory tier (MemoryState.review), not a tier of its own, because an
  approval changes a request and a memory together: ONE journal record (PutReview) carries the
  request as decided and, when the decision makes the memory global, the memory as it becomes (a
  PutMemory with its vector). MemoryState.apply applies both or, on undo, neither, at run time and
  at replay alike, so no crash can leave a global memory whose request is pending or an approved
  request whose memory stayed local. The queue is saved in memories.snapshot beside the memories.
- A local memory becomes global only through an approved request: memory.update cannot widen a
  scope. A client may still add a memory as global explicitly (memory.add scope "global"), except
  in a domain whose share policy is never.
- The automatic check runs every detector of daemon/redact.py, secrets and personal data alike and
  whatever the redaction policy, over the memory's title, content, abstract, overview and tags: any
  finding refuses the request at once and the reason names the kinds. It runs again at approval.
- The share policy of the memory's domain (Config.share_policy_for): never refuses at once; auto
  approves at once when the check passes; review (the default) leaves the request pending.
- Bad input changes nothing: an unknown id is not_found; promoting an archived or a global memory,
  deciding a request that is no longer pending, approving one whose memory changed since it was
  asked (its fingerprint), was archived or purged, are invalid_params.
- The four methods' handlers are registered here (@handles, daemon/tier.py's HANDLERS) and run as
  the memory tier's own, in its batches. memory/data.py and state.py import this module; this one
  takes PutMemory from memory/records.py and reaches the state only through the object it is given.
- Requests hold no text of the memory (only its id, domain and fingerprint), so a purge erases the
  memory's words from the queue too; views add the memory as it is now (null once purged).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ...protocol import Memory, ProtocolError, ReviewItem, ReviewView, domain_slug, new_id
from ...protocol import methods as m
from ..redact import detect
from ..tier import handles
from .records import PutMemory

DAEMON = "daemon"  # decided_by of what the automatic check or the share policy decided
LEARNING_LOOP = "learning-loop"  # requested_by of the learning loop's proposals


class PutReview(msgspec.Struct, tag="review.put"):
    """A request as it now stands and, when the decision changes the memory, the memory as it becomes."""

    item: ReviewItem
    memory: PutMemory | None = None  # the memory made global, its vector included


class ReviewQueue:
    """The requests, in the order they were made, and the pending one of each memory."""

    def __init__(self) -> None:
        self.items: dict[str, ReviewItem] = {}
        self.pending: dict[str, str] = {}  # memory id -> id of its pending request

    def get(self, review_id: str) -> ReviewItem:
        item = self.items.get(review_id)
        if item is None:
            raise ProtocolError("not_found", f"no review request with id {review_id!r}", id=review_id)
        return item

    def put(self, item: ReviewItem) -> None:
        self.items[item.id] = item
        if item.state == "pending":
            self.pending[item.memory_id] = item.id
        elif self.pending.get(item.memory_id) == item.id:
            del self.pending[item.memory_id]

    def remove(self, review_id: str) -> None:
        item = self.items.pop(review_id, None)
        if item is not None and self.pending.get(item.memory_id) == review_id:
            del self.pending[item.memory_id]

    def load(self, items: list[ReviewItem]) -> None:
        for item in items:
            self.put(item)

    def counts(self) -> dict[str, int]:
        return {"reviews": len(self.items), "reviews_pending": len(self.pending)}


def check(memory: Memory) -> list[str]:
    """The kinds of secret or personal data in a memory's text (empty: it may be shared)."""
    return detect([memory.title, memory.content, memory.abstract, memory.overview, *memory.tags])


def _invalid(message: str, **data: Any) -> ProtocolError:
    return ProtocolError("invalid_params", f"invalid params: {message}", **data)


def _shareable(memory: Memory) -> None:
    if memory.status != "active":
        raise _invalid(f"memory {memory.id!r} is {memory.status}: only an active memory can become global", field="id")
    if memory.scope == "global":
        raise _invalid(f"memory {memory.id!r} is global already", field="id")


def request(state: Any, memory_id: str, *, kind: str, reason: str, by: str, uid: int | None) -> dict[str, Any]:
    """A promotion request for a local memory, decided at once where the policy or the check says so."""
    memory = state.existing_memory(memory_id)
    _shareable(memory)
    queue: ReviewQueue = state.review
    now = state.now()
    waiting = queue.pending.get(memory.id)
    if waiting is not None:
        old = queue.items[waiting]
        if old.fingerprint == memory.fingerprint:  # asked again for the same text: the same request
            return _answer(old)
        # the memory changed since: the old request is about a text that no longer exists
        superseded = _decided(old, "refused", now, DAEMON, None, "the memory changed; superseded by a new request")
        state.commit(PutReview(superseded))
    item = ReviewItem(
        id=new_id(),
        memory_id=memory.id,
        kind=kind,
        state="pending",
        domain=memory.domain,
        fingerprint=memory.fingerprint,
        reason=reason,
        requested_at=now,
        requested_by=by,
        requested_uid=uid,
    )
    policy = state.share_policy(memory.domain)
    if policy == "never":
        item = _decided(item, "refused", now, DAEMON, None, _never(memory.domain))
        state.commit(PutReview(item))
    elif found := check(memory):
        item = _decided(item, "refused", now, DAEMON, None, _found(found))
        state.commit(PutReview(item))
    elif policy == "auto":
        why = "approved at once: share_policy auto, and the automatic check passed"
        item = _decided(item, "approved", now, DAEMON, None, why)
        state.commit(PutReview(item, _made_global(state, memory, now)))
    else:
        state.commit(PutReview(item))
    return _answer(item)


def _answer(item: ReviewItem) -> dict[str, Any]:
    out: dict[str, Any] = {"review_id": item.id, "state": item.state}
    if item.decision_reason:
        out["reason"] = item.decision_reason
    return out


def _found(kinds: list[str]) -> str:
    return f"the automatic check found {', '.join(kinds)} in the memory"


def _never(domain: str) -> str:
    return f"domain {domain!r} never shares its memories (share_policy never)"


def _decided(item: ReviewItem, verdict: str, now: str, by: str, uid: int | None, why: str) -> ReviewItem:
    return msgspec.structs.replace(
        item, state=verdict, decided_at=now, decided_by=by, decided_uid=uid, decision_reason=why
    )


def _made_global(state: Any, memory: Memory, now: str) -> PutMemory:
    shared = msgspec.structs.replace(memory, scope="global", updated_at=now)
    version = state.version_of(memory.id) + 1  # a new version in memory.history
    return PutMemory(shared, state.model_of.get(memory.id, ""), state.vector_bytes(memory.id), version, "promoted")


def view(state: Any, item: ReviewItem) -> ReviewView:
    """A request as review.* answer it: its fields, and the memory as it is now (None once purged)."""
    return ReviewView(**msgspec.structs.asdict(item), memory=state.memories.get(item.memory_id))


# --- the methods --------------------------------------------------------------------------------------


@handles("memory.promote")
def do_promote(state: Any, p: m.MemoryPromote) -> dict[str, Any]:
    return request(state, p.id, kind="promote", reason=p.reason or "", by=p.by or "", uid=p.peer_uid)


@handles("review.list")
def do_list(state: Any, p: m.ReviewList) -> list[ReviewView]:
    queue: ReviewQueue = state.review
    if p.state == "pending":
        items = [queue.items[i] for i in queue.pending.values()]
        items.sort(key=lambda item: item.requested_at)
    else:
        items = [item for item in queue.items.values() if p.state == "any" or item.state == p.state]
    if p.domain is not None:
        slug = domain_slug(p.domain)
        items = [item for item in items if domain_slug(item.domain) == slug]
    return [view(state, item) for item in items[p.offset : p.offset + p.limit]]


def _pending(state: Any, review_id: str) -> ReviewItem:
    item = state.review.get(review_id)
    if item.state != "pending":
        raise _invalid(f"review request {review_id!r} is {item.state} already", field="id")
    result: ReviewItem = item
    return result


@handles("review.approve")
def do_approve(state: Any, p: m.ReviewDecide) -> ReviewView:
    item = _pending(state, p.id)
    memory = state.memories.get(item.memory_id)
    of = f"the memory of review request {p.id!r}"
    if memory is None:
        raise _invalid(f"{of} was purged; reject the request", field="id")
    if memory.status != "active":
        raise _invalid(f"{of} is {memory.status}; restore it first, or reject the request", field="id")
    if memory.fingerprint != item.fingerprint:
        raise _invalid(f"{of} changed since it was asked; reject it, or promote the memory again", field="id")
    if state.share_policy(memory.domain) == "never":
        raise _invalid(f"{_never(memory.domain)}; reject the request", field="id")
    found = check(memory)
    if found:
        raise _invalid(f"{_found(found)}; reject the request", field="id")
    now = state.now()
    decided = _decided(item, "approved", now, p.by or "", p.peer_uid, "")
    put = _made_global(state, memory, now) if memory.scope != "global" else None
    state.commit(PutReview(decided, put))
    return view(state, decided)


@handles("review.reject")
def do_reject(state: Any, p: m.ReviewReject) -> ReviewView:
    item = _pending(state, p.id)
    decided = _decided(item, "refused", state.now(), p.by or "", p.peer_uid, p.reason or "")
    state.commit(PutReview(decided))
    return view(state, decided)


def propose(state: Any, memory_id: str, reason: str, by: str = LEARNING_LOOP) -> dict[str, Any]:
    """The learning loop's proposal that a memory it judged general be shared: a request of kind
    "proposal", under the same policy and check as memory.promote. Run it as the memory actor's
    own work (MemoryActor.propose); the caller redacts `reason` (it is stored)."""
    state.begin_batch()  # its own timestamp (an internal call is not a batch)
    return request(state, memory_id, kind="proposal", reason=reason, by=by, uid=None)


# --- applying (MemoryState.apply) --------------------------------------------------------------------


def apply_review(state: Any, mutation: PutReview) -> Callable[[], None]:
    queue: ReviewQueue = state.review
    item = mutation.item
    before = queue.items.get(item.id)
    undo_memory = state.apply(mutation.memory) if mutation.memory is not None else None
    queue.put(item)

    def undo() -> None:
        if before is None:
            queue.remove(item.id)
        else:
            queue.put(before)
        if undo_memory is not None:
            undo_memory()

    return undo
