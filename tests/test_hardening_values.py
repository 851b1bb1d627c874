"""What a request may carry in its free-form (`Any`) values, and what the daemon keeps of it (issue 30,
sections 1, 2 and 6): JSON's data model only, refused at the door otherwise, so that no request
kills the daemon (a huge integer once did, while its journal record was encoded, after the answer)
and what was acknowledged reads back the same after a snapshot and a restart, in both framings.
Also: group names that could never be extracted are refused, and a lone surrogate escape is named."""

from __future__ import annotations

import datetime
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_envelope import _minimal

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.memory.params import validate_domain
from eurekamem.protocol import METHODS, Call, Codec, ProtocolError, Rejected
from eurekamem.protocol import methods as m

QUICK = settings(derandomize=True, database=None, deadline=None, max_examples=150,
                 suppress_health_check=[HealthCheck.too_slow])

UTC = datetime.UTC


# --- the reference: JSON's data model, restated ---------------------------------------------------


def representable(value: Any, depth: int = 0) -> bool:
    """What the protocol keeps exactly (PROTOCOL.md §6, free-form values), said independently."""
    if value is None or type(value) in (bool, str):
        return True
    if type(value) is int:
        return -(2**63) <= value <= 2**64 - 1
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return depth < 64 and all(representable(item, depth + 1) for item in value)
    if type(value) is dict:
        return (depth < 64 and all(type(key) is str for key in value)
                and all(representable(item, depth + 1) for item in value.values()))
    return False


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON types all the way down (1, 1.0 and True are three values)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


# Every MessagePack type the decoder turns into a Python value, and JSON's edge cases.
KEYS = st.one_of(st.text(max_size=4), st.integers(-2, 2), st.booleans(), st.none(), st.just(1.5),
                 st.tuples(st.integers(0, 2)), st.just(b"k"))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.text(max_size=6),
    st.integers(-(2**66), 2**66),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**40, -0]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-0.0, 5e-324, 1.7976931348623157e308]),
    st.binary(max_size=4),
    st.datetimes(min_value=datetime.datetime(1900, 1, 1), timezones=st.just(UTC)),
    st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=3)),
)
VALUES = st.one_of(
    st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=3), max_leaves=8),
    st.integers(60, 70).map(nested),
)


def _json_hook(obj: Any) -> Any:
    if isinstance(obj, msgspec.msgpack.Ext):
        return None  # no JSON form
    raise NotImplementedError(type(obj))


def _json_floats(value: Any) -> Any:
    """NaN and the infinities as JSON cannot say them (msgspec would write null): an overflowing literal."""
    if type(value) is float and not math.isfinite(value):
        return msgspec.Raw(b"1e400" if value > 0 else b"-1e400") if value == value else None
    if type(value) is list:
        return [_json_floats(item) for item in value]
    if type(value) is dict:
        return {key: _json_floats(item) for key, item in value.items()}
    return value


def wire(framing: str, value: Any) -> tuple[bytes, Any] | None:
    """`value` as sent in a framing (its payload) and what the daemon decodes of it, or None when
    the framing cannot say it at all (an integer over 64 bits in MessagePack, a tuple key in JSON)."""
    if framing == "binary":
        try:
            payload = msgspec.msgpack.encode(value)
        except (OverflowError, TypeError):
            return None
        return payload, msgspec.msgpack.decode(payload)
    try:
        payload = msgspec.json.encode(_json_floats(value), enc_hook=_json_hook)
    except (TypeError, ValueError, NotImplementedError):
        return None
    return payload, json.loads(payload)  # the standard library: 1e400 is inf, ints unbounded


def request(framing: str, request_id: int, method: str, params: dict[str, Any], field: str, value: bytes) -> bytes:
    """A request whose params[field] is the given payload, in the framing's encoding (no framing)."""
    raw = msgspec.Raw(value)
    mod = msgspec.json if framing == "ndjson" else msgspec.msgpack
    return mod.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, field: raw}})


# --- the codec: every value is answered, refused exactly when not representable -------------------


