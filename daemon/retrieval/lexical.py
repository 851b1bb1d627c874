"""BM25 over memory texts, with tokens that work for English and Chinese alike.

Rule kept here: a search sees exactly the documents added and not removed since, scored by plain
Okapi BM25 over the tokens `tokenize` gives; removal and replacement never leave a stale posting
that can score. Each `add` gives the text a fresh internal document id; postings refer to those
ids, so a removed or replaced document's postings are dead the moment it goes (its id is marked
dead) and are dropped lazily: a term's postings are compacted when more than half of them are
dead, and the id space is renumbered when more than half of it is dead. A term that no live
document holds any more leaves the vocabulary at once (its id is reused by a later new term), so
neither `dump` nor memory keeps a word of a removed text (a purge erases it) and churn does not
grow the vocabulary.

Scoring, for the unique query tokens t present in the index:

    score(d) = sum_t idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))          (Lucene's, never negative)

with N the number of live documents, df(t) the number of live documents containing t, |d| the
token count of d and avgdl the mean over live documents; a token repeated in the query counts
once. Results are the documents with a positive score, best first, ties broken by the smaller
label.

Evaluation is exact but not exhaustive: postings are numpy arrays (document ids ascending, term
frequencies), scored term by term from the shortest into a dense float32 array; once the k-th
best eligible score beats the most that the remaining (long, low-idf) terms could add, those terms
are only looked up for the remaining candidates by binary search (MaxScore-style pruning), and
before each lookup the candidates that even all the terms still to come could not lift to the
current k-th best are dropped. Checks and lookups are made only where they cost less than the
scan they save (the constants below). A term's impacts, tf / (tf + norm) per posting, are cached
with its postings until the next write changes the norms (the mean length moves with any write):
a read-mostly index scans a posting in ~1.5 ns instead of ~3, and bounds each term by its true
largest impact. The scores are the same either way.

The tokens are retrieval/tokens.py's (`tokenize`, and `stem_tokens` with `stem=True`).

Labels are non-negative integers assigned by the caller (the same ones the VectorStore uses);
storage is proportional to the largest label. Plain blocking Python + numpy, not thread-safe:
the memory actor serialises calls.

`dump` gives the whole index as a few flat arrays (a `LexicalDump`, saved inside tier 4's
snapshot) and `LexicalIndex.restore` takes them back without tokenising anything: at 100,000
memories that is about 0.2 s instead of 4.5 s of re-tokenising. A dump made by another tokenizer
(`TOKENIZER_VERSION`), another stemmer (`STEMMER_VERSION`; 0 in a dump of plain tokens, and in
dumps from before stemming) or other BM25 parameters is refused or restored as what it is
(`restore` keeps the dump's `stem`), and the caller rebuilds from the texts when that is not the
index it wants.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import msgspec
import numpy as np
import Stemmer

from .tokens import STEMMER_VERSION, STOP_WORDS, TOKENIZER_VERSION, stem_tokens, tokenize

__all__ = ["LexicalDump", "LexicalIndex"]


_MAX_LABEL = 2**31 - 1


_INITIAL_POSTINGS = 4


# Pruning pays only when much is left to scan: a scan costs ~1.5 ns a posting (impacts cached) to
# ~3 ns, while checking for pruning and gathering the candidates costs a pass over every document,
# and looking a candidate up in a term's postings ~15 ns (binary search). So a search checks only
# while the postings left exceed _PRUNE_MIN_POSTINGS and _PRUNE_MIN_SHARE x the documents, and
# then looks candidates up in a term only when they are fewer than 1 / _LOOKUP_RATIO of its
# postings (else it scans the term: the scores of non-candidates are never read). A check reads
# the scores of the term just scanned (~5 ns each), so it is made only when that term has under
# 1 / _CHECK_RATIO of the postings left, and after a failed check only once the terms scanned
# since could have closed half the gap it failed by. Measured at 100,000 documents, k = 100: on
# bench_retrieval's corpus p99 2.2 -> 1.1 ms (scanning everything: 1.0); on one where three words
# are in 60 % of the documents, p50 0.75 -> 0.2 ms against scanning everything.
_PRUNE_MIN_POSTINGS = 4096
_PRUNE_MIN_SHARE = 1.0
_LOOKUP_RATIO = 8
_FILTER_RATIO = 2  # filtering the candidates (~3 ns each) pays only before lookups it can make cheaper
_CHECK_RATIO = 4


# Postings hold document ids as int64 in memory (int32 in a dump): numpy converts any other index
# type before fancy indexing, which made scoring a term ~2.7x slower (4 bytes more a posting).
_DOC = np.int64


class LexicalDump(msgspec.Struct, kw_only=True):
    """A LexicalIndex as flat arrays (raw little-endian bytes), for the snapshot."""

    tokenizer: int
    stemmer: int = 0  # STEMMER_VERSION of a stemmed index, 0 for plain tokens (and older dumps)
    k1: float
    b: float
    vocab: list[str]  # by term id ("" for a free id)
    post_n: bytes  # int64 per term: postings kept (dead ones included)
    post_dead: bytes  # int64 per term
    post_max_tf: bytes  # float32 per term
    post_docs: bytes  # int32, every term's postings one after the other
    post_tfs: bytes  # float32, likewise
    df: bytes  # int64 per term
    doc_label: bytes  # int64 per document id
    doc_len: bytes  # float32 per document id
    doc_live: bytes  # bool per document id
    doc_terms_n: bytes  # int64 per document id: its distinct terms, -1 for a removed one
    doc_terms: bytes  # int32, every live document's term ids one after the other
    n_dead: int
    label_doc: bytes  # int64 per label up to the highest
    total_len: float


class _Postings:
    """One term's postings: growable arrays of document ids (strictly ascending: ids are handed
    out in increasing order and compaction keeps the order) and term frequencies, plus an upper
    bound of the frequencies (for pruning), and the cached impacts (`LexicalIndex._impacts`)."""

    __slots__ = ("docs", "tfs", "n", "dead", "max_tf", "imp", "imp_max", "imp_version")

    def __init__(self, docs: np.ndarray, tfs: np.ndarray, n: int) -> None:
        self.docs = docs
        self.tfs = tfs
        self.n = n
        self.dead = 0
        self.max_tf = float(tfs[:n].max()) if n else 0.0
        self.forget_impacts()

    def forget_impacts(self) -> None:
        self.imp: np.ndarray | None = None  # tf / (tf + norm[doc]) per posting, for one version of the norms
        self.imp_max = 0.0  # the largest of them
        self.imp_version = -1  # the norms' version they were computed for (-1: none)

    def append(self, doc: int, tf: int) -> None:
        if self.n == self.docs.shape[0]:
            cap = max(_INITIAL_POSTINGS, 2 * self.n)
            self.docs = _grown(self.docs[: self.n], cap, 0)
            self.tfs = _grown(self.tfs[: self.n], cap, 0)
        self.docs[self.n] = doc
        self.tfs[self.n] = tf
        self.n += 1
        if tf > self.max_tf:
            self.max_tf = float(tf)
        self.forget_impacts()

    def extend(self, docs: np.ndarray, tfs: np.ndarray) -> None:
        self.docs = np.concatenate((self.docs[: self.n], docs))
        self.tfs = np.concatenate((self.tfs[: self.n], tfs))
        self.n = self.docs.shape[0]
        if tfs.size:
            self.max_tf = max(self.max_tf, float(tfs.max()))
        self.forget_impacts()


class LexicalIndex:
    """BM25 (Okapi, Lucene's idf) over one text per label. See the module docstring."""

    def __init__(
        self, k1: float = 1.2, b: float = 0.75, *, stop_words: Iterable[str] | None = None, stem: bool = False
    ) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self.stop_words = STOP_WORDS if stop_words is None else frozenset(stop_words)
        self.stem = stem  # tokens by their Snowball stems (see the module docstring)
        self._stemmer = Stemmer.Stemmer("english")  # this index's own: PyStemmer objects are not thread-safe
        # per term id
        self._vocab: dict[str, int] = {}
        self._terms: list[str | None] = []  # by term id; None for a free id
        self._free_terms: list[int] = []  # ids of terms no live document holds, reused first
        self._post: list[_Postings | None] = []
        self._df = np.zeros(1024, dtype=np.int64)  # live documents containing the term
        # per internal document id
        self._doc_label = np.zeros(1024, dtype=np.int64)
        self._doc_len = np.zeros(1024, dtype=np.float32)
        self._doc_live = np.zeros(1024, dtype=bool)
        self._doc_terms: list[np.ndarray | None] = []  # unique term ids of each document
        self._n_docs = 0  # ids handed out
        self._n_dead = 0
        # per label
        self._label_doc = np.full(1024, -1, dtype=np.int64)
        self._hi = 0
        self._count = 0
        self._total_len = 0.0
        self._norm: np.ndarray | None = None  # k1 * (1 - b + b * len / avgdl) per document id
        self._norm_version = 0  # bumped each time _norm is computed anew (the postings' impacts follow it)
        self._pruned = 0  # searches that skipped scanning some postings

    # -- basics ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __contains__(self, label: object) -> bool:
        try:
            i = int(label)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False
        return bool(0 <= i < self._label_doc.shape[0] and self._label_doc[i] >= 0)

    def tokenize(self, text: str) -> list[str]:
        tokens = tokenize(text, self.stop_words)
        return stem_tokens(tokens, self._stemmer) if self.stem else tokens

    def labels(self) -> np.ndarray:
        """The live labels, ascending (int64)."""
        return np.flatnonzero(self._label_doc[: self._hi] >= 0).astype(np.int64)

    def stats(self) -> dict[str, int]:
        posts = [p for p in self._post if p is not None]
        return {
            "documents": self._count,
            "terms": int((self._df[: len(self._post)] > 0).sum()),
            "postings": sum(p.n for p in posts),
            "dead_postings": sum(p.dead for p in posts),
            "pruned_searches": self._pruned,
        }

    # -- saving ---------------------------------------------------------------------------

    def dump(self) -> LexicalDump:
        """The whole index as flat arrays (see `restore`)."""
        n_terms, n_docs = len(self._post), self._n_docs
        posts = self._post
        post_n = np.fromiter((0 if p is None else p.n for p in posts), dtype=np.int64, count=n_terms)
        live_posts = [p for p in posts if p is not None and p.n]
        doc_terms = self._doc_terms
        return LexicalDump(
            tokenizer=TOKENIZER_VERSION,
            stemmer=STEMMER_VERSION if self.stem else 0,
            k1=self.k1,
            b=self.b,
            vocab=[term or "" for term in self._terms],
            post_n=post_n.tobytes(),
            post_dead=np.fromiter((0 if p is None else p.dead for p in posts), dtype=np.int64, count=n_terms).tobytes(),
            post_max_tf=np.fromiter((0.0 if p is None else p.max_tf for p in posts), dtype=np.float32, count=n_terms).tobytes(),
            post_docs=_joined([p.docs[: p.n] for p in live_posts], np.int32),
            post_tfs=_joined([p.tfs[: p.n] for p in live_posts], np.float32),
            df=self._df[:n_terms].tobytes(),
            doc_label=self._doc_label[:n_docs].tobytes(),
            doc_len=self._doc_len[:n_docs].tobytes(),
            doc_live=self._doc_live[:n_docs].tobytes(),
            doc_terms_n=np.fromiter((-1 if t is None else t.size for t in doc_terms), dtype=np.int64, count=n_docs).tobytes(),
            doc_terms=_joined([t for t in doc_terms if t is not None], np.int32),
            n_dead=self._n_dead,
            label_doc=self._label_doc[: self._hi].tobytes(),
            total_len=self._total_len,
        )

    @classmethod
    def restore(cls, dump: LexicalDump) -> LexicalIndex:
        """The index that `dump` was made of, stemmed or not as it was. ValueError when the dump is
        from another tokenizer or stemmer, or its arrays do not fit together."""
        if dump.tokenizer != TOKENIZER_VERSION:
            raise ValueError(f"the dump is from tokenizer version {dump.tokenizer}, this is {TOKENIZER_VERSION}")
        if dump.stemmer not in (0, STEMMER_VERSION):
            raise ValueError(f"the dump is from stemmer version {dump.stemmer}, this is {STEMMER_VERSION}")
        ix = cls(dump.k1, dump.b, stem=dump.stemmer != 0)
        n_terms = len(dump.vocab)
        post_n = np.frombuffer(dump.post_n, dtype=np.int64)
        post_dead = np.frombuffer(dump.post_dead, dtype=np.int64)
        post_max_tf = np.frombuffer(dump.post_max_tf, dtype=np.float32)
        docs = np.frombuffer(dump.post_docs, dtype=np.int32).astype(np.int64)  # a writable copy: postings grow in place
        tfs = np.frombuffer(dump.post_tfs, dtype=np.float32).copy()
        df = np.frombuffer(dump.df, dtype=np.int64)
        doc_label = np.frombuffer(dump.doc_label, dtype=np.int64)
        n_docs = doc_label.size
        doc_len = np.frombuffer(dump.doc_len, dtype=np.float32)
        doc_live = np.frombuffer(dump.doc_live, dtype=bool)
        doc_terms_n = np.frombuffer(dump.doc_terms_n, dtype=np.int64)
        doc_terms = np.frombuffer(dump.doc_terms, dtype=np.int32).copy()
        label_doc = np.frombuffer(dump.label_doc, dtype=np.int64)
        if not (
            post_n.size == post_dead.size == post_max_tf.size == df.size == n_terms
            and doc_len.size == doc_live.size == doc_terms_n.size == n_docs
            and int(post_n.sum()) == docs.size == tfs.size
            and int(doc_terms_n[doc_terms_n > 0].sum()) == doc_terms.size
            and len(set(dump.vocab) - {""}) == n_terms - dump.vocab.count("")
        ):
            raise ValueError("the lexical dump's arrays do not fit together")
        ix._vocab = {term: i for i, term in enumerate(dump.vocab) if term}
        ix._terms = [term or None for term in dump.vocab]
        ends = np.cumsum(post_n).tolist()
        starts = [0] + ends[:-1]
        posts: list[_Postings | None] = [None] * n_terms
        for tid, (start, end, dead, max_tf) in enumerate(zip(starts, ends, post_dead.tolist(), post_max_tf.tolist())):
            if end > start:
                p = _Postings.__new__(_Postings)
                p.docs, p.tfs, p.n, p.dead, p.max_tf = docs[start:end], tfs[start:end], end - start, dead, max_tf
                p.forget_impacts()
                posts[tid] = p
        ix._post = posts
        ix._df = _grown(df.copy(), max(1024, n_terms), 0)
        cap = max(1024, _next_pow2(n_docs))
        ix._doc_label = _grown(doc_label, cap, 0)
        ix._doc_len = _grown(doc_len, cap, 0)
        ix._doc_live = _grown(doc_live, cap, False)
        t_ends = np.cumsum(np.maximum(doc_terms_n, 0)).tolist()
        t_starts = [0] + t_ends[:-1]
        ix._doc_terms = [
            None if n < 0 else doc_terms[start:end] for n, start, end in zip(doc_terms_n.tolist(), t_starts, t_ends)
        ]
        ix._n_docs = n_docs
        ix._n_dead = dump.n_dead
        ix._label_doc = _grown(label_doc, max(1024, label_doc.size), -1)
        ix._hi = label_doc.size
        ix._count = int(doc_live.sum())
        ix._total_len = dump.total_len
        # free ids, and terms no live document holds (a dump of an older version kept them)
        ix._free_terms = [tid for tid, term in enumerate(ix._terms) if term is None]
        ix._forget_terms(np.flatnonzero(ix._df[:n_terms] <= 0))
        return ix

    # -- writes ---------------------------------------------------------------------------

    def add(self, label: int, text: str) -> None:
        """Index `text` under `label`, replacing what the label had."""
        lab = self._check_label(label)
        self.remove(lab)
        tokens = self.tokenize(text)
        counts = Counter(tokens)
        tids = self._term_ids(list(counts))
        doc = self._new_doc(lab, len(tokens), tids)
        post = self._post
        for tid, tf in zip(tids.tolist(), counts.values()):
            p = post[tid]
            if p is None:
                post[tid] = p = _Postings(
                    np.empty(_INITIAL_POSTINGS, dtype=_DOC), np.empty(_INITIAL_POSTINGS, dtype=np.float32), 0
                )
            p.append(doc, tf)
        self._df[tids] += 1

    def add_many(self, items: Iterable[tuple[int, str]]) -> None:
        """`add` for many (label, text) pairs, building postings in bulk (start-up, imports).

        A label given twice keeps its last text.
        """
        last: dict[int, str] = {}
        for label, text in items:
            last[self._check_label(label)] = text
        if not last:
            return
        for lab in last:
            self.remove(lab)
        tokens: list[str] = []
        lens: list[int] = []
        tok = self.tokenize
        for text in last.values():
            t = tok(text)
            tokens.extend(t)
            lens.append(len(t))
        n = len(last)
        tids = self._term_ids(tokens).astype(np.int64)
        local = np.repeat(np.arange(n, dtype=np.int64), lens)
        # one (term, document) pair per distinct token of a document, with its count
        keys = np.sort(tids * n + local)
        firsts = np.flatnonzero(np.append(True, keys[1:] != keys[:-1])) if keys.size else keys
        pairs = keys[firsts]
        tf = np.diff(np.append(firsts, keys.size))
        p_term, p_doc = pairs // n, pairs % n
        first_doc = self._n_docs
        # each document's distinct term ids, for removal
        by_doc = np.argsort(p_doc, kind="stable")
        doc_bounds = np.searchsorted(p_doc[by_doc], np.arange(1, n))
        doc_terms = np.split(p_term[by_doc].astype(np.int32), doc_bounds)
        for lab, length, terms in zip(last, lens, doc_terms):
            self._new_doc(lab, length, terms)
        if not pairs.size:
            return
        # postings, term by term (pairs are sorted by term, then document)
        docs = (p_doc + first_doc).astype(_DOC)
        tfs = tf.astype(np.float32)
        bounds = np.flatnonzero(np.diff(p_term)) + 1
        starts = np.concatenate(([0], bounds)).tolist()
        ends = np.concatenate((bounds, [p_term.size])).tolist()
        post = self._post
        for start, end in zip(starts, ends):
            tid = int(p_term[start])
            p = post[tid]
            if p is None:
                post[tid] = _Postings(docs[start:end].copy(), tfs[start:end].copy(), end - start)
            else:
                p.extend(docs[start:end], tfs[start:end])
        self._df[p_term[starts]] += np.asarray(ends) - np.asarray(starts)

    def coverage(self, query: str, labels: Iterable[int]) -> list[float]:
        """Each label's share of the query's distinct terms that its text holds: 0 to 1, 0 for a
        label not indexed and for a query without terms. It reads the query and that text alone,
        never N, df or avgdl, so it is the same whatever else the index holds (what search score
        calibration reads; BM25's own scores move with the collection). One binary search per
        query term over the labels' document ids (a term's postings are in ascending order)."""
        wanted = np.fromiter((int(label) for label in labels), dtype=np.int64)
        terms = list(dict.fromkeys(self.tokenize(query)))
        if not terms or not wanted.size:
            return [0.0] * int(wanted.size)
        known = (wanted >= 0) & (wanted < self._label_doc.shape[0])
        docs = np.where(known, self._label_doc[np.where(known, wanted, 0)], -1)  # -1: not indexed
        found = np.zeros(wanted.size, dtype=np.int64)
        for term in terms:
            tid = self._vocab.get(term)
            p = self._post[tid] if tid is not None else None
            if p is None:
                continue
            posted = p.docs[: p.n]
            at = np.minimum(np.searchsorted(posted, docs), p.n - 1)
            found += (posted[at] == docs) & (docs >= 0)
        result: list[float] = (found / len(terms)).tolist()
        return result

    def term_counts(self, query: str, labels: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """The query's distinct terms' BM25 idf over the live documents (0 for a term none holds),
        and each label's count of each term, (labels, terms) float64 (0 for a label not indexed):
        what a ranker reads to score candidates otherwise than BM25 does. One binary search per
        query term over the labels' document ids, as coverage."""
        return self.counts_of(list(dict.fromkeys(self.tokenize(query))), labels)

    def counts_of(self, terms: list[str], labels: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """As term_counts, for terms already tokenized (distinct)."""
        wanted = np.fromiter((int(label) for label in labels), dtype=np.int64)
        idf = np.zeros(len(terms))
        tf = np.zeros((wanted.size, len(terms)))
        if not terms or not wanted.size:
            return idf, tf
        known = (wanted >= 0) & (wanted < self._label_doc.shape[0])
        docs = np.where(known, self._label_doc[np.where(known, wanted, 0)], -1)  # -1: not indexed
        for j, term in enumerate(terms):
            tid = self._vocab.get(term)
            p = self._post[tid] if tid is not None else None
            if p is None or self._df[tid] <= 0:
                continue
            df = float(self._df[tid])
            idf[j] = math.log(1.0 + (self._count - df + 0.5) / (df + 0.5))
            posted = p.docs[: p.n]
            at = np.minimum(np.searchsorted(posted, docs), p.n - 1)
            hit = (posted[at] == docs) & (docs >= 0)
            tf[hit, j] = p.tfs[at[hit]]
        return idf, tf

    def lengths(self, labels: Iterable[int]) -> np.ndarray:
        """Each label's document length in tokens (float64; 0 for a label not indexed)."""
        wanted = np.fromiter((int(label) for label in labels), dtype=np.int64)
        known = (wanted >= 0) & (wanted < self._label_doc.shape[0])
        docs = np.where(known, self._label_doc[np.where(known, wanted, 0)], -1)
        return np.where(docs >= 0, self._doc_len[np.maximum(docs, 0)], 0.0).astype(np.float64)

    def remove(self, label: int) -> bool:
        """Forget `label`'s text. Idempotent; True if it was present."""
        if label not in self:
            return False
        lab = int(label)
        doc = int(self._label_doc[lab])
        self._label_doc[lab] = -1
        self._doc_live[doc] = False
        self._count -= 1
        self._total_len -= float(self._doc_len[doc])
        self._n_dead += 1
        self._norm = None
        tids = self._doc_terms[doc]
        self._doc_terms[doc] = None
        if tids is not None and tids.size:
            self._df[tids] -= 1
            post = self._post
            for tid in tids.tolist():
                p = post[tid]
                assert p is not None
                p.dead += 1
                if p.dead * 2 > p.n:
                    if p.dead == p.n:
                        post[tid] = None
                    else:
                        self._compact_term(p)
            self._forget_terms(tids[self._df[tids] <= 0])
        if self._n_dead * 2 > self._n_docs and self._n_dead > 1024:
            self._renumber()
        return True

    # -- search ---------------------------------------------------------------------------

    def search(
        self, query: str, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k best labels for `query` by BM25 and their scores (float32), best first.

        Only documents with a positive score come back. `allowed`: labels that may be returned.

        Exact, with MaxScore-style pruning: terms are scored from the shortest postings up; once
        the k-th best eligible score so far beats the most the remaining (frequent, low-idf)
        terms could still add, no unseen document can enter the top k, and the remaining terms
        are looked up only for the candidates (binary search in their sorted postings) instead
        of being scanned.
        """
        empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))
        if k <= 0 or self._count == 0:
            return empty
        n_live = self._count
        k1, b = self.k1, self.b
        vocab, post, dfs = self._vocab, self._post, self._df
        terms: list[tuple[float, _Postings]] = []
        for term in dict.fromkeys(self.tokenize(query)):
            tid = vocab.get(term)
            if tid is not None and dfs[tid] > 0:
                df = int(dfs[tid])
                p = post[tid]
                assert p is not None
                idf = math.log(1.0 + (n_live - df + 0.5) / (df + 0.5))
                terms.append((idf * (k1 + 1.0), p))
        if not terms:
            return empty
        ok_label: np.ndarray | None = None
        if allowed is not None:
            a = np.asarray(allowed, dtype=np.int64).reshape(-1)
            a = a[(a >= 0) & (a < self._hi)]
            if a.size == 0:
                return empty
            ok_label = np.zeros(self._hi, dtype=bool)
            ok_label[a] = True
        norm = self._norms()
        version = self._norm_version
        terms.sort(key=lambda t: t[1].n)
        # the most a term can add to a score: its largest impact when they are cached for these
        # norms, else a looser bound (tf / (tf + norm) grows with tf, and norm >= k1 (1 - b))
        bounds = [
            c * (p.imp_max if p.imp_version == version else p.max_tf / (p.max_tf + k1 * (1.0 - b))) for c, p in terms
        ]
        remaining_bound = sum(bounds)
        remaining_postings = sum(p.n for _, p in terms)
        scores = np.zeros(self._n_docs, dtype=np.float32)
        touched: list[np.ndarray] = []
        touched_n = 0
        cand: np.ndarray | None = None
        gained, wait_for = 0.0, 0.0  # bounds scanned since the last failed check; how much the next waits for
        i = 0
        while i < len(terms):
            c, p = terms[i]
            docs = p.docs[: p.n]
            # np.add.at: the same sums as a fancy-index add (a term lists each document once), faster
            np.add.at(scores, docs, np.float32(c) * self._impacts(p, norm))
            touched.append(docs)
            touched_n += p.n
            remaining_bound -= bounds[i]
            gained += bounds[i]
            remaining_postings -= p.n
            i += 1
            if (
                i == len(terms)
                or remaining_postings < max(_PRUNE_MIN_POSTINGS, _PRUNE_MIN_SHARE * self._n_docs)
                or p.n * _CHECK_RATIO > remaining_postings
                or gained < wait_for
            ):
                continue  # scanning the rest costs little more than checking and gathering candidates would
            # theta: the k-th best score so far among the documents of the term just scanned, a
            # lower bound of the final k-th best (scores only grow) that costs O(its postings),
            # not O(every document); the candidates are gathered only once it allows pruning
            sample = self._eligible(docs, ok_label)
            if sample.size >= k:
                theta = float(np.partition(scores[sample], sample.size - k)[sample.size - k])
                if remaining_bound * (1.0 + 1e-5) < theta:
                    # unseen documents score at most remaining_bound < theta: candidates only (a
                    # candidate scores > 0 already, as theta - remaining_bound > 0)
                    cand = np.flatnonzero(scores >= np.float32(theta - remaining_bound * (1.0 + 1e-5)))
                    cand = self._eligible(cand, ok_label)
                    self._pruned += 1
                    break
                # failed by (remaining_bound - theta): theta may grow, and remaining_bound shrinks, by
                # at most the bounds of the terms scanned next; wait until they could close the gap
                gained, wait_for = 0.0, (remaining_bound - theta) * 0.5
        if cand is not None:
            for j in range(i, len(terms)):
                c, p = terms[j]
                docs = p.docs[: p.n]
                if cand.size > k and cand.size * _FILTER_RATIO <= p.n:
                    # the k-th best candidate score so far is a tighter theta (scores only grow):
                    # drop the candidates that even every remaining term could not lift to it,
                    # before looking them up in this (longer) term
                    theta = float(np.partition(scores[cand], cand.size - k)[cand.size - k])
                    cand = cand[scores[cand] + np.float32(remaining_bound * (1.0 + 1e-5)) >= theta]
                remaining_bound -= bounds[j]
                if cand.size * _LOOKUP_RATIO > p.n:  # scanning the term is cheaper than the lookups
                    np.add.at(scores, docs, np.float32(c) * self._impacts(p, norm))
                    continue
                pos = np.searchsorted(docs, cand)
                pos[pos == p.n] = 0
                hit = docs[pos] == cand
                d, at = cand[hit], pos[hit]
                if p.imp_version == version:
                    scores[d] += np.float32(c) * p.imp[at]  # type: ignore[index]
                else:  # only these few: computing the whole term's impacts would cost its scan
                    tf = p.tfs[at]
                    scores[d] += np.float32(c) * tf / (tf + norm[d])
        else:
            cand = self._eligible(self._touched(touched, touched_n, scores), ok_label)
        return _top(self._doc_label[cand], scores[cand], k)

    def _impacts(self, p: _Postings, norm: np.ndarray) -> np.ndarray:
        """tf / (tf + norm[doc]) for each of `p`'s postings (float32), cached in `p` until the norms
        change (any write: the mean length moves) or the postings do: a search that finds them cached
        skips a gather, an add and a division per posting, and bounds the term by its true maximum."""
        if p.imp_version != self._norm_version or p.imp is None:
            docs, tfs = p.docs[: p.n], p.tfs[: p.n]
            p.imp = imp = tfs / (tfs + norm[docs])
            p.imp_max = float(imp.max()) if p.n else 0.0
            p.imp_version = self._norm_version
        return p.imp

    def _touched(self, touched: list[np.ndarray], touched_n: int, scores: np.ndarray) -> np.ndarray:
        """The documents the scanned postings name, ascending (sorting a few beats a full scan)."""
        if touched_n * 16 < self._n_docs:
            return _unique(np.concatenate(touched))
        return np.flatnonzero(scores > 0)  # 10x faster than on the floats themselves (numpy 2.4)

    def _eligible(self, docs: np.ndarray, ok_label: np.ndarray | None) -> np.ndarray:
        """The live documents among `docs` whose labels are allowed."""
        docs = docs[self._doc_live[docs]]
        if ok_label is not None:
            docs = docs[ok_label[self._doc_label[docs]]]
        return docs

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _check_label(label: int) -> int:
        lab = int(label)
        if not 0 <= lab <= _MAX_LABEL:
            raise ValueError(f"labels must be in [0, {_MAX_LABEL}], not {label}")
        return lab

    def _term_ids(self, tokens: list[str]) -> np.ndarray:
        """Term ids of `tokens` (int32), giving new terms free ids first, then the next ones."""
        vocab = self._vocab
        new = set(tokens).difference(vocab)
        if new:
            free, terms = self._free_terms, self._terms
            for term in sorted(new):
                if free:
                    tid = free.pop()
                    terms[tid] = term
                else:
                    tid = len(terms)
                    terms.append(term)
                    self._post.append(None)
                vocab[term] = tid
            if len(terms) > self._df.shape[0]:
                self._df = _grown(self._df, max(2 * self._df.shape[0], len(terms)), 0)
        return np.fromiter(map(vocab.__getitem__, tokens), dtype=np.int32, count=len(tokens))

    def _forget_terms(self, tids: np.ndarray) -> None:
        """Drop terms that no live document holds: out of the vocabulary, their ids free."""
        terms, vocab, post = self._terms, self._vocab, self._post
        for tid in tids.tolist():
            term = terms[tid]
            if term is None:
                continue
            del vocab[term]
            terms[tid] = None
            post[tid] = None
            self._df[tid] = 0
            self._free_terms.append(tid)

    def _new_doc(self, label: int, length: int, terms: np.ndarray) -> int:
        doc = self._n_docs
        if doc == self._doc_label.shape[0]:
            cap = 2 * doc
            self._doc_label = _grown(self._doc_label, cap, 0)
            self._doc_len = _grown(self._doc_len, cap, 0)
            self._doc_live = _grown(self._doc_live, cap, False)
        if label >= self._label_doc.shape[0]:
            self._label_doc = _grown(self._label_doc, max(2 * self._label_doc.shape[0], label + 1), -1)
        self._n_docs += 1
        self._doc_label[doc] = label
        self._doc_len[doc] = length
        self._doc_live[doc] = True
        self._doc_terms.append(terms)
        self._label_doc[label] = doc
        self._hi = max(self._hi, label + 1)
        self._count += 1
        self._total_len += length
        self._norm = None
        return doc

    def _norms(self) -> np.ndarray:
        if self._norm is None:
            avgdl = self._total_len / self._count if self._count else 1.0
            lens = self._doc_len[: self._n_docs]
            self._norm = (self.k1 * (1.0 - self.b + self.b * lens / max(avgdl, 1e-9))).astype(np.float32)
            self._norm_version += 1
        return self._norm

    def _compact_term(self, p: _Postings) -> None:
        docs, tfs = p.docs[: p.n], p.tfs[: p.n]
        keep = self._doc_live[docs]
        p.docs, p.tfs = docs[keep], tfs[keep]
        p.n = p.docs.shape[0]
        p.dead = 0
        p.max_tf = float(p.tfs.max()) if p.n else 0.0
        p.forget_impacts()

    def _renumber(self) -> None:
        """Give the live documents consecutive ids and drop every dead posting."""
        n = self._n_docs
        live = self._doc_live[:n]
        m = int(live.sum())
        remap = np.full(n, -1, dtype=np.int64)
        remap[live] = np.arange(m)
        for tid, p in enumerate(self._post):
            if p is None:
                continue
            new = remap[p.docs[: p.n]]
            keep = new >= 0
            if not keep.any():
                self._post[tid] = None
                continue
            p.docs = new[keep].astype(_DOC)
            p.tfs = p.tfs[: p.n][keep]
            p.n = p.docs.shape[0]
            p.dead = 0
            p.forget_impacts()
        cap = max(1024, _next_pow2(m))
        self._doc_label = _grown(self._doc_label[:n][live], cap, 0)
        self._doc_len = _grown(self._doc_len[:n][live], cap, 0)
        self._doc_live = _grown(np.ones(m, dtype=bool), cap, False)
        self._doc_terms = [t for t, ok in zip(self._doc_terms, live.tolist()) if ok]
        self._n_docs = m
        self._n_dead = 0
        labels = self._doc_label[:m]
        self._label_doc[:] = -1
        self._label_doc[labels] = np.arange(m)
        self._norm = None


def _joined(parts: list[np.ndarray], dtype: type) -> bytes:
    return np.concatenate(parts).astype(dtype, copy=False).tobytes() if parts else b""


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique is 15x slower in numpy 2.4: it hashes, then sorts)."""
    a = np.sort(a)
    if a.size > 1:
        a = a[np.append(True, a[1:] != a[:-1])]
    return a


def _top(labels: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score descending, then label ascending), exact also for ties at the cut."""
    if k < labels.size:
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        sel = scores >= kth
        labels, scores = labels[sel], scores[sel]
    order = np.lexsort((labels, -scores))[:k]
    return labels[order], scores[order]


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _grown(a: np.ndarray, cap: int, fill: int | bool) -> np.ndarray:
    out = np.full(max(cap, a.shape[0]), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


