"""The thin client against a small fake server (no daemon): a thread on a real AF_UNIX socket that
decodes binary frames with eurekamem.protocol and answers a few methods, in order or not, with
errors when asked. Every I/O wait here is bounded; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from eurekamem.client import (
    AsyncClient,
    Client,
    ConnectionLost,
    EurekamemError,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MemoryManager,
    MethodNotFound,
    NotFound,
    Overloaded,
    ParseError,
    ReadOnly,
    Timeout,
    TooLarge,
    Unavailable,
    _common,
    _generate,
    _models,
    current_async_library,
    data_root,
    default_socket_path,
    error_from_wire,
)
from eurekamem.client._calls import Calls
from eurekamem.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_CODES,
    METHODS,
    BinaryDecoder,
    Codec,
    CrossRunRecord,
    EpisodicEntry,
    KnowledgeNode,
    ProtocolError,
    Rejected,
    failure,
    now_rfc3339,
    success,
)

IO_TIMEOUT = 10.0  # every blocking wait in these tests ends within this

CLASS_BY_KIND = {
    "parse_error": ParseError,
    "invalid_request": InvalidRequest,
    "method_not_found": MethodNotFound,
    "invalid_params": InvalidParams,
    "internal": InternalError,
    "not_found": NotFound,
    "too_large": TooLarge,
    "unavailable": Unavailable,
    "overloaded": Overloaded,
    "read_only": ReadOnly,
}


# --- the fake server ----------------------------------------------------------------------------


class _Drop(Exception):
    """Close the connection without answering."""


class FakeServer:
    """A tiny eurekamem: binary framing only, state in dicts, one thread per connection.

    Behaviours, by the key given to persistent.recall:
      "!error:<kind>"  answer with that error kind
      "!drop"          close the connection without answering
      "!hang"          never answer
      "!close"         answer null, then close the connection (and set `closed`)
    `group = k` holds answers until k are ready, then sends them in reverse order.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.lock = threading.Lock()
        self.connections = 0
        self.first_bytes: list[bytes] = []
        self.request_ids: list[Any] = []  # in arrival order
        self.arrived = threading.Condition()
        self.reply_ids: list[Any] = []  # in sending order
        self.notifications: list[str] = []
        self.group = 0
        self.closed = threading.Event()
        self.errors: list[BaseException] = []
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self.store: dict[str, CrossRunRecord] = {}
        self.events: dict[str, list[EpisodicEntry]] = {}
        self.nodes: dict[str, KnowledgeNode] = {}
        self.edges: list[tuple[str, str, str]] = []
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept_thread.start()

    # lifecycle

    def stop(self) -> None:
        self._stopping = True
        try:  # wake accept()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(IO_TIMEOUT)
                s.connect(self.path)
        except OSError:
            pass
        self._accept_thread.join(IO_TIMEOUT)
        self.listener.close()
        with self.lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(IO_TIMEOUT)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._stopping:
                conn.close()
                return
            with self.lock:
                self.connections += 1
                self._conns.append(conn)
            thread = threading.Thread(target=self._serve_guarded, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve_guarded(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._serve(conn)
        except (_Drop, ConnectionError):
            pass
        except OSError as exc:
            if not self._stopping:
                self.errors.append(exc)
        except BaseException as exc:  # reported by the fixture
            self.errors.append(exc)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(IO_TIMEOUT)
        first = conn.recv(1, socket.MSG_PEEK)
        if not first:
            return
        self.first_bytes.append(first)
        assert first == b"\x00", "the client must pick binary framing"
        codec = Codec("binary")
        decoder = BinaryDecoder()
        held: list[Any] = []
        while True:
            data = conn.recv(65536)
            if not data:
                return
            for frame in decoder.feed(data):
                incoming, _batch = codec.decode(frame)
                for inc in incoming:
                    close_after = False
                    if inc.wants_reply:
                        with self.arrived:
                            self.request_ids.append(inc.id)
                            self.arrived.notify_all()
                    if isinstance(inc, Rejected):
                        reply = failure(inc.id, inc.error)
                    else:
                        if not inc.wants_reply:
                            self.notifications.append(inc.spec.name)
                        key = getattr(inc.params, "key", "")
                        if inc.spec.name == "persistent.recall" and key.startswith("!"):
                            if key == "!drop":
                                raise _Drop
                            if key == "!hang":
                                continue
                            close_after = key == "!close"
                        try:
                            reply = success(inc.id, self.dispatch(inc.spec.name, inc.params))
                        except ProtocolError as exc:
                            reply = failure(inc.id, exc)
                    if not inc.wants_reply:
                        continue
                    if self.group:
                        held.append(reply)
                        if len(held) >= self.group:
                            held.reverse()
                            self._send(conn, codec, held)
                            held = []
                        continue
                    self._send(conn, codec, [reply])
                    if close_after:
                        conn.shutdown(socket.SHUT_RDWR)
                        conn.close()
                        self.closed.set()
                        return

    def wait_requests(self, count: int) -> bool:
        """Wait until `count` requests (with ids) have arrived in all."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.request_ids) >= count, IO_TIMEOUT)

    def _send(self, conn: socket.socket, codec: Codec, replies: list[Any]) -> None:
        self.reply_ids.extend(r.id for r in replies)
        conn.sendall(b"".join(codec.encode(r) for r in replies))

    # methods

    def dispatch(self, method: str, p: Any) -> Any:
        if method == "sys.ping":
            return {"pong": True}
        if method == "sys.hello":
            return {
                "server": "eurekamem",
                "version": "fake",
                "protocol": 1,
                "methods": sorted(METHODS),
                "limits": {"max_frame_bytes": DEFAULT_MAX_FRAME_BYTES},
            }
        if method == "sys.stats":
            return {"persistent": len(self.store), "graph": len(self.nodes)}
        if method == "sys.snapshot":
            return {"seq": 1}
        if method == "episodic.log":
            entry = EpisodicEntry(
                entry_id=p.entry_id or uuid.uuid4().hex,
                session_id=p.session_id,
                agent_role=p.agent_role,
                content=p.content,
                metadata=p.metadata,
                timestamp=p.timestamp or now_rfc3339(),
            )
            self.events.setdefault(p.session_id, []).append(entry)
            return entry
        if method == "episodic.recent":
            events = [e for e in self.events.get(p.session_id, []) if p.agent_role in (None, e.agent_role)]
            return events[-p.n :]
        if method == "session.close":
            return {"job_id": None}
        if method == "persistent.remember":
            now = now_rfc3339()
            old = self.store.get(p.key)
            record = CrossRunRecord(
                record_id=old.record_id if old else uuid.uuid4().hex,
                key=p.key,
                value=p.value,
                tags=p.tags,
                source_session=p.source_session,
                created_at=old.created_at if old else now,
                updated_at=now,
            )
            self.store[p.key] = record
            return record
        if method == "persistent.recall":
            if p.key.startswith("!error:"):
                kind = p.key.split(":", 1)[1]
                raise ProtocolError(kind, f"you asked for {kind}", key=p.key)
            return self.store.get(p.key)
        if method == "persistent.by_tag":
            return [r for r in self.store.values() if p.tag in r.tags]
        if method == "persistent.forget":
            return {"deleted": self.store.pop(p.key, None) is not None}
        if method == "persistent.keys":
            return {"keys": sorted(k for k in self.store if k.startswith(p.prefix))[: p.limit]}
        if method == "graph.add_theorem":
            node = KnowledgeNode(
                node_id=uuid.uuid4().hex[:12],
                theorem_name=p.theorem_name,
                formal_statement=p.formal_statement,
                domain=p.domain,
                session_id=p.session_id,
                tags=p.tags,
                created_at=now_rfc3339(),
            )
            self.nodes[node.node_id] = node
            return node
        if method == "graph.link":
            for node_id in (p.from_id, p.to_id):
                if node_id not in self.nodes:
                    raise ProtocolError("not_found", f"no node {node_id!r}", id=node_id)
            self.edges.append((p.from_id, p.to_id, p.relation))
            return {"from_id": p.from_id, "to_id": p.to_id, "relation": p.relation}
        if method == "graph.related":
            if p.node_id not in self.nodes:
                raise ProtocolError("not_found", f"no node {p.node_id!r}", id=p.node_id)
            seen = {p.node_id}
            frontier = {p.node_id}
            for _ in range(p.depth):
                nxt = set()
                for a, b, _rel in self.edges:
                    if a in frontier and b not in seen:
                        nxt.add(b)
                    if b in frontier and a not in seen:
                        nxt.add(a)
                seen |= nxt
                frontier = nxt
            return [self.nodes[n] for n in sorted(seen - {p.node_id})]
        raise ProtocolError("unavailable", f"the fake server does not do {method}")


def _socket_dir(tmp_path: Path) -> Path:
    if len(str(tmp_path / "eurekamem.sock")) < 100:  # AF_UNIX paths are short
        return tmp_path
    return Path(tempfile.mkdtemp(prefix="em-"))


@pytest.fixture
def server(tmp_path: Path):
    srv = FakeServer(str(_socket_dir(tmp_path) / "eurekamem.sock"))
    try:
        yield srv
    finally:
        srv.stop()
    assert not srv.errors, srv.errors


@pytest.fixture
def client(server: FakeServer):
    with Client(server.path, timeout=IO_TIMEOUT) as c:
        yield c


def run_threads(target, count: int) -> list[Any]:
    """Run target(i) in `count` threads; return their results, re-raising the first failure."""
    results: list[Any] = [None] * count
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT * 3)
        assert not t.is_alive(), "a client thread hung"
    if failures:
        raise failures[0]
    return results


# --- import hygiene -----------------------------------------------------------------------------


def test_import_pulls_in_neither_trio_nor_the_daemon():
    code = (
        "import sys, eurekamem.client\n"
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith(('trio.', 'eurekamem.daemon'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- the convenience calls: written once (client/_calls.py), the async ones generated ------------


def test_async_calls_are_the_blocking_calls_regenerated():
    # client/_async_calls.py is checked in; after an edit of _calls.py, `make client-calls` rewrites it.
    source = Path(_generate.SOURCE).read_text()
    assert Path(_generate.TARGET).read_text() == _generate.async_calls(source), "stale: run `make client-calls`"


def test_the_generator_refuses_what_it_cannot_make_async():
    head = '"""doc"""\n\nclass Calls:\n'
    good = _generate.async_calls(head + "    def ping(self) -> bool:\n        return self._run(C.op_ping())\n")
    assert "    async def ping(self) -> bool:\n        return await self._run(C.op_ping())\n" in good
    assert "class AsyncCalls:" in good
    for body in (
        "    def ping(self) -> bool:\n        def inner() -> None: ...\n",  # a nested function
        "    def ping(self) -> bool:\n        return self.hello()\n",  # a call past self._run
        "    def ping(self) -> bool:\n        f = lambda: self._run(C.op_ping())\n",  # a lambda would not await
        "def ping() -> bool: ...\n",  # outside the class
    ):
        with pytest.raises(ValueError):
            _generate.async_calls(head + body)


def test_both_clients_have_the_same_calls():
    names = [name for name in vars(Calls) if not name.startswith("_")]
    assert len(names) > 50
    for name in names:
        blocking, awaited = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(blocking) == inspect.signature(awaited), name
        assert blocking.__doc__ == awaited.__doc__, name
        assert inspect.iscoroutinefunction(awaited) and not inspect.iscoroutinefunction(blocking), name


def test_every_protocol_method_has_a_convenience_call():
    # Adding a method to protocol's METHODS fails here until _common has its op_* builder (and
    # _calls.py its call), or NO_CONVENIENCE says why it has none.
    named = set(re.findall(r'\bOp\(\s*"([^"]+)"', Path(_common.__file__).read_text()))
    assert named <= set(METHODS), named - set(METHODS)
    assert not named & set(_common.NO_CONVENIENCE)
    assert named | set(_common.NO_CONVENIENCE) == set(METHODS), set(METHODS) - named - set(_common.NO_CONVENIENCE)


# what a convenience call's parameter is given below: by the parameter's annotation, else by its name
# (or function.name) where the protocol wants one of a few values
_SAMPLES: dict[str, Any] = {"str": "x", "int": 1, "float": 0.5, "bool": True, "Any": {"a": 1}, "list[str]": ["x"]}
_NAMED: dict[str, Any] = {
    "category": "fact", "categories": ["fact"], "signal": "used", "relation": "uses", "format": "node_link",
    "status": "any", "state": "pending", "jobs.state": "queued", "since": "2026-01-01T00:00:00Z",
    "until": "2026-01-02T00:00:00Z", "list_memories.order": "strongest", "messages": [{"id": "m1", "role": "user", "text": "hi"}],
    "items": [{"domain": "d", "category": "fact", "title": "t", "content": "c"}],
}


class _Recorder(Calls):
    """The convenience calls, recording the Op each would send instead of sending it."""

    def __init__(self) -> None:
        self.ops: list[_common.Op[Any]] = []

    def _run(self, op: _common.Op[Any]) -> Any:
        self.ops.append(op)
        return "job-1"  # flush(wait=True) goes on to jobs.wait with it


def test_every_convenience_call_sends_params_its_protocol_struct_accepts():
    # each call once with only what it needs, once with every optional parameter given too
    checked = set()
    for name, function in vars(Calls).items():
        if name.startswith("_") or not callable(function):
            continue
        parameters = list(inspect.signature(function).parameters.values())[1:]
        named = [p for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        for everything in (False, True):
            kwargs = {}
            for p in named:
                if p.default is not p.empty and not everything:
                    continue
                annotation = str(p.annotation).split(" | ")[0]
                if annotation.split("[")[0] in ("int", "float", "bool"):
                    kwargs[p.name] = _SAMPLES[annotation]
                else:
                    kwargs[p.name] = _NAMED.get(f"{name}.{p.name}", _NAMED.get(p.name, _SAMPLES.get(annotation, {})))
            recorder = _Recorder()
            getattr(recorder, name)(**kwargs)
            assert recorder.ops, name
            for op in recorder.ops:
                msgspec.convert(_common.to_wire(op.params), METHODS[op.method].params)  # raises if not
                checked.add(op.method)
    assert checked == set(METHODS) - set(_common.NO_CONVENIENCE)


# --- socket path --------------------------------------------------------------------------------


def test_default_socket_path_precedence(monkeypatch, tmp_path):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("EUREKAMEM_SOCKET", "XDG_RUNTIME_DIR", "EUREKACLAW_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert default_socket_path() == str(home / ".eurekaclaw" / "run" / "eurekamem.sock")
    assert data_root() == home / ".eurekaclaw"

    monkeypatch.setenv("EUREKACLAW_DIR", str(tmp_path / "claw"))
    assert default_socket_path() == str(tmp_path / "claw" / "run" / "eurekamem.sock")
    assert default_socket_path(tmp_path / "explicit") == str(tmp_path / "explicit" / "run" / "eurekamem.sock")

    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")  # ignored, as the XDG spec says
    assert default_socket_path() == str(tmp_path / "claw" / "run" / "eurekamem.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert default_socket_path() == str(tmp_path / "xdg" / "eurekamem" / "eurekamem.sock")
    assert default_socket_path(tmp_path / "explicit") == str(tmp_path / "xdg" / "eurekamem" / "eurekamem.sock")

    monkeypatch.setenv("EUREKAMEM_SOCKET", str(tmp_path / "env.sock"))
    assert default_socket_path() == str(tmp_path / "env.sock")
    monkeypatch.setenv("EUREKAMEM_SOCKET", "")  # empty counts as unset
    assert default_socket_path() == str(tmp_path / "xdg" / "eurekamem" / "eurekamem.sock")

    monkeypatch.setenv("EUREKAMEM_SOCKET", str(tmp_path / "env.sock"))
    assert Client().path == str(tmp_path / "env.sock")


# --- errors -------------------------------------------------------------------------------------


def test_error_from_wire_by_kind_then_code():
    for kind, code in ERROR_CODES.items():
        err = error_from_wire({"code": code, "message": "m", "data": {"kind": kind, "x": 1}})
        assert type(err) is CLASS_BY_KIND[kind]
        assert (err.kind, err.code, err.message, err.data) == (kind, code, "m", {"kind": kind, "x": 1})
        assert isinstance(err, EurekamemError)
        assert type(error_from_wire({"code": code, "message": "m"})) is CLASS_BY_KIND[kind]
    # the kind wins over the code
    assert type(error_from_wire({"code": -32603, "message": "", "data": {"kind": "not_found"}})) is NotFound
    odd = error_from_wire({"code": -1, "message": "who knows", "data": {"kind": "novel"}})
    assert type(odd) is EurekamemError and odd.kind == "novel" and odd.code == -1
    assert type(error_from_wire("garbage")) is InternalError


def test_errors_pickle_and_client_errors_are_builtin_kinds_too():
    err = error_from_wire({"code": -32004, "message": "gone", "data": {"kind": "not_found", "key": "k"}})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NotFound and back.data == err.data and str(back) == "gone"
    assert isinstance(ConnectionLost("x"), ConnectionError) and isinstance(ConnectionLost("x"), EurekamemError)
    assert isinstance(Timeout("x"), TimeoutError) and isinstance(Timeout("x"), EurekamemError)
    assert type(pickle.loads(pickle.dumps(ConnectionLost("y")))) is ConnectionLost


# --- the blocking client ------------------------------------------------------------------------


def test_round_trip_and_records(client: Client, server: FakeServer):
    assert client.ping() is True
    assert client.hello()["protocol"] == 1
    assert client.call("sys.ping") == {"pong": True}

    record = client.remember("k1", {"a": [1, 2]}, tags=["t"], source_session="s1")
    assert isinstance(record, CrossRunRecord)
    assert (record.key, record.value, record.tags, record.source_session) == ("k1", {"a": [1, 2]}, ["t"], "s1")
    again = client.recall("k1")
    assert isinstance(again, CrossRunRecord) and again.record_id == record.record_id
    assert client.recall("missing") is None
    assert [r.key for r in client.by_tag("t")] == ["k1"]
    assert client.keys("k") == ["k1"]
    assert client.forget("k1") is True and client.forget("k1") is False

    entry = client.log_event("s1", "prover", "tried induction", {"step": 1})
    assert isinstance(entry, EpisodicEntry) and entry.metadata == {"step": 1}
    client.log_event("s1", "critic", "gap in step 2")
    assert [e.agent_role for e in client.recent("s1")] == ["prover", "critic"]
    assert [e.content for e in client.recent("s1", n=5, agent_role="critic")] == ["gap in step 2"]

    a = client.add_theorem("A", "a = a", domain="logic", tags=["x"])
    b = client.add_theorem("B", "b = b")
    assert isinstance(a, KnowledgeNode) and a.domain == "logic"
    assert client.link(a.node_id, b.node_id)["relation"] == "uses"
    assert [n.node_id for n in client.related(a.node_id)] == [b.node_id]
    assert client.close_session("s1") is None
    assert server.connections == 1


def test_params_as_keywords_and_wire_values(client: Client, server: FakeServer):
    import datetime as dt

    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    record = client.remember("when", {"at": when, "pair": (1, 2)})
    assert record.value == {"at": "2024-05-01T12:00:00Z", "pair": [1, 2]}  # plain JSON values
    result = client.call("persistent.recall", {"key": "ignored"}, key="when")  # keywords win
    assert result["value"]["at"] == "2024-05-01T12:00:00Z"


@pytest.mark.parametrize("kind", sorted(ERROR_CODES))
def test_typed_errors_by_kind(client: Client, kind: str):
    with pytest.raises(CLASS_BY_KIND[kind]) as info:
        client.recall(f"!error:{kind}")
    err = info.value
    assert err.kind == kind and err.code == ERROR_CODES[kind]
    assert err.message == f"you asked for {kind}" and err.data["key"] == f"!error:{kind}"
    assert client.ping() is True  # the connection is still fine


def test_errors_from_the_real_codec(client: Client, server: FakeServer):
    with pytest.raises(MethodNotFound):
        client.call("no.such.method")
    with pytest.raises(InvalidParams) as info:
        client.call("episodic.recent", session_id="s", n=0)
    assert "n" in info.value.message
    with pytest.raises(InvalidParams):
        client.call("persistent.recall", key="k", extra=1)
    with pytest.raises(NotFound):
        client.link("nope", "nada")
    assert server.connections == 1


def test_too_large_is_refused_before_sending(client: Client, server: FakeServer):
    with pytest.raises(TooLarge):
        client.remember("big", "x" * DEFAULT_MAX_FRAME_BYTES)
    assert client.ping() is True
    assert server.connections == 1


def test_pipelining_from_many_threads_out_of_order(client: Client, server: FakeServer):
    threads, rounds = 8, 12
    server.group = threads  # hold every round's answers, then send them in reverse order
    barrier = threading.Barrier(threads, timeout=IO_TIMEOUT)

    def work(i: int) -> list[Any]:
        got = []
        for r in range(rounds):
            barrier.wait()
            record = client.remember(f"t{i}", {"thread": i, "round": r})
            got.append((record.key, record.value["thread"], record.value["round"]))
        return got

    results = run_threads(work, threads)
    for i, got in enumerate(results):
        assert got == [(f"t{i}", i, r) for r in range(rounds)]
    assert server.connections == 1  # one shared connection
    assert server.reply_ids != server.request_ids  # and the answers did come back out of order
    assert sorted(server.reply_ids) == sorted(server.request_ids)


def test_pipelining_many_threads_in_order(client: Client, server: FakeServer):
    def work(i: int) -> int:
        for r in range(50):
            assert client.remember(f"k{i}", r).value == r
        return i

    assert run_threads(work, 16) == list(range(16))
    assert server.connections == 1


def test_call_many_pipelines_and_collects(client: Client, server: FakeServer):
    calls = [("persistent.remember", {"key": f"k{i}", "value": i}) for i in range(20)]
    calls.append(("persistent.recall", {"key": "!error:overloaded"}))
    calls.append(("no.such.method", None))
    calls.append(("persistent.remember", {"key": "bad", "value": object()}))  # cannot be encoded
    server.group = 22  # the 22 sendable calls' answers come back reversed
    results = client.call_many(calls)
    assert [r["value"] for r in results[:20]] == list(range(20))
    assert isinstance(results[20], Overloaded)
    assert isinstance(results[21], MethodNotFound)
    assert isinstance(results[22], TypeError)
    assert server.reply_ids == list(reversed(server.request_ids))
    server.group = 0
    assert client.call_many([]) == []
    assert client.ping() is True


def test_call_many_large_batch_does_not_deadlock(client: Client, server: FakeServer):
    # The fake server answers inline: while its replies are not read, it stops reading. Many MB
    # each way: the client must read while it sends.
    blob = "y" * 20_000
    calls = [("persistent.remember", {"key": f"big{i}", "value": blob}) for i in range(400)]
    results = client.call_many(calls)
    assert all(r["value"] == blob for r in results)
    assert [r["key"] for r in results] == [f"big{i}" for i in range(400)]


def test_big_request_and_reply_from_threads(client: Client, server: FakeServer):
    blob = "z" * 3_000_000

    def work(i: int) -> bool:
        return client.remember(f"blob{i}", blob).value == blob

    assert run_threads(work, 4) == [True] * 4


def test_notify_gets_no_answer(client: Client, server: FakeServer):
    client.notify("episodic.log", session_id="s", agent_role="a", content="quiet")
    assert [e.content for e in client.recent("s")] == ["quiet"]
    assert server.notifications == ["episodic.log"]


def test_reconnects_after_the_server_closed(client: Client, server: FakeServer):
    assert client.recall("!close") is None
    assert server.closed.wait(IO_TIMEOUT)
    assert client.ping() is True  # a new connection, made lazily
    assert server.connections == 2


def test_connection_lost_then_reconnect(client: Client, server: FakeServer):
    with pytest.raises(ConnectionLost):
        client.recall("!drop")
    assert client.ping() is True
    assert server.connections == 2


def test_in_flight_calls_fail_when_the_connection_drops(client: Client, server: FakeServer):
    results = client.call_many([("persistent.recall", {"key": "!hang"}), ("persistent.recall", {"key": "!drop"})])
    assert all(isinstance(r, ConnectionLost) for r in results)
    assert client.ping() is True


def test_timeout_keeps_the_connection(server: FakeServer):
    with Client(server.path, timeout=0.3) as c:
        with pytest.raises(Timeout):
            c.recall("!hang")
        assert c.ping() is True
    assert server.connections == 1


def test_close_wakes_waiters_and_client_reconnects(server: FakeServer):
    c = Client(server.path, timeout=IO_TIMEOUT)
    assert c.ping() is True

    def hang(_i: int) -> Any:
        with pytest.raises(ConnectionLost):
            c.recall("!hang")

    t = threading.Thread(target=run_threads, args=(hang, 3), daemon=True)
    t.start()
    assert server.wait_requests(1 + 3)  # the three calls are in flight (one reads, two wait)
    c.close()
    t.join(IO_TIMEOUT)
    assert not t.is_alive()
    assert c.ping() is True
    c.close()
    assert server.connections == 2


def test_no_daemon_is_connection_lost(tmp_path: Path):
    with Client(str(_socket_dir(tmp_path) / "nobody.sock"), timeout=IO_TIMEOUT) as c:
        with pytest.raises(ConnectionLost, match="is the daemon running"):
            c.ping()


# --- MemoryManager ------------------------------------------------------------------------------


def test_memory_manager_with_structs(server: FakeServer):
    with MemoryManager("sess", socket_path=server.path, autostart=False) as mm:
        entry = mm.log_event("prover", "started", {"k": 1})
        assert isinstance(entry, _models.EpisodicEntry) and entry.session_id == "sess"
        mm.log_event("critic", "objection")
        assert [e.content for e in mm.recent_events()] == ["started", "objection"]
        assert [e.content for e in mm.recent_events(n=5, agent_role="critic")] == ["objection"]

        assert mm.remember("fact", {"x": 1}, tags=["t"]) is None
        assert mm.recall("fact") == {"x": 1}  # the value, as EurekaClaw's recall returns
        assert mm.recall("absent") is None
        assert [r.key for r in mm.recall_by_tag("t")] == ["fact"]

        a = mm.add_theorem("A", "forall x, x = x", "logic", "sess", ["refl"])
        b = mm.add_theorem("B", "1 + 1 = 2")
        assert isinstance(a, _models.KnowledgeNode)
        assert mm.link_theorems(a.node_id, b.node_id, "generalizes") is None
        assert [n.theorem_name for n in mm.find_related_theorems(b.node_id, depth=1)] == ["A"]
        assert mm.load_for_injection("logic") == ""  # the fake has no memory.inject: "" as in EurekaClaw


def test_memory_manager_records_validate_as_eurekaclaws_models(server: FakeServer):
    """EurekaClaw's pydantic models (its types/memory.py, copied field by field) read our records'
    model_dump() back into equal values, naive and aware timestamps as EurekaClaw makes them."""
    from eurekaclaw_reference import pydantic_models

    eurekaclaw = pydantic_models()
    client = Client(server.path, timeout=IO_TIMEOUT)
    mm = MemoryManager("s", client=client)
    mm.remember("k", [1, 2], tags=["t"])
    records = [mm.log_event("agent", "hi", {"a": 1}), *mm.recent_events(), mm.recall_by_tag("t")[0],
               mm.add_theorem("T", "p -> p", tags=["x"])]
    models = [eurekaclaw[name] for name in ("EpisodicEntry", "EpisodicEntry", "CrossRunRecord", "KnowledgeNode")]
    for ours, model in zip(records, models):
        theirs = model.model_validate(ours.model_dump())
        assert theirs.model_dump() == ours.model_dump()
        assert model.model_validate_json(ours.model_dump_json()).model_dump() == ours.model_dump()
        assert type(ours).__name__ == model.__name__
    assert records[0].timestamp.tzinfo is None and records[3].created_at.tzinfo is None
    assert records[2].created_at.tzinfo is None and records[2].updated_at.tzinfo is not None
    assert records[2].model_copy(update={"value": 3}).value == 3 and records[2].value == [1, 2]
    mm.close()  # a shared client stays open
    assert client.ping() is True
    client.close()


def test_memory_manager_finds_socket_from_memory_dir(monkeypatch, tmp_path):
    for name in ("EUREKAMEM_SOCKET", "XDG_RUNTIME_DIR", "EUREKACLAW_DIR"):
        monkeypatch.delenv(name, raising=False)
    mm = MemoryManager("s", tmp_path / "root" / "memory")
    assert mm.client.path == str(tmp_path / "root" / "run" / "eurekamem.sock")
    mm.close()


# --- AsyncClient --------------------------------------------------------------------------------


async def test_async_client_under_trio(server: FakeServer):
    with trio.fail_after(IO_TIMEOUT):
        assert current_async_library() == "trio"
        async with AsyncClient(server.path) as c:
            assert await c.ping() is True
            record = await c.remember("a", {"v": 1}, tags=["t"])
            assert isinstance(record, CrossRunRecord)
            assert (await c.recall("a")).value == {"v": 1}
            assert await c.recall("nothing") is None
            with pytest.raises(NotFound):
                await c.recall("!error:not_found")
            with pytest.raises(InvalidParams):
                await c.call("episodic.recent", session_id="s", n=0)

            # many tasks at once, answers out of order
            tasks = 10
            server.group = tasks
            results: dict[int, Any] = {}

            async def one(i: int) -> None:
                results[i] = (await c.remember(f"task{i}", i)).value

            async with trio.open_nursery() as nursery:
                for i in range(tasks):
                    nursery.start_soon(one, i)
            assert results == {i: i for i in range(tasks)}
            assert server.reply_ids[-tasks:] == list(reversed(server.request_ids[-tasks:]))

            server.group = 5
            many = await c.call_many([("persistent.remember", {"key": f"m{i}", "value": i}) for i in range(4)] + [("sys.nope", {})])
            assert [r["value"] for r in many[:4]] == list(range(4)) and isinstance(many[4], MethodNotFound)
            server.group = 0

            blob = "q" * 1_000_000
            big = await c.call_many([("persistent.remember", {"key": f"b{i}", "value": blob}) for i in range(12)])
            assert all(r["value"] == blob for r in big)

            # the server goes away: the call fails, the next one reconnects
            with pytest.raises(ConnectionLost):
                await c.recall("!drop")
            assert await c.ping() is True
            assert server.connections == 2
    assert "trio" in sys.modules


async def test_async_client_cancellation_under_trio(server: FakeServer):
    with trio.fail_after(IO_TIMEOUT):
        async with AsyncClient(server.path) as c:
            with trio.move_on_after(0.2) as scope:
                await c.recall("!hang")
            assert scope.cancelled_caught
            assert await c.ping() is True  # the connection survived
            assert server.connections == 1


def test_async_client_under_asyncio(server: FakeServer):
    async def main() -> None:
        async with asyncio.timeout(IO_TIMEOUT):
            assert current_async_library() == "asyncio"
            async with AsyncClient(server.path) as c:
                assert await c.ping() is True
                entry = await c.log_event("s", "agent", "hello", {"n": 1})
                assert isinstance(entry, EpisodicEntry)
                assert [e.content for e in await c.recent("s")] == ["hello"]
                with pytest.raises(Overloaded):
                    await c.recall("!error:overloaded")

                tasks = 10
                server.group = tasks
                values = await asyncio.gather(*(c.remember(f"x{i}", i) for i in range(tasks)))
                assert [r.value for r in values] == list(range(tasks))
                assert server.reply_ids[-tasks:] == list(reversed(server.request_ids[-tasks:]))
                server.group = 0

                blob = "w" * 20_000
                big = await c.call_many([("persistent.remember", {"key": f"b{i}", "value": blob}) for i in range(300)])
                assert all(r["value"] == blob for r in big)

                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(c.recall("!hang"), 0.2)
                assert await c.ping() is True

                assert await c.recall("!close") is None
                assert await asyncio.get_running_loop().run_in_executor(None, server.closed.wait, IO_TIMEOUT)
                assert await c.ping() is True  # reconnected lazily
        return None

    asyncio.run(main())
    assert server.connections == 2


def test_async_client_outside_a_loop_says_so(server: FakeServer):
    c = AsyncClient(server.path)
    coro = c.ping()
    with pytest.raises(RuntimeError, match="asyncio or trio"):
        coro.send(None)
    coro.close()


def test_async_client_survives_a_new_event_loop(server: FakeServer):
    c = AsyncClient(server.path)

    async def ping() -> bool:
        async with asyncio.timeout(IO_TIMEOUT):
            return await c.ping()

    assert asyncio.run(ping()) is True
    assert asyncio.run(ping()) is True  # the old loop's connection is replaced
    assert server.connections == 2



# --- the packages import lazily (protocol/__init__.py, client/__init__.py) ---------------------------


@pytest.mark.parametrize("package", ["eurekamem.protocol", "eurekamem.client"])
def test_a_lazy_package_names_each_name_where_its_type_checking_block_imports_it(package: str) -> None:
    """_LAZY (what runs) and the block under TYPE_CHECKING (what mypy reads) say the same: every name,
    from the same module; and every name of __all__ resolves to the very object of its module."""
    import ast
    import importlib

    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {
        alias.name: "." * node.level + (node.module or "")
        for node in guarded.body if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names if alias.name != "*"
    }
    assert imported == module._WHERE
    for name in module.__all__:
        value = getattr(module, name)
        if name in module._WHERE:
            where = module._WHERE[name]
            level = len(where) - len(where.lstrip("."))
            source = importlib.import_module("." * level + where[level:], package)
            assert value is getattr(source, name), name


def test_the_protocol_still_gives_every_public_name_of_methods() -> None:
    """What `from .methods import *` gave the package (the params Structs, the limits) it still gives."""
    from eurekamem import protocol
    from eurekamem.protocol import methods

    public = [name for name in vars(methods) if not name.startswith("_")]
    assert len(public) > 50
    assert all(getattr(protocol, name) is getattr(methods, name) for name in public)
    with pytest.raises(AttributeError):
        protocol.NoSuchName  # noqa: B018


# --- finding the daemon: the LOCK's record (client/_paths.py) ----------------------------------------


def _pid_never_used() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above pid_max: no process has it


def _lock(root: Path, text: str) -> None:
    path = root.joinpath("memory", "journal", "LOCK")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_lock_names_the_live_holder_and_its_socket(tmp_path: Path) -> None:
    import os

    from eurekamem.client import lock_text, read_lock, recorded_socket

    me = os.getpid()
    assert read_lock(tmp_path) == (None, None)  # no LOCK at all
    _lock(tmp_path, lock_text(me, "/run/x/d.sock"))
    assert read_lock(tmp_path) == (me, "/run/x/d.sock") and recorded_socket(tmp_path) == "/run/x/d.sock"
    _lock(tmp_path, lock_text(me))  # locked, not listening yet (or verify, repair, migrate)
    assert read_lock(tmp_path) == (me, None)
    _lock(tmp_path, f"{me}\nsocket /run/x/d.so")  # a write in progress: the unfinished line is not read
    assert read_lock(tmp_path) == (me, None)
    _lock(tmp_path, lock_text(_pid_never_used(), "/run/x/d.sock"))  # its daemon died without a clean stop
    assert read_lock(tmp_path) == (None, None)
    for text in ("", "not a pid\n", "-3\nsocket /x\n"):  # a clean stop empties it; nonsense is no holder
        _lock(tmp_path, text)
        assert read_lock(tmp_path) == (None, None), text


def test_a_client_tries_the_rules_socket_then_the_recorded_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from eurekamem.client import Client, LineClient, data_root, lock_text
    from eurekamem.client._paths import socket_paths

    _lock(tmp_path, lock_text(os.getpid(), "/run/x/d.sock"))
    assert list(socket_paths("/rules.sock", tmp_path)) == ["/rules.sock", "/run/x/d.sock"]
    assert list(socket_paths("/run/x/d.sock", tmp_path)) == ["/run/x/d.sock"]
    assert list(socket_paths("/rules.sock", None)) == ["/rules.sock"]  # a socket named alone: only it
    monkeypatch.setenv("EUREKACLAW_DIR", str(tmp_path))
    for cls in (Client, LineClient):  # (the LineClient keeps its root as a string: no pathlib)
        assert str(cls().root) == str(data_root()) == str(tmp_path)  # no path: the configured root's record too
        assert cls("/rules.sock").root is None  # a path named alone
        assert str(cls("/rules.sock", data_dir=tmp_path / "d").root) == str(tmp_path / "d")


def test_the_error_lists_the_paths_tried_and_who_holds_the_root(tmp_path: Path) -> None:
    import os

    from eurekamem.client import lock_text
    from eurekamem.client._paths import unreachable

    gone = FileNotFoundError(2, "No such file or directory")
    refused = ConnectionRefusedError(111, "Connection refused")
    text = unreachable([("/a.sock", gone)], None)
    assert text == "cannot connect to eurekamem at /a.sock: No such file or directory (is the daemon running? `eurekamem serve`)"
    text = unreachable([("/a.sock", gone)], tmp_path)
    assert f"(no daemon holds the data root {tmp_path}: is the daemon running? `eurekamem serve`)" in text
    me = os.getpid()
    _lock(tmp_path, lock_text(me))
    assert f"pid {me} holds the data root {tmp_path} and records no socket" in unreachable([("/a.sock", gone)], tmp_path)
    _lock(tmp_path, lock_text(me, "/b.sock"))
    text = unreachable([("/a.sock", gone), ("/b.sock", refused)], tmp_path)
    assert text.startswith("cannot connect to eurekamem at /a.sock: No such file or directory; tried ")
    assert "/a.sock (No such file or directory), /b.sock (Connection refused)" in text
    assert f"pid {me} holds the data root {tmp_path}" in text


def test_the_line_client_refuses_params_that_are_not_json_before_connecting() -> None:
    from eurekamem.client import InvalidParams, LineClient

    client = LineClient("/nonexistent/eurekamem.sock")
    with pytest.raises(InvalidParams, match="not JSON"):
        client.call("memory.add", {"confidence": float("nan")})
