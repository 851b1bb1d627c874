"""`eurekamem mcp`: a stdio MCP server (the official `mcp` SDK) that proxies to the daemon's socket.

Rules kept here: stdout is the protocol and nothing else (logs go to stderr; the SDK also points
fd 1 at stderr while it serves); the server holds no memory of its own: every tool call and
resource read is one or two daemon calls through eurekamem.client.AsyncClient, which starts the
daemon on demand for the data root when nothing listens (EUREKAMEM_NO_AUTOSTART=1 turns that off);
a daemon error becomes a tool result with isError, never a crash of the server.

Scopes: a server started with --domain is that project's. Its reads (search, get, list, inject,
resources) see the domain's own memories and every domain's global ones, never another domain's
local memories: a read naming another domain is refused, and memory_get / memory_forget of another
domain's local memory answer as for an unknown id. It may still add a memory to another domain.

It runs under trio: the SDK is written against anyio, whose trio backend it supports, and trio is
what the rest of eurekamem runs on (AsyncClient detects it).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from typing import Any
from urllib.parse import quote, unquote

import msgspec

from ..protocol import ASSISTANT_CATEGORIES, METHODS, RESEARCH_CATEGORIES

log = logging.getLogger("eurekamem.mcp")

URI_PREFIX = "eurekamem://domain/"
CATEGORIES = [*ASSISTANT_CATEGORIES, *RESEARCH_CATEGORIES]  # the assistant's first: "fact" is the default
# The tools' own defaults, where they differ from the daemon's (an agent's prompt wants fewer hits, and a
# bounded block): the schema says them and the call sends them.
SEARCH_K = 5
INJECT_TOKEN_BUDGET = 1000


# --- the tools' argument schemas: each bound is the protocol's --------------------------------------


@functools.cache
def _protocol_fields(method: str) -> dict[str, dict[str, Any]]:
    """The JSON Schema of each params field of `method`, as msgspec derives it from the params Struct
    (the Meta bounds, the Literal's values, the default); a nullable field's is its non-null branch."""
    params = METHODS[method].params
    _, components = msgspec.json.schema_components([params])
    fields: dict[str, dict[str, Any]] = {}
    for name, schema in components[params.__name__]["properties"].items():
        branches = [branch for branch in schema.get("anyOf", ()) if branch != {"type": "null"}]
        if len(branches) == 1:
            schema = {**branches[0], **({"default": schema["default"]} if schema.get("default") is not None else {})}
        fields[name] = schema
    return fields


def _argument(method: str, field: str, *, without: tuple[str, ...] = (), **tool: Any) -> dict[str, Any]:
    """A tool argument's schema: `field` of `method`'s params Struct (protocol/methods.py, the one
    source of its bounds), less the keywords `without` names, then what the tool adds itself (its
    description, its own default, the order of an enum's values, which must be the Struct's)."""
    schema = {k: v for k, v in _protocol_fields(method)[field].items() if k not in without}
    for key, value in tool.items():
        if key in ("enum", "items") and key in schema and _canonical(value) != _canonical(schema[key]):
            raise ValueError(f"{method}'s {field}: the tool's {key} {value!r} is not the protocol's {schema[key]!r}")
    schema.update(tool)
    if "enum" in schema and "type" not in schema and all(isinstance(v, str) for v in schema["enum"]):
        schema = {"type": "string", **schema}
    return schema


def _canonical(schema: Any) -> Any:
    """An enum (or a schema holding one) with its values sorted and no "type", to compare what it allows."""
    if isinstance(schema, list):
        return sorted(schema)
    if isinstance(schema, dict):
        return {k: _canonical(v) for k, v in schema.items() if k != "type"}
    return schema


def _list_all() -> int:
    """The most memories one memory.list answers (its limit's maximum): a resource lists that many."""
    most: int = _protocol_fields("memory.list")["limit"]["maximum"]
    return most


def _domain_property(method: str, default: str | None) -> dict[str, Any]:
    said = (
        f' Default: "{default}" (this server\'s project; it reads only that domain and global memories).'
        if default else " Default: every domain."
    )
    return _argument(
        method, "domain",
        description="The project or group of the memory (a research field, a repository, a chat group)." + said,
    )


def tool_specs(default_domain: str | None) -> list[dict[str, Any]]:
    """Each tool: name, description and JSON Schema of its arguments (their bounds: the protocol's)."""

    def domain(method: str) -> dict[str, Any]:
        return _domain_property(method, default_domain)

    return [
        {
            "name": "memory_add",
            "description": (
                "Store one memory: a fact, preference, decision or insight worth keeping across sessions. "
                "One idea per memory, in a sentence or a short paragraph. A near duplicate in the same domain "
                "and category is merged into the existing memory instead of stored twice. Returns the decision "
                "(created, merged, skipped) and the memory with its id."
            ),
            "input_schema": {
                "type": "object",
                "properties": {
                    "content": _argument("memory.add", "content", description="The memory's full text."),
                    # "" (or none): the first line of content, so the protocol's minLength is not the tool's
                    "title": _argument("memory.add", "title", without=("minLength",),
                                       description="A short title; the first line of content when left out."),
                    "category": _argument("memory.add", "category", enum=CATEGORIES, default="fact",
                                          description="What kind of memory this is."),
                    "domain": domain("memory.add"),
                    "tags": _argument("memory.add", "tags", without=("default",)),
                    "confidence": _argument("memory.add", "confidence",
                                            description="How sure this is; below 0.5 the memory is not stored."),
                    "scope": _argument("memory.add", "scope", enum=["local", "global"],
                                       description="global: seen from every domain (e.g. the user's general preferences)."),
                },
                "required": ["content"],
                "additionalProperties": False,
            },
        },
        {
            "name": "memory_search",
            "description": (
                "Find memories relevant to a question or a task (hybrid search: meaning and keywords), best first. "
                "Use before answering anything that earlier sessions may have settled."
            ),
            "input_schema": {
                "type": "object",
                "properties": {
                    "query": _argument("memory.search", "query"),
                    "domain": domain("memory.search"),
                    "k": _argument("memory.search", "k", default=SEARCH_K, description="How many memories at most."),
                    "categories": _argument("memory.search", "categories", items={"type": "string", "enum": CATEGORIES}),
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
        {
            "name": "memory_get",
            "description": "One memory by its id, with its full text and every field.",
            "input_schema": {
                "type": "object",
                "properties": {"id": _argument("memory.get", "id", description="The memory's id.")},
                "required": ["id"],
                "additionalProperties": False,
            },
        },
        {
            "name": "memory_list",
            "description": "The memories of a domain, newest first, one line each (title, category, abstract, id).",
            "input_schema": {
                "type": "object",
                "properties": {
                    "domain": domain("memory.list"),
                    "category": _argument("memory.list", "category", enum=CATEGORIES),
                    "limit": _argument("memory.list", "limit"),
                    "offset": _argument("memory.list", "offset"),
                },
                "additionalProperties": False,
            },
        },
        {
            "name": "memory_forget",
            "description": (
                "Forget a memory that is wrong or no longer true: it is archived (kept on disk, no longer "
                "found or injected), not destroyed."
            ),
            "input_schema": {
                "type": "object",
                "properties": {"id": _argument("memory.delete", "id", description="The memory's id.")},
                "required": ["id"],
                "additionalProperties": False,
            },
        },
        {
            "name": "memory_inject",
            "description": (
                "A <memories> block for a prompt: the memories most relevant to the query (else the newest), "
                "shortened to fit the token budget."
            ),
            "input_schema": {
                "type": "object",
                "properties": {
                    "query": _argument("memory.inject", "query"),
                    "domain": domain("memory.inject"),
                    "k": _argument("memory.inject", "k"),
                    "token_budget": _argument("memory.inject", "token_budget", default=INJECT_TOKEN_BUDGET),
                },
                "additionalProperties": False,
            },
        },
    ]


class ToolError(Exception):
    """A tool call that cannot be done: answered with isError, the server goes on."""


def _title_from(content: str) -> str:
    first = content.strip().splitlines()[0].strip() if content.strip() else ""
    return (first[:77] + "...") if len(first) > 80 else (first or "memory")


def _summary(memory: dict[str, Any]) -> dict[str, Any]:
    return {k: memory.get(k) for k in ("id", "title", "category", "domain", "abstract", "confidence", "tags", "scope")}


class Proxy:
    """The tools and resources, each a call or two to the daemon."""

    def __init__(self, client: Any, default_domain: str | None) -> None:
        self.client = client
        self.default_domain = default_domain

    def _domain(self, args: dict[str, Any]) -> str | None:
        given = args.get("domain")
        return given if isinstance(given, str) else self.default_domain

    def _read_domain(self, args: dict[str, Any]) -> str | None:
        """The domain a read runs in: this server's own when it has one (another is refused)."""
        domain = self._domain(args)
        if self.default_domain is not None and domain is not None and not same_domain(domain, self.default_domain):
            raise ToolError(
                f"this server reads the memories of {self.default_domain!r} (and global ones) only, not of {domain!r}"
            )
        return domain

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, "tool_" + name, None)
        if handler is None:
            raise ToolError(f"no tool named {name!r}")
        result: dict[str, Any] = await handler(args)
        return result

    async def tool_memory_add(self, args: dict[str, Any]) -> dict[str, Any]:
        content = str(args.get("content", ""))
        if not content.strip():
            raise ToolError("content is empty")
        params: dict[str, Any] = {
            "domain": self._domain(args) or "",
            "category": args.get("category") or "fact",
            "title": args.get("title") or _title_from(content),
            "content": content,
        }
        for name in ("tags", "confidence", "scope"):
            if args.get(name) is not None:
                params[name] = args[name]
        result = await self.client.call("memory.add", params)
        return {"decision": result.get("decision"), "memory": _summary(result.get("memory") or {}),
                "reason": result.get("reason")}

    async def tool_memory_search(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"query": args.get("query", ""), "k": args.get("k") or SEARCH_K}
        domain = self._read_domain(args)
        if domain is not None:
            params["domain"] = domain
        if args.get("categories"):
            params["categories"] = args["categories"]
        hits = await self.client.call("memory.search", params)
        return {"results": [
            {"score": round(float(hit.get("score", 0.0)), 4), **_summary(hit["memory"]),
             "content": hit["memory"]["content"]}
            for hit in hits
        ]}

    async def _get(self, memory_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {"id": memory_id}
        if self.default_domain is not None:  # another domain's local memory is not_found from here
            params["domain"] = self.default_domain
        result: dict[str, Any] = await self.client.call("memory.get", params)
        return result

    async def tool_memory_get(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"memory": await self._get(args.get("id", ""))}

    async def tool_memory_list(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": args.get("limit") or 50, "offset": args.get("offset") or 0}
        domain = self._read_domain(args)
        if domain is not None:
            params["domain"] = domain
            params["include_global"] = self.default_domain is not None
        if args.get("category"):
            params["category"] = args["category"]
        page = await self.client.call("memory.list", params)
        return {"total": page.get("total"), "memories": [_summary(m) for m in page.get("memories", [])]}

    async def tool_memory_forget(self, args: dict[str, Any]) -> dict[str, Any]:
        memory_id = args.get("id", "")
        if self.default_domain is not None:
            await self._get(memory_id)  # not_found for another domain's local memory
        result: dict[str, Any] = await self.client.call("memory.delete", {"id": memory_id, "purge": False})
        return result

    async def tool_memory_inject(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "domain": self._read_domain(args) or "",
            "k": args.get("k") or 4,
            "token_budget": args.get("token_budget") or INJECT_TOKEN_BUDGET,
        }
        if args.get("query"):
            params["query"] = args["query"]
        result = await self.client.call("memory.inject", params)
        return {"text": result.get("text", ""), "ids": result.get("ids", []), "tokens": result.get("tokens", 0)}

    # --- resources: each domain's listing -------------------------------------------------------

    async def domains(self) -> list[str]:
        if self.default_domain is not None:
            return [self.default_domain]
        page = await self.client.call("memory.list", {"limit": _list_all()})
        return sorted({m.get("domain", "") for m in page.get("memories", [])})

    async def listing(self, domain: str) -> str:
        """A domain's resource: its own memories (local and global), never another domain's for a
        server with --domain (that is refused, as a read naming it is)."""
        self._read_domain({"domain": domain})
        page = await self.client.call("memory.list", {"domain": domain, "limit": _list_all()})
        memories = page.get("memories", [])
        total = page.get("total", len(memories))
        lines = [f"# Memories: {domain or 'general'}", "", f"{total} memories, newest first.", ""]
        for m in memories:
            title, category, abstract = m.get("title", ""), m.get("category", ""), m.get("abstract", "")
            lines.append(f"- **{title}** ({category}): {abstract} `{m.get('id', '')}`")
        return "\n".join(lines) + "\n"


def same_domain(a: str, b: str) -> bool:
    """The daemon's rule: domains are the same when their slugs are."""
    from ..protocol.readable import domain_slug

    return domain_slug(a) == domain_slug(b)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eurekamem")
    except PackageNotFoundError:  # a source tree that was not installed
        return "0.0.0+source"


def resource_uri(domain: str) -> str:
    return URI_PREFIX + quote(domain, safe="")


def domain_of(uri: str) -> str:
    if not uri.startswith(URI_PREFIX):
        raise ToolError(f"unknown resource {uri!r}")
    return unquote(uri[len(URI_PREFIX) :])


def build_server(proxy: Proxy) -> Any:
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from ..client import EurekamemError

    def as_result(payload: dict[str, Any] | None, error: str | None = None) -> Any:
        if error is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=error)], is_error=True)
        text = json.dumps(payload, indent=2, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=payload)

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=[types.Tool(**spec) for spec in tool_specs(proxy.default_domain)])

    async def call_tool(ctx: Any, params: Any) -> Any:
        try:
            return as_result(await proxy.call(params.name, dict(params.arguments or {})))
        except ToolError as exc:
            return as_result(None, str(exc))
        except EurekamemError as exc:
            log.info("tool %s: %s: %s", params.name, exc.kind, exc)
            return as_result(None, f"{exc.kind}: {exc}")

    async def list_resources(ctx: Any, params: Any) -> Any:
        resources = [
            types.Resource(
                uri=resource_uri(domain), name=domain or "general", mime_type="text/markdown",
                description=f"The memories of {domain or 'general'}: title, category and abstract of each",
            )
            for domain in await proxy.domains()
        ]
        return types.ListResourcesResult(resources=resources)

    async def read_resource(ctx: Any, params: Any) -> Any:
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        try:
            text = await proxy.listing(domain_of(uri))
        except ToolError as exc:  # a refused read: the client's error, no traceback in the log
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        except EurekamemError as exc:
            log.info("resource %s: %s: %s", uri, exc.kind, exc)
            raise MCPError(types.INVALID_PARAMS if exc.kind == "invalid_params" else types.INTERNAL_ERROR,
                           f"{exc.kind}: {exc}") from None
        contents: list[types.TextResourceContents | types.BlobResourceContents] = [
            types.TextResourceContents(uri=uri, text=text, mime_type="text/markdown")
        ]
        return types.ReadResourceResult(contents=contents)

    return Server(
        "eurekamem",
        version=_version(),
        instructions=(
            "Long-term memory shared across sessions. Search it (memory_search) before answering questions that "
            "earlier sessions may have settled; store durable facts, preferences and decisions (memory_add); "
            "forget what turned out wrong (memory_forget)."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        print("eurekamem: `eurekamem mcp` needs the MCP SDK: pip install 'eurekamem[mcp]'", file=sys.stderr)
        return 1
    import anyio
    from mcp.server.stdio import stdio_server

    from ..client import AsyncClient, data_root
    from ..daemon.config import setup_logging
    from .common import client_socket

    setup_logging(args.log_level, "text", stream=sys.stderr)
    root = data_root(args.data_dir)
    socket_path = client_socket(args)
    client = AsyncClient(socket_path, timeout=args.timeout, autostart=True, data_dir=root)
    proxy = Proxy(client, args.domain)
    server = build_server(proxy)
    log.info("eurekamem mcp: daemon socket %s, data root %s, domain %s", socket_path, root, args.domain or "(any)")

    async def main() -> None:
        try:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            await client.aclose()

    anyio.run(main, backend="trio")
    return 0


def add_mcp_command(sub: Any, common: Any) -> None:
    mcp = sub.add_parser("mcp", help="an MCP server on stdio (for Claude Code, Claude Desktop, Cursor, ...)")
    common(mcp)
    mcp.add_argument("--domain", help="the project or group this server's memories belong to (default: any)")
    mcp.add_argument("--timeout", type=float, default=30.0, help="seconds one daemon call may take")
    mcp.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    mcp.set_defaults(func=cmd_mcp)
