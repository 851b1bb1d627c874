"""The conversation tier's state: groups of messages, their sessions, the indexes that search them.

Rules kept here:
- Durable changes go through `apply` only, and every mutation is state-based: PutMessages carries
  each whole message (with the daemon's sequence number and session already assigned), DropMessages
  names the sequence numbers to forget, MoveMark and PutSummary set a group's high-water mark and
  summary. Replaying one twice, or over a snapshot that has it, gives the same state.
- A group's messages are in conversation order: timestamp, then arrival (the daemon's `seq`, which
  grows with every message the tier stores). A message id is stored once per group; a resent one
  is ignored. An append is validated whole before anything changes (one bad message: nothing
  stored).
- Everything derived (the lexical documents with their neighbours, the BM25 index, which messages
  need a new vector) is recomputed from the messages for exactly the messages a change touched:
  the message itself and its previous and next message in its session. So a late message arriving
  between two stored ones updates both neighbours' documents.
- Vectors are a cache, not journaled: each is kept with the digest of the text it was computed
  from; a message whose dense document no longer has that digest is queued for the background
  embedder (its old vector keeps answering until then). Snapshots save them.
- Labels of both indexes are the messages' `seq`. The state is touched by its actor only, one batch
  or internal call at a time (in a worker thread).
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as _dt
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from ...protocol import ProtocolError, domain_slug, normalize_timestamp
from ...protocol import methods as m
from ..primitives import Histogram
from ..retrieval.fusion import Fused, boost_named, fuse_scores
from ..retrieval.lexical import LexicalDump
from ..retrieval.text import estimate_tokens
from ..retrieval.tokens import TOKENIZER_VERSION, tokenize
from ..retrieval.vectors import VectorStore
from ..tier import TierState, Undo, handles
from .signals import FEATURES, TermCache, shipped_ranker, signal_matrix
from .text import STEMMER_VERSION, StemmedIndex, date_text, name_tokens

log = logging.getLogger("eurekamem.conversation")


AUTO_SESSION = "auto-"  # sessions the daemon opens after a silence are named auto-<seq of their first message>


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


_US = _dt.timedelta(microseconds=1)


class Message(msgspec.Struct, kw_only=True):
    """One stored message, as conversation.get and conversation.search return it."""

    id: str
    group: str
    seq: int  # the daemon's sequence number: unique in the tier, grows with every message stored
    role: str
    sender: str
    text: str
    timestamp: str  # RFC 3339; the daemon's receive time when the client gave none
    session: str
    received_at: str


class PutMessages(msgspec.Struct, tag="conversation.put"):
    messages: list[Message]


class DropMessages(msgspec.Struct, tag="conversation.drop"):
    group: str
    seqs: list[int]


class MoveMark(msgspec.Struct, tag="conversation.mark"):
    group: str
    mark: int  # messages of the group with seq <= mark have been extracted
    at: str


class PutSummary(msgspec.Struct, tag="conversation.summary"):
    group: str
    summary: str
    intents: list[str]
    updated_at: str


class Summary(msgspec.Struct, kw_only=True):
    summary: str = ""
    intents: list[str] = []
    updated_at: str | None = None


class Pending(msgspec.Struct, kw_only=True):
    """A group's extraction state as a request for one sees it."""

    group: str
    mark: int
    newest: int  # the highest seq of the group (0: none)
    taken: tuple[str, int] | None  # (job id, mark_to) of the last window an extraction took


class Window(msgspec.Struct, kw_only=True):
    """What an extraction job reads: the newest messages after the mark within a token budget,
    in conversation order, and the mark to set once its results are applied."""

    group: str
    messages: list[Message]
    mark_from: int
    mark_to: int  # the highest seq of the group when the window was taken (0: nothing new)
    skipped: int  # messages after the mark that did not fit the budget (the oldest ones)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The retrieval levers (issue 18), each measured by bench/locomo.py; the defaults are the daemon's."""

    fusion: str = "zscore"  # zscore | minmax | rrf
    neighbours: bool = True  # lexical document = previous + message + next of the same session
    stemming: bool = True
    speaker_boost: float = 0.3  # 0: off
    dense_previous: bool = True  # dense document = previous + message
    w_lexical: float = 1.0
    w_dense: float = 0.5
    fetch: int = 100  # each side's top list that fusion normalises over
    # conversation.search's `ranker` when it names none (issue 31): fusion | learned; None: learned when
    # the shipped weights were trained on this embedder's vectors (their "embedder"), else fusion
    ranker: str | None = None
    k1: float = 1.2
    b: float = 0.75

    def lexical_key(self) -> str:
        """What a saved BM25 index depends on: refused (rebuilt) when this differs."""
        return (
            f"t{TOKENIZER_VERSION}.s{STEMMER_VERSION if self.stemming else 0}.n{int(self.neighbours)}.l{LINE_VERSION}"
        )


