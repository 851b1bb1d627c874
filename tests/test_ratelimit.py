"""The per-connection request rate limit: a token bucket on trio's clock, `overloaded` past it."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.daemon.config import build_config, load
from eurekamem.daemon.io_layer import IOLayer
from eurekamem.daemon.server import Limits
from eurekamem.daemon.stats import RequestStats


def _pong(call: Any, reply: Any, started_ns: int) -> None:
    reply.deliver(call, {"pong": True}, started_ns)


async def _read_answers(stream: trio.SocketStream, buf: bytearray, n: int) -> list[dict]:
    while buf.count(b"\n") < n:
        data = await stream.receive_some(65536)
        assert data, "connection closed"
        buf += data
    lines = bytes(buf).split(b"\n")
    out, rest = lines[:n], b"\n".join(lines[n:])
    buf[:] = rest
    return [json.loads(line) for line in out]


def _pings(first_id: int, n: int) -> bytes:
    return b"".join(b'{"id":%d,"method":"sys.ping"}\n' % (first_id + i) for i in range(n))


async def test_token_bucket_refuses_the_excess_then_allows_again(autojump_clock: trio.abc.Clock) -> None:
    """10 requests/s, bursts of 5, on a real socket pair; the clock is virtual (autojump)."""
    server_sock, client_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_sock.setblocking(False)
    stats = RequestStats()
    limits = Limits(max_requests_per_second=10, request_burst=5)
    layer = IOLayer(limits, _pong, stats)
    layer.add(server_sock)
    client = trio.SocketStream(trio.socket.from_stdlib_socket(client_sock))
    buf = bytearray()
    with trio.fail_after(IO_TIMEOUT + 100):  # virtual seconds: the test sleeps about 63 of them
        async with trio.open_nursery() as nursery:
            nursery.start_soon(layer.run)
            # within the burst: all pass
            await client.send_all(_pings(1, 5))
            assert all("result" in a for a in await _read_answers(client, buf, 5))
            # the bucket is empty: the next ones are refused at once, and the connection stays open
            await client.send_all(_pings(6, 3))
            refused = await _read_answers(client, buf, 3)
            assert [a["error"]["data"]["kind"] for a in refused] == ["overloaded"] * 3
            assert refused[0]["error"]["code"] == -32029
            assert refused[0]["error"]["message"].startswith("rate limit: 10 requests/s per connection")
            assert refused[0]["error"]["data"]["limit"] == 10 and refused[0]["error"]["data"]["burst"] == 5
            assert stats.rate_limited == 3
            # 0.2 s later two tokens are back (10/s): two pass, the third is refused
            await trio.sleep(0.2)
            await client.send_all(_pings(9, 3))
            answers = await _read_answers(client, buf, 3)
            assert ["result" in a for a in answers] == [True, True, False]
            # a steady 10/s passes for ever: one request every 0.1 s
            for i in range(20):
                await trio.sleep(0.1)
                await client.send_all(_pings(100 + i, 1))
                assert "result" in (await _read_answers(client, buf, 1))[0]
            # after a long pause the bucket holds at most a burst
            await trio.sleep(60)
            await client.send_all(_pings(200, 6))
            assert ["result" in a for a in await _read_answers(client, buf, 6)] == [True] * 5 + [False]
            assert stats.rate_limited == 5
            # a batch counts each of its requests
            await trio.sleep(0.3)  # 3 tokens
            await client.send_all(b"[" + b",".join(b'{"id":%d,"method":"sys.ping"}' % i for i in range(300, 305)) + b"]\n")
            batch = (await _read_answers(client, buf, 1))[0]
            assert sorted("result" in a for a in batch) == [False, False, True, True, True]
            await client.send_eof()
            assert await client.receive_some(65536) == b""  # every answer given, the connection closed
            nursery.cancel_scope.cancel()
        assert stats.summary()["rate_limited"] == 7


async def test_without_a_limit_nothing_is_refused(autojump_clock: trio.abc.Clock) -> None:
    server_sock, client_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server_sock.setblocking(False)
    stats = RequestStats()
    layer = IOLayer(Limits(), _pong, stats)
    conn = layer.add(server_sock)
    client = trio.SocketStream(trio.socket.from_stdlib_socket(client_sock))
    assert conn.protocol.rate_limiter is None
    buf = bytearray()
    with trio.fail_after(IO_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(layer.run)
            await client.send_all(_pings(1, 1000))
            assert all("result" in a for a in await _read_answers(client, buf, 1000))
            await client.send_eof()
            assert await client.receive_some(65536) == b""  # every answer given, the connection closed
            nursery.cancel_scope.cancel()
    assert stats.rate_limited == 0


async def test_the_daemon_applies_its_configured_rate_limit(data_dir: Path, sock_dir: Path) -> None:
    """Through the real daemon: the excess changes nothing; the limit shows in sys.hello and sys.stats."""
    sock = sock_dir / "s.sock"
    with trio.fail_after(IO_TIMEOUT):
        # 0.01 requests/s: the bucket cannot refill during the test, whatever the machine's speed
        async with running_daemon(data_dir, sock, max_requests_per_second=0.01, request_burst=3):
            conn = await RawConnection.open(sock)
            hello = await conn.result("sys.hello", {})
            assert hello["limits"]["max_requests_per_second"] == 0.01 and hello["limits"]["request_burst"] == 3
            await conn.result("persistent.remember", {"key": "a", "value": 1})
            await conn.result("persistent.remember", {"key": "a", "value": 2})
            answer = await conn.call("persistent.remember", {"key": "a", "value": 3})
            assert answer["error"]["data"]["kind"] == "overloaded"
            assert "rate limit: 0.01 requests/s per connection" in answer["error"]["message"]
            assert await conn.error_kind("sys.stats", {}) == "overloaded"  # the connection stays open
            other = await RawConnection.open(sock)  # the limit is per connection
            assert (await other.result("persistent.recall", {"key": "a"}))["value"] == 2  # nothing changed
            stats = await other.result("sys.stats", {})
            assert stats["requests"]["rate_limited"] == 2
            assert stats["requests"]["methods"]["persistent.remember"]["errors"] == {"overloaded": 1}
            await conn.aclose()
            await other.aclose()


def test_rate_limit_settings_come_from_file_env_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("EUREKAMEM_MAX_REQUESTS_PER_SECOND", "EUREKAMEM_REQUEST_BURST"):
        monkeypatch.delenv(name, raising=False)
    assert load({}, None)["max_requests_per_second"] == 0  # unlimited by default
    config = tmp_path / "c.toml"
    config.write_text("max_requests_per_second = 500\nrequest_burst = 50\n")
    eff = load({}, str(config))
    assert eff["max_requests_per_second"] == 500 and eff.sources["request_burst"] == "file"
    monkeypatch.setenv("EUREKAMEM_MAX_REQUESTS_PER_SECOND", "250.5")
    eff = load({}, str(config))
    assert eff["max_requests_per_second"] == 250.5 and eff.sources["max_requests_per_second"] == "env"
    eff = load({"max_requests_per_second": "1000"}, str(config))
    assert eff["max_requests_per_second"] == 1000 and eff.sources["max_requests_per_second"] == "flag"
    built = build_config(eff)
    assert built.max_requests_per_second == 1000 and built.request_burst == 50
    config.write_text("max_requests_per_second = -1\n")
    with pytest.raises(Exception, match="max_requests_per_second"):
        load({}, str(config))
