"""The daemon in-process (same trio run), spoken to over its real Unix socket in raw NDJSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon


async def test_ping_hello_and_stats(data_dir: Path, sock_dir: Path) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock):
            assert oct(sock.stat().st_mode & 0o777) == "0o600"
            conn = await RawConnection.open(sock)
            assert await conn.call("sys.ping") == {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}
            hello = await conn.result("sys.hello", {})
            assert hello["server"] == "eurekamem" and hello["protocol"] == 1
            assert "persistent.remember" in hello["methods"] and "graph.export" in hello["methods"]
            assert hello["limits"]["max_frame_bytes"] == 16 * 1024 * 1024
            stats = await conn.result("sys.stats", {})
            assert stats["tiers"]["persistent"]["records"] == 0
            assert stats["requests"]["methods"]["sys.ping"]["count"] == 1
            # the I/O layer's passes (the default, bulk): each served at least one ready socket
            assert stats["io"]["mode"] == "bulk" and 0 < stats["io"]["passes"] <= stats["io"]["events"]
            assert 0 <= stats["io"]["spin_hits"] <= stats["io"]["spins"] <= stats["io"]["passes"]
            assert stats["tiers"]["persistent"]["batches"] == stats["tiers"]["persistent"]["requests"] == 0
            await conn.aclose()


async def test_persistent_tier(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            first = await conn.result(
                "persistent.remember",
                {"key": "theory.failed_strategies.x", "value": {"tried": [1, 2]}, "tags": ["failed", "x"], "source_session": "s1"},
            )
            assert first["key"] == "theory.failed_strategies.x" and first["value"] == {"tried": [1, 2]}
            assert first["created_at"] == first["updated_at"]
            second = await conn.result("persistent.remember", {"key": "theory.failed_strategies.x", "value": 7, "tags": ["x"]})
            assert second["record_id"] == first["record_id"]
            assert second["created_at"] == first["created_at"]
            assert second["updated_at"] > first["updated_at"]
            assert (await conn.result("persistent.recall", {"key": "theory.failed_strategies.x"}))["value"] == 7
            assert await conn.result("persistent.recall", {"key": "absent"}) is None
            assert await conn.result("persistent.by_tag", {"tag": "failed"}) == []  # the overwrite dropped the tag
            assert [r["key"] for r in await conn.result("persistent.by_tag", {"tag": "x"})] == ["theory.failed_strategies.x"]
            await conn.result("persistent.remember", {"key": "theory.other", "value": None})
            await conn.result("persistent.remember", {"key": "zeta", "value": "z"})
            assert (await conn.result("persistent.keys", {"prefix": "theory."}))["keys"] == [
                "theory.failed_strategies.x",
                "theory.other",
            ]
            assert await conn.result("persistent.forget", {"key": "zeta"}) == {"deleted": True}
            assert await conn.result("persistent.forget", {"key": "zeta"}) == {"deleted": False}
            assert await conn.result("persistent.recall", {"key": "zeta"}) is None
            await conn.aclose()


async def test_graph_tier(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", **store):
            conn = await RawConnection.open(sock_dir / "s.sock")
            ids = []
            for name in ("A", "B", "C", "D"):
                node = await conn.result(
                    "graph.add_theorem",
                    {"theorem_name": f"Lemma {name}", "formal_statement": f"forall x, P{name} x", "domain": "bandits", "tags": [name.lower()]},
                )
                ids.append(node["node_id"])
            a, b, c, d = ids
            assert await conn.result("graph.link", {"from_id": a, "to_id": b}) == {"from_id": a, "to_id": b, "relation": "uses"}
            await conn.result("graph.link", {"from_id": c, "to_id": b, "relation": "generalizes"})
            await conn.result("graph.link", {"from_id": c, "to_id": d, "relation": "contradicts"})
            await conn.result("graph.link", {"from_id": a, "to_id": b})  # a duplicate edge is stored once
            near = await conn.result("graph.related", {"node_id": a, "depth": 1})
            assert [n["node_id"] for n in near] == [b]
            far = await conn.result("graph.related", {"node_id": a, "depth": 2})
            assert sorted(n["node_id"] for n in far) == sorted([b, c])  # undirected BFS, like EurekaClaw
            assert len(await conn.result("graph.related", {"node_id": a, "depth": 3})) == 3
            assert await conn.error_kind("graph.link", {"from_id": a, "to_id": "nope"}) == "not_found"
            assert await conn.error_kind("graph.related", {"node_id": "nope"}) == "not_found"
            assert await conn.error_kind("graph.link", {"from_id": a, "to_id": b, "relation": "likes"}) == "invalid_params"
            stats = await conn.result("graph.stats", {})
            assert stats["nodes"] == 4 and stats["edges"] == 3
            assert stats["relations"] == {"uses": 1, "generalizes": 1, "specializes": 0, "contradicts": 1}
            assert [n["theorem_name"] for n in await conn.result("graph.search", {"query": "pc x"})] == ["Lemma C"]
            assert len(await conn.result("graph.search", {"domain": "band"})) == 4
            assert [n["node_id"] for n in await conn.result("graph.search", {"tag": "d"})] == [d]
            assert (await conn.result("graph.get", {"node_id": d}))["theorem_name"] == "Lemma D"
            exported = await conn.result("graph.export", {})
            assert len(exported["data"]["nodes"]) == 4 and len(exported["data"]["edges"]) == 3
            graphml = await conn.result("graph.export", {"format": "graphml"})
            assert graphml["data"].startswith("<graphml") and "contradicts" in graphml["data"]
            await conn.aclose()


async def test_episodic_tier_and_session_close(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            for i in range(510):
                role = "theory" if i % 2 else "survey"
                await conn.send({"id": i, "method": "episodic.log", "params": {"session_id": "s1", "agent_role": role, "content": f"event {i}"}})
            answers = [await conn.read() for _ in range(510)]
            assert sorted(a["id"] for a in answers) == list(range(510))
            recent = await conn.result("episodic.recent", {"session_id": "s1", "n": 3})
            assert [e["content"] for e in recent] == ["event 507", "event 508", "event 509"]
            theory = await conn.result("episodic.recent", {"session_id": "s1", "n": 2, "agent_role": "theory"})
            assert [e["content"] for e in theory] == ["event 507", "event 509"]
            everything = await conn.result("episodic.recent", {"session_id": "s1", "n": 500})
            assert len(everything) == 500 and everything[0]["content"] == "event 10"  # a ring of 500
            hits = await conn.result("episodic.search", {"session_id": "s1", "query": "EVENT 50"})
            assert [e["content"] for e in hits][:2] == ["event 50", "event 500"]
            closed = await conn.result("session.close", {"session_id": "s1"})
            assert closed["events_written"] == 500 and isinstance(closed["job_id"], str)  # its extraction job
            job = await conn.result("jobs.get", {"id": closed["job_id"]})
            assert job["kind"] == "session.extract" and job["state"] == "queued"  # no LLM configured here
            written = json.loads((data_dir / "runs" / "s1" / "episodic.json").read_bytes())
            assert len(written) == 500 and written[-1]["content"] == "event 509"
            assert await conn.result("episodic.recent", {"session_id": "s1"}) == []
            assert await conn.error_kind("session.close", {"session_id": "../up"}) == "invalid_params"
            await conn.aclose()


BAD_REQUESTS = [
    (b"{not json", "parse_error"),
    (b'"a string"', "invalid_request"),
    (b'{"id": 1}', "invalid_request"),
    (b'{"id": 1, "jsonrpc": "1.0", "method": "sys.ping"}', "invalid_request"),
    (b'{"id": 1, "method": "persistent.teleport", "params": {}}', "method_not_found"),
    (b'{"id": 1, "method": "persistent.remember", "params": {"key": 5, "value": 1}}', "invalid_params"),
    (b'{"id": 1, "method": "persistent.remember", "params": {"value": 1}}', "invalid_params"),
    (b'{"id": 1, "method": "persistent.remember", "params": {"key": "k", "value": 1, "extra": 2}}', "invalid_params"),
    (b'{"id": 1, "method": "persistent.remember", "params": [1]}', "invalid_params"),
    (b'{"id": 1, "method": "persistent.remember", "params": {"key": "' + b"k" * 2000 + b'", "value": 1}}', "too_large"),
    (b'{"id": 1, "method": "episodic.recent", "params": {"session_id": "s", "n": 0}}', "invalid_params"),
    (b'{"id": 1, "method": "graph.link", "params": {"from_id": "a", "to_id": "b"}}', "not_found"),
    (b"[]", "invalid_request"),
]


@pytest.mark.parametrize("line,kind", BAD_REQUESTS)
async def test_bad_requests_get_errors_and_change_nothing(data_dir: Path, sock_dir: Path, line: bytes, kind: str) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock") as daemon:
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.result("persistent.remember", {"key": "k", "value": "kept"})
            before = daemon.journal_actor.acked_seq
            await conn.send_line(line)
            answer = await conn.read()
            assert answer["error"]["data"]["kind"] == kind, answer
            assert answer["error"]["message"]
            assert await conn.result("sys.ping") == {"pong": True}  # the connection stays usable
            assert (await conn.result("persistent.recall", {"key": "k"}))["value"] == "kept"
            assert daemon.journal_actor.acked_seq == before
            await conn.aclose()


async def test_error_messages_name_the_field(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            answer = await conn.call("persistent.remember", {"key": "k", "value": 1, "tags": [3]})
            assert answer["id"] == 1 and "$.tags[0]" in answer["error"]["message"]
            answer = await conn.call("graph.add_theorem", {"theorem_name": "t"})
            assert "formal_statement" in answer["error"]["message"]
            await conn.aclose()


async def test_unknown_framing_gets_one_error_line_then_close(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            await conn.send_line(b"GET / HTTP/1.1\r\n")
            answer = await conn.read()
            assert answer["error"]["data"]["kind"] == "parse_error" and "0x47" in answer["error"]["message"]
            assert await conn.read_line() is None
            await conn.aclose()


async def test_oversized_frame_is_refused_and_connection_survives(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", max_frame_bytes=4096):
            conn = await RawConnection.open(sock_dir / "s.sock")
            big = json.dumps({"id": 9, "method": "persistent.remember", "params": {"key": "big", "value": "x" * 100_000}})
            await conn.send_line(big)
            answer = await conn.read()
            assert answer["error"]["data"]["kind"] == "too_large" and answer["id"] is None
            assert await conn.result("persistent.recall", {"key": "big"}) is None
            assert await conn.result("sys.ping") == {"pong": True}
            await conn.aclose()


async def test_batch_and_notifications(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            batch = [
                {"jsonrpc": "2.0", "id": "a", "method": "persistent.remember", "params": {"key": "b1", "value": 1}},
                {"jsonrpc": "2.0", "method": "persistent.remember", "params": {"key": "b2", "value": 2}},  # notification
                {"jsonrpc": "2.0", "id": "c", "method": "nope"},
                5,
            ]
            await conn.send(batch)
            answers = await conn.read()
            assert isinstance(answers, list) and len(answers) == 3
            by_id = {a["id"]: a for a in answers}
            assert by_id["a"]["result"]["key"] == "b1"
            assert by_id["c"]["error"]["data"]["kind"] == "method_not_found"
            assert by_id[None]["error"]["data"]["kind"] == "invalid_request"
            await conn.send({"method": "persistent.remember", "params": {"key": "b3", "value": 3}})  # no answer
            assert (await conn.result("persistent.recall", {"key": "b2"}))["value"] == 2
            assert (await conn.result("persistent.recall", {"key": "b3"}))["value"] == 3
            await conn.aclose()


async def test_pipelining_and_half_close(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            lines = []
            for i in range(300):
                method = ("persistent.remember", "episodic.log", "graph.stats")[i % 3]
                params = {
                    "persistent.remember": {"key": f"k{i}", "value": i},
                    "episodic.log": {"session_id": "s", "agent_role": "r", "content": str(i)},
                    "graph.stats": {},
                }[method]
                lines.append(json.dumps({"id": i, "method": method, "params": params}))
            await conn.stream.send_all(("\n".join(lines) + "\n").encode())
            await conn.stream.send_eof()  # half-close: every request already sent is still answered
            answers = []
            while (line := await conn.read_line()) is not None:
                answers.append(json.loads(line))
            assert sorted(a["id"] for a in answers) == list(range(300))
            assert all("result" in a for a in answers)
            await conn.aclose()


async def test_overloaded_past_the_inflight_limit(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", max_inflight=8):
            conn = await RawConnection.open(sock_dir / "s.sock")
            lines = [json.dumps({"id": i, "method": "persistent.remember", "params": {"key": f"k{i}", "value": i}}) for i in range(200)]
            await conn.stream.send_all(("\n".join(lines) + "\n").encode())
            answers = [await conn.read() for _ in range(200)]
            assert sorted(a["id"] for a in answers) == list(range(200))
            kinds = {a["error"]["data"]["kind"] for a in answers if "error" in a}
            assert kinds == {"overloaded"}
            accepted = [a["id"] for a in answers if "result" in a]
            assert accepted  # some got through; the overloaded ones changed nothing:
            for a in answers:
                stored = await conn.result("persistent.recall", {"key": f"k{a['id']}"})
                assert (stored is not None) == ("result" in a)
            await conn.aclose()


async def test_binary_framing(data_dir: Path, sock_dir: Path) -> None:
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock"):
            stream = await trio.open_unix_socket(str(sock_dir / "s.sock"))
            frames = b""
            for i, (method, params) in enumerate(
                [("persistent.remember", {"key": "bin", "value": {"x": [1, 2.5, None]}}), ("persistent.recall", {"key": "bin"}), ("nope", {})]
            ):
                payload = msgspec.msgpack.encode({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
                frames += len(payload).to_bytes(4, "big") + payload
            await stream.send_all(frames)
            buf = b""
            answers = []
            while len(answers) < 3:
                buf += await stream.receive_some(65536)
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    size = int.from_bytes(buf[:4], "big")
                    answers.append(msgspec.msgpack.decode(buf[4 : 4 + size]))
                    buf = buf[4 + size :]
            by_id = {a["id"]: a for a in answers}
            assert by_id[1]["result"]["value"] == {"x": [1, 2.5, None]}
            assert isinstance(by_id[1]["result"]["created_at"], str)  # RFC 3339 strings in both framings
            assert by_id[2]["error"]["code"] == -32601
            await stream.aclose()


async def test_restart_keeps_everything_and_snapshot_files(data_dir: Path, sock_dir: Path, store: dict[str, Any]) -> None:
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock, **store):
            conn = await RawConnection.open(sock)
            for i in range(20):
                await conn.result("persistent.remember", {"key": f"k{i}", "value": i, "tags": ["t"]})
            a = (await conn.result("graph.add_theorem", {"theorem_name": "A", "formal_statement": "a"}))["node_id"]
            b = (await conn.result("graph.add_theorem", {"theorem_name": "B", "formal_statement": "b"}))["node_id"]
            await conn.result("graph.link", {"from_id": a, "to_id": b, "relation": "specializes"})
            seq = (await conn.result("sys.snapshot", {}))["seq"]
            if not store:  # the journal's seq (a daemon on PostgreSQL journals nothing locally)
                assert seq == 23
            await conn.result("persistent.forget", {"key": "k0"})  # after the snapshot: only in the journal
            await conn.aclose()
        assert not sock.exists()  # a clean shutdown removes its socket
        persistent = json.loads((data_dir / "memory" / "persistent.json").read_bytes())
        assert "k0" not in persistent and persistent["k5"]["value"] == 5  # the final snapshot at shutdown
        graph = json.loads((data_dir / "memory" / "knowledge_graph.json").read_bytes())
        assert graph["edges"] == [[a, b, "specializes"]] and set(graph["nodes"]) == {a, b}
        async with running_daemon(data_dir, sock, **store):
            conn = await RawConnection.open(sock)
            assert await conn.result("persistent.recall", {"key": "k0"}) is None
            assert (await conn.result("persistent.recall", {"key": "k19"}))["value"] == 19
            assert len(await conn.result("persistent.by_tag", {"tag": "t"})) == 19
            assert [n["node_id"] for n in await conn.result("graph.related", {"node_id": b})] == [a]
            await conn.aclose()


async def test_second_daemon_on_the_same_root_is_refused(data_dir: Path, sock_dir: Path) -> None:
    from eurekamem.daemon import Config, Daemon, StartupError

    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "a.sock"):
            with pytest.raises(StartupError, match="another eurekamem daemon"):
                await Daemon(Config(data_dir=data_dir, socket_path=sock_dir / "b.sock")).serve()
            assert not (sock_dir / "b.sock").exists()
            with pytest.raises(StartupError, match="already answering"):
                await Daemon(Config(data_dir=data_dir.parent / "other", socket_path=sock_dir / "a.sock")).serve()
            conn = await RawConnection.open(sock_dir / "a.sock")  # the first daemon is untouched
            assert await conn.result("sys.ping") == {"pong": True}
            await conn.aclose()


async def test_stale_socket_file_is_replaced(data_dir: Path, sock_dir: Path) -> None:
    import socket

    sock = sock_dir / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # the file stays, nobody listens
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock):
            conn = await RawConnection.open(sock)
            assert await conn.result("sys.ping") == {"pong": True}
            await conn.aclose()