@pytest.mark.parametrize("framing", ["ndjson", "binary"])
@QUICK
@given(value=VALUES)
def test_a_free_form_value_is_a_call_exactly_when_it_can_be_kept(framing: str, value: Any) -> None:
    sent = wire(framing, value)
    if sent is None:
        return
    payload, decoded = sent
    codec = Codec(framing)
    for method, params, field, whole in (
        ("persistent.remember", {"key": "k"}, "value", decoded),
        ("episodic.log", {"session_id": "s", "agent_role": "r", "content": "c"}, "metadata", None),
    ):
        if field == "metadata":  # a dict of it
            payload_of = (b'{"v":' + payload + b"}") if framing == "ndjson" else b"\x81\xa1v" + payload
            whole = {"v": decoded}
        else:
            payload_of = payload
        frame = request(framing, 7, method, params, field, payload_of)
        (item,), batch = codec.decode(frame)
        general, _ = codec.decode_general(frame)
        assert not batch and type(general[0]) is type(item)
        if representable(whole):
            assert isinstance(item, Call), item
            assert same(getattr(item.params, field), whole)
        else:
            assert isinstance(item, Rejected), (whole, item)
            assert item.id == 7 and item.error.kind in ("invalid_params", "too_large"), item.error
            assert f"`$.{field}" in item.error.message, item.error.message
            assert item.error.message == general[0].error.message  # type: ignore[union-attr]
            assert (item.error.kind == "too_large") == ("Nesting deeper" in item.error.message)


@QUICK
@given(value=VALUES)
def test_the_fast_check_and_the_path_finder_agree(value: Any) -> None:
    problem = m.value_problem(value, "value")
    assert m.value_ok(value) == (problem is None) == representable(value), problem


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, {"b c": 2**64}]}, '`$.value.a[1]["b c"]`'),
        ([0, 1, -(2**63) - 1], "`$.value[2]`"),
        ({"x": {"y": float("nan")}}, "`$.value.x.y`"),
        ({"t": datetime.datetime(2020, 1, 1, tzinfo=UTC)}, "`$.value.t`"),
        ([b"bytes"], "`$.value[0]`"),
        ({"e": msgspec.msgpack.Ext(5, b"")}, "`$.value.e`"),
        ({"m": {1: "one"}}, "`$.value.m`"),
    ],
)
def test_the_refusal_names_the_field_path(value: Any, path: str) -> None:
    problem = m.value_problem(value, "value")
    assert problem is not None and problem.endswith(path), problem


def test_every_integer_and_float_field_is_bounded_and_every_free_form_field_is_checked() -> None:
    """A method added later cannot bring back an unbounded number or an unchecked Any."""
    t = msgspec.inspect
    exempt = {"ConversationMessage.timestamp"}  # a time: the daemon refuses what is not one, naming it
    seen: set[type] = set()
    free_form: list[tuple[str, str]] = []

    def walk(tp: Any, where: str, method: str, top: bool) -> None:
        if isinstance(tp, t.StructType):
            if tp.cls in seen and not top:
                return
            seen.add(tp.cls)
            for f in tp.fields:
                if top and (isinstance(f.type, t.AnyType) or isinstance(f.type, t.DictType)
                            and isinstance(f.type.value_type, t.AnyType)):
                    free_form.append((method, f.name))  # checked as it decodes: tried below
                else:
                    walk(f.type, f"{tp.cls.__name__}.{f.name}", method, False)
        elif isinstance(tp, t.UnionType):
            for x in tp.types:
                walk(x, where, method, top)
        elif isinstance(tp, t.ListType):
            walk(tp.item_type, where, method, False)
        elif isinstance(tp, t.DictType):
            walk(tp.key_type, where, method, False)
            walk(tp.value_type, where, method, False)
        elif isinstance(tp, t.IntType) and where not in exempt:
            assert tp.ge is not None and tp.ge >= -(2**63) and tp.le is not None and tp.le <= 2**63 - 1, where
        elif isinstance(tp, t.FloatType) and where not in exempt:
            assert tp.ge is not None and tp.le is not None, f"{where}: NaN and the infinities would decode"
        elif isinstance(tp, t.AnyType):
            raise AssertionError(f"{where}: a free-form value inside a nested type is not checked")

    for spec in METHODS.values():
        walk(t.type_info(spec.params), spec.params.__name__, spec.name, True)
    assert sorted(free_form) == [("episodic.log", "metadata"), ("persistent.remember", "value")]
    for framing in ("ndjson", "binary"):
        codec = Codec(framing)
        for method, field in free_form:
            params = _minimal(t.type_info(METHODS[method].params))
            bad = b'{"x":[1' + b"0" * 30 + b"]}" if framing == "ndjson" else msgspec.msgpack.encode({"x": [b"bin"]})
            (item,), _ = codec.decode(request(framing, 1, method, params, field, bad))
            assert isinstance(item, Rejected) and item.error.kind == "invalid_params", (method, item)
            assert f"`$.{field}.x[0]`" in item.error.message


