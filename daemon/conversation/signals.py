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

import bisect
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol

import numpy as np

from ..retrieval.ranker import LinearRanker
from ..retrieval.vectors import VectorStore
from .text import StemmedIndex

__all__ = ["FEATURES", "WINDOWS", "TermCache", "shipped_ranker", "signal_matrix"]


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

    def forget(self, seq: int, group: str, session: str) -> None:
        self.turns.pop(seq, None)
        self.sessions.pop((group, session), None)

    def clear(self) -> None:
        self.turns.clear()
        self.sessions.clear()

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
    index, terms_cache = state.lexical, state.terms
    terms = [(t, weight) for t in dict.fromkeys(index.tokenize(query)) if (weight := index.idf(t)) > 0]
    idf = np.array([weight for _, weight in terms], dtype=np.float64)
    k1, b = index.k1, index.b
    turn_avg = max(index.mean_length() / (_NEIGHBOUR_TURNS if state.tuning.neighbours else 1.0), 1e-9)

    # each candidate's session and place; the query terms' counts of each turn needed (the candidates
    # and two neighbours each side), once per turn, as rows of one array (the last row: zeros)
    names = [t for t, _ in terms]
    row_of: dict[int, int] = {}
    turn_tf: list[list[int]] = []
    turn_len: list[int] = []
    places: list[tuple[str, list[tuple[int, int]], int]] = []
    window_rows: list[list[int]] = []
    messages, keys_of, sessions = state.messages, state.keys, group.sessions
    for seq in labels:
        session = messages[seq].session
        keys = sessions[session]
        i = bisect.bisect_left(keys, keys_of[seq])
        places.append((session, keys, i))
        lo, hi = max(i - 2, 0), min(i + 3, len(keys))
        rows = [-1] * (lo - i + 2)
        for _, other in keys[lo:hi]:
            r = row_of.get(other)
            if r is None:
                counts, length = terms_cache.turn(other)
                r = row_of[other] = len(turn_tf)
                turn_tf.append([counts.get(t, 0) for t in names])
                turn_len.append(length)
            rows.append(r)
        window_rows.append(rows + [-1] * (i + 3 - hi))
    pad = np.zeros((1, len(terms)))
    at = np.array(window_rows, dtype=np.int64)  # (n, 5); -1 picks the zero row
    tf = np.concatenate((np.array(turn_tf, dtype=np.float64).reshape(len(turn_tf), len(terms)), pad))[at]
    ln = np.append(np.array(turn_len, dtype=np.float64), 0.0)[at]

    def bm25(tfs: np.ndarray, lens: np.ndarray, avgdl: float) -> np.ndarray:
        if not terms:
            return np.zeros(tfs.shape[0])
        norm = k1 * (1.0 - b + b * lens / avgdl)
        result: np.ndarray = (idf * (k1 + 1.0) * tfs / (tfs + norm[:, None])).sum(axis=1)
        return result

    for a, after in WINDOWS:
        part = slice(2 - a, 3 + after)
        x[:, col[f"bm25_{a}_{after}"]] = bm25(tf[:, part].sum(axis=1), ln[:, part].sum(axis=1), turn_avg * (a + after + 1))
    session_row: dict[str, int] = {}
    session_tf: list[list[int]] = []
    session_len: list[int] = []
    for session, keys, _ in places:
        if session not in session_row:
            counts, length = terms_cache.session(group.name, session, [k[1] for k in keys])
            session_row[session] = len(session_tf)
            session_tf.append([counts.get(t, 0) for t in names])
            session_len.append(length)
    which = [session_row[session] for session, _, _ in places]
    s_avg = turn_avg * max(len(group.keys) / max(len(group.sessions), 1), 1.0)
    s_tf = np.array(session_tf, dtype=np.float64).reshape(len(session_tf), len(terms))[which]
    x[:, col["bm25_session"]] = bm25(s_tf, np.array(session_len, dtype=np.float64)[which], s_avg)

    lowest = min(lexical.values()) if lexical else 0.0
    x[:, col["lexical"]] = [lexical.get(seq, lowest) for seq in labels]
    x[:, col["lexical_rrf"]] = [1.0 / (RRF_K + lexical_rank[s]) if s in lexical_rank else 0.0 for s in labels]
    x[:, col["dense_rrf"]] = [1.0 / (RRF_K + dense_rank[s]) if s in dense_rank else 0.0 for s in labels]
    x[:, col["fusion"]] = fusion

    _dense(state, query_vector, labels, places, x, col)

    named = state.named_speakers(query, group)
    senders = [messages[seq].sender for seq in labels]
    x[:, col["speaker"]] = [float(sender in named) for sender in senders]
    if named:
        stems = {name: frozenset(index.tokenize(name)) for name in named}
        x[:, col["names_person"]] = [
            float(any(name != sender and not stems[name].isdisjoint(terms_cache.turn(seq)[0]) for name in named))
            for seq, sender in zip(labels, senders)
        ]
    x[:, col["question"]] = [float("?" in messages[seq].text) for seq in labels]
    x[:, col["log_length"]] = np.log1p(ln[:, 2])
    x[:, col["position"]] = [i / (len(keys) - 1) if len(keys) > 1 else 0.0 for _, keys, i in places]
    x[:, col["speaker_x_bm25"]] = x[:, col["speaker"]] * x[:, col["bm25_1_1"]]
    return x


def _dense(
    state: State,
    query_vector: np.ndarray | None,
    labels: Sequence[int],
    places: list[tuple[str, list[tuple[int, int]], int]],
    x: np.ndarray,
    col: dict[str, int],
) -> None:
    """The cosine columns; a message without a vector (not embedded yet) counts as the candidates'
    mean, and all of them 0 when the query has no vector."""
    if query_vector is None or not len(state.vectors):
        return
    nexts = [keys[i + 1][1] if i + 1 < len(keys) else seq for seq, (_, keys, i) in zip(labels, places)]
    wanted = np.unique(np.array([*labels, *nexts], dtype=np.int64))
    sims = state.vectors.similarities(query_vector, wanted).astype(np.float64)
    sim_of = dict(zip(wanted.tolist(), sims.tolist()))
    best: dict[str, float] = {}
    for seq, sim in sim_of.items():
        if not math.isnan(sim):
            session = state.messages[seq].session
            best[session] = max(best.get(session, -1.0), sim)
    x[:, col["cos_prev"]] = [sim_of[s] for s in labels]
    x[:, col["cos_next"]] = [sim_of[s] for s in nexts]
    x[:, col["cos_session_max"]] = [best.get(session, math.nan) for session, _, _ in places]
    for name in ("cos_prev", "cos_next", "cos_session_max"):
        column = x[:, col[name]]
        missing = np.isnan(column)
        if missing.any():
            column[missing] = float(np.nanmean(column)) if not missing.all() else 0.0
