"""The sans-IO server connection (protocol/_connection.py), without sockets or an event loop: every
rule of a connection (framing, frame limit, decoding, in-flight count, back-pressure, batches, rate
limit, half-close, outbound order, per-connection order) as bytes in and bytes out."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from eurekamem.protocol import (
    ALL_TIERS,
    METHODS,
    ORDERING_KEYS,
    OUTBOUND_LIMIT,
    Call,
    ConnectionLimits,
    ProtocolError,
    ServerConnection,
)

# --- a harness: a connection whose dispatched calls wait for the test to answer them ----------------


class Harness:
    """Records dispatched calls; answers them when told (or at once, with `sync`)."""

    def __init__(
        self,
        limits: ConnectionLimits | None = None,
        *,
        sync: bool = False,
        now: float = 0.0,
        ordered: frozenset = frozenset(),
    ) -> None:
        self.sync = sync
        self.dispatched: list[tuple[Call, Any, int]] = []
        self.recorded: list[tuple[Any, Any]] = []
        self.flushes = 0
        self.conn = ServerConnection(
            limits or ConnectionLimits(),
            self._dispatch,
            now=now,
            record=lambda request, result, stamp: self.recorded.append((request, result)),
            on_output=self._flushed,
            ordered_tiers=ordered,
        )

    def _dispatch(self, call: Call, reply: Any, stamp: int) -> None:
        self.dispatched.append((call, reply, stamp))
        if self.sync:
            reply.deliver(call, {"echo": call.spec.name}, stamp)

    def _flushed(self) -> None:
        self.flushes += 1

    def send(self, *messages: Any, now: float = 0.0) -> None:
        self.conn.receive_data(b"".join(_line(m) for m in messages), now)

    def ids(self) -> list[Any]:
        """The ids of the dispatched calls, in dispatch order (None for a notification)."""
        return [None if call.id is UNSET else call.id for call, _, _ in self.dispatched]

    def answer(self, request_id: Any, result: Any = None) -> None:
        """Deliver (and flush) the answer to the dispatched call with this id."""
        for call, reply, stamp in self.dispatched:
            if call.id == request_id or (request_id is None and call.id is UNSET):
                reply.deliver(call, {"ok": request_id} if result is None else result, stamp)
                reply.flush()
                return
        raise AssertionError(f"{request_id!r} was not dispatched (dispatched: {self.ids()})")

    def take(self) -> list[Any]:
        """The answers written so far (NDJSON), and clear them."""
        lines = bytes(self.conn.outbound).split(b"\n")
        assert lines[-1] == b""
        self.conn.outbound.clear()
        return [json.loads(line) for line in lines[:-1]]


def _line(message: Any) -> bytes:
    return message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"


def req(request_id: Any, method: str, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return message


ADD = {"domain": "d", "category": "fact", "title": "t", "content": "c"}


def add(request_id: Any) -> dict[str, Any]:
    return req(request_id, "memory.add", **ADD)


def search(request_id: Any) -> dict[str, Any]:
    return req(request_id, "memory.search", query="q")


def remember(request_id: Any) -> dict[str, Any]:
    return req(request_id, "persistent.remember", key="k", value=1)


def recall(request_id: Any) -> dict[str, Any]:
    return req(request_id, "persistent.recall", key="k")


def kind(answer: dict[str, Any]) -> str:
    return answer["error"]["data"]["kind"]


# --- framing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", [b"{", b"[", b" ", b"\t", b"\r", b"\n"])
def test_json_first_bytes_choose_ndjson(first: bytes) -> None:
    h = Harness(sync=True)
    h.conn.receive_data(first)
    assert h.conn.framing == "ndjson" and not h.conn.framing_error


def test_a_zero_first_byte_chooses_binary_frames() -> None:
    h = Harness(sync=True)
    body = msgspec.msgpack.encode(req(1, "sys.ping"))
    h.conn.receive_data(len(body).to_bytes(4, "big") + body)
    assert h.conn.framing == "binary"
    size = int.from_bytes(h.conn.outbound[:4], "big")
    answer = msgspec.msgpack.decode(h.conn.outbound[4 : 4 + size])
    assert answer == {"jsonrpc": "2.0", "id": 1, "result": {"echo": "sys.ping"}}


def test_an_unknown_first_byte_gets_one_error_line_and_ends_the_connection() -> None:
    h = Harness(sync=True)
    h.conn.receive_data(b"")  # nothing yet: no framing chosen
    assert h.conn.framing is None and not h.conn.outbound
    h.conn.receive_data(b'GET / HTTP/1.1\r\n{"id":1,"method":"sys.ping"}\n')
    assert h.conn.framing_error and h.conn.closed and h.conn.finished
    [answer] = h.take()
    assert answer["id"] is None and kind(answer) == "parse_error" and "0x47" in answer["error"]["message"]
    h.conn.receive_data(b'{"id":2,"method":"sys.ping"}\n')  # ignored: the connection is over
    assert h.dispatched == [] and not h.conn.outbound


# --- the frame limit --------------------------------------------------------------------------------


def test_an_oversized_line_is_skipped_as_it_arrives_and_answered_once() -> None:
    h = Harness(ConnectionLimits(max_frame_bytes=100), sync=True)
    big = b'{"id":1,"method":"sys.ping","params":{"pad":"' + b"x" * 5000 + b'"}}\n'
    for i in range(0, len(big), 7):  # never more than the limit held
        h.conn.receive_data(big[i : i + 7])
        assert h.conn.pending_bytes <= 100
    h.send(req(2, "sys.ping"))
    too_large, pong = h.take()
    assert too_large["id"] is None and kind(too_large) == "too_large"
    assert too_large["error"]["data"]["limit"] == 100 and "over the limit of 100" in too_large["error"]["message"]
    assert pong == {"jsonrpc": "2.0", "id": 2, "result": {"echo": "sys.ping"}}
    assert h.conn.owed == 0 and [c.spec.name for c, _, _ in h.dispatched] == ["sys.ping"]


def test_an_oversized_binary_frame_is_skipped_and_the_next_one_served() -> None:
    h = Harness(ConnectionLimits(max_frame_bytes=100), sync=True)
    ping = msgspec.msgpack.encode(req(2, "sys.ping"))
    data = len(ping).to_bytes(4, "big") + ping + (10_000).to_bytes(4, "big") + b"\x00" * 10_000
    data += len(ping).to_bytes(4, "big") + ping
    for i in range(0, len(data), 333):
        h.conn.receive_data(data[i : i + 333])
        assert h.conn.pending_bytes <= 104
    out = bytes(h.conn.outbound)
    answers = []
    while out:
        size = int.from_bytes(out[:4], "big")
        answers.append(msgspec.msgpack.decode(out[4 : 4 + size]))
        out = out[4 + size :]
    assert [a.get("result") for a in answers] == [{"echo": "sys.ping"}, None, {"echo": "sys.ping"}]
    assert answers[1]["error"]["data"] == {"kind": "too_large", "limit": 100}


# --- decoding: calls, or an error answered at once ------------------------------------------------------


def test_requests_that_cannot_run_are_answered_at_once_and_never_dispatched() -> None:
    h = Harness()
    h.send(
        b"{not json\n",
        req(1, "no.such"),
        req(2, "persistent.recall", key=5),
        {"id": 3, "params": {}},
        req(None, "no.such"),  # a notification: no answer even for an error
        b"  \r\n",  # blank lines are skipped
    )
    answers = h.take()
    assert [(a["id"], kind(a)) for a in answers] == [
        (None, "parse_error"),
        (1, "method_not_found"),
        (2, "invalid_params"),
        (3, "invalid_request"),
    ]
    assert h.dispatched == [] and h.conn.owed == 0
    assert [type(request).__name__ for request, _ in h.recorded] == ["Rejected"] * 5


def test_a_notification_is_run_but_its_answer_is_never_written() -> None:
    h = Harness()
    h.send(req(None, "persistent.recall", key="k"))
    assert h.conn.owed == 1 and len(h.dispatched) == 1
    call, reply, stamp = h.dispatched[0]
    reply.deliver(call, ProtocolError("not_found", "no"), stamp)
    assert h.conn.owed == 0 and not h.conn.outbound and len(h.recorded) == 1


def test_an_answer_that_cannot_be_encoded_becomes_internal() -> None:
    h = Harness()
    h.send(req(1, "sys.ping"))
    h.answer(1, {"bad": object()})
    [answer] = h.take()
    assert answer["id"] == 1 and kind(answer) == "internal"


# --- answers: in delivery order ------------------------------------------------------------------------


def test_answers_are_written_in_the_order_they_are_delivered() -> None:
    h = Harness()
    h.send(req(1, "persistent.recall", key="a"), req(2, "graph.stats"), req(3, "memory.list"))
    assert h.ids() == [1, 2, 3]
    flushes = h.flushes
    for request_id in (3, 1, 2):
        h.answer(request_id)
    assert [a["id"] for a in h.take()] == [3, 1, 2]
    assert h.flushes == flushes + 3  # each reply.flush() reaches the caller's on_output


# --- batches ------------------------------------------------------------------------------------------


def test_a_batch_is_answered_as_one_array_once_every_element_is() -> None:
    h = Harness()
    h.send([req(1, "sys.ping"), req(None, "sys.ping"), req(2, "no.such"), req(3, "persistent.recall", key="k")])
    assert h.ids() == [1, None, 3] and h.conn.owed == 1  # a batch owes one answer
    h.answer(3)
    h.answer(None)
    assert not h.conn.outbound
    h.answer(1)
    [array] = h.take()
    assert [(a["id"], "result" in a) for a in array] == [(2, False), (3, True), (1, True)]
    assert h.conn.owed == 0


def test_batches_of_notifications_and_empty_batches() -> None:
    h = Harness(sync=True)
    h.send([req(None, "sys.ping"), req(None, "sys.ping")])
    assert not h.conn.outbound and h.conn.owed == 0 and len(h.dispatched) == 2
    h.send([])
    [answer] = h.take()
    assert not isinstance(answer, list) and answer["id"] is None and kind(answer) == "invalid_request"


# --- in flight, overloaded, back-pressure -------------------------------------------------------------


def test_past_max_inflight_requests_are_answered_overloaded_at_once() -> None:
    h = Harness(ConnectionLimits(max_inflight=4))
    h.send(*[req(i, "persistent.recall", key="k") for i in range(6)])
    assert h.ids() == [0, 1, 2, 3] and h.conn.owed == 4
    assert [(a["id"], kind(a)) for a in h.take()] == [(4, "overloaded"), (5, "overloaded")]
    h.send([req(10, "sys.ping"), req(11, "sys.ping")])  # a batch over the limit: each element refused
    [array] = h.take()
    assert [kind(a) for a in array] == ["overloaded", "overloaded"]
    h.answer(0)
    h.send(req(6, "persistent.recall", key="k"))  # room again
    assert h.ids()[-1] == 6
    assert h.conn.owed == 4 and not h.conn.reading_paused  # the refused ones owe nothing


def test_reading_pauses_while_too_many_answer_bytes_are_unsent() -> None:
    h = Harness()
    h.send(*[req(i, "persistent.recall", key="k") for i in range(5)])
    big = {"blob": "x" * (OUTBOUND_LIMIT // 4 - 100)}
    for i in range(4):
        h.answer(i, big)
        assert not h.conn.reading_paused
    h.answer(4, big)
    assert h.conn.reading_paused
    del h.conn.outbound[: len(h.conn.outbound) - OUTBOUND_LIMIT]  # the caller sent some of it
    assert not h.conn.reading_paused


def test_reading_pauses_at_twice_max_inflight_owed() -> None:
    """The overloaded rule keeps `owed` at most max_inflight through receive_data; the pause is for
    a connection whose owed count is past it anyway (max_inflight 0: every request refused)."""
    h = Harness(ConnectionLimits(max_inflight=0))
    assert h.conn.reading_paused
    h = Harness(ConnectionLimits(max_inflight=2))
    h.send(*[req(i, "persistent.recall", key="k") for i in range(10)])
    assert h.conn.owed == 2 and not h.conn.reading_paused


# --- the rate limit, on an injected clock --------------------------------------------------------------


def test_the_token_bucket_refuses_the_excess_then_refills() -> None:
    h = Harness(ConnectionLimits(max_requests_per_second=10, request_burst=5), sync=True, now=100.0)
    assert h.conn.rate_limiter is not None
    h.send(*[req(i, "sys.ping") for i in range(8)], now=100.0)
    answers = h.take()
    assert ["result" in a for a in answers] == [True] * 5 + [False] * 3
    assert kind(answers[5]) == "overloaded" and answers[5]["error"]["code"] == -32029
    assert answers[5]["error"]["message"].startswith("rate limit: 10 requests/s per connection (bursts of 5)")
    assert answers[5]["error"]["data"] == {"kind": "overloaded", "limit": 10, "burst": 5}
    assert h.conn.rate_limited == 3 and len(h.dispatched) == 5
    h.send(*[req(i, "sys.ping") for i in range(3)], now=100.2)  # two tokens back
    assert ["result" in a for a in h.take()] == [True, True, False]
    for i in range(20):  # a steady 10/s passes
        h.send(req(i, "sys.ping"), now=100.3 + i * 0.1)
    assert all("result" in a for a in h.take())
    h.send(*[req(i, "sys.ping") for i in range(7)], now=1000.0)  # after a long pause: one burst
    assert ["result" in a for a in h.take()] == [True] * 5 + [False] * 2
    h.send([req(i, "sys.ping") for i in range(5)], now=1000.3)  # each element of a batch counts
    [array] = h.take()
    assert sorted("result" in a for a in array) == [False, False, True, True, True]
    assert h.conn.rate_limited == 8


def test_without_a_rate_limit_nothing_is_refused() -> None:
    h = Harness(sync=True)
    assert h.conn.rate_limiter is None
    h.send(*[req(i, "sys.ping") for i in range(1000)])
    assert len(h.take()) == 1000 and h.conn.rate_limited == 0


# --- half-close -------------------------------------------------------------------------------------


def test_after_eof_everything_received_is_still_answered_then_finished() -> None:
    h = Harness()
    h.send(req(1, "persistent.recall", key="k"), b'{"id":2,"method":"sys.pi')  # the last frame is cut
    h.conn.receive_eof()
    assert not h.conn.finished  # one answer owed
    with pytest.raises(RuntimeError):
        h.conn.receive_data(b'ng"}\n')
    h.answer(1)
    assert h.conn.finished and [a["id"] for a in h.take()] == [1]


def test_a_lost_connection_drops_its_output_and_its_held_requests() -> None:
    h = Harness()
    h.send(add(1), search(2))
    assert h.ids() == [1] and h.conn.held == 1
    h.conn.outbound += b"unsent"
    h.conn.connection_lost()
    assert h.conn.finished and not h.conn.outbound and h.conn.held == 0
    h.answer(1)  # an actor still answers: nothing is written, nothing released
    assert h.ids() == [1] and not h.conn.outbound
    h.conn.receive_data(b'{"id":3,"method":"sys.ping"}\n')
    assert h.ids() == [1]


# --- split anywhere -----------------------------------------------------------------------------------

_MESSAGES = st.sampled_from(
    [
        req(1, "sys.ping"),
        req("s", "persistent.recall", key="k"),
        req(None, "episodic.log", session_id="s", agent_role="r", content="é\\n"),
        [req(2, "sys.ping"), req(3, "graph.stats")],
        [],
        req(4, "no.such"),
        b"{oops\n",
        b"\r\n",
        req(5, "memory.add", **ADD),
        req(6, "memory.search", query="q"),
        req(7, "sys.stats"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(_MESSAGES, min_size=1, max_size=12), binary=st.booleans(), data=st.data())
def test_bytes_split_anywhere_give_the_same_calls_and_answers(messages: list[Any], binary: bool, data: Any) -> None:
    if binary:
        encoded = [
            msgspec.msgpack.encode(m) if not isinstance(m, bytes) else m.strip() or b"\xc1" for m in messages
        ]
        stream = b"".join(len(body).to_bytes(4, "big") + body for body in encoded)
    else:
        stream = b"".join(_line(m) for m in messages)
    whole = Harness(sync=True)
    whole.conn.receive_data(stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    split = Harness(sync=True)
    for start, stop in zip([0] + cuts, cuts + [len(stream)]):
        split.conn.receive_data(stream[start:stop])
    assert split.ids() == whole.ids()
    assert bytes(split.conn.outbound) == bytes(whole.conn.outbound)
    assert split.conn.owed == whole.conn.owed == 0


# --- per-connection order ------------------------------------------------------------------------------


def test_every_method_has_an_ordering_key_and_no_sys_method_writes() -> None:
    assert set(ORDERING_KEYS) == set(METHODS)
    for name, spec in METHODS.items():
        key = ORDERING_KEYS[name]
        if spec.tier == "sys":
            assert not spec.writes and key in (None, ALL_TIERS)
        elif any(s.writes for s in METHODS.values() if s.tier == spec.tier):
            assert key == spec.tier
        else:
            assert key is None  # tier 1: nothing written, its actor keeps arrival order
    assert ORDERING_KEYS["sys.ping"] is ORDERING_KEYS["sys.hello"] is None
    assert ORDERING_KEYS["sys.stats"] == ORDERING_KEYS["sys.snapshot"] == ALL_TIERS


def test_a_read_waits_for_an_earlier_write_to_its_tier() -> None:
    h = Harness()
    h.send(add(1), search(2), req(3, "memory.get", id="x"))
    assert h.ids() == [1] and h.conn.held == 2 and h.conn.owed == 3
    h.answer(1)
    assert h.ids() == [1, 2, 3] and h.conn.held == 0


def test_writes_to_one_tier_are_not_held() -> None:
    h = Harness()
    h.send(add(1), add(2), req(3, "memory.delete", id="x"), remember(4), remember(5))
    assert h.ids() == [1, 2, 3, 4, 5] and h.conn.held == 0


def test_other_tiers_and_tierless_methods_are_not_held() -> None:
    h = Harness()
    h.send(add(1), recall(2), req(3, "sys.ping"), req(4, "sys.hello"), req(5, "graph.stats"))
    h.send(req(6, "episodic.log", session_id="s", agent_role="r", content="c"))
    h.send(req(7, "episodic.recent", session_id="s"))
    assert h.ids() == [1, 2, 3, 4, 5, 6, 7]


def test_a_write_waits_for_an_earlier_read_of_its_tier() -> None:
    h = Harness()
    h.send(search(1), add(2), recall(3))
    assert h.ids() == [1, 3] and h.conn.held == 1
    h.answer(3)
    assert h.ids() == [1, 3]
    h.answer(1)
    assert h.ids() == [1, 3, 2]


def test_a_held_read_never_sees_a_write_sent_after_it() -> None:
    h = Harness()
    h.send(add(1), search(2), add(3), search(4))
    assert h.ids() == [1]
    h.answer(1)
    assert h.ids() == [1, 2]  # the second add waits for the search before it
    h.answer(2)
    assert h.ids() == [1, 2, 3]
    h.answer(3)
    assert h.ids() == [1, 2, 3, 4] and h.conn.held == 0


def test_requests_spanning_tiers_wait_for_every_earlier_write() -> None:
    h = Harness()
    theorem = req(5, "graph.add_theorem", theorem_name="T", formal_statement="S")
    h.send(add(1), remember(2), req(3, "sys.stats"), recall(4), theorem)
    assert h.ids() == [1, 2] and h.conn.held == 3  # the recall waits for 2, the theorem for sys.stats
    h.answer(2)
    assert h.ids() == [1, 2, 4]
    h.answer(1)
    assert h.ids() == [1, 2, 4, 3]  # sys.stats now; the write after it waits for its answer
    h.answer(3)
    assert h.ids() == [1, 2, 4, 3, 5]


def test_sys_stats_answered_at_once_releases_the_writes_behind_it() -> None:
    h = Harness()
    h.send(add(1), req(2, "sys.stats"), remember(3))
    assert h.ids() == [1]
    h.sync = True  # sys.stats and then the remember answer during the release
    h.answer(1)
    assert h.ids() == [1, 2, 3] and h.conn.held == 0 and h.conn.owed == 0


def test_held_requests_are_released_oldest_first() -> None:
    h = Harness()
    h.send(add(1), remember(2))
    h.send(recall(3), search(4), recall(5), search(6))
    assert h.ids() == [1, 2]
    h.sync = True
    h.answer(2)
    assert h.ids() == [1, 2, 3, 5]
    h.answer(1)
    assert h.ids() == [1, 2, 3, 5, 4, 6]


def test_the_elements_of_a_batch_are_ordered_in_array_order() -> None:
    h = Harness()
    h.send([add(1), search(2), req(3, "sys.ping")])
    assert h.ids() == [1, 3]
    h.answer(3)
    h.answer(1)
    assert h.ids() == [1, 3, 2] and not h.conn.outbound
    h.answer(2)
    [array] = h.take()
    assert [a["id"] for a in array] == [3, 1, 2]


def test_a_write_answered_as_an_error_releases_too() -> None:
    h = Harness()
    h.send(remember(1), recall(2))
    h.answer(1, ProtocolError("read_only", "disk full"))
    assert h.ids() == [1, 2]
    assert kind(h.take()[0]) == "read_only"


def test_a_tier_that_keeps_order_itself_is_not_held_within_itself() -> None:
    h = Harness(ordered=frozenset({"persistent"}))
    h.send(remember(1), recall(2), remember(3), recall(4), add(5), search(6))
    assert h.ids() == [1, 2, 3, 4, 5]  # its executor runs them in this order; tier 4 still waits
    h.answer(5)
    assert h.ids() == [1, 2, 3, 4, 5, 6]


def test_a_tier_that_keeps_order_still_waits_for_requests_spanning_tiers() -> None:
    h = Harness(ordered=frozenset({"persistent"}))
    h.send(add(1), req(2, "sys.stats"), remember(3), recall(4), remember(5))
    assert h.ids() == [1]  # the remember waits for sys.stats, and the recall behind that remember
    h.answer(1)
    assert h.ids() == [1, 2]
    h.answer(2)
    assert h.ids() == [1, 2, 3, 4, 5]
    h.send(req(6, "sys.stats"))
    assert h.ids()[-1] == 5  # sys.stats waits for the two remembers
    h.answer(3)
    h.answer(5)
    assert h.ids()[-1] == 6


# A model of the rule, checked on random pipelines answered in random orders.

_POOL = {
    "memory.add": ADD,
    "memory.search": {"query": "q"},
    "persistent.remember": {"key": "k", "value": 1},
    "persistent.recall": {"key": "k"},
    "graph.stats": {},
    "sys.stats": {},
    "sys.ping": {},
}


def _must_wait(earlier: str, later: str, ordered: frozenset) -> str | None:
    """What `later` must wait for of an `earlier` request: "answer", "dispatch" (only to come after
    it, for writes to one tier and within a tier that keeps order itself), or None."""
    a, b = ORDERING_KEYS[earlier], ORDERING_KEYS[later]
    if a is None or b is None:
        return None
    writes_a, writes_b = METHODS[earlier].writes, METHODS[later].writes
    if not (writes_a or writes_b) or (a != b and ALL_TIERS not in (a, b)):
        return None
    if ALL_TIERS in (a, b):
        return "answer"
    return "dispatch" if (writes_a and writes_b) or a in ordered else "answer"


@settings(max_examples=400, deadline=None)
@given(
    methods=st.lists(st.sampled_from(sorted(_POOL)), min_size=1, max_size=25),
    batches=st.lists(st.integers(1, 4), max_size=10),
    ordered=st.frozensets(st.sampled_from(["persistent", "memory"])),
    data=st.data(),
)
def test_random_pipelines_keep_the_rule_and_all_run(
    methods: list[str], batches: list[int], ordered: frozenset, data: Any
) -> None:
    answered: set[int] = set()
    order: list[int] = []

    def check(call: Call, reply: Any, stamp: int) -> None:
        i = call.id
        for j in range(i):
            wait = _must_wait(methods[j], methods[i], ordered)
            if wait == "answer":
                assert j in answered, f"{i} {methods[i]} dispatched before {j} {methods[j]} was answered"
            elif wait == "dispatch":
                assert j in order, f"{i} {methods[i]} dispatched before the earlier {j} {methods[j]}"
        order.append(i)

    h = Harness(ordered=ordered)
    def checked(call: Call, reply: Any, stamp: int) -> None:
        check(call, reply, stamp)
        h.dispatched.append((call, reply, stamp))

    h.conn._dispatch = checked  # type: ignore[assignment]
    frames: list[Any] = []
    i = 0
    sizes = iter(batches)
    while i < len(methods):  # some requests go in batches
        size = next(sizes, 1)
        group = [req(j, methods[j], **_POOL[methods[j]]) for j in range(i, min(len(methods), i + size))]
        frames.append(group if size > 1 else group[0])
        i += len(group)
    h.send(*frames)
    while len(answered) < len(methods):
        pending = [call.id for call, _, _ in h.dispatched if call.id not in answered]
        assert pending, f"nothing runs, {h.conn.held} held: {methods}"
        choice = data.draw(st.sampled_from(pending))
        answered.add(choice)
        h.answer(choice)
    assert sorted(order) == list(range(len(methods))) and h.conn.held == 0 and h.conn.owed == 0