@pytest.mark.parametrize("framing", ["ndjson", "binary"])
def test_numbers_in_typed_fields_are_ones_the_journal_can_keep(framing: str) -> None:
    """A TheoryState's `iteration` over 64 bits closed the connection (the job's journal record);
    a NaN `confidence_score` would come back null from a snapshot."""
    codec = Codec(framing)
    mod = msgspec.json if framing == "ndjson" else msgspec.msgpack
    big = 2**70 if framing == "ndjson" else 2**64 - 1  # MessagePack carries no more
    for theory_state, path in (
        ({"failed_attempts": [{"lemma_id": "l", "failure_reason": "r", "iteration": big}]}, "failed_attempts[0].iteration"),
        ({"lemma_dag": {"a": {"statement": "s", "confidence_score": 1e308 * 10 if framing == "binary" else 1e308}}}, None),
    ):
        frame = mod.encode({"jsonrpc": "2.0", "id": 3, "method": "session.close",
                            "params": {"session_id": "s", "theory_state": theory_state}})
        (item,), _ = codec.decode(frame)
        if path is None and framing == "ndjson":
            assert isinstance(item, Call)  # a finite float
            continue
        assert isinstance(item, Rejected) and item.error.kind == "invalid_params", item
        assert path is None or f"$.theory_state.{path}" in item.error.message, item.error.message
    for method, params in (("memory.list", {"offset": 2**63}), ("review.list", {"offset": 2**63})):
        (item,), _ = codec.decode(mod.encode({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}))
        assert isinstance(item, Rejected) and item.error.kind == "invalid_params", item


# --- group names --------------------------------------------------------------------------------

BAD_GROUPS = ["..", ".", "../../x", "a/../b", "a\\..\\b", "x/.", "a\x00b", "\x00"]
GOOD_GROUPS = ["...", ".hidden", "a/b", "team chat", "a..b", "ü/..x"]


@pytest.mark.parametrize("group", BAD_GROUPS + GOOD_GROUPS)
def test_a_group_is_refused_exactly_when_its_domain_would_be(group: str) -> None:
    try:
        validate_domain(group)
    except ProtocolError:
        refused_as_domain = True
    else:
        refused_as_domain = False
    assert (m.group_problem(group) is not None) == refused_as_domain == (group in BAD_GROUPS)


@settings(QUICK, max_examples=300)
@given(group=st.text(alphabet=st.sampled_from("./\\\x00ab "), min_size=1, max_size=8))
def test_the_group_rule_is_the_domain_rule(group: str) -> None:
    try:
        validate_domain(group)
    except ProtocolError:
        assert m.group_problem(group) is not None
    else:
        assert m.group_problem(group) is None


async def test_every_conversation_method_refuses_a_group_that_could_never_be_extracted(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    message = {"id": "m1", "role": "user", "text": "hello"}
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock):
            conn = await RawConnection.open(sock)
            for group in BAD_GROUPS:
                for method, params in (
                    ("conversation.append", {"group": group, "messages": [message]}),
                    ("conversation.get", {"group": group}),
                    ("conversation.summary", {"group": group}),
                    ("conversation.flush", {"group": group}),
                    ("conversation.search", {"group": group, "query": "hello"}),
                    ("memory.inject", {"domain": "d", "group": group, "messages": 2}),
                ):
                    answer = await conn.call(method, params)
                    assert answer["error"]["data"]["kind"] == "invalid_params", (method, group, answer)
                    text = answer["error"]["message"]
                    assert "`$.group`" in text and "cannot be a conversation group" in text, text
            for group in GOOD_GROUPS:
                assert (await conn.result("conversation.append", {"group": group, "messages": [message]}))["appended"] == 1
            groups = [g["group"] for g in await conn.result("conversation.groups", {})]
            assert sorted(groups) == sorted(GOOD_GROUPS)
            await conn.aclose()


