"""What the conversation tier indexes: stemmed tokens, and each message's lexical and dense documents.

Rules kept here:
- Tokens are the search library's (`daemon.retrieval.tokens.tokenize`, as tier 4's: lower-cased runs
  of letters and digits, English stop words dropped, CJK runs as character bigrams), then each token
  made only of Latin letters is reduced by the Snowball English stemmer ("running", "runs" ->
  "run"). Digits, CJK bigrams and other scripts are kept as they are. The same function serves
  documents and queries, so a query and a message meet on the same stems.
- A message's lexical document is its own line plus the previous and next message of the same
  session (the message itself is what search returns); its dense document is the previous line
  plus its own. A line is "Sender (8 May 2023): text" (the role when there is no sender), so a
  question that names a speaker, or a date, finds the turn. Both documents are pure functions of
  the messages, so a late message changes its neighbours' documents and nothing else.

The tokens and the stemmer are the search library's (daemon/retrieval/tokens.py: `stemmed_tokenize`,
`LexicalIndex(stem=True)`); this module re-exports them under the names the tier has used.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable

from ..retrieval.lexical import LexicalIndex
from ..retrieval.tokens import STEMMER_VERSION, name_tokens, stem_tokens, stemmed_tokenize

__all__ = ["STEMMER_VERSION", "StemmedIndex", "date_text", "name_tokens", "stem_tokens", "stemmed_tokenize"]


_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


class StemmedIndex(LexicalIndex):
    """LexicalIndex stemmed by default (documents and queries alike); `stem=False` gives plain
    tokens (for measuring what stemming is worth)."""

    def __init__(
        self, k1: float = 1.2, b: float = 0.75, *, stop_words: Iterable[str] | None = None, stem: bool = True
    ) -> None:
        super().__init__(k1, b, stop_words=stop_words, stem=stem)

    def idf(self, term: str) -> float:
        """BM25's idf of a (stemmed) term over the live documents; 0 for a term none holds."""
        tid = self._vocab.get(term)
        df = int(self._df[tid]) if tid is not None else 0
        if df <= 0:
            return 0.0
        return math.log(1.0 + (self._count - df + 0.5) / (df + 0.5))

    def mean_length(self) -> float:
        """The mean token count of the live documents (1.0 when there are none)."""
        return self._total_len / self._count if self._count else 1.0


def date_text(timestamp: str) -> str:
    """RFC 3339 -> "8 May 2023" (English month names whatever the locale), in the timestamp's own offset."""
    try:
        d = _dt.datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    return f"{d.day} {_MONTHS[d.month - 1]} {d.year}"