LINE_VERSION = 1  # bump when line() changes


def line(msg: Message) -> str:
    return f"{msg.sender or msg.role} ({date_text(msg.timestamp)}): {msg.text}"


def micros(timestamp: str) -> int:
    return (_dt.datetime.fromisoformat(timestamp) - _EPOCH) // _US


def text_digest(text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little", signed=True
    )


Key = tuple[int, int]  # (timestamp in microseconds, seq): conversation order


@dataclasses.dataclass(frozen=True)
class Sides:
    """One search's two top lists (the lexical one with the speaker boost), as fusion saw them."""

    lex_labels: list[int]
    lex_scores: list[float]
    boosts: dict[int, float]
    dense_labels: list[int]


class Group:
    __slots__ = (
        "_cache", "ids", "keys", "mark", "marks", "name", "senders", "sessions", "slug", "summary", "taken", "version"
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.slug = domain_slug(name)
        self.keys: list[Key] = []  # every message, in conversation order
        self.ids: dict[str, int] = {}  # message id -> seq
        self.sessions: dict[str, list[Key]] = {}  # session -> its messages in order
        self.senders: dict[str, dict[int, None]] = {}  # sender -> seqs
        self.mark = 0
        self.marks: list[tuple[int, str]] = []  # (mark, at) of every move not yet used by retention
        self.summary = Summary()
        self.taken: tuple[str, int] | None = None  # (job id, mark_to) of the last window an extraction took (not durable)
        self.version = 0
        self._cache: dict[Any, Any] = {}

    def changed(self) -> None:
        self.version += 1
        self._cache.clear()

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """What `build` gives, kept until the group changes (the ranker's Layout)."""
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = build()
        return got

    def order_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps in microseconds, seqs) in conversation order, cached until the group changes."""
        got = self._cache.get("order")
        if got is None:
            us = np.fromiter((k[0] for k in self.keys), dtype=np.int64, count=len(self.keys))
            seqs = np.fromiter((k[1] for k in self.keys), dtype=np.int64, count=len(self.keys))
            self._cache["order"] = got = np.stack([us, seqs]) if self.keys else np.zeros((2, 0), dtype=np.int64)
        return got[0], got[1]

    def labels(self, since_us: int | None, until_us: int | None) -> np.ndarray:
        """The seqs of the messages with since <= timestamp <= until, ascending (int64)."""
        if since_us is None and until_us is None:
            got = self._cache.get("all")
            if got is None:
                got = self._cache["all"] = np.sort(self.order_arrays()[1])
            return got
        us, seqs = self.order_arrays()
        lo = 0 if since_us is None else int(np.searchsorted(us, since_us, side="left"))
        hi = us.size if until_us is None else int(np.searchsorted(us, until_us, side="right"))
        return np.sort(seqs[lo:hi])

    def sender_labels(self, sender: str) -> np.ndarray:
        key = ("sender", sender)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = np.sort(np.fromiter(self.senders.get(sender, ()), dtype=np.int64))
        return got


class ConversationState(TierState):
    name = "conversation"

    def __init__(self, embedder: Any, tuning: Tuning | None = None, *, session_gap: float) -> None:
        super().__init__()
        self.embedder = embedder
        self.model = embedder.name
        self.tuning = tuning or Tuning()
        self.session_gap = session_gap  # seconds of silence after which a message without a session opens a new one
        self.groups: dict[str, Group] = {}
        self.messages: dict[int, Message] = {}
        self.keys: dict[int, Key] = {}
        self.next_seq = 1
        self.session_count = 0  # sessions of every group (kept, so that counts() walks nothing)
        self.lexical = StemmedIndex(self.tuning.k1, self.tuning.b, stem=self.tuning.stemming)
        self.lexical_from = "new"  # or "snapshot" / "rebuilt"
        self.vectors = VectorStore(embedder.dim, model=self.model)
        self.digests: dict[int, int] = {}  # seq -> digest of the dense text its vector was computed from
        self.to_embed: dict[int, None] = {}  # seqs whose dense text has no vector yet (or a stale one)
        self.vectors_stem = ""  # memory/conversation/<stem>.vectors as last saved
        self.saved_fingerprint = ""
        self._deferred: set[int] | None = None  # while loading: reindex once at the end
        self.search_time = Histogram()
        self.searches = 0
        self.searches_lexical_only = 0  # searches that ran on BM25 alone (see _search)
        self.embedded = 0  # vectors computed since start
        self.terms = TermCache(lambda seq: self.lexical.tokenize(line(self.messages[seq])))  # the ranker's

    # --- documents -------------------------------------------------------------------------------

    def neighbours(self, seq: int) -> tuple[Message | None, Message | None]:
        """The previous and next message of the same session (None at either end)."""
        msg = self.messages[seq]
        keys = self.groups[msg.group].sessions[msg.session]
        i = bisect.bisect_left(keys, self.keys[seq])
        prev = self.messages[keys[i - 1][1]] if i > 0 else None
        nxt = self.messages[keys[i + 1][1]] if i + 1 < len(keys) else None
        return prev, nxt

    def lexical_text(self, seq: int) -> str:
        msg = self.messages[seq]
        if not self.tuning.neighbours:
            return line(msg)
        prev, nxt = self.neighbours(seq)
        return "\n".join(line(x) for x in (prev, msg, nxt) if x is not None)

    def dense_text(self, seq: int) -> str:
        msg = self.messages[seq]
        if not self.tuning.dense_previous:
            return line(msg)
        prev, _ = self.neighbours(seq)
        return line(msg) if prev is None else f"{line(prev)}\n{line(msg)}"

    def _reindex(self, seqs: set[int]) -> None:
        if self._deferred is not None:
            self._deferred |= seqs
            return
        for seq in sorted(seqs):
            if seq not in self.messages:
                continue
            self.lexical.add(seq, self.lexical_text(seq))
            if self.digests.get(seq) != text_digest(self.dense_text(seq)):
                self.to_embed[seq] = None

    # --- mutations -------------------------------------------------------------------------------

    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, PutMessages):
            return self._apply_put(mutation.messages)
        if isinstance(mutation, DropMessages):
            return self._apply_drop(mutation)
        if isinstance(mutation, MoveMark):
            group = self._group(mutation.group)
            before = (group.mark, list(group.marks))
            group.mark = mutation.mark
            if not group.marks or group.marks[-1] != (mutation.mark, mutation.at):
                group.marks.append((mutation.mark, mutation.at))

            def undo_mark() -> None:
                group.mark, group.marks = before[0], before[1]

            return undo_mark
        if isinstance(mutation, PutSummary):
            group = self._group(mutation.group)
            old = group.summary
            group.summary = Summary(
                summary=mutation.summary, intents=list(mutation.intents), updated_at=mutation.updated_at
            )

            def undo_summary() -> None:
                group.summary = old

            return undo_summary
        raise TypeError(f"not a conversation mutation: {mutation!r}")

    def _apply_drop(self, mutation: DropMessages) -> Undo:
        dropped = [
            self.messages[s] for s in mutation.seqs if s in self.messages and self.messages[s].group == mutation.group
        ]
        self._remove_all([msg.seq for msg in dropped])
        group = self.groups.get(mutation.group)
        marks = list(group.marks) if group is not None else []
        if group is not None and mutation.seqs:  # mark moves whose messages are gone are spent: keep the newest
            top = max(mutation.seqs)
            group.marks = [x for x in group.marks[:-1] if x[0] > top] + group.marks[-1:]

        def undo() -> None:
            if group is not None:
                group.marks = marks
            self._apply_put(dropped)

        return undo

    def _group(self, name: str) -> Group:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name)
        return group

    def _apply_put(self, messages: list[Message]) -> Undo:
        replaced: list[Message] = []
        added: list[int] = []
        touched: set[int] = set()
        for msg in messages:
            old = self.messages.get(msg.seq)
            if old is not None:
                replaced.append(old)
                touched |= self._remove_one(old.seq)
            else:
                # the same id under another seq cannot come from the daemon; replay keeps the newest
                other = self.groups.get(msg.group)
                if other is not None and msg.id in other.ids and other.ids[msg.id] != msg.seq:
                    replaced.append(self.messages[other.ids[msg.id]])
                    touched |= self._remove_one(other.ids[msg.id])
            touched |= self._insert_one(msg)
            added.append(msg.seq)
        self._reindex(touched)

        def undo() -> None:
            self._remove_all(added)
            if replaced:
                self._apply_put(replaced)

        return undo

    def _insert_one(self, msg: Message) -> set[int]:
        group = self._group(msg.group)
        key = (micros(msg.timestamp), msg.seq)
        self.messages[msg.seq] = msg
        self.keys[msg.seq] = key
        bisect.insort(group.keys, key)
        group.ids[msg.id] = msg.seq
        session = group.sessions.get(msg.session)
        if session is None:
            session = group.sessions[msg.session] = []
            self.session_count += 1
        i = bisect.bisect_left(session, key)
        session.insert(i, key)
        group.senders.setdefault(msg.sender, {})[msg.seq] = None
        self.terms.forget(msg.seq, msg.group, msg.session)
        group.changed()
        if msg.seq >= self.next_seq:
            self.next_seq = msg.seq + 1
        touched = {msg.seq}
        if i > 0:
            touched.add(session[i - 1][1])
        if i + 1 < len(session):
            touched.add(session[i + 1][1])
        return touched

    def _remove_one(self, seq: int) -> set[int]:
        """Forget one message; returns its former neighbours (whose documents change)."""
        msg = self.messages.pop(seq)
        key = self.keys.pop(seq)
        group = self.groups[msg.group]
        del group.keys[bisect.bisect_left(group.keys, key)]
        if group.ids.get(msg.id) == seq:
            del group.ids[msg.id]
        session = group.sessions[msg.session]
        i = bisect.bisect_left(session, key)
        del session[i]
        self.terms.forget(seq, msg.group, msg.session)
        touched = set()
        if i > 0:
            touched.add(session[i - 1][1])
        if i < len(session):
            touched.add(session[i][1])
        if not session:
            del group.sessions[msg.session]
            self.session_count -= 1
        senders = group.senders[msg.sender]
        senders.pop(seq, None)
        if not senders:
            del group.senders[msg.sender]
        group.changed()
        self.lexical.remove(seq)
        self.vectors.remove(seq)
        self.digests.pop(seq, None)
        self.to_embed.pop(seq, None)
        return touched

    def _remove_all(self, seqs: list[int]) -> None:
        touched: set[int] = set()
        for seq in reversed(seqs):
            if seq in self.messages:
                touched |= self._remove_one(seq)
        self._reindex(touched)

    # --- handlers --------------------------------------------------------------------------------

    @handles("conversation.append")
    def do_append(self, p: m.ConversationAppend) -> dict[str, int]:
        now = self.now()
        stamps: list[tuple[str, int]] = []
        for i, item in enumerate(p.messages):  # validate everything before anything changes
            if item.timestamp is None:
                stamp = now
            else:
                try:
                    stamp = normalize_timestamp(item.timestamp)
                    us = micros(stamp)
                except (ValueError, TypeError, OverflowError, OSError) as exc:
                    raise ProtocolError(
                        "invalid_params",
                        f"invalid params: messages[{i}].timestamp {item.timestamp!r} is not an RFC 3339 timestamp"
                        f" ({exc})",
                        field=f"messages[{i}].timestamp",
                    ) from None
            stamps.append((stamp, micros(stamp) if item.timestamp is None else us))
        group = self.groups.get(p.group)
        known = group.ids if group is not None else {}
        seen: set[str] = set()
        new: list[Message] = []
        pending: list[tuple[int, int, str]] = []  # (us, seq, session) of this call's messages so far, sorted
        seq = self.next_seq
        for item, (stamp, us) in zip(p.messages, stamps):
            if item.id in known or item.id in seen:
                continue
            seen.add(item.id)
            session = item.session or self._auto_session(group, pending, us, seq)
            bisect.insort(pending, (us, seq, session))
            new.append(
                Message(
                    id=item.id,
                    group=p.group,
                    seq=seq,
                    role=item.role,
                    sender=item.sender or "",
                    text=item.text,
                    timestamp=stamp,
                    session=session,
                    received_at=now,
                )
            )
            seq += 1
        if new:
            self.commit(PutMessages(new))
        return {"appended": len(new), "ignored": len(p.messages) - len(new)}

    def _auto_session(self, group: Group | None, pending: list[tuple[int, int, str]], us: int, seq: int) -> str:
        """A message without a session joins the session of the nearest earlier message of the group
        (stored, or earlier in this call) if it came at most session_gap before; else that of the
        nearest later one within the gap (a late message); else it opens auto-<seq>."""
        gap = int(self.session_gap * 1_000_000)
        key = (us, seq)
        near: list[tuple[int, int, str]] = []  # (after?, distance, session): an earlier one wins
        if group is not None and group.keys:
            i = bisect.bisect_left(group.keys, key)
            if i > 0:
                k = group.keys[i - 1]
                near.append((0, us - k[0], self.messages[k[1]].session))
            if i < len(group.keys):
                k = group.keys[i]
                near.append((1, k[0] - us, self.messages[k[1]].session))
        j = bisect.bisect_left(pending, (us, seq, ""))
        if j > 0:
            near.append((0, us - pending[j - 1][0], pending[j - 1][2]))
        if j < len(pending):
            near.append((1, pending[j][0] - us, pending[j][2]))
        within = [n for n in near if n[1] <= gap]
        if within:
            return min(within)[2]
        return f"{AUTO_SESSION}{seq}"

    @handles("conversation.get")
    def do_get(self, p: m.ConversationGet) -> list[Message]:
        group = self.groups.get(p.group)
        if group is None:
            return []
        keys = group.keys
        if p.since is None:
            chosen = keys[-p.limit :]
        else:
            start = bisect.bisect_left(keys, (_timestamp_us(p.since, "since"), -1))
            chosen = keys[start : start + p.limit]
        return [self.messages[seq] for _, seq in chosen]

    @handles("conversation.groups")
    def do_groups(self, p: m.Empty) -> list[dict[str, Any]]:
        return [self.group_info(self.groups[name]) for name in sorted(self.groups)]

    def group_info(self, group: Group) -> dict[str, Any]:
        first = self.messages[group.keys[0][1]].timestamp if group.keys else None
        last = self.messages[group.keys[-1][1]].timestamp if group.keys else None
        pending = sum(1 for seq in group.ids.values() if seq > group.mark)
        return {
            "group": group.name,
            "domain": group.name,
            "memories": f"memories/{group.slug}/",
            "messages": len(group.keys),
            "high_water_mark": group.mark,
            "pending": pending,
            "sessions": len(group.sessions),
            "first_at": first,
            "last_at": last,
        }

    @handles("conversation.summary")
    def do_summary(self, p: m.ConversationGroupRef) -> Summary:
        group = self.groups.get(p.group)
        return group.summary if group is not None else Summary()

    # --- search ----------------------------------------------------------------------------------

    def search(
        self, p: m.ConversationSearch, query_vector: np.ndarray | None, dense_error: str | None = None
    ) -> list[dict[str, Any]]:
        started = time.perf_counter_ns()
        try:
            return self._search(p, query_vector, dense_error)
        finally:
            self.searches += 1
            self.search_time.add((time.perf_counter_ns() - started) / 1000)

    def _search(
        self, p: m.ConversationSearch, query_vector: np.ndarray | None, dense_error: str | None
    ) -> list[dict[str, Any]]:
        ranker = p.ranker or self.default_ranker()
        got = self._candidates(p, query_vector, everything=ranker == "learned")
        if got is None:
            return []
        group, sides, fused = got
        if ranker == "learned":
            fused = self._reranked(group, p.query, query_vector, sides, fused)
        fused = fused[: p.k]
        t = self.tuning
        fusion = "learned" if ranker == "learned" else t.fusion
        boosts = sides.boosts
        # BM25 alone: no query vector (the model loading or failing) or no message vector yet
        lexical_only = query_vector is None or not len(self.vectors)
        self.searches_lexical_only += lexical_only
        out = []
        for item in fused:
            prev, nxt = self.neighbours(item.label)
            why: dict[str, Any] = {
                "lexical_rank": item.ranks["lexical"],
                "lexical_score": _round(item.raw["lexical"]),
                "dense_rank": item.ranks["dense"],
                "dense_score": _round(item.raw["dense"]),
                "speaker_boost": _round(boosts.get(item.label, 0.0)),
                "fusion": fusion,
                "embedded": item.label in self.vectors,  # false: no vector yet, found and ranked by BM25 alone
                "lexical_only": lexical_only,
            }
            if dense_error:
                why["dense_error"] = dense_error
            out.append(
                {
                    "message": self.messages[item.label],
                    "score": round(item.score, 6),
                    "why": why,
                    "context": [x for x in (prev, nxt) if x is not None],
                }
            )
        return out

    def default_ranker(self) -> str:
        """The ranker of a search that names none (see Tuning.ranker)."""
        if self.tuning.ranker is not None:
            return self.tuning.ranker
        return "learned" if shipped_ranker().meta.get("embedder") == self.model else "fusion"

    def _candidates(
        self, p: m.ConversationSearch, query_vector: np.ndarray | None, everything: bool
    ) -> tuple[Group, Sides, list[Fused]] | None:
        """The group, both sides' top lists and their fusion (all of it with `everything`, else
        the top k); None when nothing can match (no such group, nothing in since/until)."""
        since = None if p.since is None else _timestamp_us(p.since, "since")
        until = None if p.until is None else _timestamp_us(p.until, "until")
        group = self.groups.get(p.group)
        if group is None:
            return None
        allowed = group.labels(since, until)
        if allowed.size == 0:
            return None
        t = self.tuning
        whole = since is None and until is None  # every message of the group
        lex_labels, lex_scores, boosts = self.lexical_side(p.query, group, allowed, whole)
        dense_labels: list[int] = []
        dense_scores: list[float] = []
        if query_vector is not None and len(self.vectors):
            # the only group, unfiltered: no filter at all (hnswlib then searches without a mask)
            unfiltered = whole and allowed.size == len(self.messages)
            labels, scores = self.vectors.search(query_vector, t.fetch, None if unfiltered else allowed)
            dense_labels, dense_scores = labels.tolist(), scores.tolist()
        fused = fuse_scores(
            {"lexical": (lex_labels, lex_scores), "dense": (dense_labels, dense_scores)},
            {"lexical": t.w_lexical, "dense": t.w_dense},
            t.fusion,
            limit=None if everything else p.k,
        )
        return group, Sides(lex_labels, lex_scores, boosts, dense_labels), fused

    def candidate_signals(
        self, p: m.ConversationSearch, query_vector: np.ndarray | None
    ) -> tuple[list[int], np.ndarray]:
        """Every candidate of a search (the fusion's order) and its signals: what the learned
        ranker scores, for bench/train_ranker.py (the daemon's own code path)."""
        got = self._candidates(p, query_vector, everything=True)
        if got is None:
            return [], np.zeros((0, len(FEATURES)))
        group, sides, fused = got
        return [f.label for f in fused], self._signals(group, p.query, query_vector, sides, fused)

    def _signals(
        self, group: Group, query: str, query_vector: np.ndarray | None, sides: Sides, fused: list[Fused]
    ) -> np.ndarray:
        return signal_matrix(
            self,
            group,
            query,
            query_vector,
            [f.label for f in fused],
            dict(zip(sides.lex_labels, sides.lex_scores)),
            {lab: i + 1 for i, lab in enumerate(sides.lex_labels)},
            {lab: i + 1 for i, lab in enumerate(sides.dense_labels)},
            [f.score for f in fused],
        )

    def _reranked(
        self, group: Group, query: str, query_vector: np.ndarray | None, sides: Sides, fused: list[Fused]
    ) -> list[Fused]:
        """The fusion's first `depth` candidates (the weights file says how many) by the shipped
        linear ranker's score, ties in the fusion's order, then the rest in the fusion's order; each
        item's score becomes the ranker's (the rest: one less each than the one before)."""
        ranker = shipped_ranker()
        head, tail = fused[: ranker.depth], fused[ranker.depth :]
        scores = ranker.score(self._signals(group, query, query_vector, sides, head)).tolist()
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        low = min(scores, default=0.0)
        for i in order:
            head[i].score = scores[i]
        for item in tail:  # below every reranked one, in the fusion's order
            low -= 1.0
            item.score = low
        return [head[i] for i in order] + tail

    def named_speakers(self, query: str, group: Group) -> list[str]:
        """The group's senders whose name the query contains (as a token, unstemmed)."""
        words = set(tokenize(query))
        return [s for s in group.senders if s and name_tokens(s) & words]

    def lexical_side(
        self, query: str, group: Group, allowed: np.ndarray, whole: bool = False
    ) -> tuple[list[int], list[float], dict[int, float]]:
        """BM25's top `fetch`, with the speaker boost: when the query names a participant, each of
        that participant's messages gains speaker_boost x the best BM25 score among them.
        `whole`: `allowed` is every message of the group (no since/until)."""
        t = self.tuning
        everything = whole and allowed.size == len(self.messages)  # the only group: no filter needed
        labels, scores = self.lexical.search(query, t.fetch, None if everything else allowed)
        named = []
        if t.speaker_boost > 0:
            for sender in self.named_speakers(query, group):
                theirs = group.sender_labels(sender)
                named.append(theirs if whole else np.intersect1d(allowed, theirs, assume_unique=True))
        return boost_named(
            labels.tolist(),
            scores.tolist(),
            named,
            lambda theirs: self.lexical.search(query, t.fetch, theirs),
            t.speaker_boost,
            t.fetch,
        )

    # --- the extraction hooks (the job queue reads these; see PROTOCOL.md "conversation") ---------

    def high_water_mark(self, group: str) -> int:
        g = self.groups.get(group)
        return g.mark if g is not None else 0

    def window(self, group: str, token_budget: int | None = None) -> Window:
        """The group's messages after its high-water mark, in conversation order; with a budget,
        the newest of them whose lines fit in it (never a head-cut: the end of a long session is kept)."""
        g = self.groups.get(group)
        if g is None:
            return Window(group=group, messages=[], mark_from=0, mark_to=0, skipped=0)
        after = [self.messages[seq] for _, seq in g.keys if seq > g.mark]
        kept = after
        if token_budget is not None:
            spent = 0
            start = len(after)
            while start > 0:
                cost = estimate_tokens(line(after[start - 1])) + 1
                if spent + cost > token_budget:
                    break
                spent += cost
                start -= 1
            kept = after[start:]
        mark_to = max((msg.seq for msg in after), default=g.mark)
        return Window(group=group, messages=kept, mark_from=g.mark, mark_to=mark_to, skipped=len(after) - len(kept))

    def take_window(self, group: str, token_budget: int | None, job_id: str) -> tuple[Window, Summary]:
        """An extraction's window and the group's current summary; remembers which job took a window
        up to which seq (conversation.flush's debounce reads it through extraction_pending())."""
        window = self.window(group, token_budget)
        g = self.groups.get(group)
        if g is None:
            return window, Summary()
        g.taken = (job_id, window.mark_to)
        return window, g.summary

    def extraction_pending(self, group: str) -> Pending | None:
        """What an extraction request needs to know of a group (None: no such group)."""
        g = self.groups.get(group)
        if g is None:
            return None
        newest = max(g.ids.values(), default=0)  # a late message has the highest seq, not the last place
        return Pending(group=group, mark=g.mark, newest=newest, taken=g.taken)

    def groups_with_new_text(self, min_chars: int) -> list[str]:
        """The groups with at least min_chars of message text past their mark (the periodic trigger)."""
        out = []
        for name, g in self.groups.items():
            chars = 0
            for _, seq in reversed(g.keys):  # newest first: a group caught up stops at once, mostly
                if seq > g.mark:
                    chars += len(self.messages[seq].text)
                    if chars >= min_chars:
                        out.append(name)
                        break
        return out

    def commit_extraction(self, group: str, mark_from: int, mark_to: int, summary: str | None, intents: list[str]) -> int:
        """Run inside a job's commit (staged, one journal record with its memories): the group's mark
        moves past the window the job read, and its summary and intents are replaced. Refused when the
        mark moved since the window was taken (the window would be applied twice)."""
        g = self.groups.get(group)
        if g is None:
            raise ProtocolError("not_found", f"no conversation group {group!r}", field="group")
        if g.mark != mark_from:
            raise ProtocolError(
                "internal", f"the mark of {group!r} moved from {mark_from} to {g.mark} while its window was extracted"
            )
        if mark_to > g.mark:
            self.move_mark(group, mark_to)
        if summary is not None:
            self.put_summary(group, summary, intents)
        return mark_to

    def move_mark(self, group: str, mark: int) -> MoveMark:
        """Commit (journal with the batch or internal call) the group's new high-water mark."""
        if group not in self.groups:
            raise ProtocolError("not_found", f"no conversation group {group!r}", field="group")
        if not 0 <= mark < self.next_seq:
            raise ProtocolError(
                "invalid_params", f"invalid params: mark {mark} is not a sequence number of this tier", field="mark"
            )
        mutation = MoveMark(group=group, mark=mark, at=self.now())
        self.commit(mutation)
        return mutation

    def put_summary(self, group: str, summary: str, intents: list[str]) -> PutSummary:
        if group not in self.groups:
            raise ProtocolError("not_found", f"no conversation group {group!r}", field="group")
        mutation = PutSummary(group=group, summary=summary, intents=list(intents)[:3], updated_at=self.now())
        self.commit(mutation)
        return mutation

    # --- retention -------------------------------------------------------------------------------

    def expired(self, now: _dt.datetime, keep_days: float) -> dict[str, list[int]]:
        """Per group, the extracted messages (seq <= a mark) whose extraction is more than
        keep_days old. Nothing when keep_days is 0 (keep everything)."""
        if keep_days <= 0:
            return {}
        cutoff = now - _dt.timedelta(days=keep_days)
        out: dict[str, list[int]] = {}
        for name, g in self.groups.items():
            old = [mark for mark, at in g.marks if _dt.datetime.fromisoformat(at) <= cutoff]
            if not old:
                continue
            limit = min(max(old), g.mark)  # a mark moved back re-opens what it un-extracted
            seqs = sorted(seq for seq in g.ids.values() if seq <= limit)
            if seqs:
                out[name] = seqs
        return out

    def drop(self, group: str, seqs: list[int]) -> None:
        self.commit(DropMessages(group=group, seqs=list(seqs)))

    # --- background embedding --------------------------------------------------------------------

    def take_to_embed(self, limit: int) -> list[tuple[int, str, int]]:
        """Up to `limit` (seq, dense text, its digest) that need a vector, oldest first."""
        out: list[tuple[int, str, int]] = []
        for seq in list(self.to_embed):
            if len(out) >= limit:
                break
            if seq not in self.messages:
                del self.to_embed[seq]
                continue
            text = self.dense_text(seq)
            digest = text_digest(text)
            if self.digests.get(seq) == digest and seq in self.vectors:
                del self.to_embed[seq]  # changed and changed back
                continue
            out.append((seq, text, digest))
        return out

    def put_vectors(self, items: list[tuple[int, str, int]], vectors: np.ndarray) -> int:
        """Store the vectors computed for take_to_embed's items whose text is still the same."""
        keep = [
            i
            for i, (seq, _, digest) in enumerate(items)
            if seq in self.messages and text_digest(self.dense_text(seq)) == digest
        ]
        if keep:
            self.vectors.add([items[i][0] for i in keep], vectors[keep])
            for i in keep:
                seq, _, digest = items[i]
                self.digests[seq] = digest
                self.to_embed.pop(seq, None)
        self.embedded += len(keep)
        return len(keep)

    # --- statistics and snapshots ----------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Walks nothing: sys.stats reads it from the event loop while a batch may run in a thread."""
        return {
            "groups": len(self.groups),
            "messages": len(self.messages),
            "sessions": self.session_count,
            "vectors": len(self.vectors),
            "unembedded": len(self.to_embed),
        }

    def statistics(self) -> dict[str, Any]:
        """What sys.stats shows of the tier's work; called by the owner only (the actor publishes a copy)."""
        return {
            "model": self.model,
            "embedded": self.embedded,
            "lexical_index_from": self.lexical_from,
            "searches": self.searches,
            "searches_lexical_only": self.searches_lexical_only,
            "search": self.search_time.copy(),
        }

    def snapshot_document(self) -> ConversationSnapshot:
        labels = np.fromiter(self.digests, dtype=np.int64, count=len(self.digests))
        digests = np.fromiter(self.digests.values(), dtype=np.int64, count=len(self.digests))
        return ConversationSnapshot(
            next_seq=self.next_seq,
            messages=[self.messages[seq] for seq in sorted(self.messages)],
            marks={name: g.mark for name, g in self.groups.items() if g.mark},
            mark_history={name: [list(x) for x in g.marks] for name, g in self.groups.items() if g.marks},
            summaries={name: g.summary for name, g in self.groups.items() if g.summary.updated_at is not None},
            groups=sorted(self.groups),
            lexical_key=self.tuning.lexical_key(),
            lexical=self.lexical.dump(),
            model=self.model,
            vectors_stem=self.vectors_stem,
            vectors_fingerprint=self.saved_fingerprint,
            digest_labels=labels.tobytes(),
            digests=digests.tobytes(),
        )

    def load_snapshot(self, doc: ConversationSnapshot, vectors: VectorStore | None) -> None:
        """Rebuild the state from a snapshot (before the journal is replayed over it)."""
        self._deferred = set()
        for name in doc.groups:
            self._group(name)
        self._apply_put(doc.messages)
        self._deferred = None
        self.next_seq = max(self.next_seq, doc.next_seq)
        for name, mark in doc.marks.items():
            self._group(name).mark = mark
        for name, history in doc.mark_history.items():
            self._group(name).marks = [(int(a), str(b)) for a, b in history]
        for name, summary in doc.summaries.items():
            self._group(name).summary = summary
        self.lexical, self.lexical_from = self._restored_lexical(doc)
        if vectors is not None and doc.model == self.model:
            self.vectors = vectors
            self.vectors_stem, self.saved_fingerprint = doc.vectors_stem, doc.vectors_fingerprint
            labels = np.frombuffer(doc.digest_labels, dtype=np.int64).tolist()
            self.digests = dict(zip(labels, np.frombuffer(doc.digests, dtype=np.int64).tolist()))
            for label in vectors.labels().tolist():
                if label not in self.messages:
                    vectors.remove(label)
                    self.digests.pop(label, None)
        for seq in self.messages:
            if self.digests.get(seq) != text_digest(self.dense_text(seq)) or seq not in self.vectors:
                self.to_embed[seq] = None

    def _restored_lexical(self, doc: ConversationSnapshot) -> tuple[StemmedIndex, str]:
        if doc.lexical is not None and doc.lexical_key == self.tuning.lexical_key():
            try:
                index = StemmedIndex.restore(doc.lexical)
                assert isinstance(index, StemmedIndex)  # restore builds the class it is called on
                index.stem = self.tuning.stemming
                if len(index) == len(self.messages):
                    return index, "snapshot"
                log.warning(
                    "conversation: the saved BM25 index holds %d documents for %d messages; rebuilding",
                    len(index),
                    len(self.messages),
                )
            except ValueError as exc:
                log.warning("conversation: the saved BM25 index cannot be used (%s); rebuilding from the texts", exc)
        index = StemmedIndex(self.tuning.k1, self.tuning.b, stem=self.tuning.stemming)
        index.add_many((seq, self.lexical_text(seq)) for seq in sorted(self.messages))
        return index, "rebuilt"


class ConversationSnapshot(msgspec.Struct, kw_only=True):
    """memory/conversations.snapshot: every message and group record; the BM25 index as saved;
    which vector file generation (memory/conversation/<stem>.vectors) goes with it."""

    version: int = 1
    next_seq: int
    messages: list[Message]
    groups: list[str] = []
    marks: dict[str, int] = {}
    mark_history: dict[str, list[list[Any]]] = {}
    summaries: dict[str, Summary] = {}
    lexical_key: str = ""
    lexical: LexicalDump | None = None
    model: str = ""
    vectors_stem: str = ""
    vectors_fingerprint: str = ""
    digest_labels: bytes = b""  # int64 per vector
    digests: bytes = b""  # int64 per vector: the digest of the text it was computed from


def _timestamp_us(value: str, field: str) -> int:
    try:
        return micros(normalize_timestamp(value))
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(
            "invalid_params", f"invalid params: {field} {value!r} is not an RFC 3339 timestamp ({exc})", field=field
        ) from None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


OnChange = Callable[[], None]