# --- lone surrogates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "kind", "where"),
    [
        (rb'{"jsonrpc":"2.0","id":4,"method":"episodic.log","params":{"session_id":"s","agent_role":"r","content":"a\ud800"}}',
         "invalid_params", "`$.content`"),
        (rb'{"jsonrpc":"2.0","id":4,"method":"persistent.remember","params":{"key":"k","value":{"x":["\udc00"]}}}',
         "invalid_params", "`$.value.x[0]`"),
        (rb'{"jsonrpc":"2.0","id":4,"method":"persistent.remember","params":{"key":"\ud800\n","value":1}}',
         "invalid_params", "`$.key`"),
        (rb'{"jsonrpc":"2.0","id":4,"method":"sys.ping\udbff"}', "invalid_request", "`$.method`"),
    ],
)
def test_a_lone_surrogate_escape_is_named_not_called_truncated(frame: bytes, kind: str, where: str) -> None:
    (item,), batch = Codec("ndjson").decode(frame)
    assert not batch and isinstance(item, Rejected) and item.id == 4
    assert item.error.kind == kind and where in item.error.message and "surrogate" in item.error.message, item.error


def test_a_batch_with_a_lone_surrogate_runs_its_other_requests() -> None:
    frame = (rb'[{"jsonrpc":"2.0","id":1,"method":"persistent.recall","params":{"key":"k"}},'
             rb'{"jsonrpc":"2.0","id":2,"method":"persistent.recall","params":{"key":"\ud800"}}]')
    items, batch = Codec("ndjson").decode(frame)
    assert batch and isinstance(items[0], Call) and items[0].params.key == "k"
    assert isinstance(items[1], Rejected) and items[1].id == 2 and items[1].error.kind == "invalid_params"


@pytest.mark.parametrize(
    "frame",
    [
        rb'{"jsonrpc":"2.0","id":1,"method":"sys.ping","params":{"a":"\ud800"',  # truncated indeed
        b'{"jsonrpc":"2.0","id":1,"method":"sys.ping\xed\xa0\x80"}',  # not UTF-8 (an encoded surrogate)
        rb'{"id":1,"method":"persistent.remember","params":{"key":"\ud800","value":1e400,}}',  # malformed anyway
    ],
)
def test_what_is_not_json_text_stays_a_parse_error(frame: bytes) -> None:
    (item,), _ = Codec("ndjson").decode(frame)
    assert isinstance(item, Rejected) and item.error.kind == "parse_error" and item.id is None


def test_bytes_that_are_not_utf8_in_params_are_invalid_params_saying_so() -> None:
    (item,), _ = Codec("ndjson").decode(b'{"jsonrpc":"2.0","id":1,"method":"persistent.recall","params":{"key":"\xed\xa0\x80"}}')
    assert isinstance(item, Rejected) and item.id == 1 and item.error.kind == "invalid_params"
    assert "Invalid UTF-8" in item.error.message


def test_an_escaped_backslash_before_u_is_no_surrogate() -> None:
    (item,), _ = Codec("ndjson").decode(rb'{"jsonrpc":"2.0","id":1,"method":"persistent.recall","params":{"key":"\\ud800"}}')
    assert isinstance(item, Call) and item.params.key == "\\ud800"


# --- end to end: answered, alive, the same after a snapshot and a restart -------------------------


