"""The JSON-RPC envelope in both encodings: frames become Calls or Rejecteds with the contract's
error kinds; replies encode and decode back; no input makes Codec.decode raise."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from eurekamem.protocol import (
    ERROR_CODES,
    METHODS,
    Call,
    Codec,
    NdjsonDecoder,
    ProtocolError,
    Rejected,
    failure,
    framing_error_line,
    success,
)
from eurekamem.protocol import methods as m

FAST = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(FAST, max_examples=80)

FRAMINGS = ("ndjson", "binary")


@pytest.fixture(params=FRAMINGS)
def codec(request) -> Codec:
    return Codec(request.param)


def encode(codec: Codec, obj: Any) -> bytes:
    """An envelope object as one frame's payload (no framing) in the codec's encoding."""
    return (msgspec.json if codec.framing == "ndjson" else msgspec.msgpack).encode(obj)


def unframe(codec: Codec, data: bytes) -> Any:
    if codec.framing == "ndjson":
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        return msgspec.json.decode(data[:-1])
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return msgspec.msgpack.decode(data[4:])


def one(codec: Codec, obj: Any) -> Call | Rejected:
    items, batch = codec.decode(encode(codec, obj))
    assert not batch and len(items) == 1
    return items[0]


def rejected(codec: Codec, obj: Any, kind: str) -> Rejected:
    item = one(codec, obj)
    assert isinstance(item, Rejected), item
    assert item.error.kind == kind, item.error
    assert item.error.code == ERROR_CODES[kind]
    return item


def req(method: str, params: Any = UNSET, id: Any = 1) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id is not UNSET:
        out["id"] = id
    if params is not UNSET:
        out["params"] = params
    return out


# --- valid requests -----------------------------------------------------------------------------


def _minimal(tp: Any) -> Any:
    """The smallest valid value of a msgspec type (for params of methods added later)."""
    t = msgspec.inspect
    if isinstance(tp, t.StructType):
        return {f.encode_name: _minimal(f.type) for f in tp.fields if f.required}
    if isinstance(tp, t.StrType):
        return "x" * (tp.min_length or 1)
    if isinstance(tp, t.IntType):
        return tp.ge if tp.ge is not None else 1
    if isinstance(tp, t.FloatType):
        return tp.ge if tp.ge is not None else 0.5
    if isinstance(tp, t.BoolType):
        return True
    if isinstance(tp, t.LiteralType):
        return tp.values[0]
    if isinstance(tp, t.ListType):
        return [_minimal(tp.item_type)] * (tp.min_length or 0)
    if isinstance(tp, t.DictType):
        return {}
    if isinstance(tp, t.UnionType):
        return _minimal(next(x for x in tp.types if not isinstance(x, t.NoneType)))
    return None  # Any, None


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_decodes_minimal_params(codec, name):
    spec = METHODS[name]
    params = _minimal(msgspec.inspect.type_info(spec.params))
    call = one(codec, req(name, params, id=9))
    assert isinstance(call, Call), call
    assert call.spec is spec and isinstance(call.params, spec.params)
    assert call.id == 9 and call.wants_reply


EXAMPLES = [
    ("sys.ping", None, m.Empty, {}),
    ("episodic.log", {"session_id": "s1", "agent_role": "prover", "content": "tried induction"}, m.EpisodicLog,
     {"metadata": {}}),
    ("episodic.recent", {"session_id": "s1"}, m.EpisodicRecent, {"n": 20, "agent_role": None}),
    ("episodic.search", {"session_id": "s1", "query": "lemma", "n": 5}, m.EpisodicSearch, {"n": 5}),
    ("session.close", {"session_id": "s1", "theory_state": {"status": "proved", "extra": 1}}, m.SessionClose,
     {"extract": True, "domain": None}),
    ("persistent.remember", {"key": "a.b", "value": {"x": [1, 2.5, None]}, "tags": ["t"]}, m.PersistentRemember,
     {"value": {"x": [1, 2.5, None]}, "source_session": ""}),
    ("persistent.remember", {"key": "k", "value": None}, m.PersistentRemember, {"value": None, "tags": []}),
    ("persistent.recall", {"key": "k"}, m.PersistentKey, {"key": "k"}),
    ("persistent.keys", {}, m.PersistentKeys, {"prefix": "", "limit": 1000}),
    ("graph.add_theorem", {"theorem_name": "T", "formal_statement": "1+1=2"}, m.GraphAddTheorem, {"domain": "", "tags": []}),
    ("graph.link", {"from_id": "a", "to_id": "b"}, m.GraphLink, {"relation": "uses"}),
    ("graph.link", {"from_id": "a", "to_id": "b", "relation": "contradicts"}, m.GraphLink, {"relation": "contradicts"}),
    ("graph.related", {"node_id": "a", "depth": 0}, m.GraphRelated, {"depth": 0}),
    ("graph.search", {"tag": "algebra"}, m.GraphSearch, {"limit": 50, "query": ""}),
    ("graph.export", {"format": "graphml"}, m.GraphExport, {"format": "graphml"}),
]


@pytest.mark.parametrize(("method", "params", "struct", "expect"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_valid_request_becomes_call(codec, method, params, struct, expect):
    if method not in METHODS:
        pytest.skip(f"{method} not in METHODS")
    call = one(codec, req(method, UNSET if params is None else params, id="req-1"))
    assert isinstance(call, Call), call
    assert type(call.params) is struct and call.spec.name == method and call.id == "req-1"
    for field, value in expect.items():
        assert getattr(call.params, field) == value


def test_theory_state_unknown_fields_are_ignored(codec):
    call = one(codec, req("session.close", {"session_id": "s", "theory_state": {"status": "open", "lemma_dag": {}, "x": 1}}))
    assert isinstance(call, Call) and isinstance(call.params.theory_state, m.TheoryState)
    assert call.params.theory_state.status == "open"


def test_jsonrpc_member_may_be_left_out(codec):
    call = one(codec, {"id": 3, "method": "sys.ping"})
    assert isinstance(call, Call) and call.id == 3


def test_unknown_envelope_members_are_ignored(codec):
    assert isinstance(one(codec, {"id": 3, "method": "sys.ping", "extra": [1]}), Call)


@pytest.mark.parametrize("request_id", [0, -5, 2**62, "", "abc", None])
def test_ids_are_kept(codec, request_id):
    call = one(codec, req("sys.ping", id=request_id))
    assert isinstance(call, Call) and call.id == request_id and call.id is not UNSET
    assert call.wants_reply  # "id": null is a request, not a notification


def test_notification_wants_no_reply(codec):
    call = one(codec, req("sys.ping", id=UNSET))
    assert isinstance(call, Call) and call.id is UNSET and not call.wants_reply
    bad = one(codec, req("persistent.recall", {"key": 5}, id=UNSET))
    assert isinstance(bad, Rejected) and not bad.wants_reply
    unknown = one(codec, req("no.such", id=UNSET))
    assert isinstance(unknown, Rejected) and not unknown.wants_reply


def test_ndjson_line_with_crlf():
    codec = Codec("ndjson")
    decoder = NdjsonDecoder()
    frames = decoder.feed(b'{"id":1,"method":"sys.ping"}\r\n\r\n {"id":2,"method":"sys.ping"} \r\n')
    calls = [codec.decode(f)[0][0] for f in frames]
    assert [c.id for c in calls] == [1, 2] and all(isinstance(c, Call) for c in calls)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [b"{not json", b'{"id":1', b"", b"\xff\xfe"])
def test_parse_error_json(frame):
    items, batch = Codec("ndjson").decode(frame)
    assert not batch and len(items) == 1
    assert isinstance(items[0], Rejected) and items[0].error.kind == "parse_error" and items[0].id is None
    assert items[0].error.code == -32700


@pytest.mark.parametrize("frame", [b"\xc1", b"\x82\xa2id", b"", b"\x81\xa6method\xa8sys.ping\x00"])
def test_parse_error_msgpack(frame):
    items, batch = Codec("binary").decode(frame)
    assert not batch and len(items) == 1
    assert isinstance(items[0], Rejected) and items[0].error.kind == "parse_error" and items[0].id is None


def test_parse_error_after_a_validation_error():
    # msgspec validates while parsing: a wrong type early and garbage later is still a parse error.
    for frame in (b'{"method": 5, x', b"5 garbage", b'{"id": 1.5, "method": "sys.ping"'):
        (item,), _ = Codec("ndjson").decode(frame)
        assert isinstance(item, Rejected) and item.error.kind == "parse_error" and item.id is None
    (item,), _ = Codec("binary").decode(msgspec.msgpack.encode({"method": 5}) + b"\xc1")
    assert isinstance(item, Rejected) and item.error.kind == "parse_error"


@pytest.mark.parametrize("obj", [5, "x", None, True, 1.5])
def test_invalid_request_non_object(codec, obj):
    item = rejected(codec, obj, "invalid_request")
    assert item.id is None and item.wants_reply
    assert "object" in item.error.message


def test_invalid_request_missing_method(codec):
    item = rejected(codec, {"id": 4, "params": {}}, "invalid_request")
    assert item.id == 4 and "method" in item.error.message


def test_invalid_request_method_not_a_string(codec):
    item = rejected(codec, {"id": 4, "method": 12}, "invalid_request")
    assert item.id == 4 and "method" in item.error.message


@pytest.mark.parametrize("bad_id", [1.5, True, [1], {"a": 1}])
def test_invalid_request_bad_id_type(codec, bad_id):
    item = rejected(codec, {"id": bad_id, "method": "sys.ping"}, "invalid_request")
    assert item.id is None  # an id that is not an id is not echoed
    assert "id" in item.error.message


@pytest.mark.parametrize("version", ["1.0", "2", ""])
def test_invalid_request_wrong_jsonrpc_version(codec, version):
    item = rejected(codec, {"jsonrpc": version, "id": 8, "method": "sys.ping"}, "invalid_request")
    assert item.id == 8 and "jsonrpc" in item.error.message


def test_invalid_request_without_id_is_still_answered(codec):
    # Not a valid request object, so not a notification either (JSON-RPC 2.0 §5): answered with id null.
    for obj in ({"jsonrpc": "1.0", "method": "sys.ping"}, {"method": 5}, {"jsonrpc": 2, "method": "sys.ping"}):
        item = rejected(codec, obj, "invalid_request")
        assert item.id is None and item.wants_reply


@pytest.mark.parametrize("version", [2, 2.0, None])
def test_invalid_request_jsonrpc_not_a_string(codec, version):
    item = rejected(codec, {"jsonrpc": version, "id": 8, "method": "sys.ping"}, "invalid_request")
    assert item.id == 8 and "jsonrpc" in item.error.message


def test_invalid_request_empty_batch(codec):
    items, batch = codec.decode(encode(codec, []))
    assert not batch and len(items) == 1  # answered with a single error, not an array
    assert isinstance(items[0], Rejected) and items[0].error.kind == "invalid_request" and items[0].id is None
    assert "batch" in items[0].error.message


def test_method_not_found(codec):
    item = rejected(codec, req("nope.nothing", id=11), "method_not_found")
    assert item.id == 11 and "nope.nothing" in item.error.message
    assert item.error.to_wire()["data"] == {"kind": "method_not_found", "method": "nope.nothing"}


INVALID_PARAMS = [
    # (method, params, words the message must contain)
    ("persistent.recall", {"key": 5}, ["key", "str"]),  # wrong type
    ("persistent.recall", {}, ["key"]),  # missing field
    ("persistent.recall", {"key": "k", "colour": "red"}, ["colour"]),  # unknown field
    ("sys.ping", {"x": 1}, ["x"]),  # unknown field on an empty Struct
    ("episodic.recent", {"session_id": "s", "n": 0}, ["n", ">= 1"]),  # out of range, below
    ("episodic.recent", {"session_id": "s", "n": m.MAX_RECENT + 1}, ["n", f"<= {m.MAX_RECENT}"]),  # above
    ("graph.related", {"node_id": "a", "depth": m.MAX_DEPTH + 1}, ["depth"]),
    ("graph.related", {"node_id": "a", "depth": "2"}, ["depth"]),
    ("persistent.keys", {"limit": 0}, ["limit"]),
    ("graph.link", {"from_id": "a", "to_id": "b", "relation": "owns"}, ["relation", "owns"]),  # bad enum
    ("graph.export", {"format": "csv"}, ["format"]),
    ("persistent.recall", {"key": ""}, ["key", "length >= 1"]),  # empty string is not too large
    ("persistent.remember", {"key": "k", "value": 1, "tags": [""]}, ["tags"]),
    ("persistent.remember", {"key": "k", "value": 1, "tags": "t"}, ["tags"]),
    ("episodic.log", {"session_id": "s", "agent_role": "r", "content": "c", "metadata": []}, ["metadata"]),
    ("session.close", {"session_id": "s", "extract": "yes"}, ["extract"]),
    ("sys.ping", [], ["object"]),  # params must be an object
    ("sys.ping", None, ["object"]),
    # client text that merely looks like a length bound must not turn into too_large
    ("graph.link", {"from_id": "a", "to_id": "b", "relation": "length <= 3"}, ["relation"]),
    ("sys.ping", {"length <= 1": 1}, ["length <= 1"]),
]


@pytest.mark.parametrize(("method", "params", "words"), INVALID_PARAMS)
def test_invalid_params(codec, method, params, words):
    item = rejected(codec, req(method, params, id="p"), "invalid_params")
    assert item.id == "p"
    for word in words:
        assert word in item.error.message, (word, item.error.message)


TOO_LARGE = [
    ("persistent.recall", {"key": "k" * (m.MAX_KEY + 1)}, "key"),
    ("episodic.log", {"session_id": "s" * (m.MAX_ID + 1), "agent_role": "r", "content": ""}, "session_id"),
    ("episodic.log", {"session_id": "s", "agent_role": "r", "content": "c" * (m.MAX_TEXT + 1)}, "content"),
    ("persistent.remember", {"key": "k", "value": 1, "tags": ["t"] * (m.MAX_TAGS + 1)}, "tags"),
    ("persistent.remember", {"key": "k", "value": 1, "tags": ["t" * (m.MAX_ID + 1)]}, "tags[0]"),
    ("graph.add_theorem", {"theorem_name": "T", "formal_statement": "f" * (m.MAX_TEXT + 1)}, "formal_statement"),
]


@pytest.mark.parametrize(("method", "params", "field"), TOO_LARGE, ids=[t[2] for t in TOO_LARGE])
def test_too_large_field(codec, method, params, field):
    item = rejected(codec, req(method, params, id=2), "too_large")
    assert item.id == 2 and f"`$.{field}`" in item.error.message


def test_limits_are_inclusive(codec):
    assert isinstance(one(codec, req("persistent.recall", {"key": "k" * m.MAX_KEY})), Call)
    assert isinstance(one(codec, req("persistent.remember", {"key": "k", "value": 0, "tags": ["t" * m.MAX_ID] * m.MAX_TAGS})), Call)
    assert isinstance(one(codec, req("episodic.recent", {"session_id": "s", "n": m.MAX_RECENT})), Call)


def test_text_limit_counts_characters_not_bytes(codec):
    content = "é" * m.MAX_TEXT  # 2 MiB of UTF-8, 1 Mi characters
    assert isinstance(one(codec, req("episodic.log", {"session_id": "s", "agent_role": "r", "content": content})), Call)


@pytest.mark.parametrize("depth", [2000, 100_000])
def test_deep_nesting_is_rejected_not_raised(codec, depth):
    ndjson = codec.framing == "ndjson"
    nested = b"[" * depth + b"]" * depth if ndjson else b"\x91" * depth + b"\x90"
    frames = [nested]
    if ndjson:
        frames.append(b'{"id":1,"method":"episodic.log","params":{"session_id":"s","agent_role":"r","content":"c",'
                      b'"metadata":{"a":' + nested + b"}}}")
        frames.append(b"[" + nested + b"]")
    for frame in frames:
        items, _ = codec.decode(frame)
        assert all(isinstance(i, Rejected) and i.error.kind in ("too_large", "invalid_request") for i in items)


def test_error_codes_are_the_contract_table():
    assert ERROR_CODES == {
        "parse_error": -32700, "invalid_request": -32600, "method_not_found": -32601, "invalid_params": -32602,
        "internal": -32603, "not_found": -32004, "too_large": -32013, "unavailable": -32003,
        "overloaded": -32029, "read_only": -32030,
    }


# --- batches ------------------------------------------------------------------------------------


def test_batch(codec):
    batch = [
        req("sys.ping", id=1),
        req("sys.ping", id=UNSET),  # notification inside a batch
        req("nope", id=2),
        7,
        req("persistent.recall", {"key": 1}, id="three"),
        {"id": 4, "method": "sys.ping", "jsonrpc": "1.0"},
        {"id": 5.5, "method": "sys.ping"},
    ]
    items, is_batch = codec.decode(encode(codec, batch))
    assert is_batch and len(items) == len(batch)
    kinds = [i.error.kind if isinstance(i, Rejected) else "call" for i in items]
    assert kinds == ["call", "call", "method_not_found", "invalid_request", "invalid_params", "invalid_request",
                     "invalid_request"]
    assert [i.id for i in items] == [1, UNSET, 2, None, "three", 4, None]
    assert [i.wants_reply for i in items] == [True, False, True, True, True, True, True]


def test_batch_of_one_is_still_a_batch(codec):
    items, is_batch = codec.decode(encode(codec, [req("sys.ping", id=1)]))
    assert is_batch and len(items) == 1 and isinstance(items[0], Call)


def test_batch_that_is_not_json_is_one_parse_error():
    items, is_batch = Codec("ndjson").decode(b'[{"id":1,"method":"sys.ping"}, {')
    assert not is_batch and len(items) == 1 and items[0].error.kind == "parse_error"


# --- encoding -----------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
request_ids = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20))


@QUICK
@given(framing=st.sampled_from(FRAMINGS), request_id=request_ids, result=json_values)
def test_success_round_trip(framing, request_id, result):
    codec = Codec(framing)
    assert unframe(codec, codec.encode(success(request_id, result))) == {"jsonrpc": "2.0", "id": request_id, "result": result}


@FAST
@given(framing=st.sampled_from(FRAMINGS), request_id=request_ids, kind=st.sampled_from(sorted(ERROR_CODES)),
       message=st.text(max_size=40))
def test_failure_round_trip(framing, request_id, kind, message):
    codec = Codec(framing)
    error = ProtocolError(kind, message, field="key")
    decoded = unframe(codec, codec.encode(failure(request_id, error)))
    assert decoded == {
        "jsonrpc": "2.0", "id": request_id,
        "error": {"code": ERROR_CODES[kind], "message": message, "data": {"kind": kind, "field": "key"}},
    }


def test_batch_reply_round_trip(codec):
    replies = [success(1, {"pong": True}), failure(2, ProtocolError("not_found", "no such key"))]
    decoded = unframe(codec, codec.encode(replies))
    assert [r["id"] for r in decoded] == [1, 2]
    assert decoded[0]["result"] == {"pong": True} and decoded[1]["error"]["data"]["kind"] == "not_found"


@QUICK
@given(framing=st.sampled_from(FRAMINGS), request_id=request_ids,
       key=st.text(min_size=1, max_size=50), value=json_values, tags=st.lists(st.text(min_size=1, max_size=5), max_size=5))
def test_encode_request_round_trip(framing, request_id, key, value, tags):
    codec = Codec(framing)
    data = codec.encode_request(request_id, "persistent.remember", {"key": key, "value": value, "tags": tags})
    payload = data[:-1] if framing == "ndjson" else data[4:]
    (call,), batch = codec.decode(payload)
    assert not batch and isinstance(call, Call), call
    assert call.id == request_id and call.spec.name == "persistent.remember"
    assert (call.params.key, call.params.value, call.params.tags) == (key, value, tags)


def test_framing_error_line():
    line = framing_error_line(0x47)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    reply = msgspec.json.decode(line)
    assert reply["id"] is None and reply["jsonrpc"] == "2.0"
    assert reply["error"]["code"] == -32700 and reply["error"]["data"]["kind"] == "parse_error"
    assert "0x47" in reply["error"]["message"]


def test_unknown_framing_name():
    with pytest.raises(ValueError):
        Codec("xml")


# --- never raises -------------------------------------------------------------------------------


def check_total(codec: Codec, frame: bytes) -> None:
    items, batch = codec.decode(frame)
    assert items and isinstance(batch, bool)
    for item in items:
        assert isinstance(item, (Call, Rejected))
        if isinstance(item, Rejected):
            assert item.error.kind in ERROR_CODES
            assert item.id is UNSET or item.id is None or isinstance(item.id, (int, str))
            assert not isinstance(item.id, bool)
            msgspec.json.encode(failure(None if item.id is UNSET else item.id, item.error))  # encodable


@FAST
@given(framing=st.sampled_from(FRAMINGS), frame=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(framing, frame):
    check_total(Codec(framing), frame)


# Structured fuzz: envelope-shaped objects with plausible and implausible members, then mangled.
member_values = st.one_of(json_values, st.sampled_from(sorted(METHODS)), st.just("2.0"))
envelopes = st.dictionaries(st.sampled_from(["jsonrpc", "id", "method", "params", "x"]), member_values, max_size=5)
params_like = st.dictionaries(
    st.sampled_from(["key", "value", "tags", "session_id", "agent_role", "content", "n", "relation", "depth", "zz"]),
    json_values, max_size=5,
)
shaped = st.one_of(
    envelopes,
    st.builds(lambda e, p, meth: {**e, "method": meth, "params": p}, envelopes, params_like, st.sampled_from(sorted(METHODS))),
)
messages = st.one_of(shaped, st.lists(st.one_of(shaped, json_values), max_size=4), json_values)


@FAST
@given(framing=st.sampled_from(FRAMINGS), message=messages, cut=st.integers(0, 400), junk=st.binary(max_size=4))
def test_mangled_envelopes_never_raise(framing, message, cut, junk):
    codec = Codec(framing)
    frame = encode(codec, message)
    check_total(codec, frame)
    check_total(codec, frame[:cut])
    check_total(codec, frame + junk)
    check_total(codec, frame[:cut] + junk + frame[cut:])


@pytest.mark.parametrize("framing", ["ndjson", "binary"])
def test_encode_into_appends_what_encode_returns_and_nothing_on_error(framing: str) -> None:
    from eurekamem.protocol import Codec, success

    codec = Codec(framing)
    out = bytearray(b"earlier")
    messages = [success(1, {"pong": True}), [success("a", [1, 2]), success(None, None)]]
    for message in messages:
        codec.encode_into(message, out)
    assert bytes(out) == b"earlier" + b"".join(codec.encode(m) for m in messages)
    before = bytes(out)
    with pytest.raises(TypeError):
        codec.encode_into(success(2, object()), out)
    assert bytes(out) == before


# --- the one-pass way agrees with the general way -------------------------------------------------
# Codec.decode first decodes a frame in one pass (envelope and params at once) and falls back to
# decode_general only when that pass refuses it. Both must give the same items for every frame.


def _comparable(items: list[Call | Rejected]) -> list[Any]:
    return [
        ("call", item.id, item.spec.name, msgspec.to_builtins(item.params)) if isinstance(item, Call)
        else ("rejected", item.id, item.error.kind, item.error.message)
        for item in items
    ]


def check_same_as_general(codec: Codec, frame: bytes) -> None:
    items, batch = codec.decode(frame)
    general, general_batch = codec.decode_general(frame)
    assert batch == general_batch
    assert _comparable(items) == _comparable(general)
    for item, other in zip(items, general, strict=True):
        if isinstance(item, Call):
            assert type(item.params) is type(other.params) and item.params == other.params


@pytest.mark.parametrize("name", sorted(METHODS))
def test_one_pass_decodes_every_method_as_the_general_way(codec, name):
    params = _minimal(msgspec.inspect.type_info(METHODS[name].params))
    for message in (req(name, params, id=9), req(name, params), req(name, id="x"), {"method": name, "params": params},
                    req(name, {**params, "zz": 1}), req(name, None), req(name, [params]), [req(name, params), {}]):
        check_same_as_general(codec, encode(codec, message))


@pytest.mark.parametrize("raw", [
    b'{"jsonrpc":"2.0","id":1,"method":"sys.ping","method":"sys.hello"}',  # the tag twice: the last one wins
    b'{"method":"sys.hello","method":"sys.ping","id":1}',
    b'{"method":"sys.ping","id":1,"id":2}',
    b'{"method":"sys.hello","params":{},"params":{"x":1}}',
    b'{"params":{"session_id":"s","agent_role":"r","content":"c"},"method":"episodic.log","id":3}',  # method last
    b'{"jsonrpc":"2.0","jsonrpc":"1.0","method":"sys.ping","id":1}',
    b'{"jsonrpc":"2.0","id":true,"method":"sys.ping"}',
    b'{"jsonrpc":"2.0","id":1.5,"method":"sys.ping"}',
    b'{"jsonrpc":2,"id":1,"method":"sys.ping"}',
    b'{"method":"persistent.recall","params":{"key":"k"},"params":null,"id":1}',
])
def test_one_pass_agrees_on_odd_envelopes(raw):
    check_same_as_general(Codec("ndjson"), raw)
    check_same_as_general(Codec("binary"), msgspec.msgpack.encode(msgspec.json.decode(raw)))  # duplicates collapse here


@FAST
@given(framing=st.sampled_from(FRAMINGS), message=messages, cut=st.integers(0, 400))
def test_one_pass_agrees_with_the_general_way_on_mangled_envelopes(framing, message, cut):
    codec = Codec(framing)
    frame = encode(codec, message)
    check_same_as_general(codec, frame)
    check_same_as_general(codec, frame[:cut])
