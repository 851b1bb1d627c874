"""`eurekamem mcp` through the MCP SDK's own client, over stdio and streamable HTTP, in both eras of
the protocol (the 2025 initialize handshake and the stateless 2026-07-28 requests), against a real
daemon subprocess (one per module). The HTTP server is one subprocess for the module too; each stdio
test starts its own server, as an agent does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from daemon_process import DaemonProcess, shared_daemon, wait_gone
from eurekamem.cli.mcp_tools import SEARCH_MIN_SCORE
from eurekamem.client import Client as DaemonClient
from eurekamem.client._autostart import daemon_answers

MCP_TIMEOUT = 90  # seconds for a whole session: the server's start imports the SDK
MODERN = "2026-07-28"
TOKEN = "test-token-0123456789"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with shared_daemon("em-mcp-") as proc:
        yield proc


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR", "EUREKAMEM_MCP_TOKEN")}
    return base | (extra or {})


def mcp_argv(daemon: DaemonProcess, *args: str) -> list[str]:
    return ["-m", "eurekamem.cli.main", "mcp", "--socket", str(daemon.socket_path), "--data-dir", str(daemon.data_dir),
            "--watch-interval", "0.05", *args]


def server_params(*args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "eurekamem.cli.main", "mcp", *args], env=_env(env))


class Inbox:
    """The notifications a client received, and a wait for the next one about a resource."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[str](100)

    async def handler(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await self.send.send(str(message.params.uri))


@asynccontextmanager
async def stdio_session(params: StdioServerParameters, mode: str, errlog: Path | None = None,
                        message_handler: Any = None) -> AsyncIterator[Client]:
    with open(errlog or os.devnull, "w") as err:
        from mcp.client.stdio import stdio_client

        client = Client(stdio_client(params, errlog=err), mode=mode, message_handler=message_handler)
        async with client:
            yield client


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    assert result.structured_content == json.loads(result.content[0].text)
    return result.structured_content


def refused(result: Any) -> str:
    assert result.is_error and result.structured_content is None, result
    text: str = result.content[0].text
    return text


def memory_count(daemon: DaemonProcess) -> int:
    with DaemonClient(daemon.socket_path, timeout=30) as c:
        count: int = c.call("sys.stats")["tiers"]["memory"]["memories"]
    return count


# --- stdio, the 2025 handshake: every tool, the resources, a subscription ----------------------


async def test_stdio_handshake_every_tool_resources_and_a_subscription(daemon: DaemonProcess, tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, env=_env(), args=mcp_argv(
        daemon, "--domain", "bandit theory", "--kind", "research", "--review"))
    inbox = Inbox()
    stderr = tmp_path / "mcp.stderr"
    with trio.fail_after(MCP_TIMEOUT):
        async with stdio_session(params, "legacy", stderr, inbox.handler) as s:
            assert s.protocol_version != MODERN and s.server_info is not None and s.server_info.name == "eurekamem"
            assert s.server_capabilities.resources is not None and s.server_capabilities.resources.subscribe
            assert "memory_search" in (s.instructions or "")

            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"memory_add", "memory_search", "memory_get", "memory_update", "memory_forget",
                                  "memory_restore", "memory_purge", "memory_list", "memory_inject", "conversation_append",
                                  "conversation_flush", "review_list", "review_decide"}
            for tool in tools.values():
                assert tool.title and tool.description and "call it" in tool.description.lower()
                assert tool.input_schema["type"] == "object" and tool.input_schema["additionalProperties"] is False
                assert tool.output_schema is not None and tool.output_schema["type"] == "object"
                a = tool.annotations
                assert a is not None and a.open_world_hint is False
                assert a.read_only_hint is not None and a.destructive_hint is not None and a.idempotent_hint is not None
            assert [n for n, t in tools.items() if t.annotations and t.annotations.destructive_hint] == ["memory_purge"]
            assert tools["memory_search"].annotations.read_only_hint  # type: ignore[union-attr]
            assert not tools["memory_add"].annotations.read_only_hint  # type: ignore[union-attr]
            # a research domain's server offers the research categories only
            assert tools["memory_add"].input_schema["properties"]["category"]["enum"] == [
                "domain_knowledge", "proof_strategy", "open_problems", "pitfalls"]
            assert '"bandit theory"' in tools["memory_add"].input_schema["properties"]["domain"]["description"]

            added = payload(await s.call_tool("memory_add", {
                "content": "Peel the time axis into geometric epochs and union-bound over them for anytime bounds.",
                "title": "Peeling for anytime bounds", "category": "proof_strategy", "tags": ["concentration"]}))
            assert added["decision"] == "created" and added["memory"]["domain"] == "bandit theory"
            memory_id = added["memory"]["id"]
            other = payload(await s.call_tool("memory_add", {
                "content": "The user prefers proofs written out in full.\nNo sketches.", "domain": "assistant"}))
            assert other["memory"]["title"] == "The user prefers proofs written out in full."  # the first line
            assert other["memory"]["category"] == "domain_knowledge" and other["memory"]["domain"] == "assistant"

            found = payload(await s.call_tool("memory_search", {"query": "anytime bound with epochs"}))["results"]
            assert [r["id"] for r in found] == [memory_id] and found[0]["score"] >= SEARCH_MIN_SCORE
            # the default floor leaves out what does not match; min_score 0 keeps every hit
            assert payload(await s.call_tool("memory_search", {"query": "zebra crossing at noon"}))["results"] == []
            everything = payload(await s.call_tool("memory_search", {"query": "zebra crossing at noon", "min_score": 0}))
            assert [r["id"] for r in everything["results"]] == [memory_id] and everything["results"][0]["score"] < 0.01
            got = payload(await s.call_tool("memory_get", {"id": memory_id}))
            assert got["memory"]["title"] == "Peeling for anytime bounds" and got["memory"]["tags"] == ["concentration"]
            listed = payload(await s.call_tool("memory_list", {}))
            assert listed["total"] == 1 and listed["memories"][0]["id"] == memory_id
            block = payload(await s.call_tool("memory_inject", {"query": "anytime epochs", "token_budget": 200}))
            assert block["text"].startswith("<memories>") and block["ids"] == [memory_id] and 0 < block["tokens"] <= 200
            assert payload(await s.call_tool("memory_inject", {"query": "zebra crossing at noon"}))["ids"] == []

            # scopes: another domain's local memory is not seen, nor changed, from here
            hidden = other["memory"]["id"]
            assert "not_found" in refused(await s.call_tool("memory_get", {"id": hidden}))
            assert "not_found" in refused(await s.call_tool("memory_update", {"id": hidden, "content": "x"}))
            assert "not_found" in refused(await s.call_tool("memory_forget", {"id": hidden}))
            assert "'bandit theory'" in refused(await s.call_tool("memory_list", {"domain": "assistant"}))

            # the resources: the guide, GLOBAL.md, this domain's MEMORY.md; a subscription to it
            resources = {str(r.uri): r for r in (await s.list_resources()).resources}
            uri = "eurekamem://memories/bandit%20theory/MEMORY.md"
            assert list(resources) == ["eurekamem://guide", "eurekamem://memories/GLOBAL.md", uri]
            text = (await s.read_resource(uri)).contents[0].text  # type: ignore[union-attr]
            assert text.startswith("# Memories: bandit theory") and "Peeling for anytime bounds" in text
            assert "memory_search" in (await s.read_resource("eurekamem://guide")).contents[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError, match="reads the memories of 'bandit theory'"):
                await s.read_resource("eurekamem://memories/assistant/MEMORY.md")
            with pytest.raises(MCPError, match="no resource"):
                await s.read_resource("eurekamem://memories/a/b/MEMORY.md")
            templates = (await s.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["eurekamem://memories/{domain}/MEMORY.md"]
            prompt = await s.get_prompt("memory_guide")
            assert "memory_add" in prompt.messages[0].content.text  # type: ignore[union-attr]

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # resources/subscribe is the 2025 way, deprecated in 2026
                await s.subscribe_resource(uri)
                await s.subscribe_resource("eurekamem://guide")  # taken; it never changes
                with pytest.raises(MCPError, match="reads the memories of 'bandit theory'"):
                    await s.subscribe_resource("eurekamem://memories/assistant/MEMORY.md")
            updated = payload(await s.call_tool("memory_update", {
                "id": memory_id, "title": "Peeling for anytime regret bounds", "pinned": True}))["memory"]
            assert updated["title"] == "Peeling for anytime regret bounds" and updated["pinned"] is True
            assert await inbox.receive.receive() == uri  # the daemon rewrote MEMORY.md
            assert "anytime regret bounds" in (await s.read_resource(uri)).contents[0].text  # type: ignore[union-attr]

            # the learning loop's feed: the group defaults to the server's domain
            turns = [{"id": "m1", "role": "user", "text": "Use Freedman's inequality for martingales.", "sender": "ana"},
                     {"id": "m2", "role": "assistant", "text": "Noted."}]
            assert payload(await s.call_tool("conversation_append", {"messages": turns})) == {"appended": 2, "ignored": 0}
            assert payload(await s.call_tool("conversation_append", {"messages": turns[:1]})) == {"appended": 0, "ignored": 1}
            assert payload(await s.call_tool("conversation_flush", {}))["job_id"]
            with DaemonClient(daemon.socket_path, timeout=30) as c:
                assert [m["id"] for m in c.call("conversation.get", {"group": "bandit theory"})] == ["m1", "m2"]
                review_id = c.call("memory.promote", {"id": memory_id, "reason": "general"})["review_id"]

            # review, for the person this server runs for
            pending = payload(await s.call_tool("review_list", {}))["requests"]
            assert [(r["id"], r["memory_id"]) for r in pending] == [(review_id, memory_id)]
            decided = payload(await s.call_tool("review_decide", {"id": review_id, "decision": "approve"}))["request"]
            assert decided["state"] == "approved" and decided["memory"]["scope"] == "global"
            assert "approved already" in refused(await s.call_tool("review_decide", {"id": review_id, "decision": "reject"}))

            # forget archives (still readable by id), purge erases
            assert payload(await s.call_tool("memory_forget", {"id": memory_id})) == {"id": memory_id, "status": "archived"}
            assert payload(await s.call_tool("memory_list", {}))["total"] == 0
            assert payload(await s.call_tool("memory_get", {"id": memory_id}))["memory"]["status"] == "archived"
            assert payload(await s.call_tool("memory_restore", {"id": memory_id}))["memory"]["status"] == "active"
            assert "not archived" in refused(await s.call_tool("memory_restore", {"id": memory_id}))
            assert "not_found" in refused(await s.call_tool("memory_restore", {"id": hidden}))
            assert payload(await s.call_tool("memory_purge", {"id": memory_id})) == {"id": memory_id, "status": "purged"}
            assert "not_found" in refused(await s.call_tool("memory_get", {"id": memory_id}))
    assert "Traceback" not in stderr.read_text()


# --- stdio, the 2026-07-28 stateless era -----------------------------------------------------------


async def test_stdio_2026_without_handshake_every_domain_and_a_listen_stream(daemon: DaemonProcess) -> None:
    params = StdioServerParameters(command=sys.executable, env=_env(), args=mcp_argv(daemon))
    with trio.fail_after(MCP_TIMEOUT):
        async with stdio_session(params, MODERN) as s:
            assert s.protocol_version == MODERN
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "review_list" not in tools and "review_decide" not in tools  # no --review
            assert tools["memory_add"].input_schema["properties"]["category"]["enum"] == [
                "fact", "preference", "skill", "goal", "context"]
            assert "conversation_append" in tools and tools["conversation_append"].input_schema["required"] == [
                "group", "messages"]  # no --domain to default to

            club, shared = "eurekamem://memories/book_club/MEMORY.md", "eurekamem://memories/GLOBAL.md"
            async with s.listen(resource_subscriptions=[club, shared, "eurekamem://guide"]) as sub:
                rule = payload(await s.call_tool("memory_add", {"content": "Group chat rule: no spoilers.",
                                                                "domain": "book club"}))
                assert rule["memory"]["category"] == "fact"
                assert str((await sub.__anext__()).uri) == club  # type: ignore[union-attr]
                # its MEMORY.md is written: the domain is listed (every domain's, by its folder)
                assert club in [str(r.uri) for r in (await s.list_resources()).resources]
                text = (await s.read_resource(club)).contents[0].text  # type: ignore[union-attr]
                assert text.startswith("# Memories: book club") and "no spoilers" in text

                name = payload(await s.call_tool("memory_add", {
                    "content": "The user's name is Ana.", "domain": "book club", "scope": "global"}))
                assert name["memory"]["scope"] == "global"
                while str((await sub.__anext__()).uri) != shared:  # type: ignore[union-attr]
                    pass  # the club's MEMORY.md changes too (it links GLOBAL.md now)
            text = (await s.read_resource(shared)).contents[0].text  # type: ignore[union-attr]
            assert "The user's name is Ana." in text
            found = payload(await s.call_tool("memory_search", {"query": "spoilers"}))
            assert found["results"][0]["domain"] == "book club"


# --- the daemon away -------------------------------------------------------------------------------


async def test_with_no_daemon_a_clean_error_and_one_log_line(tmp_path: Path) -> None:
    params = server_params("--data-dir", str(tmp_path / "root"), "--socket", str(tmp_path / "none.sock"),
                           env={"EUREKAMEM_NO_AUTOSTART": "1"})
    stderr = tmp_path / "mcp.stderr"
    with trio.fail_after(MCP_TIMEOUT):
        async with stdio_session(params, "legacy", stderr) as s:
            with pytest.raises(MCPError, match="cannot connect to eurekamem"):
                await s.list_resources()
            text = refused(await s.call_tool("memory_search", {"query": "anything"}))
            assert "cannot connect to eurekamem" in text and "is the daemon running?" in text
            # refused before any daemon call: the arguments' problem, not the daemon's
            assert "invalid arguments" in refused(await s.call_tool("memory_search", {"query": "x", "k": 0}))
    lines = stderr.read_text().splitlines()
    assert "Traceback" not in stderr.read_text()
    assert len([x for x in lines if "resource list" in x]) == 1, lines
    assert len([x for x in lines if "tool memory_search" in x]) == 1, lines


async def test_the_server_starts_the_daemon_when_none_listens() -> None:
    root = Path(tempfile.mkdtemp(prefix="em-mcp-auto-"))
    sock = root / "run" / "eurekamem.sock"
    try:
        params = server_params("--data-dir", str(root), "--socket", str(sock))
        with trio.fail_after(MCP_TIMEOUT):
            async with stdio_session(params, "auto") as s:
                added = payload(await s.call_tool("memory_add", {"content": "Started on demand.", "domain": "d"}))
                assert added["decision"] == "created"
        assert daemon_answers(str(sock)) and "serving on" in (root / "run" / "eurekamem.log").read_text()
    finally:
        if daemon_answers(str(sock)):
            with DaemonClient(sock, timeout=10) as c:
                pid = c.call("sys.stats")["pid"]
            os.kill(pid, 15)
            wait_gone(pid)
        shutil.rmtree(root, ignore_errors=True)


# --- streamable HTTP on loopback, behind a bearer token -------------------------------------------


class HttpServer:
    """`eurekamem mcp --http --port 0` as a subprocess: its URL, read from the line it prints."""

    def __init__(self, daemon: DaemonProcess, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *mcp_argv(daemon, "--http", "--port", "0", *args)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=_env({"EUREKAMEM_MCP_TOKEN": TOKEN}),
        )
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def drain() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if "serving on http://" in line:
                    self.url = line.split("serving on ", 1)[1].split()[0]
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(MCP_TIMEOUT) or not self.url:
            self.stop()
            raise RuntimeError("mcp --http did not start:\n" + "".join(self.lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def http_server(daemon: DaemonProcess) -> Iterator[HttpServer]:
    server = HttpServer(daemon, "--review")
    try:
        yield server
    finally:
        server.stop()
        assert "Traceback" not in "".join(server.lines), "".join(server.lines)


def http_client(url: str, mode: str, token: str = TOKEN) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def test_http_refuses_a_request_without_the_token(http_server: HttpServer) -> None:
    assert http_server.url.startswith("http://127.0.0.1:") and http_server.url.endswith("/mcp")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": MODERN}
    with trio.fail_after(30):
        async with httpx2.AsyncClient(timeout=30) as http:
            for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                answer = await http.post(http_server.url, json=body, headers=headers | auth)
                assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
                assert "tools" not in answer.text
    with pytest.raises(BaseExceptionGroup) as caught:  # the SDK's client: the 401 as an MCP error
        with trio.fail_after(30):
            async with http_client(http_server.url, "legacy", token="wrong"):
                pass
    assert caught.value.subgroup(MCPError) is not None


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_http_serves_both_eras_and_their_subscriptions(http_server: HttpServer, mode: str) -> None:
    domain = "web " + mode
    uri = f"eurekamem://memories/{domain.replace(' ', '_').replace('-', '_')}/MEMORY.md"
    inbox = Inbox()
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    with trio.fail_after(MCP_TIMEOUT):
        async with Client(streamable_http_client(http_server.url, http_client=http), mode=mode,
                          message_handler=inbox.handler) as s:
            assert (s.protocol_version == MODERN) == (mode == MODERN)
            tools = {t.name for t in (await s.list_tools()).tools}
            assert {"memory_add", "memory_purge", "review_decide"} <= tools
            content = f"HTTP clients reach the memory too ({mode})."
            if mode == MODERN:  # a subscriptions/listen stream
                async with s.listen(resource_subscriptions=[uri]) as sub:
                    added = payload(await s.call_tool("memory_add", {"content": content, "domain": domain}))
                    assert str((await sub.__anext__()).uri) == uri  # type: ignore[union-attr]
            else:  # resources/subscribe: the notification comes on the session's own stream
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await s.subscribe_resource(uri)
                added = payload(await s.call_tool("memory_add", {"content": content, "domain": domain}))
                assert await inbox.receive.receive() == uri
            found = payload(await s.call_tool("memory_search", {"query": content, "domain": domain}))["results"]
            assert found[0]["id"] == added["memory"]["id"]
            assert "invalid arguments" in refused(await s.call_tool("memory_add", {"content": 7}))


# --- every advertised schema refuses what it forbids --------------------------------------------


def _valid(schema: dict[str, Any]) -> Any:
    """A value `schema` accepts: the least one of its type within its bounds."""
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _valid(schema["anyOf"][0])
    kind = schema["type"]
    if kind == "string":
        return "x" * max(schema.get("minLength", 1), 1)
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return True
    if kind == "array":
        return [_valid(schema["items"])] * schema.get("minItems", 0)
    return {name: _valid(schema["properties"][name]) for name in schema.get("required", ())}


WRONG_TYPE = {"string": 7, "integer": "7", "number": "0.5", "boolean": "true", "array": "x", "object": ["x"]}


def _forbidden(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(what, value) pairs `schema` forbids: a value of another type, past each bound, off its enum;
    an object's unknown member and each member's own; an array's item's."""
    kind = schema.get("type")
    if kind is not None:
        yield f"a {type(WRONG_TYPE[kind]).__name__} for a {kind}", WRONG_TYPE[kind]
    if kind == "integer":
        yield "a fraction for an integer", 1.5
    if "enum" in schema:
        yield "a value off the enum", "no-such-value"
    if "minimum" in schema and schema["minimum"] > -(2**63):
        yield "below the minimum", schema["minimum"] - (1 if kind == "integer" else 0.5)
    if "maximum" in schema and schema["maximum"] < 2**63 - 1:
        yield "above the maximum", schema["maximum"] + (1 if kind == "integer" else 0.5)
    if schema.get("minLength"):
        yield "shorter than minLength", "x" * (schema["minLength"] - 1)
    if "maxLength" in schema and schema["maxLength"] <= 4096:  # longer ones: the same rule, a big frame
        yield "longer than maxLength", "x" * (schema["maxLength"] + 1)
    if kind == "array":
        item = _valid(schema["items"])
        if schema.get("minItems"):
            yield "fewer items than minItems", []
        if "maxItems" in schema and schema["maxItems"] <= 256:
            yield "more items than maxItems", [item] * (schema["maxItems"] + 1)
        for what, value in _forbidden(schema["items"]):
            yield f"an item: {what}", [value]
    if kind == "object":
        base = _valid(schema)
        if schema.get("additionalProperties") is False:
            yield "an unknown member", {**base, "no_such_member": 1}
        for name in schema.get("required", ()):
            yield f"no {name}", {k: v for k, v in base.items() if k != name}
        for name, member in schema["properties"].items():
            for what, value in _forbidden(member):
                yield f"{name}: {what}", {**base, name: value}


async def test_every_tool_schema_refuses_what_it_forbids(http_server: HttpServer, daemon: DaemonProcess) -> None:
    """Derived from the schemas as advertised: for every tool, an unknown field, a missing required
    one, a value of the wrong type for each property (and each item), each bound crossed, each enum
    left: refused with isError naming the tool, and nothing reaches the daemon."""
    before = memory_count(daemon)
    checked = 0
    failures: list[tuple[str, str, Any]] = []

    limit = trio.CapacityLimiter(8)  # a few calls at a time: their waits overlap

    async def refuse(s: Client, name: str, what: str, arguments: dict[str, Any]) -> None:
        nonlocal checked
        async with limit:
            result = await s.call_tool(name, arguments)
        text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
        if not (result.is_error and f"invalid arguments for {name}" in text):
            failures.append((name, what, arguments))
        checked += 1

    with trio.fail_after(MCP_TIMEOUT):
        async with http_client(http_server.url, MODERN) as s:
            async with trio.open_nursery() as nursery:
                for tool in (await s.list_tools()).tools:
                    cases = list(_forbidden(tool.input_schema))
                    assert any(what == "an unknown member" for what, _ in cases)
                    for what, arguments in cases:
                        if isinstance(arguments, dict):  # else not an object: the SDK's own params check
                            nursery.start_soon(refuse, s, tool.name, what, arguments)
    assert failures == []
    assert checked > 150
    assert memory_count(daemon) == before


def test_the_least_valid_arguments_pass_the_check() -> None:
    """The other half of the property: what the schema allows passes, with its defaults filled in
    (k: 0 and token_budget: 0 are refused, never replaced by a default)."""
    from eurekamem.cli.mcp_tools import SEARCH_K, ToolError, check_arguments, tool_specs

    for spec in tool_specs("project", "research", review=True) + tool_specs(None):
        checked = check_arguments(spec, _valid(spec.input_schema))
        assert set(checked) >= set(spec.input_schema.get("required", ()))
    search = next(spec for spec in tool_specs(None) if spec.name == "memory_search")
    assert check_arguments(search, {"query": "q"})["k"] == SEARCH_K
    inject = next(spec for spec in tool_specs(None) if spec.name == "memory_inject")
    for bad in ({"k": 0}, {"token_budget": 0}, {"k": True}, {"query": ""}):
        with pytest.raises(ToolError, match="invalid arguments for memory_inject"):
            check_arguments(inject, bad)


# --- the tools' schemas state the protocol's bounds (no daemon) ----------------------------------

# the daemon method each tool's arguments come from, and the least params it takes
TOOL_METHODS = {
    "memory_add": ("memory.add", {"domain": "d", "category": "fact", "title": "t", "content": "c"}),
    "memory_search": ("memory.search", {"query": "q"}),
    "memory_get": ("memory.get", {"id": "m"}),
    "memory_update": ("memory.update", {"id": "m"}),
    "memory_list": ("memory.list", {}),
    "memory_forget": ("memory.delete", {"id": "m"}),
    "memory_purge": ("memory.delete", {"id": "m"}),
    "memory_restore": ("memory.restore", {"id": "m"}),
    "memory_inject": ("memory.inject", {"domain": "d"}),
    "conversation_append": ("conversation.append", {"group": "g", "messages": []}),
    "conversation_flush": ("conversation.flush", {"group": "g"}),
    "review_list": ("review.list", {}),
    "review_decide": ("review.reject", {"id": "r"}),
}
TOOL_OWN = {("review_decide", "decision")}  # arguments of the tool's own, not a protocol field


def _edges(schema: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """Values at each bound `schema` states (accepted) and just past it (refused)."""
    if "maxLength" in schema:
        yield "x" * schema["maxLength"], True
        yield "x" * (schema["maxLength"] + 1), False
    if schema.get("minLength"):
        yield "x" * schema["minLength"], True
        yield "x" * (schema["minLength"] - 1), False
    if "maximum" in schema:
        step = 1 if schema["type"] == "integer" else 0.5
        yield schema["maximum"], True
        yield schema["maximum"] + step, False
    if "minimum" in schema:
        step = 1 if schema["type"] == "integer" else 0.5
        yield schema["minimum"], True
        yield schema["minimum"] - step, False
    if "enum" in schema:
        yield from ((value, True) for value in schema["enum"])
        yield "no-such-value", False
    if "items" in schema and "properties" not in schema["items"]:
        item = next(value for value, ok in _edges(schema["items"]) if ok)
        if "maxItems" in schema:
            yield [item] * schema["maxItems"], True
            yield [item] * (schema["maxItems"] + 1), False
        yield from (([value], ok) for value, ok in _edges(schema["items"]))


def test_every_bound_of_a_tool_schema_is_the_protocols() -> None:
    import msgspec

    from eurekamem.cli.mcp_tools import tool_specs
    from eurekamem.protocol import METHODS

    checked = 0
    for spec in tool_specs("project", "research", review=True) + tool_specs(None):
        method, least = TOOL_METHODS[spec.name]
        for name, schema in spec.input_schema["properties"].items():
            if (spec.name, name) in TOOL_OWN:
                continue
            if name == "title" and spec.name == "memory_add":  # "" is the tool's own: the first line of content
                assert "minLength" not in schema
            for value, ok in _edges(schema):
                params = {**least, name: value}
                if ok:
                    msgspec.convert(params, METHODS[method].params)
                else:
                    with pytest.raises(msgspec.ValidationError):
                        msgspec.convert(params, METHODS[method].params)
                checked += 1
            # and every bound the protocol puts on the field is stated (the add's title's minLength aside)
            field = _protocol_field(METHODS[method].params, name)
            mine = _bounds(schema) | ({"minLength"} if name == "title" and spec.name == "memory_add" else set())
            assert mine - {"minItems"} == _bounds(field), (spec.name, name)
    assert checked > 150


_BOUNDS = ("minLength", "maxLength", "minimum", "maximum", "maxItems", "minItems")


def _protocol_field(params: type, name: str) -> dict[str, Any]:
    import msgspec

    _, components = msgspec.json.schema_components([params])
    field: dict[str, Any] = components[params.__name__]["properties"][name]
    return next((branch for branch in field.get("anyOf", ()) if branch != {"type": "null"}), field)


def _bounds(schema: dict[str, Any]) -> set[str]:
    items = schema.get("items", {})
    nested = {"items." + key for key in _bounds(items)} if "type" in items and "properties" not in items else set()
    return {key for key in _BOUNDS if key in schema} | nested


def test_the_http_token_is_kept_in_the_data_root_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from eurekamem.cli.mcp_server import http_token

    monkeypatch.delenv("EUREKAMEM_MCP_TOKEN", raising=False)
    no_file = argparse.Namespace(token_file=None)
    token, where = http_token(no_file, tmp_path)
    path = tmp_path / "run" / "mcp-token"
    assert where == str(path) and len(token) >= 40 and path.stat().st_mode & 0o777 == 0o600
    assert http_token(no_file, tmp_path) == (token, where)  # kept across restarts
    path.chmod(0o644)  # a token others could read is no secret: replaced
    again, _ = http_token(no_file, tmp_path)
    assert again != token and path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("EUREKAMEM_MCP_TOKEN", " from-env ")
    assert http_token(no_file, tmp_path) == ("from-env", "$EUREKAMEM_MCP_TOKEN")
    (tmp_path / "t").write_text("from-file\n")
    assert http_token(argparse.Namespace(token_file=str(tmp_path / "t")), tmp_path) == ("from-file", str(tmp_path / "t"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="holds no token"):
        http_token(argparse.Namespace(token_file=str(tmp_path / "empty")), tmp_path)


def test_a_tool_enum_may_narrow_the_protocols_never_widen_it() -> None:
    from eurekamem.cli.mcp_tools import _argument

    assert _argument("memory.add", "category", enum=["fact"])["enum"] == ["fact"]
    with pytest.raises(ValueError, match="not within the protocol's"):
        _argument("memory.add", "category", enum=["fact", "gossip"])