class BinaryConnection:
    """Length-prefixed MessagePack over a real Unix socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = b""

    @classmethod
    async def open(cls, path: Path) -> BinaryConnection:
        return cls(await trio.open_unix_socket(str(path)))

    async def send_payload(self, payload: bytes) -> None:
        await self.stream.send_all(len(payload).to_bytes(4, "big") + payload)

    async def read(self) -> Any:
        while len(self._buf) < 4 or len(self._buf) < 4 + int.from_bytes(self._buf[:4], "big"):
            data = await self.stream.receive_some(65536)
            assert data, "connection closed before an answer came"
            self._buf += data
        size = int.from_bytes(self._buf[:4], "big")
        answer, self._buf = msgspec.msgpack.decode(self._buf[4 : 4 + size]), self._buf[4 + size :]
        return answer

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _send(conn: Any, payload: bytes) -> Any:
    if isinstance(conn, BinaryConnection):
        await conn.send_payload(payload)
    else:
        await conn.send_line(payload)
    return await conn.read()


async def _no_snapshot(force: bool = False) -> int:
    return -1


def _runs_metadata(root: Path, session: str) -> list[Any]:
    path = root / "runs" / session / "episodic.json"
    if not path.exists():
        return []
    stored = json.loads(path.read_text())
    events = stored if isinstance(stored, list) else stored.get("events", stored.get("entries", []))
    return [event["metadata"]["v"] for event in events]


async def _check_kept(sock: Path, kept: dict[str, Any], refused: set[str]) -> None:
    conn = await RawConnection.open(sock)
    binary = await BinaryConnection.open(sock)
    for key, value in kept.items():
        assert same((await conn.result("persistent.recall", {"key": key}))["value"], value), key
        await binary.send_payload(msgspec.msgpack.encode(
            {"jsonrpc": "2.0", "id": 1, "method": "persistent.recall", "params": {"key": key}}))
        assert same((await binary.read())["result"]["value"], value), key
    for key in refused:
        assert await conn.result("persistent.recall", {"key": key}) is None, key
    await conn.aclose()
    await binary.aclose()


def _round(root: Path, sock: Path, values: list[Any]) -> None:
    kept: dict[str, Any] = {}
    logged: dict[str, list[Any]] = {"ndjson": [], "binary": []}
    refused: set[str] = set()

    async def main() -> None:
        with trio.fail_after(IO_TIMEOUT * 3):
            async with running_daemon(root, sock) as daemon:
                conns = {"ndjson": await RawConnection.open(sock), "binary": await BinaryConnection.open(sock)}
                for index, value in enumerate(values):
                    for framing, conn in conns.items():
                        sent = wire(framing, value)
                        if sent is None:
                            continue
                        payload, decoded = sent
                        key = f"{framing}-{index}"
                        answer = await _send(conn, request(framing, index, "persistent.remember", {"key": key}, "value", payload))
                        metadata = (b'{"v":' + payload + b"}") if framing == "ndjson" else b"\x81\xa1v" + payload
                        logged_answer = await _send(conn, request(framing, index, "episodic.log", {
                            "session_id": f"s-{framing}", "agent_role": "r", "content": "c"}, "metadata", metadata))
                        for a, whole in ((answer, decoded), (logged_answer, {"v": decoded})):
                            assert a["id"] == index
                            if representable(whole):
                                assert "result" in a, (whole, a)
                            else:
                                assert a["error"]["data"]["kind"] in ("invalid_params", "too_large"), (whole, a)
                        if "result" in answer:
                            kept[key] = decoded
                        else:
                            refused.add(key)
                        if "result" in logged_answer:
                            logged[framing].append(decoded)
                    if index == len(values) // 2:  # the first half from the snapshot, the rest from the journal
                        assert "result" in await conns["ndjson"].call("sys.snapshot", {})
                for framing in conns:
                    assert "result" in await conns["ndjson"].call("session.close", {"session_id": f"s-{framing}"})
                for conn in conns.values():
                    await conn.aclose()
                await _check_kept(sock, kept, refused)
                daemon.snapshot = _no_snapshot  # as if killed: the journal replays the second half
            async with running_daemon(root, sock):
                await _check_kept(sock, kept, refused)
                conn = await RawConnection.open(sock)
                assert "result" in await conn.call("sys.snapshot", {})
                await conn.aclose()
            async with running_daemon(root, sock):  # from the snapshot alone
                await _check_kept(sock, kept, refused)
                conn = await RawConnection.open(sock)
                assert (await conn.result("sys.ping", {})) == {"pong": True}
                await conn.aclose()

    trio.run(main)
    for framing, values_logged in logged.items():
        assert all(same(a, b) for a, b in zip(_runs_metadata(root, f"s-{framing}"), values_logged, strict=True))


@settings(derandomize=True, database=None, deadline=None, max_examples=6,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(VALUES, min_size=12, max_size=12))
def test_every_value_is_answered_and_what_was_acknowledged_survives_restarts(values: list[Any]) -> None:
    root = Path(tempfile.mkdtemp(prefix="em-values-"))
    sock_dir = Path(tempfile.mkdtemp(prefix="em-", dir="/tmp"))
    try:
        _round(root, sock_dir / "s.sock", values)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_the_values_that_once_broke_the_daemon() -> None:
    """Issue 30's cases, each once: a huge integer (JSON), NaN, infinity, bin, a timestamp, an
    extension, a non-string key, deep nesting; and good values beside them."""
    root = Path(tempfile.mkdtemp(prefix="em-values-"))
    sock_dir = Path(tempfile.mkdtemp(prefix="em-", dir="/tmp"))
    values = [10**30, -(2**63) - 1, 2**64 - 1, float("nan"), float("inf"), b"\x00raw", datetime.datetime(2020, 1, 1, tzinfo=UTC),
              msgspec.msgpack.Ext(3, b"x"), {1: "one"}, {(1, 2): 3}, nested(80), nested(64), {"ok": [1, 2.5, None, "s"]}]
    try:
        _round(root, sock_dir / "s.sock", values)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
