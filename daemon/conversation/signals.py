"""The learned ranker's signals for conversation.search (issue 31): one row per candidate message.

Rules kept here:
- Every signal comes from what the state already holds: the messages and their sessions, the BM25
  index's statistics (idf, mean document length), the stored vectors, the fusion's two top lists.
  No new index and no new vector: "turn + next" is the next message's own vector (its dense
  document is its previous line plus its own, i.e. this turn plus the next), and a session's
  best cosine is the best over the messages of that session the query's lists and the candidates'
  neighbours reached (exact whenever the session has a message in the dense top list).
- The term counts of a message's line and of a session are derived caches (`TermCache`), computed
  when a search first needs them and dropped when the message or its session changes.
- The candidates are those the fusion sees: the union of the lexical and the dense top lists.
- BM25 over a window of a turn's session neighbours sums their term counts and lengths; its idf is
  the index's, its mean length the index's mean line length times the window's size. BM25 over a
  session likewise, the mean session length being the group's messages per session times that.
- The daemon and bench/train_ranker.py compute the signals through this one function, so the
  shipped weights (ranker.json beside this module) mean the same thing in both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol

import numpy as np

from ..retrieval import dates
from ..retrieval.ranker import LinearRanker
from ..retrieval.vectors import VectorStore
from .text import StemmedIndex

__all__ = ["FEATURES", "WINDOWS", "Layout", "TermCache", "shipped_ranker", "signal_matrix"]


WINDOWS = ((0, 0), (1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2))  # (turns before, turns after)

FEATURES: tuple[str, ...] = (
    *(f"bm25_{a}_{b}" for a, b in WINDOWS),
    "bm25_session",
    "lexical",  # the lexical side's score (BM25 of the neighbour document + speaker boost), its list's last if absent
    "lexical_rrf",  # 1 / (60 + rank) on the lexical side, 0 if absent
    "dense_rrf",
    "fusion",  # the old fusion's score
    "cos_prev",  # cosine of the query with the turn + previous turn (the turn's vector)
    "cos_next",  # ... with the turn + next turn (the next turn's vector; the turn's own at a session's end)
    "cos_session_max",
    "speaker",  # the query names the turn's sender
    "names_person",  # the turn's line names another participant the query names
    "speaker_x_bm25",  # speaker x bm25_1_1
    "question",  # the turn's text has a "?"
    "log_length",  # log(1 + tokens of the turn's line)
    "position",  # the turn's place in its session, 0 (first) to 1 (last)
    "date_match",  # exp(-days / 14) between the turn's date and a date the query names or implies (0 if none)
    "text_date_match",  # ... between the dates the turn's text names or implies ("yesterday" said on 8 May is
    # 7 May) and the query's
    "when_x_time",  # the query asks when, and the turn's text names a date or a relative time
)

RRF_K = 60

_NEIGHBOUR_TURNS = 2.9  # the mean number of lines in a neighbour document (sessions' ends have two)

Terms = tuple[dict[str, int], int]  # term -> count, token count


class Group(Protocol):
    """What the signals read of a group (state.Group; a Protocol: the state imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def keys(self) -> Sequence[tuple[int, int]]: ...
    @property
    def sessions(self) -> Mapping[str, list[tuple[int, int]]]: ...
    def cached(self, key: str, build: Callable[[], Any]) -> Any: ...


class State(Protocol):
    """What the signals read of the tier's state (state.ConversationState)."""

    @property
    def messages(self) -> Mapping[int, Any]: ...
    @property
    def keys(self) -> Mapping[int, tuple[int, int]]: ...
    @property
    def lexical(self) -> StemmedIndex: ...
    @property
    def vectors(self) -> VectorStore: ...
    @property
    def terms(self) -> TermCache: ...
    @property
    def tuning(self) -> Any: ...
    def named_speakers(self, query: str, group: Any) -> list[str]: ...


class TermCache:
    """Term counts of each message's line, and of each session, computed when first asked."""

    def __init__(self, tokens_of: Callable[[int], list[str]]) -> None:
        self.tokens_of = tokens_of  # seq -> the tokens of its line
        self.turns: dict[int, Terms] = {}
        self.sessions: dict[tuple[str, str], Terms] = {}
        self.times: dict[int, list[dates.Interval]] = {}  # seq -> the dates its text names or implies

    def forget(self, seq: int, group: str, session: str) -> None:
        self.turns.pop(seq, None)
        self.times.pop(seq, None)
        self.sessions.pop((group, session), None)

    def clear(self) -> None:
        self.turns.clear()
        self.times.clear()
        self.sessions.clear()

    def time(self, seq: int, text: str, day: float) -> list[dates.Interval]:
        got = self.times.get(seq)
        if got is None:
            got = self.times[seq] = dates.text_days(text, day)
        return got

    def turn(self, seq: int) -> Terms:
        got = self.turns.get(seq)
        if got is None:
            tokens = self.tokens_of(seq)
            got = self.turns[seq] = (dict(Counter(tokens)), len(tokens))
        return got

    def session(self, group: str, session: str, seqs: Sequence[int]) -> Terms:
        got = self.sessions.get((group, session))
        if got is None:
            total: Counter[str] = Counter()
            length = 0
            for seq in seqs:
                counts, n = self.turn(seq)
                total.update(counts)
                length += n
            got = self.sessions[(group, session)] = (dict(total), length)
        return got


@cache
def shipped_ranker() -> LinearRanker:
    """The weights shipped in the package (ranker.json beside this module)."""
    text = resources.files(__package__).joinpath("ranker.json").read_text(encoding="utf-8")
    return LinearRanker.from_json(text, FEATURES)


class Layout:
    """What the signals read of a group that no query changes: its turns in session order (a row
    each: session after session, each in conversation order), each row's session, place, size,
    token count, sender and whether it is a question, and each sender's name tokens. Built when a
    search first needs it after the group changed (Group.cached: dropped with every change), from
    the TermCache's counts, so a rebuild tokenizes only the lines that changed."""

    __slots__ = ("days", "index", "length", "names", "newest", "order", "question", "rows", "sender", "senders", "seqs", "session",
                 "session_names", "size", "sorted_seqs")

    def __init__(self, state: State, group: Group) -> None:
        messages, terms = state.messages, state.terms
        self.session_names = list(group.sessions)
        seqs = [k[1] for keys in group.sessions.values() for k in keys]
        sizes = [len(keys) for keys in group.sessions.values()]
        self.seqs = np.asarray(seqs, dtype=np.int64)
        self.session = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        starts = np.cumsum([0, *sizes[:-1]], dtype=np.int64)
        self.size = np.repeat(np.asarray(sizes, dtype=np.int64), sizes)
        self.index = np.arange(len(seqs), dtype=np.int64) - np.repeat(starts, sizes)  # the place in its session
        self.order = np.argsort(self.seqs, kind="stable")
        self.sorted_seqs = self.seqs[self.order]
        self.length = np.fromiter((terms.turn(seq)[1] for seq in seqs), dtype=np.float64, count=len(seqs))
        keys = state.keys  # (microseconds since the epoch, seq)
        self.days = np.fromiter((keys[seq][0] / 86_400e6 for seq in seqs), dtype=np.float64, count=len(seqs))
        self.newest = float(self.days.max()) if len(seqs) else 0.0
        self.question = np.fromiter(("?" in messages[seq].text for seq in seqs), dtype=np.float64, count=len(seqs))
        self.senders = list(dict.fromkeys(messages[seq].sender for seq in seqs))
        sender_of = {name: i for i, name in enumerate(self.senders)}
        self.sender = np.fromiter((sender_of[messages[seq].sender] for seq in seqs), dtype=np.int64, count=len(seqs))
        self.names = {name: frozenset(state.lexical.tokenize(name)) for name in self.senders if name}

    def rows_of(self, seqs: np.ndarray) -> np.ndarray:
        """The rows of `seqs` (each a message of the group)."""
        result: np.ndarray = self.order[np.searchsorted(self.sorted_seqs, seqs)]
        return result


def layout(state: State, group: Group) -> Layout:
    got: Layout = group.cached("ranker-layout", lambda: Layout(state, group))
    return got


def signal_matrix(
    state: State,
    group: Group,
    query: str,
    query_vector: np.ndarray | None,
    labels: Sequence[int],
    lexical: dict[int, float],
    lexical_rank: dict[int, int],
    dense_rank: dict[int, int],
    fusion: Sequence[float],
) -> np.ndarray:
    """(len(labels), len(FEATURES)) float64: the raw signals of each candidate (see FEATURES)."""
    n = len(labels)
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return x
    col = {name: i for i, name in enumerate(FEATURES)}
    index, terms_cache, lay = state.lexical, state.terms, layout(state, group)
    terms = [(t, weight) for t in dict.fromkeys(index.tokenize(query)) if (weight := index.idf(t)) > 0]
    names = [t for t, _ in terms]
    idf = np.array([weight for _, weight in terms], dtype=np.float64)
    k1, b = index.k1, index.b
    turn_avg = max(index.mean_length() / (_NEIGHBOUR_TURNS if state.tuning.neighbours else 1.0), 1e-9)
    cand = np.asarray(labels, dtype=np.int64)
    rows = lay.rows_of(cand)

    # each candidate's window of two turns each side in its session, as rows (-1: none)
    offsets = np.arange(-2, 3, dtype=np.int64)
    at = lay.index[rows][:, None] + offsets
    window = np.where((at >= 0) & (at < lay.size[rows][:, None]), rows[:, None] + offsets, -1)  # (n, 5)
    # the query terms' counts of each turn in a window, once per turn (the last row: zeros)
    needed = np.unique(window[window >= 0])
    counts = [terms_cache.turn(seq)[0] for seq in lay.seqs[needed].tolist()]
    tf_needed = np.zeros((needed.size + 1, len(names)))
    for j, term in enumerate(names):
        tf_needed[:-1, j] = [c.get(term, 0) for c in counts]
    slot = np.where(window >= 0, np.searchsorted(needed, window), needed.size)
    tf = tf_needed[slot]  # (n, 5, terms)
    ln = np.where(window >= 0, lay.length[np.maximum(window, 0)], 0.0)  # (n, 5)

    def bm25(tfs: np.ndarray, lens: np.ndarray, avgdl: np.ndarray | float) -> np.ndarray:
        """BM25 over the last axis's terms; tfs (..., terms), lens (...)."""
        if not names:
            return np.zeros(tfs.shape[:-1])
        norm = k1 * (1.0 - b + b * lens / avgdl)
        result: np.ndarray = (idf * (k1 + 1.0) * tfs / (tfs + norm[..., None])).sum(axis=-1)
        return result

    # every window at once: membership (windows, 5) of the five places
    member = np.array([[2 - a <= p < 3 + after for p in range(5)] for a, after in WINDOWS], dtype=np.float64)
    sizes = member.sum(axis=1)
    x[:, [col[f"bm25_{a}_{after}"] for a, after in WINDOWS]] = bm25(
        np.einsum("npt,wp->nwt", tf, member), ln @ member.T, turn_avg * sizes
    )
    sessions, which = np.unique(lay.session[rows], return_inverse=True)
    s_tf = np.zeros((sessions.size, len(names)))
    s_len = np.zeros(sessions.size)
    for i, s in enumerate(sessions.tolist()):
        name = lay.session_names[s]
        s_counts, s_len[i] = terms_cache.session(group.name, name, [k[1] for k in group.sessions[name]])
        s_tf[i] = [s_counts.get(t, 0) for t in names]
    s_avg = turn_avg * max(len(group.keys) / max(len(group.sessions), 1), 1.0)
    x[:, col["bm25_session"]] = bm25(s_tf[which], s_len[which], s_avg)

    lowest = min(lexical.values()) if lexical else 0.0
    x[:, col["lexical"]] = [lexical.get(seq, lowest) for seq in labels]
    x[:, col["lexical_rrf"]] = [1.0 / (RRF_K + lexical_rank[s]) if s in lexical_rank else 0.0 for s in labels]
    x[:, col["dense_rrf"]] = [1.0 / (RRF_K + dense_rank[s]) if s in dense_rank else 0.0 for s in labels]
    x[:, col["fusion"]] = fusion

    _dense(state, query_vector, cand, rows, lay, x, col)

    named = state.named_speakers(query, group)
    sender = lay.sender[rows]
    named_ids = [i for i, name in enumerate(lay.senders) if name in named]
    x[:, col["speaker"]] = np.isin(sender, named_ids)
    if named:
        stems = [(i, lay.names.get(name, frozenset())) for i, name in enumerate(lay.senders) if name in named]
        x[:, col["names_person"]] = [
            float(any(i != who and not stem.isdisjoint(terms_cache.turn(seq)[0]) for i, stem in stems))
            for seq, who in zip(labels, sender.tolist())
        ]
    x[:, col["question"]] = lay.question[rows]
    x[:, col["log_length"]] = np.log1p(ln[:, 2])
    x[:, col["position"]] = np.where(lay.size[rows] > 1, lay.index[rows] / np.maximum(lay.size[rows] - 1, 1), 0.0)
    x[:, col["speaker_x_bm25"]] = x[:, col["speaker"]] * x[:, col["bm25_1_1"]]
    temporal = _temporal(state, query, labels, lay.days[rows], lay.newest)
    x[:, [col["date_match"], col["text_date_match"], col["when_x_time"]]] = temporal
    return x


def _temporal(state: State, query: str, labels: Sequence[int], days: np.ndarray, now: float) -> np.ndarray:
    """date_match, text_date_match and when_x_time (see FEATURES), as (candidates, 3); `days`: each
    candidate's own day, `now`: the group's newest (what the query's relative times count from)."""
    texts = [state.terms.time(seq, state.messages[seq].text, day) for seq, day in zip(labels, days.tolist())]
    wanted = dates.query_intervals(query, now)
    own = [[(float(np.floor(day)), float(np.floor(day)) + 1.0)] for day in days.tolist()]
    when = np.array([bool(t) for t in texts], dtype=np.float64) if dates.asks_when(query) else np.zeros(len(labels))
    return np.column_stack((dates.closeness(wanted, own), dates.closeness(wanted, texts), when))


def _dense(
    state: State, query_vector: np.ndarray | None, cand: np.ndarray, rows: np.ndarray, lay: Layout, x: np.ndarray,
    col: dict[str, int],
) -> None:
    """The cosine columns; a message without a vector (not embedded yet) counts as the candidates'
    mean, and all of them 0 when the query has no vector."""
    if query_vector is None or not len(state.vectors):
        return
    last = lay.index[rows] + 1 >= lay.size[rows]
    next_rows = np.where(last, rows, rows + 1)  # turn + next: the next turn's vector; the last turn's own
    wanted_rows = np.unique(np.concatenate((rows, next_rows)))
    sims = state.vectors.similarities(query_vector, lay.seqs[wanted_rows]).astype(np.float64)
    slot = np.searchsorted(wanted_rows, rows)
    x[:, col["cos_prev"]] = sims[slot]
    x[:, col["cos_next"]] = sims[np.searchsorted(wanted_rows, next_rows)]
    sessions = lay.session[wanted_rows]
    best = np.full(len(lay.session_names), -np.inf)
    ok = ~np.isnan(sims)
    np.maximum.at(best, sessions[ok], sims[ok])
    session_best = best[lay.session[rows]]
    x[:, col["cos_session_max"]] = np.where(np.isfinite(session_best), session_best, np.nan)
    for name in ("cos_prev", "cos_next", "cos_session_max"):
        column = x[:, col[name]]
        missing = np.isnan(column)
        if missing.any():
            column[missing] = float(np.nanmean(column)) if not missing.all() else 0.0
